"""Tier specs for hypothetical memory systems (``sim:<name>``): TOML files in this package.

Each file gives a fast and a slow tier (read/write bandwidth in GB/s, latency in ns), the
access model (``staged`` or ``direct``), move bandwidths per direction (``to_fast``,
``to_slow``) and mode (``sync``, ``async``), and optionally ``[compute] peak_gflops``
(default: this machine's measured float32 matmul peak). Read by
``autotm.profile.load_spec``.
"""
