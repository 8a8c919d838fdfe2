"""The check's parts that read the software and the GPUs (pure: torch is imported inside the functions)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

from torus_train.job import gpus as job_gpus
from torus_train.verdict import Verdict


def environment(ctx: Any) -> Verdict:
    """Versions of what a run uses; ok when torch imports (the rest is said, a run needs only torch)."""
    import torch

    cuda = torch.version.cuda
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl_version(),
        "dali": dali_version(),
        "mpi4py": mpi_version(),
        "mpirun": mpirun_version(),
        "driver": job_gpus.driver_version(),
    }
    build = f"CUDA {cuda} build" if cuda else "CPU build"
    words = [f"python {found['python']}", f"torch {found['torch']} ({build})"]
    words.append(f"cuDNN {found['cudnn']}" if found["cudnn"] else "no cuDNN")
    words.append(f"NCCL {found['nccl']}" if found["nccl"] else "no NCCL")
    words.append(f"DALI {found['dali']}" if found["dali"] else "no DALI (torchvision decodes)")
    words.append(f"mpi4py {found['mpi4py']}" if found["mpi4py"] else "no mpi4py")
    words.append(found["mpirun"] or "no mpirun")
    no_driver = "no NVIDIA driver" if job_gpus.nvml() is not None else "no NVML binding (pip install nvidia-ml-py)"
    words.append(f"driver {found['driver']}" if found["driver"] else no_driver)
    return Verdict.passed(", ".join(words), **found)


def nccl_version() -> str | None:
    import torch

    try:
        v = torch.cuda.nccl.version()
    except Exception:  # a CPU build has no NCCL bindings
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def dali_version() -> str | None:
    try:
        import nvidia.dali as dali
    except Exception:  # not installed, or installed without its libraries
        return None
    return str(dali.__version__)


def mpi_version() -> str | None:
    try:
        import mpi4py
        from mpi4py import MPI
    except Exception:  # not installed, or no MPI library under it
        return None
    library = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
    return f"{mpi4py.__version__} ({library})"


def mpirun_version() -> str | None:
    path = shutil.which("mpirun")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return f"at {path} (its --version did not answer)"
    first = next((line for line in out.splitlines() if line.strip()), "")
    return f"{first.strip()} at {path}"


def gpus(ctx: Any) -> Verdict:
    """job/gpus.py's count (what `run` plans ranks on) against torch.cuda.device_count(); each GPU's name and
    memory. None without CUDA; False when the two counts differ."""
    import torch

    planned = job_gpus.local_gpus()
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = []
    for i in range(cuda):
        p = torch.cuda.get_device_properties(i)
        devices.append(
            {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}"}
        )
    detail = {
        "job_gpus": planned.count,
        "job_gpus_why": planned.why,
        "cuda_device_count": cuda,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": devices,
    }
    if planned.count != cuda:
        return Verdict.failed(
            f"job/gpus.py counts {planned.count} GPU(s) but CUDA shows {cuda}: `run` would plan ranks on GPUs that do "
            f"not exist or leave them idle ({planned.why or 'check CUDA_VISIBLE_DEVICES'})",
            **detail,
        )
    if cuda == 0:
        why = planned.why or "torch.cuda.is_available() is False"
        return Verdict.cannot_run(f"no CUDA device ({why}): runs use CPU ranks", **detail)
    names = ", ".join(sorted({f"{d['name']} ({d['memory_gib']} GiB)" for d in devices}))
    return Verdict.passed(f"{cuda} GPU(s), counted alike by job/gpus.py and CUDA: {names}", **detail)
