"""ranks/orchestrate.run_job without ranks: the dry run comes back as a report (the command prints it), a plan
the preflight refuses comes back with the problem after the whole plan, and the launcher's modules (runner,
watchdog, diagnosis, orchestrate) import each other without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torus_train.errors import UserError
from torus_train.job.spec import load_spec, parse_override
from torus_train.ranks.orchestrate import RunOptions, run_job

PKG = Path(__file__).resolve().parents[1] / "torus_train"


def test_a_dry_run_returns_its_report_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x"
    spec = load_spec(None, [("grid.gpus", 4), ("grid.grid", "2x2"), ("job.out", str(out))])
    result = run_job(spec, RunOptions(dry_run=True))
    assert result.problem is None and result.summary is None and result.out == out.resolve()
    text = result.dry_run
    assert text.startswith("# resolved spec\n") and "grid 2x2: 4 ranks" in text
    assert text.splitlines()[-1].startswith("# preflight passed: ")
    assert capsys.readouterr().out == ""  # the command prints the report, the library does not
    assert not out.exists()


def three_ranks(out: Path):
    """A job whose global batch 64 does not split over its 3 ranks."""
    return load_spec(
        None,
        [
            ("grid.gpus", 3),
            ("grid.grid", "3x1"),
            ("job.out", str(out)),
            parse_override("schedule.stages=[{until_epoch=1,global_batch=64}]"),
        ],
    )


def test_a_refused_plan_comes_back_after_the_whole_report(tmp_path):
    spec = three_ranks(tmp_path / "x")
    result = run_job(spec, RunOptions(dry_run=True))
    assert isinstance(result.problem, UserError) and "does not divide by world size 3" in str(result.problem)
    assert "cannot be built for 3 ranks" in result.dry_run and "# preflight passed" not in result.dry_run


def test_a_real_run_is_refused_before_anything_starts_when_the_plan_fails(tmp_path):
    spec = three_ranks(tmp_path / "x")
    with pytest.raises(UserError, match="does not divide by world size 3"):
        run_job(spec, RunOptions())
    assert not (tmp_path / "x" / "logs").exists()


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    deps = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            deps |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
    return deps & known


def test_the_package_imports_form_no_cycle():
    """Top-level imports only (those inside functions run later, once everything is loaded)."""
    paths = {
        ".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PKG.rglob("*.py")
    }
    graph = {name: _top_level_imports(p, set(paths)) - {name} for name, p in paths.items()}
    assert {"torus_train.ranks.runner", "torus_train.ranks.diagnosis"} <= graph[
        "torus_train.ranks.orchestrate"
    ] | graph["torus_train.ranks.runner"]
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            # state 1: dep is on the current path, so this edge closes a cycle
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path[path.index(dep) :], name, dep])
            if dep not in state:
                visit(dep, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
