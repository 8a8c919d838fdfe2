"""The fuzz test's harness: one input (argv + environment) through the real entry point, ``torus_train.cli.main``,
in this process, under a hard timeout, with the files of its temporary folder compared before and after, and a
verdict: exit 0, or exactly one ``torus-train: error:`` line with exit 2 that names what was given (exit 1 only
where the command's contract has it), no traceback, no hang, nothing written outside the places it was asked to
write (nothing at all when it refused), within seconds.

Commands that would run long stop at their launch point: the function each calls once every check has passed
(``LAUNCH_POINTS``) raises ``WouldLaunch`` there, and reaching it counts as accepted input. Everything before it
(parsing, the spec, the preflight, the writer rules) runs for real; so does every command without a launch point.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import click
from click.testing import CliRunner

from torus_train.cli import main

LAUNCH_POINTS = {
    "torus_train.ranks.orchestrate.run_legs": "run: the ranks start",
    "torus_train.ranks.orchestrate.run_as_rank": "run inside a launcher's rank: this process trains",
    "torus_train.commands.bench._spawn_local": "bench allreduce: its ranks start",
    "torus_train.bench.sweep.measure": "bench allreduce as a rank: the sweep",
    "torus_train.commands.bench_input.alternate": "bench input: the timed rounds",
    "torus_train.commands.check.run_parts": "check: the probes",
    "torus_train.check.acceptance.accept": "check --acceptance: the parts",
    "torus_train.commands.data.generate": "data demo: drawing the images",
    "torus_train.commands.rehearse.rehearse": "plan rehearse: its ranks start",
}
"""Where each long-running command has checked everything it can before the work starts (docs/faults.md)."""

EXIT_1 = {
    ("check",): "a part failed (docs/check.md)",
    ("plan", "rehearse"): "a rule is broken (docs/rehearse.md)",
    ("bench", "allreduce"): "wrong elements (#wrong)",
    ("run",): "the run failed after it started (errors.RunFailed)",
}
"""The commands whose contract has exit 1 (errors.py: RunFailed, PeerLost; the commands' docs)."""


class WouldLaunch(BaseException):
    """Raised at a launch point: the input was accepted and the long work would start here."""


class CaseTimeout(BaseException):
    """The case ran past its hard limit."""


@dataclass
class Case:
    """One input: the command line, the environment set on top of the clean one, and the names a refusal of it
    must mention (the option, variable or field that alone was changed; empty: no such check)."""

    command: tuple[str, ...]
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    given: tuple[str, ...] = ()
    label: str = ""
    value: str | None = None
    """The value that alone was changed (a refusal may name it instead of the option)."""


@dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float
    launched: str = ""
    crash: str = ""
    timed_out: bool = False
    written: list[str] = field(default_factory=list)
    touched: list[str] = field(default_factory=list)
    left_running: list[int] = field(default_factory=list)


def install_launch_points(monkeypatch) -> None:
    """Replace every launch point by one that raises WouldLaunch naming it."""
    import importlib

    for ref, what in LAUNCH_POINTS.items():
        module, name = ref.rsplit(".", 1)

        def stop(*_a, _what=what, **_k):
            raise WouldLaunch(_what)

        monkeypatch.setattr(importlib.import_module(module), name, stop)


def _main(argv: list[str]) -> tuple[int, str]:
    """(exit code, the launch point reached or '') of ``torus-train ARGV`` in this process."""
    try:
        main(list(argv))
    except SystemExit as e:
        return (e.code if isinstance(e.code, int) else (0 if e.code is None else 1)), ""
    except WouldLaunch as e:
        return 0, str(e)
    return 0, ""


def child_pids() -> set[int]:
    """This process's children (every thread's), from /proc."""
    pid, found = os.getpid(), set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            found |= {int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()}
    return found


def end_children(pids: set[int], grace_s: float = 2.0) -> list[int]:
    """The children a case left that are still running after ``grace_s``: each is then killed by its id and
    reaped, so the next case starts alone."""
    deadline = time.monotonic() + grace_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        for p in list(alive):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(p, os.WNOHANG)[0] == p:
                    alive.discard(p)
        time.sleep(0.02)
    for p in alive:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
            os.waitpid(p, 0)
    return sorted(alive)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry below ``root``: a file's size and mtime, a link's target, a folder, a FIFO (never opened)."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.islink(p):
                seen[p] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                seen[p] = ("dir",)
            else:
                seen[p] = ("file", st.st_size, st.st_mtime_ns, st.st_mode)
    return seen


class Harness:
    """Runs cases with HOME, the cwd, TORUS_TRAIN_CACHE and TMPDIR inside ``root``; every variable the package
    reads (``clean``) removed from the environment first, so the host's own (a CI runner inside Slurm) cannot
    change a verdict."""

    def __init__(self, root: Path, clean: list[str], limit_s: float = 20.0):
        self.root, self.limit_s = root, limit_s
        self.cwd, self.cache, self.tmp = root / "cwd", root / "cache", root / "tmp"
        for p in (self.cwd, self.cache, self.tmp, root / "home"):
            p.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if k not in clean}
        self.env.update(HOME=str(root / "home"), TORUS_TRAIN_CACHE=str(self.cache), TMPDIR=str(self.tmp), COLUMNS="110")

    def run(self, case: Case) -> Result:
        before, children = snapshot(self.root), child_pids()
        saved, saved_cwd = dict(os.environ), os.getcwd()
        os.environ.clear()
        os.environ.update({**self.env, **case.env})
        os.chdir(self.cwd)
        try:
            result = self._invoke(case)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved)
        self._compare(case, before, result)
        result.left_running = end_children(child_pids() - children)
        return result

    def _invoke(self, case: Case) -> Result:
        code, launched, crash, timed_out = 0, "", "", False

        def alarm(*_):
            raise CaseTimeout()

        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, self.limit_s)
        t0 = time.perf_counter()
        runner = CliRunner()  # click's test isolation: stdin empty (no prompt waits), stdout/stderr captured
        with runner.isolation() as (out, err, _):
            try:
                code, launched = _main(case.argv)
            except CaseTimeout:
                timed_out, code = True, -1
            except BaseException:
                crash, code = traceback.format_exc(), -2
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
            texts = out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
        return Result(code, *texts, time.perf_counter() - t0, launched, crash, timed_out)

    def _compare(self, case: Case, before: dict, result: Result) -> None:
        """What the case changed below root: entries it made (removed again, so every case starts alike) and
        entries that were there and changed or went (always a finding: inputs are not the command's own)."""
        after = snapshot(self.root)
        for p, was in before.items():
            now = after.get(p)
            if now is None or (now != was and was[0] != "dir"):
                result.touched.append(p)
        made = sorted(p for p in after if p not in before)
        result.written = made
        for p in sorted(made, key=len):
            if os.path.lexists(p):
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    os.unlink(p)

    def allowed(self, case: Case, path: str) -> bool:
        """A place this case may write: below a path its command line names, the cache, TMPDIR, or run's
        default output folder (runs/ in the cwd)."""
        places = [self.cwd / "runs", *self.caches()]
        places += [self.cwd / a.split("=", 1)[-1] for a in case.argv if a and "\0" not in a]
        p = Path(path)
        for place in places:
            with contextlib.suppress(OSError, ValueError):
                # below a named path, or a folder made on the way to it (--out new/run makes new/)
                if p == place or place in p.parents or p in place.parents or p.resolve() == place.resolve():
                    return True
        return False

    def caches(self) -> list[Path]:
        """Where any command may write, refusing or not: TORUS_TRAIN_CACHE, TMPDIR, HOME/.cache
        and HOME/.config (matplotlib keeps its font cache and config there when a command imports it for a --plot)."""
        return [self.cache, self.tmp, self.root / "home" / ".cache", self.root / "home" / ".config"]


