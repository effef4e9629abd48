"""Experiments: the benchmark drivers (bench, demo), the results store (results) and the
figures (plots). The library never imports this package."""
