"""The fuzz test's walker finds what is added, with no case written for it: a command and option added to the
click tree at test time, a variable read in a new module, a new spec field; and the fuzz then fails on a new
option that breaks the rules (a traceback, a refusal that does not name it)."""

from __future__ import annotations

import dataclasses
import textwrap

import click
import pytest
from fuzzrun import Case, Harness, verdict
from fuzzwalk import env_reads, options, spec_fields
from test_fuzz_inputs import SCAN, USER_CHOSEN_READS, argv_with, values_for

from torus_train import cli as cli_module
from torus_train.errors import UserError


@click.command("knob")
@click.option("--new-knob", type=str, default="1", help="A new option nobody wrote a case for.")
@click.option("--safe", type=int, default=1)
def knob(new_knob: str, safe: int) -> None:
    """Parses its option the way the issue's defects did: int() on user text."""
    if not new_knob.isdigit():
        raise UserError("value must be digits")  # names nothing: the fuzz must say so
    int(new_knob)  # "²".isdigit() is True and int("²") raises ValueError: the fuzz must find the traceback


@click.command("misbehave")
@click.option("--how", default="ok")
@click.option("--out", default=None)
def misbehave(how: str, out: str | None) -> None:
    """Each way a command can break the rules besides its message."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    if how == "write-elsewhere":
        Path("elsewhere.txt").write_text("not asked for\n")
    elif how == "write-then-refuse":
        Path(out or "o").mkdir()
        raise UserError("--out: refused after writing")
    elif how == "hang":
        time.sleep(30)
    elif how == "hang-with-progress":
        click.echo("step 1 of 1000", err=True)
        time.sleep(30)
    elif how == "child":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    elif how == "two-lines":
        click.echo("a line first", err=True)
        raise UserError("--how: two-lines")
    elif how == "touch-input":
        Path(os.environ["HOME"], "input.txt").write_text("changed\n")


@pytest.fixture
def tree_with_knob(monkeypatch):
    monkeypatch.setattr(cli_module.LazyGroup, "list_commands", lambda self, ctx: ["knob", "misbehave", "plan"])
    real = cli_module.LazyGroup.get_command
    monkeypatch.setattr(
        cli_module.LazyGroup,
        "get_command",
        lambda self, ctx, n: {"knob": knob, "misbehave": misbehave}.get(n) or real(self, ctx, n),
    )
    return cli_module.cli


def test_walker_finds_a_command_and_option_added_at_test_time(tree_with_knob):
    found = {(o.command, o.flag) for o in options(tree_with_knob)}
    assert (("knob",), "--new-knob") in found and (("knob",), "--safe") in found
    assert (("plan",), "--gpus") in found and (("plan", "calibrate"), "BENCH") in found


def test_the_fuzz_fails_on_the_new_options_defects(tree_with_knob, tmp_path):
    harness = Harness(tmp_path, sorted(SCAN.names))
    opt = next(o for o in options(tree_with_knob) if o.flag == "--new-knob")
    found = {}
    for v in values_for(opt.kind, opt):
        case = Case(("knob",), ["knob", *argv_with([], opt, v)], given=opt.names, label=v)
        found[v] = verdict(case, harness.run(case), True, harness)
    assert found["1"] == ""
    assert found["²"].startswith("traceback escaped main(): ValueError")
    assert found["x"].startswith("the refusal does not name --new-knob")


@pytest.mark.parametrize(
    "how, finding",
    [
        ("ok", ""),
        ("write-elsewhere", "wrote outside the places it names"),
        ("write-then-refuse", "exit 2 but wrote"),
        ("hang", "no answer and no progress line within 2 s (hang)"),
        ("hang-with-progress", ""),  # a long run that says where it is: not a hang
        ("child", "left 1 process(es) running"),
        ("two-lines", "exit 2 with 2 stderr lines"),
        ("touch-input", "changed or removed an entry it did not make"),
    ],
)
def test_the_verdict_sees_each_way_to_break_the_rules(tree_with_knob, tmp_path, how, finding):
    harness = Harness(tmp_path, sorted(SCAN.names), limit_s=2)
    (tmp_path / "home" / "input.txt").write_text("a user's file\n")
    case = Case(("misbehave",), ["misbehave", "--how", how, "--out", "made"], given=("--how", "--out"), label=how)
    found = verdict(case, harness.run(case), True, harness)
    assert found.startswith(finding) if finding else found == ""


def test_scan_finds_a_variable_read_in_a_new_module(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "consts.py").write_text('SHARED = "PKG_SHARED"\n')
    (pkg / "new.py").write_text(
        textwrap.dedent(
            """
            import os
            from dataclasses import dataclass
            from pkg.consts import SHARED
            KNOB = "PKG_KNOB"
            DIRS = ("PKG_DIR_A", "PKG_DIR_B")

            @dataclass
            class Vars:
                rank: str

            VARS = Vars("PKG_RANK")

            def env_number(environ, name, low=0):
                return int(environ.get(name, "0"))

            def read(environ, prefix):
                env_number(environ, "PKG_THROUGH_ACCESSOR")
                env_number(environ, name="PKG_BY_KEYWORD")
                a = os.environ.get("PKG_LITERAL")
                b = os.getenv(KNOB)
                c = [environ[n] for n in DIRS if n in environ]
                d = environ.get(VARS.rank) or environ.get(SHARED)
                e = os.environ.get(f"PKG_{prefix}_MB")
                f = environ.get(prefix.upper())
                return a, b, c, d, e, f
            """
        )
    )
    scan = env_reads(pkg)
    assert {
        "PKG_LITERAL",
        "PKG_KNOB",
        "PKG_DIR_A",
        "PKG_DIR_B",
        "PKG_RANK",
        "PKG_SHARED",
        "PKG_THROUGH_ACCESSOR",
    } <= set(scan.names)
    assert "PKG_BY_KEYWORD" in scan.names
    assert list(scan.prefixes) == ["PKG_"]
    assert [u.split(": ")[1] for u in scan.unresolved] == ["prefix.upper()"]  # a name only known at run time is said


def test_every_read_of_the_package_is_named():
    """A new read whose name the scan cannot work out fails here, pointing at its line (name it by a constant,
    or add its file to USER_CHOSEN_READS with why the user chooses the name)."""
    left = [u for u in SCAN.unresolved if u.split(":")[0] not in USER_CHOSEN_READS]
    assert left == []
    assert {"RANK", "SLURM_GPUS_ON_NODE", "TORUS_TRAIN_SHM_PIECE_MB", "OMPI_COMM_WORLD_RANK"} <= set(SCAN.names)


@dataclasses.dataclass
class NewStage:
    until: int = 0


@dataclasses.dataclass
class NewSection:
    new_field: float = 1.0
    stages: list[NewStage] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class NewSpec:
    section: NewSection = dataclasses.field(default_factory=NewSection)


def test_spec_fields_finds_a_new_field():
    paths = [f.path for f in spec_fields(NewSpec)]
    assert paths == ["section.new_field", "section.stages", "section.stages[0].until"]
