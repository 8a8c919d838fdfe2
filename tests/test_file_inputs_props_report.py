"""Property-based tests over what `report`, `plan` and `plan calibrate` read and write (issue 33), beside
test_file_inputs_props.py: hostile metrics.jsonl lines, summary.json (a FIFO among them), bench rows, layer
profiles and --json targets, each run through the real entry point in process. Every example ends in exit 0 with a correct result, or exit 2 with one
line; never a traceback, never a hang (a deadline per example, a time limit per test), and no file outside the
one asked for changes. Kept fast: bounded examples, report without its PNG except in one small test.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from clihelp import invoke, tree_digest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_file_inputs_props import JSON_VALUES, mutated

GOOD_INTERVAL = {
    "step": 2,
    "epoch": 0,
    "global_batch": 128,
    "per_rank_batch": 64,
    "lr": 0.1,
    "loss": 1.5,
    "images_per_second": 250.0,
    "data_time": 0.01,
    "step_time": 0.5,
    "wall_seconds": 1.0,
}
GOOD_EVAL = {"event": "eval", "epoch": 0, "step": 4, "top1": 0.3, "top5": 0.9, "val_loss": 1.0, "wall_seconds": 2.2}
GOOD_STAGE = {"event": "stage", "epoch": 0, "stage": 0, "global_batch": 128, "per_rank_batch": 64, "step": 0}
GOOD_SUMMARY = {
    "steps": 4,
    "wall_seconds": 2.0,
    "world_size": 2,
    "grid": "2x1",
    "target_top1": 0.8,
    "ranks": [{"rank": r, "work_p50": 0.1, "compute_p50": 0.09, "data_p50": 0.01} for r in range(2)],
}
GOOD_ROW = {
    "algo": "torus",
    "backend": "gloo",
    "grid": "2x1",
    "size_bytes": 1024,
    "count": 256,
    "dtype": "float32",
    "time_us": 51.0,
    "algbw_gbps": 0.02,
    "busbw_gbps": 0.02,
    "wrong": 0,
}
HOSTILE = st.sampled_from(
    [
        None,
        True,
        0,
        -1,
        10**400,
        -(10**400),
        1e308,
        -1e308,
        float("nan"),
        float("inf"),
        "",
        "1",
        [],
        {},
        [[[[1]]]],
        2**63,
        2**63 - 1,
        1e-320,
    ]
)

COUNT = {"examples": 0, "exit0": 0, "exit2": 0}
SETTINGS = settings(
    max_examples=30,
    deadline=timedelta(seconds=60),
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def no_nan(doc_text: str) -> object:
    """The JSON document, refusing the non-standard NaN/Infinity a writer must not put out."""

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name} in an output")

    return json.loads(doc_text, parse_constant=refuse)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    d = tmp_path_factory.mktemp("report_files")
    yield d
    print(
        f"\nhypothesis over report/plan files: {COUNT['examples']} generated inputs: {COUNT['exit0']} exit 0, "
        f"{COUNT['exit2']} exit 2 (one line each)"
    )


def line_text(draw) -> str:
    """One hostile metrics.jsonl line: a good line with a field changed, any JSON, raw text or deep nesting."""
    how = draw(st.sampled_from(["field", "field", "json", "text", "deep", "event"]))
    if how == "field":
        good = dict(draw(st.sampled_from([GOOD_INTERVAL, GOOD_EVAL, GOOD_STAGE])))
        good[draw(st.sampled_from(sorted(good)))] = draw(st.one_of(HOSTILE, JSON_VALUES))
        return json.dumps(good)
    if how == "json":
        return json.dumps(draw(JSON_VALUES))
    if how == "deep":
        n = draw(st.sampled_from([10, 900, 5000, 200_000]))
        return "[" * n + "]" * n
    if how == "event":
        return json.dumps(GOOD_INTERVAL | {"event": draw(st.one_of(HOSTILE, st.text(max_size=5)))})
    return draw(st.text(max_size=30)).replace("\n", " ")


def other_event(text: str) -> bool:
    """A line report leaves out without counting: JSON of an event it does not plot (resume, ...)."""
    try:
        rec = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(rec, dict) and isinstance(rec.get("event"), str) and rec["event"] not in ("eval", "stage")


def write_run(run: Path, lines: list[str], summary: str | None) -> None:
    run.mkdir(exist_ok=True)
    for name in ("metrics.jsonl", "summary.json"):
        if (run / name).exists() or (run / name).is_symlink():
            (run / name).unlink()
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    if summary is not None:
        (run / "summary.json").write_text(summary)


@pytest.mark.timeout(600)
@SETTINGS
@given(data=st.data())
def test_hostile_metrics_lines_are_skipped_and_counted(place, data):
    bad = [line_text(data.draw) for _ in range(data.draw(st.integers(1, 4)))]
    good = [json.dumps(GOOD_STAGE), json.dumps(GOOD_INTERVAL), json.dumps(GOOD_EVAL)]
    lines = good[:1] + bad[:2] + good[1:] + bad[2:]
    write_run(place / "run", lines, json.dumps(GOOD_SUMMARY))
    before = tree_digest(place / "run")
    code, out = _report(place, "--no-png")
    assert code == 0  # the good lines are there to report
    doc = no_nan((place / "rep.json").read_text())
    run = doc["runs"][0]
    used = len(run["intervals"]) + len(run["evals"]) + len(run["stages"])
    shown = {k: v for k, v in GOOD_INTERVAL.items() if k != "per_rank_batch"}  # the fields report reads
    assert used >= 3 and run["intervals"][0] == shown  # the good lines, as written
    nonblank = [t for t in lines if t.strip()]
    assert used + run["skipped_lines"] + sum(map(other_event, nonblank)) == len(nonblank)
    assert doc["skipped_lines"] == run["skipped_lines"]
    if run["skipped_lines"]:
        assert f"{run['skipped_lines']} line(s) of metrics.jsonl skipped" in out
    assert tree_digest(place / "run") == before


def _report(place: Path, *args: str) -> tuple[int, str]:
    with contextlib.chdir(place):
        if (place / "rep.json").exists():
            (place / "rep.json").unlink()
        code, out, err = invoke("report", "run", "--json", "rep.json", *args)
    COUNT["examples"] += 1
    COUNT["exit0" if code == 0 else "exit2"] += 1
    assert "Traceback" not in err and code in (0, 2), (code, err)
    if code == 2:
        assert err.startswith("torus-train: error:") and err.count("\n") == 1, err
    return code, out


@pytest.mark.timeout(600)
@SETTINGS
@given(data=st.data(), fifo=st.sampled_from([None, None, None, "metrics.jsonl", "summary.json"]))
def test_hostile_summaries_leave_the_curves(place, data, fifo):
    write_run(place / "run", [json.dumps(GOOD_INTERVAL), json.dumps(GOOD_EVAL)], data.draw(mutated(GOOD_SUMMARY)))
    if fifo:
        (place / "run" / fifo).unlink()
        os.mkfifo(place / "run" / fifo)
    before = tree_digest(place / "run")
    code, _out = _report(place, "--no-png")
    if fifo:
        assert code == 2  # refused by name, never opened
    else:
        assert code == 0
        run = no_nan((place / "rep.json").read_text())["runs"][0]
        assert len(run["intervals"]) == 1 and len(run["evals"]) == 1
        if run["summary"] is not None:
            assert set(run["summary"]) <= {"steps", "wall_seconds", "world_size", "grid", "target_top1"}
    assert tree_digest(place / "run") == before


@pytest.mark.timeout(600)
@settings(SETTINGS, max_examples=4)
@given(data=st.data())
def test_hostile_figures_still_draw(place, data):
    """The PNG is drawn from whatever passed the checks (extreme but finite figures)."""
    lines = [json.dumps(GOOD_STAGE), json.dumps(GOOD_INTERVAL)]
    for _ in range(3):
        rec = dict(data.draw(st.sampled_from([GOOD_INTERVAL, GOOD_EVAL])))
        key = data.draw(st.sampled_from(sorted(k for k in rec if k != "event")))
        rec[key] = data.draw(st.sampled_from([0, 1e29, -1e29, 2**62, 1e-300, 1.0]))
        lines.append(json.dumps(rec))
    write_run(place / "run", lines, data.draw(st.one_of(st.none(), mutated(GOOD_SUMMARY))))
    if (place / "run.png").exists():
        (place / "run.png").unlink()
    code, _ = _report(place, "--png", "run.png")
    assert code == 0 and (place / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TARGETS = st.sampled_from(
    [
        "run/metrics.jsonl",
        "run/summary.json",
        "notes.json",
        "plan.json",
        "rep.json",
        "folder",
        "fifo.json",
        "link.json",
        "new.json",
        "missing/x.json",
        "run",
        "",
    ]
)


@pytest.fixture(scope="module")
def outplace(tmp_path_factory):
    d = tmp_path_factory.mktemp("targets")
    write_run(d / "run", [json.dumps(GOOD_INTERVAL), json.dumps(GOOD_EVAL)], json.dumps(GOOD_SUMMARY))
    (d / "notes.json").write_text('{"mine": true}')
    (d / "plan.json").write_text('{"written_by": "torus-train plan", "gpus": 8}')
    (d / "folder").mkdir()
    (d / "folder" / "keep.txt").write_text("keep")
    os.mkfifo(d / "fifo.json")
    os.symlink("notes.json", d / "link.json")
    return d


@pytest.mark.timeout(600)
@settings(SETTINGS, max_examples=25)
@given(target=TARGETS, command=st.sampled_from(["report", "plan"]))
def test_json_targets_are_replaced_only_when_the_command_wrote_them(outplace, target, command):
    args = ["report", "run", "--no-png"] if command == "report" else ["plan", "--gpus", "8", "--grid", "2x4"]
    ours = Path(outplace / target) if target else None
    before = tree_digest(outplace, exclude=ours)
    own_before = _owner(ours)
    with contextlib.chdir(outplace):
        code, _, err = invoke(*args, "--json", target)
    COUNT["examples"] += 1
    COUNT["exit0" if code == 0 else "exit2"] += 1
    assert "Traceback" not in err and code in (0, 2), err
    assert tree_digest(outplace, exclude=ours) == before
    if code == 2:
        assert err.startswith("torus-train: error:") and err.count("\n") == 1, err
        assert _owner(ours) == own_before  # left as it was
    else:  # written: it was absent, or this command's own
        assert own_before in (None, f"torus-train {command}")
        assert _owner(ours) == f"torus-train {command}"


def _owner(path: Path | None) -> str | None:
    """The written_by of a regular JSON file there; None when absent; its bytes' digest otherwise."""
    if path is None or not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        return f"not a file: {os.lstat(path).st_mode}"
    text = path.read_bytes()
    try:
        doc = json.loads(text)
    except ValueError:
        return str(hash(text))
    return doc.get("written_by", str(hash(text))) if isinstance(doc, dict) else str(hash(text))


