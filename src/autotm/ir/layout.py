"""Sizes the arena layout is built on, shared by the planner that lays blocks out
(planner/arena.py), the executor that places tensors in it and the profiler that times
moves as the executor makes them."""

PAGE = 4096
"""Alignment of direct I/O buffers, file offsets and lengths, and of mapped regions."""

LARGE_BLOCK_BYTES = 64 << 10
"""Blocks of this size or more: page-aligned in the arena on cpu+file, moved from and into
arena slots, served by the executor's pool when they miss the arena."""

TEMPORARY_MIN_BYTES = 1 << 20
"""Kernels' temporaries of at least this size go to free pages of the arena at run time
(tiers/cpu_arena.py); a kernel's workspace this large gets its own range in the layout."""
