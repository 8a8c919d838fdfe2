"""How many GPUs this machine lets a process use, as CUDA counts them, without importing torch (--help and
--dry-run stay fast).

CUDA_VISIBLE_DEVICES is read as the CUDA driver reads it (the CUDA programming guide's "CUDA environment
variables", and torch.cuda._parse_visible_devices, written against the driver's behaviour: pytorch/pytorch PRs
84879 and 92315):

    entries          a comma-separated list; surrounding spaces ignored; no ranges ("0-3" reads as 0)
    indices          each entry read as strtoul reads a number: "1gpu2" is 1; an entry that is not a number
                     ("abc", "") or is negative ends the list there ("0,2,-1,1" shows 0 and 2)
    UUIDs            a list that starts with GPU-... (or MIG-...) takes entries while they carry that prefix
                     ("GPU-3f2a,0" shows one); an abbreviated UUID is valid
    a repeat         an index or UUID listed twice hides every GPU ("0,0" and "0,1,0" show none)
    past the driver  an index the driver does not have ends the list there ("0,5" on 2 GPUs shows one)
    "", "-1"         hide every GPU (on purpose)

The driver's GPUs are the folders of /proc/driver/nvidia/gpus, else `nvidia-smi -L`'s lines where /proc does
not show them (WSL). Without either there is no NVIDIA driver, and CUDA shows no GPU whatever the variable says.
UUIDs cannot be checked against the driver without NVML; they count as named (GPU-... capped by the driver's
GPUs; MIG-... not, as one GPU holds up to 7 instances).

Commands ask ``local_gpu_count()`` through this module (``gpus.local_gpu_count()``), so a test replaces the
probe in one place and sees the plans of a machine with 0, 1 or 4 GPUs without starting a rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

BACKENDS = ("auto", "nccl", "gloo")
"""comm.backend's values (run --backend): auto = NCCL where there are GPUs, else gloo."""
DRIVER_GPUS = "/proc/driver/nvidia/gpus"
"""One folder per GPU the NVIDIA driver found (Linux)."""
UUID_PREFIXES = ("GPU-", "MIG-")
NO_DRIVER = "no NVIDIA driver here: no /proc/driver/nvidia/gpus, no nvidia-smi"


@dataclass(frozen=True)
class Visible:
    """What CUDA_VISIBLE_DEVICES names, read as CUDA reads it (before the driver is asked)."""

    entries: tuple[str, ...]
    """The entries CUDA takes, in order: indices as numbers' text ("1gpu2" -> "1"), UUIDs as written."""
    why: str = ""
    """Why CUDA takes fewer than the variable lists, in a few words ("" when it takes them all)."""

    @property
    def uuids(self) -> bool:
        return bool(self.entries) and self.entries[0].startswith(UUID_PREFIXES)


@dataclass(frozen=True)
class GpuCount:
    """The GPUs CUDA shows a process here, and why fewer than asked when that is so."""

    count: int
    why: str = ""
    """"" or one clause for a message: the repeat, the entry CUDA stops at, the missing driver."""


def _strtoul(text: str) -> int:
    """The number ``text`` starts with (an optional sign, then digits), -1 when none: C's strtoul as CUDA
    applies it to an entry."""
    digits = text[1:] if text[:1] in "+-" else text
    n = len(digits) - len(digits.lstrip("0123456789"))
    if n == 0:
        return -1
    value = int(digits[:n])
    return -value if text.startswith("-") else value


def read_visible(value: str) -> Visible:
    """CUDA_VISIBLE_DEVICES = ``value`` read as CUDA reads it (module docstring)."""
    items = [item.strip() for item in value.split(",")]
    prefix = next((p for p in UUID_PREFIXES if items[0].startswith(p)), None)
    taken: list[str] = []
    for item in items:
        if prefix is not None:
            ok, key = item.startswith(prefix), item
        else:
            number = _strtoul(item)
            ok, key = number >= 0, str(number)
        if not ok:
            shown = repr(item) if item else "an empty entry"
            why = "hides every GPU" if not taken and item in ("", "-1") and len(items) == 1 else f"stops at {shown}"
            return Visible(tuple(taken), f"CUDA_VISIBLE_DEVICES={value} {why}")
        if key in taken:
            return Visible((), f"CUDA_VISIBLE_DEVICES={value} names {key} twice, and CUDA then shows no GPU")
        taken.append(key)
    return Visible(tuple(taken))


def visible_entries(value: str) -> int:
    """Devices CUDA_VISIBLE_DEVICES names, as CUDA reads it, before the driver is asked."""
    return len(read_visible(value).entries)


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


def gpu_count(environ: Mapping[str, str], driver: int | None) -> GpuCount:
    """The GPUs a process with ``environ`` sees when the driver lists ``driver`` (None: no driver)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if driver is None:
        return GpuCount(0, NO_DRIVER)
    if value is None:
        return GpuCount(driver)
    seen = read_visible(value)
    if seen.uuids:
        cap = None if seen.entries[0].startswith("MIG-") else driver
        n = len(seen.entries) if cap is None else min(len(seen.entries), cap)
        return GpuCount(n, seen.why or (f"the driver lists {driver} GPU(s)" if n < len(seen.entries) else ""))
    for k, index in enumerate(seen.entries):
        if int(index) >= driver:
            return GpuCount(
                k, f"CUDA_VISIBLE_DEVICES={value} names GPU {index}, and the driver lists {driver} (0-{driver - 1})"
            )
    return GpuCount(len(seen.entries), seen.why)


def count_gpus(environ: Mapping[str, str], driver: int | None) -> int:
    """gpu_count's number."""
    return gpu_count(environ, driver).count


def local_gpus(environ: Mapping[str, str] | None = None) -> GpuCount:
    """The GPUs this process may use, and why fewer than asked (module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return GpuCount(0, f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} hides every GPU")  # no driver asked
    return gpu_count(env, driver_gpus())


def local_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """The GPUs this process may use (module docstring)."""
    return local_gpus(environ).count


def rank_gpus(backend: str, visible: int) -> int:
    """GPUs the ranks of a job may take here under comm.backend: none for gloo (CPU ranks on a GPU machine)."""
    return 0 if backend == "gloo" else visible


__all__ = [
    "BACKENDS",
    "DRIVER_GPUS",
    "GpuCount",
    "Visible",
    "count_gpus",
    "driver_gpus",
    "gpu_count",
    "local_gpu_count",
    "local_gpus",
    "rank_gpus",
    "read_visible",
    "visible_entries",
]
