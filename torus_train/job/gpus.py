"""How many GPUs this machine lets a process use, without importing torch (--help and --dry-run stay fast).

The count is what CUDA would enumerate: CUDA_VISIBLE_DEVICES when set (its entries up to the first invalid
one, as CUDA reads it; "" or "-1" hide every GPU), capped by the GPUs the NVIDIA driver lists
(/proc/driver/nvidia/gpus, else `nvidia-smi -L` where /proc does not show them, as under WSL). Without a
driver list CUDA_VISIBLE_DEVICES is taken at its word.

Commands ask ``local_gpu_count()`` through this module (``gpus.local_gpu_count()``), so a test replaces the
probe in one place and sees the plans of a machine with 0, 1 or 4 GPUs without starting a rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

BACKENDS = ("auto", "nccl", "gloo")
"""comm.backend's values (run --backend): auto = NCCL where there are GPUs, else gloo."""
DRIVER_GPUS = "/proc/driver/nvidia/gpus"
"""One folder per GPU the NVIDIA driver found (Linux)."""


def visible_entries(value: str) -> int:
    """Devices CUDA_VISIBLE_DEVICES names: its entries up to the first invalid one (CUDA ignores the rest)."""
    n = 0
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        n += 1
    return n


def driver_gpus(driver_dir: str = DRIVER_GPUS, which: Callable[[str], str | None] = shutil.which) -> int | None:
    """GPUs the NVIDIA driver lists, or None when there is no driver to ask."""
    try:
        return len(os.listdir(driver_dir))
    except OSError:
        pass
    smi = which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def count_gpus(environ: Mapping[str, str], driver: int | None) -> int:
    """The GPUs a process with `environ` sees when the driver lists `driver` (None: no driver list)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return driver or 0
    named = visible_entries(value)
    return named if driver is None else min(named, driver)


def local_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """The GPUs this process may use (module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return 0  # hidden on purpose: no need to ask the driver
    return count_gpus(env, driver_gpus())


def rank_gpus(backend: str, visible: int) -> int:
    """GPUs the ranks of a job may take here under comm.backend: none for gloo (CPU ranks on a GPU machine)."""
    return 0 if backend == "gloo" else visible


__all__ = ["BACKENDS", "DRIVER_GPUS", "count_gpus", "driver_gpus", "local_gpu_count", "rank_gpus", "visible_entries"]
