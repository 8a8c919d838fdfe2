"""`torus-train bench ...`: benchmarks that print tables in the conventions of the tools users compare with."""
from __future__ import annotations

import click


@click.group()
def bench() -> None:
    """Benchmarks: collectives (nccl-tests conventions) and input pipelines."""
