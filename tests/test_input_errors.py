"""Every input error is one line and exit 2, before anything launches (issue 15, part 1).

Fixed cases for each kind of bad input the issue lists, then a property-based test (hypothesis) that drives the
real entry point, ``torus_train.cli.main``, in process with generated specs, flags and files and asserts: exit 0
or 2, exactly one ``torus-train: error:`` line on stderr for exit 2, no traceback, under 2 s each.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torus_train.job.models import CLASSIFICATION_ARCHS
from torus_train.job.spec import SpecError, load_spec, parse_override
from torus_train.job.topology import MAX_WORLD, GridError, choose_grid, factor_pairs, parse_grid


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------------------------------------
# (1) numeric ranges, arch, --set tokens
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "setting, message",
    [
        ("optimizer.momentum=1", "optimizer.momentum: 1.0 must be in [0, 1)"),
        ("optimizer.momentum=-0.1", "optimizer.momentum: -0.1 must be in [0, 1)"),
        ("optimizer.momentum=nan", "optimizer.momentum: nan must be a finite number"),
        ("optimizer.weight_decay=nan", "optimizer.weight_decay: nan must be a finite number"),
        ("optimizer.weight_decay=inf", "optimizer.weight_decay: inf must be a finite number"),
        ("optimizer.weight_decay=-1", "optimizer.weight_decay: -1.0 must be >= 0"),
        ("optimizer.trust_coefficient=0", "optimizer.trust_coefficient: 0.0 must be > 0"),
        ("optimizer.trust_coefficient=-inf", "optimizer.trust_coefficient: -inf must be a finite number"),
        ("comm.timeout_s=inf", "comm.timeout_s: inf must be a finite number"),
        ("comm.timeout_s=1e300", "comm.timeout_s: 1e+300 must be <= 31,536,000"),
        ("comm.bucket_mb=inf", "comm.bucket_mb: inf must be a finite number"),
        ("comm.bucket_mb=0", "comm.bucket_mb: 0.0 must be > 0"),
        ("eval.target_top1=nan", "eval.target_top1: nan must be a finite number"),
        ("eval.target_top1=1.5", "eval.target_top1: 1.5 must be a fraction in [0, 1]"),
        ("schedule.label_smoothing=1", "schedule.label_smoothing: 1.0 must be in [0, 1)"),
        ("schedule.base_lr=inf", "schedule.base_lr: inf must be a finite number"),
        (
            "schedule.base_lr=" + "9" * 400,
            "schedule.base_lr: 999999999999999999...999999999999999999 (400 characters) is out of range for a number",
        ),
        ("data.image_size=100000", "data.image_size: 100000 must be <= 8,192"),
        (
            "schedule.epochs=" + "9" * 400,
            "schedule.epochs: 999999999999999999...999999999999999999 (400 characters) is out",
        ),
        ("model.arch=fcn_resnet50", "model.arch: 'fcn_resnet50' is not a torchvision classification model"),
        ("model.arch=resnet5", "did you mean resnet50"),
        ("job.name=\"a\\u0000b\"", "job.name: 'a\\x00b' contains a NUL character"),
        ("=1", "--set '=1': no field name before '='"),
        (" = 1", "--set ' = 1': no field name before '='"),
        ("a..b=1", "--set 'a..b=1': 'a..b' is not a dotted field name"),
        ("comm.=1", "--set 'comm.=1': 'comm.' is not a dotted field name"),
        ("noequals", "--set 'noequals': expected FIELD=VALUE"),
        ("x=" + "[" * 2000 + "]" * 2000, "the value is nested too deeply"),
    ],
)
def test_bad_values_are_named(here, setting, message):
    code, _, err = invoke("run", "--dry-run", "--set", setting)
    assert_one_line_error(code, err, message)


def test_nesterov_needs_momentum():
    with pytest.raises(SpecError, match=re.escape("optimizer.nesterov = true needs optimizer.momentum > 0")):
        load_spec(None, [("optimizer.nesterov", True), ("optimizer.momentum", 0.0)])


def test_arch_list_is_torchvisions_classification_models():
    tv = pytest.importorskip("torchvision")
    assert sorted(CLASSIFICATION_ARCHS) == sorted(tv.models.list_models(module=tv.models))


def test_validation_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from torus_train.job.spec import load_spec; "
        "load_spec(None, [('model.arch', 'resnet18')]); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_parse_override_keeps_plain_strings():
    assert parse_override("comm.algo=flat") == ("comm.algo", "flat")
    assert parse_override("launch.binds=[\"/a\"]") == ("launch.binds", ["/a"])


# ------------------------------------------------------------------------------------------------------------
# (2) world size bounded, factored in O(sqrt N)
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--dry-run", "--gpus", "1000000007"], "grid.gpus: 1000000007 must be <= 1,000,000"),
        (["run", "--dry-run", "--grid", "99999x99999"], "grid.grid: grid 99999x99999: 9,999,800,001 ranks is more"),
        (["run", "--dry-run", "--grid", "1" * 400 + "x2"], "a side has more than 12 digits"),
        (["run", "--dry-run", "--gpus", "9" * 400], "grid.gpus: 999999999999999999"),
        (["plan", "--gpus", "1000000007"], "--gpus: 1,000,000,007 ranks is more than"),
        (["plan", "--grid", "99999x99999"], "9,999,800,001 ranks"),
        (["plan", "--gpus", "1000000", "--simulate"], "--simulate runs on at most 65,536 virtual ranks, not 1,000,000"),
        (["bench", "allreduce", "--nprocs", "0"], "--nprocs 0 must be at least 1"),
        (["bench", "allreduce", "--nprocs", "1000000007"], "--nprocs 1000000007 must be at least 1 and at most"),
        (["bench", "allreduce", "--grid", "99999x99999"], "9,999,800,001 ranks"),
        (["plan", "--gpus", "8", "--images-per-second", "inf"], "--images-per-second: inf must be a finite number"),
        (["plan", "--gpus", "8", "--images-per-second", "nan"], "--images-per-second: nan must be a finite number"),
        (["plan", "--gpus", "8", "--overlap", "nan"], "--overlap: nan must be a finite number"),
    ],
)
def test_huge_and_non_finite_flags_answer_at_once(here, args, message):
    t = time.perf_counter()
    code, _, err = invoke(*args)
    assert_one_line_error(code, err, message)
    assert time.perf_counter() - t < 2


def test_factor_pairs_is_fast_and_right():
    t = time.perf_counter()
    assert factor_pairs(999983) == [(1, 999983), (999983, 1)]  # a prime below the bound
    assert factor_pairs(36) == [(1, 36), (2, 18), (3, 12), (4, 9), (6, 6), (9, 4), (12, 3), (18, 2), (36, 1)]
    for n in range(1, 500):
        assert factor_pairs(n) == [(x, n // x) for x in range(1, n + 1) if n % x == 0]
    choose_grid(MAX_WORLD, 8)
    assert time.perf_counter() - t < 1
    with pytest.raises(GridError, match="at most 1,000,000"):
        choose_grid(1000000007)
    with pytest.raises(GridError, match="at most 1,000,000"):
        parse_grid("1001x1000")


# ------------------------------------------------------------------------------------------------------------
# (3) file and OS errors on user paths
# ------------------------------------------------------------------------------------------------------------
def test_file_errors_are_one_line(here):
    (here / "latin1.toml").write_bytes(b"[job]\nname = \"caf\xe9\"\n")
    (here / "hosts.bin").write_bytes(b"\xff\xfe node1 slots=4\n")
    (here / "afile").write_text("x")
    (here / "deep.toml").write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")
    (here / "big.toml").write_text("[schedule]\nepochs = " + "9" * 5000 + "\n")
    long = "a" * 300
    cases = [
        (["run", "--dry-run", "--spec", "latin1.toml"], "--spec 'latin1.toml': not UTF-8 text (byte 17)"),
        (["run", "--dry-run", "--spec", long], "File name too long"),
        (["run", "--dry-run", "--spec", "deep.toml"], "--spec 'deep.toml': values nested too deeply"),
        (["run", "--dry-run", "--spec", "big.toml"], "--spec 'big.toml': not a usable TOML value"),
        (["run", "--dry-run", "--spec", "nothere.toml"], "no such file"),
        (["run", "--dry-run", "--hostfile", "hosts.bin"], "--hostfile hosts.bin: not UTF-8 text (byte 0)"),
        (["run", "--dry-run", "--hostfile", long], "File name too long"),
        (["run", "--dry-run", "--out", "afile"], "--out afile: a file is in the way"),
        (["run", "--dry-run", "--out", "afile/sub"], "--out afile/sub: a file is in the way (afile)"),
        (["run", "--dry-run", "--out", long + "/x"], "a name in the path is longer than 255 bytes"),
        (
            ["plan", "--gpus", "8", "--json", "missing/plan.json"],
            "--json missing/plan.json: its folder missing does not exist",
        ),
        (["plan", "--gpus", "8", "--json", "afile/plan.json"], "its folder afile is a file, not a folder"),
        (["plan", "--gpus", "8", "--json", long + ".json"], "(305 characters): File name too long"),
        (["bench", "allreduce", "--json", "missing/b.json"], "--json missing/b.json: its folder missing does not"),
        (["data", "demo", "--out", "afile/sub"], "--out afile/sub: a file is in the way (afile)"),
    ]
    for args, message in cases:
        code, _, err = invoke(*args)
        assert_one_line_error(code, err, message)
    assert not (here / "runs").exists()


def test_nul_in_a_path_is_one_line(here):
    code, _, err = invoke("run", "--dry-run", "--spec", "a\0b.toml")
    assert_one_line_error(code, err, "NUL character")
    code, _, err = invoke("run", "--dry-run", "--out", "a\0b")
    assert_one_line_error(code, err, "NUL character")
    code, _, err = invoke("plan", "--gpus", "8", "--json", "a\0b")
    assert_one_line_error(code, err, "NUL character")


# ------------------------------------------------------------------------------------------------------------
# (4) property-based: generated specs, flags and files through the real entry point
# ------------------------------------------------------------------------------------------------------------
FIELDS = {
    "job": ["name", "out", "seed", "log_every"],
    "grid": ["gpus", "grid", "gpus_per_node"],
    "launch": ["launcher", "hostfile", "env", "binds"],
    "model": ["arch", "num_classes", "precision", "channels_last"],
    "data": ["source", "image_size", "num_threads", "synthetic_samples", "loader"],
    "schedule": ["epochs", "steps", "base_lr", "warmup_epochs", "label_smoothing", "lr_reference_batch", "stages"],
    "optimizer": ["name", "momentum", "weight_decay", "trust_coefficient", "nesterov"],
    "comm": ["algo", "compression", "bucket_mb", "timeout_s"],
    "checkpoint": ["every_steps", "every_epochs", "keep"],
    "eval": ["every_epochs", "target_top1"],
}
NASTY_TEXT = st.sampled_from(
    [
        "",
        "=",
        "a..b",
        "\n",
        "\x00",
        "é",
        "a" * 300,
        "[",
        "{",
        "\"",
        "'",
        "1e999",
        "nan",
        "inf",
        "-0",
        "9" * 400,
        "resnet18",
        "fcn_resnet50",
        "2x2",
        "0x4",
        "99999x99999",
        "synthetic",
        "demo",
        "flat",
        "torus",
        "fp16",
    ]
)
NUMBERS = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**7),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
SCALAR = st.one_of(NUMBERS, NASTY_TEXT, st.text(max_size=12))


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    import json

    return json.dumps(v)


@st.composite
def spec_files(draw) -> bytes:
    kind = draw(st.sampled_from(["fields", "fields", "fields", "bytes", "deep", "stages"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        n = draw(st.integers(min_value=1, max_value=3000))
        return ("x = " + "[" * n + "]" * n + "\n").encode()
    lines = []
    for section in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        lines.append(f"[{section}]")
        for key in draw(st.lists(st.sampled_from(FIELDS[section] + ["bogus"]), max_size=3, unique=True)):
            value = draw(st.one_of(SCALAR, st.lists(SCALAR, max_size=3)))
            lines.append(f"{key} = {_toml(value)}")
    if kind == "stages":
        until = draw(st.integers(min_value=-2, max_value=20))
        batch = draw(NUMBERS)
        lines += ["[[schedule.stages]]", f"until_epoch = {until}", f"per_rank_batch = {_toml(batch)}"]
    return "\n".join(lines).encode("utf-8", "surrogatepass")


@st.composite
def run_args(draw, folder: Path) -> list[str]:
    args = ["run", "--dry-run"]
    if draw(st.booleans()):
        f = folder / f"spec{draw(st.integers(0, 3))}.toml"
        f.write_bytes(draw(spec_files()))
        args += ["--spec", str(f)]
    flag_values = {
        "--gpus": st.one_of(
            st.integers(min_value=-5, max_value=64), st.integers(min_value=-(10**30), max_value=10**30)
        ).map(str),
        "--grid": st.one_of(st.builds(lambda x, y: f"{x}x{y}", st.integers(0, 9), st.integers(0, 9)), NASTY_TEXT),
        "--gpus-per-node": st.integers(min_value=-2, max_value=10**8).map(str),
        "--model": st.one_of(st.sampled_from(["resnet18", "vit_b_16", "deeplabv3_resnet50"]), NASTY_TEXT),
        "--image-size": st.integers(min_value=-1, max_value=10**5).map(str),
        "--steps": st.integers(min_value=-1, max_value=10**20).map(str),
        "--epochs": st.integers(min_value=-1, max_value=10**20).map(str),
        "--data": st.one_of(st.just("synthetic"), NASTY_TEXT),
        "--out": st.one_of(st.just("out"), st.just("afile"), st.just("afile/x"), NASTY_TEXT),
        "--hostfile": st.one_of(st.just("hosts.bin"), st.just("hosts.ok"), NASTY_TEXT),
        "--set": st.one_of(
            st.builds(
                lambda s, k, v: f"{s}.{k}={_toml(v)}",
                st.sampled_from(sorted(FIELDS)),
                st.sampled_from(sorted({k for ks in FIELDS.values() for k in ks})),
                SCALAR,
            ),
            NASTY_TEXT,
            st.text(max_size=20),
        ),
    }
    for flag in draw(st.lists(st.sampled_from(sorted(flag_values)), max_size=4)):
        args += [flag, draw(flag_values[flag])]
    return args


PLAN_ARGS = st.lists(
    st.one_of(
        # a real plan for up to 4,096 GPUs (larger ones take seconds by design), or a count past the bound
        st.tuples(
            st.just("--gpus"),
            st.one_of(st.integers(-3, 4096), st.integers(MAX_WORLD + 1, 10**20), st.integers(-(10**20), 0)).map(str),
        ),
        st.tuples(
            st.just("--grid"),
            st.one_of(st.builds(lambda x, y: f"{x}x{y}", st.integers(0, 64), st.integers(0, 64)), NASTY_TEXT),
        ),
        st.tuples(st.just("--images-per-second"), st.floats().map(repr)),
        st.tuples(st.just("--overlap"), st.floats().map(repr)),
        st.tuples(st.just("--per-gpu-batch"), st.integers(-3, 10**6).map(str)),
        st.tuples(st.just("--json"), st.sampled_from(["p.json", "missing/p.json", "afile/p.json", ".", "a\0b"])),
        st.tuples(st.just("--model"), st.one_of(st.just("resnet50"), NASTY_TEXT)),
    ),
    max_size=4,
).map(lambda pairs: ["plan", *[x for p in pairs for x in p]])

# bench and data demo that would start work when valid: always with one bad flag, so they never launch
BENCH_ARGS = st.tuples(
    st.sampled_from(
        [
            ["--nprocs", "0"],
            ["--nprocs", "-3"],
            ["--nprocs", "99999999999"],
            ["--json", "missing/b.json"],
            ["--json", "afile/b.json"],
            ["--grid", "99999x99999"],
            ["--grid", "x"],
            ["--timeout", "nan"],
            ["-f", "1"],
            ["-b", "1Z"],
        ]
    ),
    st.lists(st.sampled_from([["--nprocs", "4"], ["--grid", "2x2"], ["--algo", "flat"]]), max_size=2),
).map(lambda t: ["bench", "allreduce", *[x for a in t[1] for x in a], *t[0]])
DATA_ARGS = st.sampled_from(
    [
        ["data", "demo", "--out", "afile"],
        ["data", "demo", "--out", "afile/x"],
        ["data", "demo", "--out", "d", "--size", "100000"],
        ["data", "demo", "--out", "d", "--train-per-class", "-1"],
        ["data", "check", "--data", "nowhere"],
        ["data", "index", "--data", "afile"],
    ]
)

COUNT = {"examples": 0, "exit0": 0, "exit2": 0, "slowest": 0.0}


@pytest.fixture(scope="module")
def playground(tmp_path_factory):
    d = tmp_path_factory.mktemp("hyp")
    (d / "afile").write_text("x")
    (d / "hosts.bin").write_bytes(b"\xff\xfe\n")
    (d / "hosts.ok").write_text("localhost slots=64\n")
    with contextlib.chdir(d):
        invoke("plan", "--gpus", "8")  # imports once, outside the timed examples
        invoke("run", "--dry-run")
        yield d
    print(
        f"\nhypothesis: {COUNT['examples']} generated inputs through torus_train.cli.main: {COUNT['exit0']} exit 0, "
        f"{COUNT['exit2']} exit 2 (one line each), slowest {COUNT['slowest']:.2f} s"
    )


# derandomize: the same 200 inputs on every run, so a CI run cannot turn red on a new random draw
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(data=st.data())
def test_generated_inputs_exit_0_or_2_with_one_line(playground, data):
    args = data.draw(
        st.one_of(run_args(playground), run_args(playground), run_args(playground), PLAN_ARGS, BENCH_ARGS, DATA_ARGS),
        label="argv",
    )
    t = time.perf_counter()
    code, _, err = invoke(*args)
    seconds = time.perf_counter() - t
    COUNT["examples"] += 1
    COUNT["slowest"] = max(COUNT["slowest"], seconds)
    assert "Traceback" not in err, (args, err)
    assert code in (0, 2), (args, code, err)
    if code == 2:
        COUNT["exit2"] += 1
        assert err.startswith("torus-train: error:") and err.count("\n") == 1, (args, err)
    else:
        COUNT["exit0"] += 1
    assert seconds < 2, (args, seconds)
    assert not any(p.name == "logs" for p in playground.rglob("logs")), args  # nothing launched
