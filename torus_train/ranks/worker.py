"""The per-rank entry point: ``python -m torus_train.ranks.worker --job OUT/job.json``.

Started by `torus-train run` (local launcher), by mpirun or by srun. It redirects its output to
OUT/logs/rankNNNNN.log (rank 0 keeps its stdout for the progress bar), brings up the process group and the
grid's row/column groups, trains, and on success leaves OUT/logs/rankNNNNN.done so that the launcher can tell
a finished rank from one that exited 0 too early. A failure is logged with its traceback and reported on one
line as ``torus-train: rank R failed: ...`` with a non-zero exit code; OUT/logs/rankNNNNN.failed says what
kind of failure it was (input, verdict, stopped, crash), which the launcher reads to decide on a restart.

What torch records of a failure is on by default (``torch_diagnostics``; a value the user set wins): torch's
``record`` writes an uncaught exception with its traceback to OUT/logs/rankNNNNN.error.json and has
faulthandler print every thread's stack on a fatal signal; an NCCL rank keeps NCCL's flight recorder, dumped to
OUT/logs/nccl_trace_rank_R when a collective times out. For the launcher's watchdog (any backend, any hang) a
rank keeps a heartbeat (OUT/logs/rankNNNNN.beat, ranks/heartbeat.py) and dumps the Python stack of all its
threads into its log on SIGUSR1 (faulthandler). Started by the local launcher, it dies with the launcher
(heartbeat.die_with_parent).
"""

from __future__ import annotations

import argparse
import errno
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from torus_train.errors import PeerLost, RunFailed, UserError, comm_failure
from torus_train.job.spec import JobSpec, spec_from_table
from torus_train.job.topology import Grid
from torus_train.ranks.bootstrap import rank_info
from torus_train.ranks.diagnosis import (
    NO_SPACE_KIND,
    TRACE_PREFIX,
    done_path,
    error_path,
    failed_path,
    log_path,
    reserve_path,
)
from torus_train.ranks.heartbeat import Heartbeat, beat_interval, die_with_parent
from torus_train.train import faults
from torus_train.train.checkpoint import NO_SPACE
from torus_train.train.stop import StopRequest, StopRequested
from torus_train.train.writer import APPENDER
from torus_train.usernumbers import int_of

REDIRECTED = "TORUS_TRAIN_LOG_REDIRECTED"
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
"""Where torch's ``record`` writes a rank's uncaught exception (torchrun's agent sets it to a file of its own)."""
RESERVE_BYTES = 4096
"""The marker's room, taken when the rank starts: a full disk cannot then keep its failure from the launcher."""
STALLED_S = 10.0
"""A rank whose own clock thread did not run for this long before its failure was stopped or frozen (SIGSTOP, a
debugger, a frozen node): it says so in its marker, which is how the launcher tells the hung rank from those that
timed out waiting for it, under any launcher (ranks/diagnosis.hung_rank)."""
TICK = [time.monotonic()]
"""When this rank's clock thread last ran."""
STALL = [0.0, 0.0]
"""The clock thread's last gap of STALLED_S or more: [its seconds, when it ended (monotonic)]."""
FLIGHT_RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
"""NCCL's flight recorder: each rank keeps its last 2,000 collectives (a few steps of every bucket's row and
column exchanges) and dumps them when one times out, rank 0's dump asking the others for theirs."""


class Terminated(Exception):
    """SIGTERM/SIGINT reached this rank; it must exit non-zero (never 0, or the others would hang)."""


def read_job(path: str | Path) -> tuple[JobSpec, Grid, dict]:
    """The job file a launcher wrote: {"spec": {...}, "grid": {"x", "y", "gpus_per_node"}, "resume": bool}."""
    job = json.loads(Path(path).read_text())
    g = job["grid"]
    return spec_from_table(job["spec"]), Grid(g["x"], g["y"], g["gpus_per_node"]), job


