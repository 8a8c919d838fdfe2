"""The floors of the package (docs/extending.md): no import runs upward and no two files import each other in a
circle, pure modules never import torch, an import sits inside a function only for a reason (an optional extra, or
a pure module reaching torch), no module is over 500 lines (a command over 250) and no function over 60, every
file a user names is opened through the door (torus_train/userfiles.py), and every number a user supplies is read
through its door (torus_train/usernumbers.py)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Being split in issue 45 (other branches): modules over 500 lines, or holding a function over 60. The lead empties
# this set after merging those branches (plan/search.py, plan/host.py and train/results.py were; none is left).
BEING_SPLIT: set[str] = set()
# Being cut in issue 45 (other branches): files in an import circle. Emptied after the merge (plan/nccl.py <->
# plan/networks.py was cut; none is left).
CIRCLES_BEING_CUT: set[str] = set()
# Being routed through the door in issue 45 (other branches): a file a user names, still read another way
# ("module:function"). Emptied after the merge.
USER_FILES_BEING_ROUTED: set[str] = set()
# Being routed through the number door (other branches): text a user supplies, still turned into a number another
# way ("module:function"). Emptied after the merge (ranks.worker:rank_threads was; none is left).
NUMBERS_BEING_ROUTED: set[str] = set()


@pytest.fixture(scope="module")
def measure():
    spec = importlib.util.spec_from_file_location(
        "measure_structure", ROOT / "scripts" / "dev" / "measure_structure.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_runs_upward(measure):
    assert measure.measure()["upward_imports"] == []


def test_every_import_inside_a_function_has_its_reason(measure):
    found = measure.measure()["imports_in_functions"]
    assert found["others"] == [] and found["other"] == 0


def test_the_kinds_of_import_are_told_apart(measure):
    assert measure.import_kind("matplotlib.pyplot", "plan.plots") == "optional"
    assert measure.import_kind("torch", "plan.timeline") == "torch"
    assert measure.import_kind("torus_train.train.loop", "ranks.worker") == "torch"
    assert measure.import_kind("torch", "train.build") == "other"  # a torch-side module imports it at the top
    assert measure.import_kind("json", "job.spec") == "other"
    assert measure.import_kind("torus_train.job.spec", "ranks.worker") == "other"


def test_pure_modules_never_import_torch(measure):
    names = sorted(measure.module_name(p) for p in measure.modules())
    pure = [f"torus_train.{n}" if n else "torus_train" for n in names if n not in measure.TORCH_SIDE]
    torch_side = [f"torus_train.{n}" for n in measure.TORCH_SIDE]
    assert set(torch_side) <= {f"torus_train.{n}" for n in names}, "TORCH_SIDE names a module that is gone"
    code = (
        "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
        "    assert 'torch' not in sys.modules, m + ' imports torch'\nprint(len(sys.argv) - 1)"
    )
    out = subprocess.run([sys.executable, "-c", code, *pure], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == len(pure) > 60


def test_no_import_circles_between_files(measure):
    """A module that reaches itself import by import (TYPE_CHECKING imports count: mypy and a reader follow them
    too) fails, naming the circle."""
    circles = measure.measure()["import_circles"]
    new = [c for c in circles if not set(c.split(" -> ")) <= CIRCLES_BEING_CUT]
    assert new == [], new


def test_circles_are_found(measure):
    """The measure finds a circle of three files, through a TYPE_CHECKING import and a `from package import module`."""
    a, b, c = (measure.PKG / "job" / n for n in ("a.py", "b.py", "c.py"))
    trees = {
        a: ast.parse("from torus_train.job import b"),
        b: ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torus_train.job.c import X"),
        c: ast.parse("import torus_train.job.a"),
    }
    files = {"torus_train.job.a": a, "torus_train.job.b": b, "torus_train.job.c": c}
    real = measure.module_files
    measure.module_files = lambda: files
    try:
        found = measure.import_circles(trees)
    finally:
        measure.module_files = real
    assert found == ["torus_train/job/a.py -> torus_train/job/b.py -> torus_train/job/c.py -> torus_train/job/a.py"]


def test_no_module_over_500_lines_and_no_function_over_60(measure):
    big = measure.measure()["oversized"]
    modules = {m: n for m, n in big["modules"].items() if m not in BEING_SPLIT}
    functions = {f: n for f, n in big["functions"].items() if f.split(":")[0] not in BEING_SPLIT}
    assert modules == {}, f"modules over {measure.MAX_MODULE_LINES} lines: {modules}"
    assert functions == {}, f"functions over {measure.MAX_FUNCTION_LINES} lines: {functions}"


def test_every_user_file_is_opened_through_the_door(measure):
    """Every call under torus_train/ that opens a file to read is in userfiles.py, or NOT_USER_FILES names why
    the file it opens is no user's (the kernel's, the package's, one this run wrote); no entry there is stale."""
    door = measure.measure()["door"]
    unnamed = {k: v for k, v in door["unnamed"].items() if k not in USER_FILES_BEING_ROUTED}
    assert unnamed == {}, f"opened outside torus_train/userfiles.py: {unnamed}"
    assert door["stale"] == [], f"NOT_USER_FILES names code that opens no file: {door['stale']}"


