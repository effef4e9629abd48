"""What a measurement depends on besides the kernel: the profile cache key's environment part."""

from __future__ import annotations

import os
import platform

import torch


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(memory_system: str, device: torch.device | None = None,
                async_engine: str | None = None) -> dict:
    """What a measurement depends on besides the kernel: the cache key's environment part.

    `device`: the fast tier's device; for a GPU, "device" is the GPU's name (so CPU timings
    are never reused for it) and the CUDA and cuDNN versions are part of the key."""
    env = {
        "device": cpu_model(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "memory_system": memory_system,
        # how things are timed: a new method measures everything again (what each changed:
        # benchmarks/HISTORY.md, "Profile methods")
        "method": 16,
    }
    if async_engine is not None:  # cpu+file: Linux AIO or the I/O thread
        env["async_io"] = async_engine
    if device is not None and torch.device(device).type == "cuda":
        env.update(device=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    return env