def verdict(case: Case, r: Result, base_accepted: bool, harness: Harness) -> str:
    """'' when the case is fine, else what is wrong (one line)."""
    if r.crash:
        return "traceback escaped main(): " + r.crash.strip().splitlines()[-1][:200]
    if r.timed_out:
        progress = any(line.strip() for line in (r.out + r.err).splitlines())
        return "" if progress else f"no answer and no progress line within {harness.limit_s:g} s (hang)"
    if "Traceback (most recent call last)" in r.out + r.err:
        return "a traceback was printed"
    if r.left_running:
        return f"left {len(r.left_running)} process(es) running after it ended"
    if r.touched:
        return f"changed or removed an entry it did not make: {r.touched[0]}"
    if r.launched or r.code == 0:
        bad = [p for p in r.written if not harness.allowed(case, p)]
        return f"wrote outside the places it names: {bad[0]}" if bad else ""
    stray = [p for p in r.written if not _under(p, harness.caches())]
    if stray:
        return f"exit {r.code} but wrote {stray[0]}"
    lines = r.err.splitlines()
    last = lines[-1] if lines else ""
    if r.code == 1 and case.command in EXIT_1 and last.startswith("torus-train: error:"):
        return ""
    if r.code != 2:
        return f"exit {r.code} (stderr: {last[:160]!r})"
    if len(lines) != 1 or not last.startswith("torus-train: error:") or not r.err.endswith("\n"):
        return f"exit 2 with {len(lines)} stderr lines, not one 'torus-train: error:' line: {r.err[:200]!r}"
    if case.given and base_accepted and not names_it(last, case.given, case.value):
        return f"the refusal does not name {case.given[0]}: {last[:200]!r}"
    return ""


def names_it(line: str, names: tuple[str, ...], value: str | None) -> bool:
    """True when a refusal names what was given: an option's spelling or spec field (``--grid``,
    ``grid.gpus``), or its bare name with the value (``grid '1x'``, ``launcher srun``), or the value itself
    where a value is named (``'VALUE``, a path ``/VALUE``, ``error: VALUE``, ``: VALUE`` of an argument)."""
    if any(n in line for n in names):
        return True
    if not value:
        return False
    bare = [n.lstrip("-") for n in names if n.startswith("--")]
    for v in {value[:20], value.replace("\n", " ")[:20], repr(value)[1:21]}:
        shapes = [f"{b} '{v}" for b in bare]  # the option's name and its quoted value: algo ' '
        if v.strip():
            shapes += [f"'{v}", f"/{v}", f"error: {v}", f": {v}", *(f"{b} {v}" for b in bare)]
        if any(s in line for s in shapes):
            return True
    return False


def _under(path: str, places) -> bool:
    p = Path(path)
    return any(p == q or q in p.parents for q in places)


def short(text: str, n: int = 60) -> str:
    text = repr(text)
    return text if len(text) <= n else f"{text[:40]}...{text[-12:]} ({len(text)} chars)"


def echo_summary(lines: list[str]) -> None:
    """Print the summary where `pytest -s` shows it (and in the captured output otherwise)."""
    click.echo("\n".join(lines), file=sys.__stdout__)
