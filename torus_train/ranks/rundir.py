"""A run's output folder (OUT = job.out) as the launcher sees it: chosen, checked, prepared, read back.

A run writes job.json, logs/ and its results (summary.json, metrics.jsonl, checkpoints/, tensorboard/) into
OUT; a folder that holds anything else is someone's folder, not a run's, and is refused. No torch import.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from torus_train.errors import RunFailed, UserError, check_output_folder, shown_path
from torus_train.job.hosts import MAX_HOSTFILE_BYTES
from torus_train.job.launchers.local import agent_started_at, torchrun_attempt
from torus_train.job.spec import JobSpec
from torus_train.ranks.claim import CLAIM_FILE, job_of
from torus_train.train.checkpoint import list_checkpoints
from torus_train.userfiles import UserFileError, read_bytes, read_json

RESULT_FILES = ("summary.json", "metrics.jsonl", "checkpoints", "tensorboard")
RUN_ENTRIES = {*RESULT_FILES, "logs", "job.json", "job.tmp", "hosts.elastic", "report.png", "report.json", CLAIM_FILE}
"""Everything a run writes at the top of its output folder: a folder holding anything else is not a run's."""
JOB_TEMP = re.compile(r"^job\.json\.[A-Za-z0-9_]+\.tmp$")
"""job.json's temporary (a name of its own per write; one a killed launcher left is still a run's entry)."""
FIRST_ATTEMPT = "torchrun-attempt.json"
"""OUT/logs/FILE: which torchrun job prepared the folder, and in which attempt (see continues_attempt)."""
CLOCK_SKEW_S = 5.0
"""How far apart the nodes' clocks may be when a restarted rank compares the record's time with its agent's."""


def check_user_paths(spec: JobSpec) -> None:
    """Before anything is planned or launched: the output folder can be made and the hostfile is readable
    UTF-8 text; each problem is one UserError naming the flag and the path."""
    flag = "--out" if spec.job.out else "job.name"
    check_output_folder(spec.out_dir, flag)
    check_not_foreign(spec.out_dir, flag)
    if spec.launch.hostfile:
        hf = spec.launch.hostfile
        try:  # through the door: a FIFO named here would block the read for ever
            raw = read_bytes(hf, "--hostfile", MAX_HOSTFILE_BYTES)
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"--hostfile {shown_path(hf)}: not UTF-8 text (byte {e.start})") from None
        except UserFileError as e:
            why = "no such file" if e.why == "does not exist" else e.why.removeprefix("is ")
            raise UserError(f"--hostfile {shown_path(hf)}: {why}") from None


def check_not_foreign(out: Path, flag: str) -> None:
    """A run writes job.json, logs/ and its results into its output folder: a folder that holds anything else
    (the user's own files) is refused, so that nothing there is overwritten or mixed with a run."""
    try:
        entries = sorted(os.listdir(out)) if out.is_dir() else []
    except OSError as e:
        raise UserError(f"{flag} {shown_path(out)}: {e.strerror or e}") from None
    foreign = [e for e in entries if e not in RUN_ENTRIES and not JOB_TEMP.match(e)]
    if foreign:
        raise UserError(
            f"{flag} {shown_path(out)}: the folder holds files that are not a torus-train run's "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); they are left untouched: "
            f"give a new or empty folder"
        )


def holds_results(out: Path) -> list[str]:
    return [name for name in RESULT_FILES if (out / name).exists()]


