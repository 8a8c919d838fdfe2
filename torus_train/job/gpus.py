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

The driver's GPUs come from NVML (NVIDIA's `nvidia-ml-py`, a ctypes binding to the driver's libnvidia-ml.so.1,
the library torch.cuda.device_count asks before CUDA starts: torch.cuda._device_count_nvml). NVML lists every
GPU of the machine and ignores CUDA_VISIBLE_DEVICES, so the variable is read here; torch's reader of it is
private and needs torch imported. A UUID entry is matched against the driver's GPUs' UUIDs as torch matches it
(a unique prefix; one that matches no GPU or several ends the list there; two entries naming one GPU hide
every GPU); the UUIDs are asked only then. MIG instances (MIG-..., up to 7 on one GPU) are not among those UUIDs:
they count as named. Without NVML's library there is no NVIDIA driver, and CUDA shows no GPU whatever the
variable says.

Commands ask ``local_gpu_count()`` through this module (``gpus.local_gpu_count()``), so a test replaces the
probe in one place and sees the plans of a machine with 0, 1 or 4 GPUs without starting a rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no py.typed marker

from torus_train.usernumbers import int_of

ULONG_MAX = (1 << 64) - 1
"""What C's strtoul gives for a number past its range (CUDA reads CUDA_VISIBLE_DEVICES's entries with it)."""

BACKENDS = ("auto", "nccl", "gloo")
"""comm.backend's values (run --backend): auto = NCCL where there are GPUs, else gloo."""
UUID_PREFIXES = ("GPU-", "MIG-")
NO_DRIVER = "no NVIDIA driver here: NVML (libnvidia-ml.so.1, installed with the driver) does not start"
T = TypeVar("T")


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
    # past 19 digits strtoul saturates at ULONG_MAX: a GPU no driver lists, as CUDA reads it
    value = int_of(digits[:n], "CUDA_VISIBLE_DEVICES") if n <= 19 else ULONG_MAX
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


def nvml_query(query: Callable[[], T]) -> T | None:
    """``query()`` between nvmlInit and nvmlShutdown; None when NVML does not start (no driver) or fails."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return query()
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def driver_version() -> str | None:
    """The NVIDIA driver's version (`torus-train check`'s environment part); None without a driver."""
    version = nvml_query(pynvml.nvmlSystemGetDriverVersion)
    return None if version is None else str(version)


def driver_gpus() -> int | None:
    """GPUs the NVIDIA driver lists, or None when there is no driver to ask."""
    return nvml_query(pynvml.nvmlDeviceGetCount)


def driver_uuids() -> list[str] | None:
    """The UUIDs of the driver's GPUs in its order (GPU-...), or None when there is no driver to ask."""

    def uuids() -> list[str]:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return [str(pynvml.nvmlDeviceGetUUID(h)) for h in handles]

    return nvml_query(uuids)


def gpu_count(environ: Mapping[str, str], driver: int | Sequence[str] | None) -> GpuCount:
    """The GPUs a process with ``environ`` sees when the driver lists ``driver``: its GPUs' UUIDs (UUID entries
    are matched against them), or only their count; None: no driver."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if driver is None:
        return GpuCount(0, NO_DRIVER)
    gpus = driver if isinstance(driver, int) else len(driver)
    if value is None:
        return GpuCount(gpus)
    seen = read_visible(value)
    if seen.uuids:
        return _uuid_count(seen, value, driver)
    for k, index in enumerate(seen.entries):
        if int(index) >= gpus:
            return GpuCount(
                k, f"CUDA_VISIBLE_DEVICES={value} names GPU {index}, and the driver lists {gpus} (0-{gpus - 1})"
            )
    return GpuCount(len(seen.entries), seen.why)


def _uuid_count(seen: Visible, value: str, driver: int | Sequence[str]) -> GpuCount:
    """UUID entries matched as torch matches them (module docstring). MIG instances are not among the GPUs'
    UUIDs, and a driver known only by its count has none to match: those count as named."""
    if seen.entries[0].startswith("MIG-") or isinstance(driver, int):
        return GpuCount(len(seen.entries), seen.why)
    found: list[str] = []
    for entry in seen.entries:
        matches = [u for u in driver if u.startswith(entry)]
        if len(matches) != 1:
            which = "no GPU here has" if not matches else f"{len(matches)} GPUs here match"
            return GpuCount(len(found), f"CUDA_VISIBLE_DEVICES={value} stops at {entry}, which {which}")
        if matches[0] in found:
            return GpuCount(0, f"CUDA_VISIBLE_DEVICES={value} names {matches[0]} twice, and CUDA then shows no GPU")
        found.append(matches[0])
    return GpuCount(len(found), seen.why)


def local_gpus(environ: Mapping[str, str] | None = None) -> GpuCount:
    """The GPUs this process may use, and why fewer than asked (module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return GpuCount(0, f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} hides every GPU")  # no driver asked
    uuids = read_visible(env.get("CUDA_VISIBLE_DEVICES", "")).uuids
    return gpu_count(env, driver_uuids() if uuids else driver_gpus())  # a GPU's UUID only where one is named


def local_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """The GPUs this process may use (module docstring)."""
    return local_gpus(environ).count


def rank_gpus(backend: str, visible: int) -> int:
    """GPUs the ranks of a job may take here under comm.backend: none for gloo (CPU ranks on a GPU machine)."""
    return 0 if backend == "gloo" else visible


__all__ = [
    "BACKENDS",
    "GpuCount",
    "Visible",
    "driver_gpus",
    "driver_uuids",
    "gpu_count",
    "local_gpu_count",
    "local_gpus",
    "rank_gpus",
    "read_visible",
]
