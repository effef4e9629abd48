"""Interpret: run a TrainingGraph's kernels in order on real tensors (replay), the loop the
profiler and the executor build on."""