def classify(e: BaseException, out: Path | None = None) -> tuple[int, str, str]:
    """(exit code, kind, message) of the exception that ended a rank. Kinds: input (bad input: exit 2),
    stopped (a signal), verdict (the job's own check failed: a corrupt checkpoint, diverged replicas, non-finite
    loss; it would fail again the same way) and crash (anything else: a lost peer, a library error, a bug)."""
    if isinstance(e, UserError):
        return 2, "input", str(e)
    if isinstance(e, (StopRequested, Terminated)):
        return 143, "stopped", str(e)
    full = no_space(e, out)
    if full:  # a full file system would fail a restart the same way
        return 1, NO_SPACE_KIND, full
    if isinstance(e, RunFailed):
        return 1, "verdict", str(e)
    if isinstance(e, PeerLost):  # a peer died in a collective: restartable, said in the transport's words
        return 1, "crash", str(e)
    first = str(e).splitlines()[0] if str(e) else ""
    said = comm_failure(str(e))  # gloo's and NCCL's words for a failed collective (errors.COMM_FAILURES)
    return 1, "crash", said or f"{type(e).__name__}: {first}"


def no_space(e: BaseException, out: Path | None = None) -> str:
    """The line for a failure that a full file system caused ('' for any other): a failed checkpoint says so
    itself (with the checkpoint kept); an OSError ENOSPC anywhere in the chain names the output folder."""
    if isinstance(e, RunFailed) and NO_SPACE in str(e):
        return str(e)
    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            where = f" (writing {seen.filename})" if seen.filename else ""
            return f"{out or 'the output folder'}: {NO_SPACE} on its file system{where}"
        seen = seen.__cause__ or seen.__context__
    return ""


def torch_diagnostics(spec: JobSpec, out: Path, rank: int, environ=os.environ) -> None:
    """Before torch is imported: the rank's error file for torch's ``record`` and, where the ranks may run on
    NCCL, its flight recorder with the dump beside the logs (``torchfrtrace OUT/logs -p nccl_trace_rank_``
    reads them). setdefault: a value the user or torchrun set wins."""
    environ.setdefault(ERROR_FILE, str(error_path(out, rank)))
    if spec.comm.backend != "gloo":  # the flight recorder is NCCL's
        for name, value in FLIGHT_RECORDER.items():
            environ.setdefault(name, value)
        environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(out / "logs" / TRACE_PREFIX))


def start_clock() -> None:
    """A daemon thread that notes the time twice a second: a gap means the whole process did not run."""

    def tick() -> None:
        while True:
            now = time.monotonic()
            if now - TICK[0] >= STALLED_S:  # woken first: the main thread may not have read the gap yet
                STALL[:] = [now - TICK[0], now]
            TICK[0] = now
            time.sleep(0.5)

    threading.Thread(target=tick, name="stall-clock", daemon=True).start()


def stalled_for() -> float:
    """Seconds the process did not run just before now (the clock thread's gap, still open or ended within
    the last minute); 0 when it ran."""
    now = time.monotonic()
    gap = now - TICK[0]
    if gap >= STALLED_S:
        return gap
    return STALL[0] if now - STALL[1] < 60.0 else 0.0


def start_heartbeat(out: Path, rank: int, stop: StopRequest) -> None:
    beat = Heartbeat(out, rank, beat_interval(rank_info().world_size))
    stop.on_step = beat.record


def redirect_output(out: Path, rank: int) -> int:
    """Send stderr (and stdout except on rank 0) to this rank's log; return a dup of the original stderr."""
    if os.environ.get(REDIRECTED) == "1":  # the local launcher already sends stderr to the log
        original = 2
    else:
        original = os.dup(2)
        path = log_path(out, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(fd, 2)
        if rank != 0:
            os.dup2(fd, 1)
        os.close(fd)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s"
    )
    return original


def signal_handler(stop: StopRequest):
    """SIGTERM/SIGINT: the loop stops all ranks together at its next logging interval (and checkpoints);
    outside the loop the rank ends at once, non-zero."""

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if not stop.request(name):
            raise Terminated(f"received {name}")

    return on_signal


MAX_THREADS = 1 << 16
"""The most compute threads a rank is given (the largest nodes have some thousands of cores)."""


