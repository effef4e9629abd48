"""Runtime: a plan executed on real memory tiers (executor), checked bit for bit against
eager PyTorch (verify), the executor's own overheads calibrated (overhead), GPU baselines
(gpu_baselines)."""