@pytest.mark.timeout(600)
@SETTINGS
@given(
    rows=st.lists(st.tuples(st.sampled_from(sorted(GOOD_ROW)), st.one_of(HOSTILE, JSON_VALUES)), max_size=4),
    compare=st.booleans(),
)
def test_hostile_bench_rows_for_calibrate(place, rows, compare):
    docs = [dict(GOOD_ROW, size_bytes=s, time_us=50 + s / 1e3) for s in (1024, 65536, 1 << 20, 4 << 20)]
    for i, (key, value) in enumerate(rows):
        docs[i % len(docs)][key] = value
    text = json.dumps(docs)
    (place / "b.json").write_text(text)
    (place / "good.json").write_text(
        json.dumps([dict(GOOD_ROW, size_bytes=s, time_us=50 + s / 1e3) for s in (1024, 1 << 20)])
    )
    extra = ["--compare", "b.json"] if compare else []
    fit = "good.json" if compare else "b.json"
    _plan_json(place, ["plan", "calibrate", fit, *extra])


def _plan_json(place: Path, args: list[str]) -> None:
    """One plan example writing cal.json: exit 2 with one line, or exit 0 with standard JSON (no NaN or
    Infinity) and nothing else in place changed."""
    if (place / "cal.json").exists():
        (place / "cal.json").unlink()
    before = tree_digest(place, skip="run")
    with contextlib.chdir(place):
        code, _out, err = invoke(*args, "--json", "cal.json")
    COUNT["examples"] += 1
    COUNT["exit0" if code == 0 else "exit2"] += 1
    assert "Traceback" not in err and code in (0, 2), err
    if code == 2:
        assert err.startswith("torus-train: error:") and err.count("\n") == 1, err
        assert tree_digest(place, skip="run") == before
    else:
        assert no_nan((place / "cal.json").read_text())["written_by"].startswith("torus-train plan")
        assert tree_digest(place, skip="run", exclude=place / "cal.json") == before


@pytest.fixture(scope="module")
def module_names() -> list[str]:
    from torus_train.plan.timeline import model_layers

    return sorted({layer.name.rsplit(".", 1)[0] for layer in model_layers("resnet50", 224, 1000)})


@pytest.mark.timeout(600)
@settings(SETTINGS, max_examples=15)
@given(
    changes=st.lists(st.tuples(st.integers(0, 200), st.one_of(HOSTILE, JSON_VALUES)), max_size=3),
    base=st.sampled_from([1e-3, 1e6, 1e-320]),
)
def test_hostile_layer_profiles(place, module_names, changes, base):
    doc = dict.fromkeys(module_names, base)
    for i, value in changes:
        doc[module_names[i % len(module_names)]] = value
    (place / "layers.json").write_text(json.dumps(doc))
    _plan_json(place, ["plan", "--gpus", "8", "--grid", "2x4", "--layer-profile", "layers.json"])