def rank_threads(environ) -> int | None:
    """Compute threads of this rank: OMP_NUM_THREADS as the launcher set it, else the CPUs Slurm gave the
    task (`srun -n 4 torus-train run` by hand sets SLURM_CPUS_PER_TASK but no OMP_NUM_THREADS)."""
    for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        # OpenMP takes a list per nesting level ("8,2"): the first is this rank's; 0 or unset says nothing
        first = environ.get(name, "").split(",")[0]
        if first.strip() and (n := int_of(first, name, 0, MAX_THREADS)):
            return n
    return None


def run_worker(
    spec: JobSpec, grid: Grid, resume: bool, stop: StopRequest, regrid: bool = False, fault: faults.Fault | None = None
) -> dict:
    """Start-up, training, shutdown of one rank (torch imported here)."""
    threads = rank_threads(os.environ)
    if spec.job.deterministic:  # before torch touches the GPU: cuBLAS reads it when its handle is made
        from torus_train.train.build import DETERMINISTIC_ENV

        for name, value in DETERMINISTIC_ENV.items():
            os.environ.setdefault(name, value)
    if spec.model.cuda_graphs == "auto":
        # the graphed step never has captured and uncaptured collectives outstanding on one communicator (a
        # synchronisation separates them, train/graphs.py), so NCCL's mixing mechanism, seen to deadlock CUDA
        # when graphs of several communicators (the row's and the column's) launch from one thread, stays off
        os.environ.setdefault("NCCL_GRAPH_MIXING_SUPPORT", "0")
    import torch

    if threads:
        torch.set_num_threads(threads)
    from torus_train.ranks.distributed import init_distributed, shutdown
    from torus_train.train.loop import run_training

    boot = init_distributed(
        grid, spec.comm.timeout_s, backend=None if spec.comm.backend == "auto" else spec.comm.backend
    )
    logging.getLogger("torus_train.ranks.worker").info(
        "rank %d/%d (local %d, from %s) at grid %s position %s on %s/%s",
        boot.info.rank,
        boot.info.world_size,
        boot.info.local_rank,
        boot.info.source,
        grid,
        grid.position(boot.info.rank),
        boot.device,
        boot.backend,
    )
    summary = run_training(spec, boot, spec.out_dir, resume, stop, regrid=regrid, fault=fault)
    shutdown()
    return summary


def execute(spec: JobSpec, grid: Grid, resume: bool, regrid: bool = False) -> None:
    """Run this rank to the end and exit the process: 0 on success, 2 on bad input, 1 (or 143) on failure."""
    rank = rank_info().rank
    code, kind, message = 0, "", ""
    original_stderr, errors = 2, None
    out = spec.out_dir
    try:
        original_stderr = redirect_output(out, rank)
        reserve_marker(out, rank)
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        stop = StopRequest()
        signal.signal(signal.SIGTERM, signal_handler(stop))
        signal.signal(signal.SIGINT, signal_handler(stop))
        die_with_parent()
        start_clock()
        start_heartbeat(out, rank, stop)
        torch_diagnostics(spec, out, rank)
        # torch's record: faulthandler on fatal signals, and the uncaught exception with its traceback for the
        # error file, written after the rank's own line and marker (errors_after_the_line)
        from torch.distributed.elastic.multiprocessing.errors import record

        errors = errors_after_the_line()
        record(start_rank, error_handler=errors)(spec, grid, resume, stop, regrid, rank)
        done_path(out, rank).write_text("ok\n")
        reserve_path(out, rank).unlink(missing_ok=True)
    except BaseException as e:
        code, kind, message = classify(e, out)
        report_failure(out, rank, code, kind, message, original_stderr)
        try:
            traceback.print_exc()  # inside the except block, or it prints "NoneType: None"
        except OSError:  # the log is on a full disk: the line above went to the launcher already
            pass
    try:  # metrics lines still with the writer thread reach the file (a hung file system gets 10 s)
        APPENDER.flush(timeout=10.0)
    except OSError:
        pass
    if errors is not None:
        errors.write()
    exit_rank(code)


