"""scripts/bench/bench_hook.py refuses a missing cluster hostfile in one line, before any run starts."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "bench_hook.py"


def test_a_missing_cluster_hostfile_is_named(tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--cluster", str(tmp_path / "hosts"), "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert f"--cluster {tmp_path / 'hosts'}: no such hostfile" in r.stderr
    assert "Traceback" not in r.stderr
