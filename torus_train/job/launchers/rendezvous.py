"""Where rank 0 listens: the rendezvous port of a job, the same in every process that knows the job (pure
apart from reading this host's ephemeral port range; no torch import).

Under a launcher with a command (mpirun, srun) rank 0 runs on another host, so no free port can be picked
here; the port is a function of the job instead, drawn outside the ephemeral range so that no outgoing
connection holds it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from torus_train.usernumbers import int_of

PORT_BAND = (20000, 32767)
"""Where rendezvous ports are drawn from: below Linux's default ephemeral range (32768-60999)."""
DEFAULT_EPHEMERAL = (32768, 60999)
EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range(path: str = EPHEMERAL_FILE) -> tuple[int, int]:
    """This host's ephemeral (outgoing) port range, or Linux's default when the file cannot be read."""
    try:
        with open(path) as f:
            lo, hi = (int(v) for v in f.read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def port_band(ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL) -> tuple[int, int]:
    """The ports rendezvous_port draws from: PORT_BAND minus the ephemeral range, else the wider free side of
    the ephemeral range (above 1023), else PORT_BAND when the ephemeral range covers every port."""
    lo, hi = PORT_BAND
    elo, ehi = ephemeral
    pieces = [(lo, min(hi, elo - 1)), (max(lo, ehi + 1), hi)]
    pieces = [(a, b) for a, b in pieces if a <= b]
    if not pieces:
        pieces = [(a, b) for a, b in ((1024, elo - 1), (ehi + 1, 65535)) if a <= b]
    return max(pieces, key=lambda p: p[1] - p[0]) if pieces else PORT_BAND


def rendezvous_port(key: str, ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL) -> int:
    """The rendezvous port of a job: every process that knows `key` computes the same one, in port_band().

    A key of digits (a Slurm job id) maps to lo + id mod width, so consecutive jobs get consecutive ports;
    any other key (the job file path) through sha256, which, unlike hash(), is the same in every process."""
    lo, hi = port_band(ephemeral)
    digits = re.fullmatch("[0-9]{1,18}", key, re.ASCII)  # a job id; "²" or 5,000 digits are hashed as any key
    n = int_of(key, "the job key") if digits else int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return lo + n % (hi - lo + 1)


def job_key(environ: Mapping[str, str], job_file: str) -> str:
    """What names this launch: the scheduler's job id (if any) and the job file, which lives in the run's own
    output folder, so two runs inside one allocation get different ports."""
    job = environ.get("SLURM_JOB_ID") or environ.get("PBS_JOBID") or ""
    return f"{job}:{job_file}"
