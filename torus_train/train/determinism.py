"""What a deterministic run (job.deterministic) needs of its process before CUDA runs its first matrix product
(pure: the worker, `torus-train check` and the acceptance test's part processes set it before torch runs one).

cuBLAS repeats its results only with a fixed workspace per stream (CUBLAS_WORKSPACE_CONFIG). torch reads the
variable once per process, the first time any CUDA gemm runs, deterministic or not, and keeps what it read: set
later, it changes nothing, and torch.use_deterministic_algorithms then raises at the next cuBLAS call. So a
process that may turn determinism on sets it before its first gemm, and train/build.set_determinism refuses in
one line when CUDA has started without it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
"""cuBLAS's fixed workspace (a value the user set, such as ":16:8", is also deterministic and stands)."""


def with_deterministic_env(environ: MutableMapping[str, str]) -> None:
    """DETERMINISTIC_ENV into ``environ`` where the user has not set the variable."""
    for name, value in DETERMINISTIC_ENV.items():
        environ.setdefault(name, value)


def missing_deterministic_env(environ: Mapping[str, str]) -> list[str]:
    """The variables of DETERMINISTIC_ENV that ``environ`` lacks."""
    return [name for name in DETERMINISTIC_ENV if name not in environ]