def exit_rank(code: int) -> None:
    try:
        sys.stdout.flush(), sys.stderr.flush()
    except OSError:
        pass
    if code == 0 and "mpi4py.MPI" in sys.modules:  # mpirun counts an exit without MPI_Finalize as a failure
        MPI = sys.modules["mpi4py.MPI"]
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    # os._exit: a failed collective can leave gloo/NCCL threads that would block a normal interpreter exit.
    os._exit(code)


def errors_after_the_line():
    """torch's ErrorHandler for ``record`` whose error file is written when the rank is done with its own line
    and marker, and never raises: torch's writes it at once and its OSError on a full disk replaced the rank's
    failure. The file has torch's layout ({"message": {"message", "extraInfo": {"py_callstack",
    "timestamp"}}}), which torchrun's agent and diagnosis.recorded_traceback read."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    class AfterTheLine(ErrorHandler):
        pending: dict | None = None

        def record_exception(self, e: BaseException) -> None:
            stack = traceback.format_exc()
            self.pending = {"message": f"{type(e).__name__}: {e}", "extraInfo": {"py_callstack": stack}}
            self.pending["extraInfo"]["timestamp"] = str(int(time.time()))

        def write(self) -> None:
            path = self._get_error_file_path()
            if self.pending and path:
                write_whole(Path(path), json.dumps({"message": self.pending}))

    return AfterTheLine()


def start_rank(spec: JobSpec, grid: Grid, resume: bool, stop: StopRequest, regrid: bool, rank: int) -> None:
    """The rank's work under torch's ``record``: an injected start-up fault (docs/faults.md), then training."""
    fault = faults.from_environ()  # the launcher's and the loop's tests inject faults (docs/faults.md)
    if faults.fails_at_start(fault, rank):
        raise RunFailed("injected start-up failure")
    run_worker(spec, grid, resume, stop, regrid, fault)


def report_failure(out: Path, rank: int, code: int, kind: str, message: str, original_stderr: int) -> None:
    """The one line for the user and the .failed marker for the launcher, written where a full disk cannot
    lose them: the launcher's stderr first (mpirun/srun pass it on), then the log, then the marker into the room
    the rank took at its start (reserve_marker)."""
    line = f"torus-train: rank {rank} failed: {message}\n"
    if original_stderr != 2:
        try:
            os.write(original_stderr, line.encode())
        except OSError:
            pass
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except OSError:
        pass
    record = {"rank": rank, "code": code, "kind": kind, "message": message[:600]}  # fits the room
    stalled = stalled_for()  # read before anything here may block
    if stalled:
        record["stalled_s"] = round(stalled, 1)
    marker = json.dumps(record)
    reserve = reserve_path(out, rank)
    try:  # overwriting taken room needs no new blocks; the rename makes it the marker, never half written
        with open(reserve, "r+b") as f:
            f.write(marker.encode())
            f.truncate()
        os.replace(reserve, failed_path(out, rank))
    except OSError:
        write_whole(failed_path(out, rank), marker)


def reserve_marker(out: Path, rank: int) -> None:
    """Room for the .failed marker, taken at the start (OUT/logs/rankNNNNN.failed.room, RESERVE_BYTES)."""
    write_whole(reserve_path(out, rank), " " * RESERVE_BYTES)


def write_whole(path: Path, text: str) -> bool:
    """path with text, through a temporary renamed into place: whole or not at all (never an empty marker on
    a full disk); False when it could not be written."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
        return True
    except OSError:
        tmp.unlink(missing_ok=True)
        return False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m torus_train.ranks.worker")
    ap.add_argument("--job", required=True, help="job.json written by `torus-train run`")
    args = ap.parse_args(argv)
    try:
        spec, grid, job = read_job(args.job)
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"torus-train: rank {rank_info().rank} failed: cannot read job file {args.job}: {e}\n")
        os._exit(2)
    execute(spec, grid, bool(job.get("resume")), bool(job.get("regrid")))


if __name__ == "__main__":
    main()