def choose_out(spec: JobSpec, resume: bool, overwrite: bool) -> Path:
    """The output folder. A folder the user named (job.out / --out) that holds results is refused later
    unless --resume or --overwrite; the default runs/<name> moves on to a fresh runs/<name>-<timestamp>."""
    out = spec.out_dir.resolve()
    if spec.job.out or resume or overwrite or not holds_results(out):
        return out
    return out.with_name(f"{out.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_out(out: Path, resume: bool, overwrite: bool) -> list[str]:
    """Refuse to mix a new run into an output folder that holds results, unless --resume or --overwrite; the
    results --overwrite will replace. Touches nothing, so it runs before the data is prepared."""
    present = holds_results(out)
    if present and not resume and not overwrite:
        raise UserError(
            f"{out} already holds results ({', '.join(present)}); pass --resume to continue, "
            "--overwrite to replace them, or --out for another folder"
        )
    if resume and not (out / "checkpoints").is_dir():
        raise UserError(f"--resume: {out / 'checkpoints'} does not exist; nothing to resume")
    return [] if resume else present


def prepare_out(out: Path, resume: bool, overwrite: bool) -> None:
    """check_out, then the results --overwrite replaces removed and logs/ made."""
    present = check_out(out, resume, overwrite)
    if present:
        for name in (*present, "logs"):
            p = out / name
            if not p.exists():
                continue
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (out / "logs").mkdir(parents=True, exist_ok=True)


def write_job(path: Path, spec: JobSpec, grid, resume: bool, regrid: bool = False) -> None:
    """job.json for the ranks; regrid: a checkpoint of another grid is resumed on purpose (the job moved)."""
    job: dict[str, Any] = {
        "spec": spec.to_dict(),
        "grid": {"x": grid.x, "y": grid.y, "gpus_per_node": grid.gpus_per_node},
        "resume": resume,
        "regrid": regrid,
    }
    job["spec"]["job"]["out"] = str(path.parent)
    tmp = path.with_name(f"{path.name}.{os.getpid()}_{secrets.token_hex(4)}.tmp")  # a name of its own
    try:
        tmp.write_text(json.dumps(job, indent=1))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_hosts(hosts, path: Path) -> Path:
    """An OpenMPI hostfile ('host slots=K' lines)."""
    path.write_text("".join(f"{h.name} slots={h.slots}\n" for h in hosts))
    return path


def resume_epoch(out: Path) -> int:
    """The epoch of the newest checkpoint's manifest (0 when there is none or it cannot be read); it picks
    the leg to start with, the ranks verify and agree on the checkpoint themselves."""
    found = list_checkpoints(out / "checkpoints")
    try:
        return int(json.loads(found[0][1].read_text()).get("epoch", 0)) if found else 0
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def resume_starts(out: Path) -> list[int]:
    """The stage starts schedule.control decided, from the newest checkpoint's manifest ([] when there is
    none, or it holds none): with them the launcher plans the legs that are left."""
    found = list_checkpoints(out / "checkpoints")
    try:
        starts = read_json(found[0][1], "resume").get("stage_starts", []) if found else []
    except (UserError, AttributeError):
        return []
    ok = isinstance(starts, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in starts)
    return starts if ok else []


def latest_checkpoint_text(out: Path) -> str:
    """'the checkpoint at step 30' or 'the start (no checkpoint yet)', from the manifests' names (the ranks
    verify and agree on the checkpoint themselves)."""
    found = list_checkpoints(out / "checkpoints")
    return f"the checkpoint at step {found[0][0]}" if found else "the start (no checkpoint yet)"


def read_summary(out: Path) -> dict:
    """summary.json of ranks that exited 0; RunFailed when it is missing, unreadable or the replicas differ."""
    summary = out / "summary.json"
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        raise RunFailed(unfinished(out)) from None
    if not isinstance(s, dict) or not s.get("param_digests_agree"):
        raise RunFailed(f"replicas differ: see {summary}")
    return s


def unfinished(out: Path) -> str:
    """Why there is no summary although the launcher reported success: mpirun can exit 0 when a node's daemon
    is lost with its ranks. Counted once from the ranks' markers (every rank that started left a heartbeat)."""
    logs = out / "logs"
    done, started = len(list(logs.glob("rank*.done"))), len(list(logs.glob("rank*.beat")))
    if started and done < started:
        return (
            f"the launcher ended without an error, but only {done} of {started} ranks finished and no "
            f"summary.json was written: a node or rank was lost; see {logs}/ (resume with --resume)"
        )
    return f"the ranks exited but {out / 'summary.json'} was not written or cannot be read"


def record_attempt(out: Path, environ) -> None:
    """Rank 0 of a torchrun job, once it prepared OUT: this job (its run id) prepared it in this attempt."""
    rec = {"job": job_of(environ), "attempt": torchrun_attempt(environ), "time": time.time()}
    path = out / "logs" / FIRST_ATTEMPT
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)


def continues_attempt(out: Path, environ) -> bool:
    """Whether this rank of a `torchrun --max-restarts` attempt continues what an earlier attempt of its own
    job prepared in OUT: the record names this job, an earlier attempt, and a time after this node's agent
    started (torchrun's run id is "none" unless --rdzv-id or --standalone makes it unique, so the agent's start
    tells this job's record from an earlier job's). Otherwise the attempt is a first one: it makes the first
    attempt's checks (a folder with results is refused without --resume, --resume needs checkpoints), so a
    restart never continues a folder its first attempt refused or never prepared."""
    attempt = torchrun_attempt(environ)
    if attempt == 0:
        return False
    try:
        rec = json.loads((out / "logs" / FIRST_ATTEMPT).read_text())
        job, earlier, written = str(rec["job"]), int(rec["attempt"]), float(rec["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    started = agent_started_at(os.getppid())
    return job == job_of(environ) and earlier < attempt and started is not None and written >= started - CLOCK_SKEW_S