def test_every_user_number_goes_through_the_door(measure):
    """Every int()/float() of text under torus_train/ (an environment variable, a field by its key, a regex
    group, a split, a str parameter) and every str.isdigit() is in usernumbers.py, or NOT_USER_NUMBERS names why
    the text is no user's (the kernel's, a tool's own output, a file this run wrote, one checked already)."""
    door = measure.measure()["number_door"]
    unnamed = {k: v for k, v in door["unnamed"].items() if k not in NUMBERS_BEING_ROUTED}
    assert unnamed == {}, f"text turned into a number outside torus_train/usernumbers.py: {unnamed}"
    assert door["stale"] == [], f"NOT_USER_NUMBERS names code that converts no text: {door['stale']}"
    assert not NUMBERS_BEING_ROUTED - set(door["unnamed"]), "NUMBERS_BEING_ROUTED names code routed already"


@pytest.mark.parametrize(
    ("code", "converts"),
    [
        ("def f(environ):\n    return int(environ['RANK'])", True),
        ("def f(env):\n    return int(os.environ.get('X', '1'))", True),
        ("def f():\n    return float(os.getenv('X'))", True),
        ("def f(d):\n    return int(d['step'])", True),
        ("def f(m):\n    return int(m.group(1) or 0)", True),
        ("def f(text: str):\n    lo, _, hi = text.partition('-')\n    return int(lo)", True),
        ("def f(text):\n    return [int(p) for p in text.split(',')]", True),
        ("def f(env):\n    v = env.get('X', '')\n    return v.isdigit()", True),
        ("def f(raw):\n    for n, line in enumerate(raw.decode().splitlines()):\n        int(line)", True),
        ("def f(value: str | None):\n    return float(value)", True),
        ("def f(x):\n    return int(x * 2)", False),
        ("def f(xs):\n    return int(len(xs))", False),
        ("def f(a):\n    return float(np.sqrt(a).mean())", False),
        ("def f(environ):\n    return int(env_int(environ, 'X', 1, 4) or 1)", False),
        ("def f(t):\n    return int(t.item())", False),
    ],
)
def test_the_number_scan_knows_a_conversion_of_text(measure, code, converts):
    fn = ast.parse(code).body[0]
    tainted = measure._text_names(fn.body, measure._text_params(fn))
    found = [c for c in measure._calls(fn.body) if measure.converts_text(c, tainted)]
    assert bool(found) is converts, (code, tainted)


@pytest.mark.parametrize(
    ("code", "reads"),
    [
        ("open(p)", True),
        ("open(p, 'rb')", True),
        ("open(p, mode)", True),
        ("open(p, 'w')", False),
        ("open(p, 'ab')", False),
        ("io.open(p)", True),
        ("Path(p).open()", True),
        ("Path(p).open('rb')", True),
        ("log.open('w')", False),
        ("layout.open(data, log)", False),
        ("Path(p).read_bytes()", True),
        ("p.read_text(encoding='utf-8')", True),
        ("userfiles.read_text(p, '--x')", False),
        ("read_text(p, '--x')", False),
        ("os.open(p, os.O_RDONLY)", True),
        ("os.open(p, os.O_WRONLY | os.O_CREAT)", False),
        ("tarfile.open(p)", True),
        ("tarfile.open(name=p, mode='r:')", True),
        ("tarfile.open(fileobj=f, mode='r:')", False),
        ("np.load(p, mmap_mode='r')", True),
        ("numpy.load(p)", True),
        ("loadmat(p)", True),
        ("loadmat(io.BytesIO(raw))", False),
        ("Image.open(p)", True),
        ("Image.open(io.BytesIO(data))", False),
        ("json.load(f)", False),
    ],
)
def test_the_door_scan_knows_a_read(measure, code, reads):
    assert measure.reads_a_file(ast.parse(code).body[0].value) is reads


def test_a_command_module_has_the_smaller_cap(measure):
    """Commands are thin (parse, build, call, print): their modules are held to MAX_COMMAND_LINES, others to 500."""
    assert measure._module_cap(measure.PKG / "commands" / "bench_input.py") == measure.MAX_COMMAND_LINES == 250
    assert measure._module_cap(measure.PKG / "bench" / "input.py") == measure.MAX_MODULE_LINES
