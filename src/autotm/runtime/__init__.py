"""Runtime: a plan executed on real memory tiers (executor, session), what a run measured
(report), the plan's layout followed (arena_following), the process's memory watched
(host_memory), Ctrl-C between kernels (interrupts), checked bit for bit against eager
PyTorch (verify), the executor's own overheads calibrated (overhead), GPU baselines
(gpu_baselines)."""
