#!/usr/bin/env python3
"""Measure the structure of torus_train: what issue 23 asks a rerunnable script to show.

  python scripts/dev/measure_structure.py [--json out.json]

Prints, from the source alone (nothing is imported):
- imports that run from a lower package up to a higher one, in the order written in docs/extending.md;
- import circles between files (a module that, import by import, reaches itself; TYPE_CHECKING imports count);
- imports written inside functions (all, and those of torch);
- the largest module and the largest function, in lines, and every module over MAX_MODULE_LINES and function
  over MAX_FUNCTION_LINES;
- for every algorithm, launcher and data-source name: the modules of torus_train that spell it as a string
  literal (the registry's own module is where it belongs);
- the files a contributor touches for each worked example of docs/extending.md ("Files touched:" lines);
- every call that opens a file to read it outside the door (torus_train/userfiles.py), and which of them
  NOT_USER_FILES does not name with its reason;
- every call that turns text into a number outside the number door (torus_train/usernumbers.py): int() or
  float() of text (an environment variable, a field by its string key, a regex group, a split, a ``str``
  parameter, a name assigned from one of these in the same function) and every str.isdigit(), and which of
  them NOT_USER_NUMBERS does not name with its reason. A number cast through a callable passed in, or text
  that reaches a function through an unannotated parameter, is not seen.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "torus_train"

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_COMMAND_LINES = 250
"""The house's sizes: a module a reader takes in at one sitting, a function that fits a screen, and a command
module (torus_train/commands/) thin enough to read as parse, build, call, print."""

# Lowest first. A module may import from its own package and from any package before it in this list.
ORDER = (
    "errors",
    "usernumbers",
    "verdict",
    "registry",
    "cache",
    "userfiles",
    "outdir",
    "outfiles",
    "specs",
    "job",
    "comm",
    "data",
    "train",
    "ranks",
    "plan",
    "bench",
    "check",
    "commands",
    "cli",
    "__main__",
)

# Modules that import torch at their top: a rank's training, the collectives, the torch loaders. Every other
# module is pure: importing it never imports torch (`--help`, `run --dry-run`, `plan` and the launcher stay free
# of it), and a pure module reaches torch only inside the function that needs it (the torch boundary).
TORCH_SIDE = (
    "bench.sweep",
    "check.accept_graphs",
    "check.accept_loop",
    "check.device",
    "check.smallrun",
    "check.syncs",
    "check.throughput",
    "comm.algos",
    "comm.arith",
    "comm.buckets",
    "comm.collectives",
    "comm.consensus",
    "comm.groups",
    "comm.hooks",
    "comm.mpi.transport",
    "comm.pipeline",
    "comm.shm",
    "data.batch_decode",
    "data.decode_probe",
    "data.dali",
    "data.synthetic",
    "data.torchvision_loader",
    "plan.rehearse.cuda",
    "plan.rehearse.rank",
    "plan.rehearse.record",
    "ranks.distributed",
    "train.build",
    "train.decoder",
    "train.follow",
    "train.graphs",
    "train.loop",
    "train.models",
    "train.noise",
    "train.optim",
    "train.report",
    "train.state",
    "train.step",
    "train.timing",
)
# Optional dependencies (extras), version fallbacks and heavy libraries one feature needs (scipy: the ImageNet
# devkit's meta.mat): imported where used, so that a missing one costs only the feature that needs it.
OPTIONAL = (
    "matplotlib",
    "torch.utils.tensorboard",
    "nvidia.dali",
    "mpi4py",
    "tomli",
    "tomllib",
    "PIL",
    "scipy",
    "pynvml",
)

# The names a registry owns; a module outside that registry that spells one as a whole string literal is a
# branch the registry should have answered.
NAMES = {
    "algorithm": ("flat", "torus", "hierarchical", "torus-sync", "ddp"),
    "launcher": ("local", "mpirun", "srun"),
    "data source": ("synthetic", "demo", "folder", "packed"),
}


# The door: the one module that opens the files a user names (it refuses special files by name and caps reads).
DOOR = ("userfiles",)

# Calls outside the door that open a file to read it, by "module:function": each opens a file no user names (the
# reason beside it), so it needs no door. Everything else that opens a file to read goes through the door.
NOT_USER_FILES = {
    "check.accept_loop:deterministic_run": "summary.json of the run this check started in its own folder",
    "check.accept_production:production": "summary.json and metrics.jsonl of the run this check started",
    "check.acceptance:merged": "parts/NAME.json, written by the part this check started",
    "check.acceptance:run_part": "the result file of the part this check started",
    "comm.groups:_host_id": "/proc/sys/kernel/random/boot_id, the kernel's",
    "comm.shm:ShmRow.__init__": "the wake-up FIFO this job's row made in /dev/shm (opened without blocking)",
    "comm.shm:ShmRow._open_existing": "the shared-memory row this job made in /dev/shm",
    "comm.shm:ShmRow.connect": "the peers' wake-up FIFOs this job made in /dev/shm (opened without blocking)",
    "data.index:load_arrays": "an index's arrays, memory-mapped by name (numpy cannot map an open file); "
    "refuse_special refuses a FIFO or a device first",
    "job.launch:usable_cpus": "the cgroup's CPU quota files under /sys/fs/cgroup, the kernel's",
    "job.launchers.local:agent_started_at": "/proc/PID/stat and /proc/stat (a process's start time), the kernel's",
    "job.launchers.rendezvous:ephemeral_range": "/proc/sys/net/ipv4/ip_local_port_range, the kernel's",
    "job.spec:read_spec_table": "the embedded default spec, the package's own (a user's --spec goes through the door)",
    "plan.rehearse:_run_rank": "the log and trace of a rehearsal rank this command started",
    "plan.rehearse.rank:_delivered.wrapped": "the checkpoint the rehearsal chose for its ranks",
    "plan.rehearse.rank:main": "the job file the rehearsal wrote for its ranks",
    "plan.rehearse.rank:rehearse_rank": "the pickled oracle rank 0 of this rehearsal wrote",
    "ranks.diagnosis:failure_kind": "the failure record a rank of this run wrote",
    "ranks.diagnosis:failure_message": "the failure record a rank of this run wrote",
    "ranks.diagnosis:markers": "the failure records the ranks of this run wrote",
    "ranks.diagnosis:process_state": "/proc/PID/stat of a rank this launcher started",
    "ranks.diagnosis:recorded_traceback": "the error file torch's record() wrote for a rank of this run",
    "ranks.diagnosis:tail": "a rank's log, written by the rank into the run's logs/",
    "ranks.heartbeat:read_beats": "a rank's heartbeat file of this run",
    "ranks.rundir:continues_attempt": "logs/torchrun-attempt.json, written by rank 0 of a torchrun job",
    "ranks.rundir:read_summary": "summary.json the ranks of this run wrote",
    "ranks.rundir:resume_epoch": "the checkpoint manifest this run wrote",
    "ranks.worker:read_job": "job.json the launcher wrote for its ranks",
    "train.checkpoint:_fsync_dir": "a folder opened to fsync it, not read",
    "train.checkpoint:read_manifest": "a checkpoint manifest this run wrote",
    "train.checkpoint:read_verified": "a checkpoint this run wrote, checked against its manifest's hash",
    "train.report:truncate_metrics": "metrics.jsonl this run wrote, cut back on resume",
}


def modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def package_of(path: Path) -> str:
    parts = path.relative_to(PKG).parts
    return parts[0] if len(parts) > 1 else parts[0][:-3]


def imported(node) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module] if node.module and node.level == 0 else []
    return [a.name for a in node.names]


def import_sites(tree: ast.AST):
    """Yield (import node, inside_function) for every import in the module."""

    def walk(node, in_fn):
        for child in ast.iter_child_nodes(node):
            inner = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_fn
            yield from walk(child, inner)

    yield from walk(tree, False)


def upward_imports(trees: dict[Path, ast.AST]) -> list[str]:
    rank = {name: i for i, name in enumerate(ORDER)}
    found = []
    for path, tree in trees.items():
        src = package_of(path)
        for node, _ in import_sites(tree):
            for name in imported(node):
                if not name.startswith("torus_train."):
                    continue
                dst = name.split(".")[1]
                if dst != src and rank.get(dst, -1) > rank.get(src, len(ORDER)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {src} -> {dst} ({name})")
    return found


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own, for its __init__.py)."""
    return {"torus_train." + module_name(p) if module_name(p) else "torus_train": p for p in modules()}


def import_edges(trees: dict[Path, ast.AST]) -> dict[Path, set[Path]]:
    """file -> the files of torus_train it imports by name, wherever the import stands (a function, a
    TYPE_CHECKING block): ``from a.b import c`` is a.b.c's file when c is a module, else a.b's."""
    files = module_files()
    edges: dict[Path, set[Path]] = {p: set() for p in trees}
    for path, tree in trees.items():
        for node, _ in import_sites(tree):
            names = imported(node)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module for a in node.names
                ]
            for name in names:
                if name in files and files[name] != path:
                    edges[path].add(files[name])
    return edges


def import_circles(trees: dict[Path, ast.AST]) -> list[str]:
    """Each set of files that import one another in a circle (a strongly connected component of more than
    one file, Tarjan's algorithm), as 'a.py -> b.py -> a.py' along one circle through its first file."""
    edges = import_edges(trees)
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    found: list[list[Path]] = []

    def visit(v: Path) -> None:  # recursion depth is bounded by the package's import depth
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(_circle_text(comp, edges) for comp in found)


def _circle_text(comp: list[Path], edges: dict[Path, set[Path]]) -> str:
    """One circle through the component's first file, by a breadth-first search inside the component."""
    start, members = comp[0], set(comp)
    prev: dict[Path, Path] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                names = [str(p.relative_to(ROOT)) for p in reversed(path)] + [str(start.relative_to(ROOT))]
                extra = f" (with {len(comp) - len(path)} more files)" if len(comp) > len(path) else ""
                return " -> ".join(names) + extra
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return " <-> ".join(str(p.relative_to(ROOT)) for p in comp)


def _is_bytesio(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "BytesIO"


def _read_mode(call: ast.Call, at: int) -> bool:
    """Whether an open() call opens to read: its mode (positional ``at`` or mode=) absent or without w, a, x, +."""
    mode = call.args[at] if len(call.args) > at else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return True
    return not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"))


def reads_a_file(call: ast.Call) -> bool:
    """Whether ``call`` opens a file by name to read it: open() and Path.open() to read, os.open() without
    O_WRONLY or O_CREAT, Path.read_bytes()/read_text(), tarfile.open() of a name, numpy.load(), scipy's loadmat()
    and PIL's Image.open() of anything but an in-memory buffer."""
    f = call.func
    if isinstance(f, ast.Name):
        if f.id == "open":
            return _read_mode(call, 1)
        return f.id == "loadmat" and not (call.args and _is_bytesio(call.args[0]))
    if not isinstance(f, ast.Attribute):
        return False
    owner = ast.unparse(f.value)
    if f.attr in ("read_bytes", "read_text"):
        return owner != "userfiles"
    if f.attr == "load":
        return owner in ("np", "numpy")
    if f.attr != "open":
        return False
    if owner == "os":
        flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
        return "O_WRONLY" not in flags and "O_CREAT" not in flags
    if owner == "tarfile":
        return bool(call.args) or any(k.arg == "name" for k in call.keywords)
    if owner == "Image":
        return not (call.args and _is_bytesio(call.args[0]))
    if owner in ("io", "builtins"):
        return _read_mode(call, 1)
    # Path.open([mode]): no argument, or a mode string first (another class's open takes other arguments)
    first = call.args[0] if call.args else None
    return (first is None or (isinstance(first, ast.Constant) and isinstance(first.value, str))) and _read_mode(call, 0)


def file_reads(trees: dict[Path, ast.AST]) -> dict[str, list[str]]:
    """ "module:function" -> the calls in it that open a file to read (reads_a_file), outside the door."""
    found: dict[str, list[str]] = {}
    for path, tree in trees.items():
        name = module_name(path)
        if name in DOOR:
            continue
        for qual, node in [("<module>", tree), *_functions(tree, "")]:
            for call in _calls(node.body):
                if reads_a_file(call):
                    found.setdefault(f"{name}:{qual}", []).append(f"{call.lineno}: {ast.unparse(call)[:80]}")
    return found


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _calls(body: list[ast.stmt]):
    """The calls in ``body`` that are not inside a nested function or class (those are scopes of their own)."""
    stack: list[ast.AST] = [n for n in body if not isinstance(n, _SCOPES)]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))


def door_bypasses(trees: dict[Path, ast.AST]) -> dict:
    """The reads outside the door that NOT_USER_FILES does not name, and its entries that name no read (stale:
    the function is gone or no longer opens a file; an entry of a module that is gone is dropped silently)."""
    found = file_reads(trees)
    names = {module_name(p) for p in trees}
    return {
        "reads": found,
        "unnamed": {k: v for k, v in sorted(found.items()) if k not in NOT_USER_FILES},
        "stale": sorted(k for k in NOT_USER_FILES if k.split(":")[0] in names and k not in found),
    }


# The number door: the one module that turns the text of an option, a variable or a file's field into a number.
NUMBER_DOOR = ("usernumbers",)
TEXT_METHODS = {
    "decode",
    "get",
    "getenv",
    "group",
    "partition",
    "pop",
    "read",
    "read_text",
    "readline",
    "removeprefix",
    "removesuffix",
    "rpartition",
    "rsplit",
    "rstrip",
    "split",
    "splitlines",
    "lstrip",
    "strip",
}
"""Calls whose result is (or holds) text: a mapping's or the environment's value, a regex group, a split."""
PASS_THROUGH = {"enumerate", "iter", "list", "reversed", "sorted", "str", "tuple", "zip"}
"""Calls whose result holds their arguments' items: text in, text out."""
DIGIT_TESTS = {"isdigit", "isdecimal", "isnumeric"}
"""str.isdigit takes "²", which int() refuses: a test of this kind before int() is the door's job."""

# Conversions of text to a number outside the door, by "module:function": each converts text no user wrote (the
# reason beside it). Everything else goes through torus_train/usernumbers.py.
NOT_USER_NUMBERS = {
    "bench.input:check_device": "--device's N after a regex of 1 to 4 ASCII digits",
    "data.layouts.archives:_val_wnids": "an image name's number after a regex of 8 ASCII digits (VAL_NAME)",
    "data.layouts.archives:ground_truth": "a line after a regex of 1 to 9 ASCII digits (GROUND_TRUTH_ID)",
    "data.layouts.archives:parse_meta_mat": "numbers scipy read from meta.mat (MATLAB numbers, not text)",
    "data.packed:Packed.bytes": "a packed index's field, checked as an int by userfiles.check (INDEX_FIELDS)",
    "data.packed:Packed.shard_files": "a packed index's field, checked as an int by userfiles.check (SHARD_FIELDS)",
    "data.packed:Packed.split": "a packed index's field, checked as an int by userfiles.check (SHARD_FIELDS)",
    "job.launch:usable_cpus": "the cgroup's CPU quota files under /sys/fs/cgroup, the kernel's",
    "job.launchers.local:agent_started_at": "/proc/PID/stat and /proc/stat, the kernel's",
    "job.launchers.mpirun:Mpirun.culprit": "mpirun's own stderr line (rank and signal numbers it printed)",
    "job.launchers.rendezvous:ephemeral_range": "/proc/sys/net/ipv4/ip_local_port_range, the kernel's",
    "job.launchers.srun:Srun.culprit": "srun's own stderr line (the task number it printed)",
    "job.noise:curve": "a metrics.jsonl value already checked to be a finite int or float (float() of a number)",
    "job.spec:_check_names": "whether a name starts with a digit (an identifier rule, no number read)",
    "job.topology:parse_grid": "X and Y after _GRID_RE's 1 to 12 digits a side (int() takes any of them)",
    "plan.grids:choose_grid_and_cap": "a candidate's grid text, written by this module from a Grid",
    "plan.grids:why_chosen": "a candidate's grid text, written by this module from a Grid",
    "plan.rehearse.rank:main": "OMP_NUM_THREADS, set to 1 by the rehearsal that started this rank",
    "plan.rehearse.summary:nbytes": "a trace event a rehearsal rank of this command wrote",
    "ranks.bootstrap:_arch": "CUDA architecture names torch reports (sm_90a)",
    "ranks.diagnosis:markers": "a rank marker's stalled_s, already checked to be an int or float (written by a rank)",
    "ranks.heartbeat:die_with_parent": "TORUS_TRAIN_PARENT_PID, set by the local launcher that started this rank",
    "ranks.heartbeat:read_beats": "a rank's heartbeat file of this run",
    "ranks.rundir:continues_attempt": "logs/torchrun-attempt.json, written by an earlier attempt of this job; a damaged one is a first attempt",
    "ranks.rundir:resume_epoch": "the checkpoint manifest this run wrote",
    "train.checkpoint:_named_step": "a checkpoint file's name after _NAME's or _DATA's 8 to 19 digits; a name save_checkpoint would not write is no checkpoint",
    "train.checkpoint:ref_from_verdict": "a checkpoint manifest this run wrote, verified against its hash",
    "train.optim:DeviceLR.load_state_dict": "the optimizer's own learning rate (a number in torch's param_groups)",
    "train.optim:DeviceLR.state_dict": "the optimizer's own learning rate (a number in torch's param_groups)",
    "train.optim:DeviceLR.use_device_lr": "the optimizer's own learning rate (a number in torch's param_groups)",
    "train.state:hand_to_node": "a checkpoint manifest this run wrote",
}


def _is_text(node: ast.AST, tainted: set[str]) -> bool:
    """Whether the expression ``node`` is text (or a value read from a file or the environment): a name that
    holds text in its function, the environment, a field by its string key (``d["rank"]``), a TEXT_METHODS call
    or any method of text (``s.strip()``), an item of text (``parts[0]``), ``a or b`` of text. Arithmetic and
    other calls make numbers: a conversion of their result is not one of text."""
    if isinstance(node, ast.Name):
        return node.id in tainted or node.id == "environ"
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" or _is_text(node.value, tainted)
    if isinstance(node, ast.Subscript):
        key = node.slice
        return (isinstance(key, ast.Constant) and isinstance(key.value, str)) or _is_text(node.value, tainted)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in TEXT_METHODS or _is_text(node.func.value, tainted)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PASS_THROUGH:
        return any(_is_text(a, tainted) for a in node.args)
    if isinstance(node, ast.BoolOp):
        return any(_is_text(v, tainted) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _is_text(node.body, tainted) or _is_text(node.orelse, tainted)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        inner = tainted | {t for g in node.generators if _is_text(g.iter, tainted) for t in _targets(g.target)}
        return _is_text(node.elt, inner)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_is_text(e, tainted) for e in node.elts)
    return False


def _targets(node: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def _text_params(node: ast.AST) -> set[str]:
    """A function's parameters annotated as text (``str``, ``str | None``)."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    return {p.arg for p in params if p.annotation is not None and ast.unparse(p.annotation) in TEXT_ANNOTATIONS}


TEXT_ANNOTATIONS = {"str", "str | None", "Optional[str]"}


def _text_names(scope: list[ast.stmt], tainted: set[str]) -> set[str]:
    """Names that hold text in a scope: parameters annotated as text (``tainted``), and names assigned (=, :=,
    for, a comprehension) from text, to a fixed point."""
    nodes = []
    stack: list[ast.AST] = [n for n in scope if not isinstance(n, _SCOPES)]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))
    pairs = []
    for n in nodes:
        if isinstance(n, ast.Assign):
            pairs += [(t, n.value) for t in n.targets]
        elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
            pairs.append((n.target, n.value))
        elif isinstance(n, (ast.For, ast.comprehension)):
            pairs.append((n.target, n.iter))
    while True:
        new = {name for target, value in pairs if _is_text(value, tainted) for name in _targets(target)} - tainted
        if not new:
            return tainted
        tainted |= new


def converts_text(call: ast.Call, tainted: set[str]) -> bool:
    """Whether ``call`` turns text into a number: int() or float() of text, or a str.isdigit-like test."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr in DIGIT_TESTS
    return isinstance(f, ast.Name) and f.id in ("int", "float") and bool(call.args) and _is_text(call.args[0], tainted)


def number_conversions(trees: dict[Path, ast.AST]) -> dict[str, list[str]]:
    """ "module:function" -> the calls in it that turn text into a number (converts_text), outside the door."""
    found: dict[str, list[str]] = {}
    for path, tree in trees.items():
        name = module_name(path)
        if name in NUMBER_DOOR:
            continue
        for qual, node in [("<module>", tree), *_functions(tree, "")]:
            tainted = _text_names(node.body, _text_params(node))
            for call in _calls(node.body):
                if converts_text(call, tainted):
                    found.setdefault(f"{name}:{qual}", []).append(f"{call.lineno}: {ast.unparse(call)[:80]}")
    return found


def number_door_bypasses(trees: dict[Path, ast.AST]) -> dict:
    """The conversions outside the number door that NOT_USER_NUMBERS does not name, and its stale entries."""
    found = number_conversions(trees)
    names = {module_name(p) for p in trees}
    return {
        "conversions": found,
        "unnamed": {k: v for k, v in sorted(found.items()) if k not in NOT_USER_NUMBERS},
        "stale": sorted(k for k in NOT_USER_NUMBERS if k.split(":")[0] in names and k not in found),
    }


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PKG).with_suffix("").parts).removesuffix(".__init__")


def import_kind(name: str, inside: str) -> str:
    """Why an import sits inside a function of module ``inside``: "optional" (an extra), "torch" (a pure
    module reaching torch or a torch-side module: the boundary), or "other" (no reason: it belongs at the top)."""
    if any(name == o or name.startswith(o + ".") for o in OPTIONAL):
        return "optional"
    torchy = name.split(".")[0] in ("torch", "torchvision") or (
        name.removeprefix("torus_train.") in TORCH_SIDE and name.startswith("torus_train.")
    )
    return "torch" if torchy and inside not in TORCH_SIDE else "other"


def imports_in_functions(trees: dict[Path, ast.AST]) -> dict:
    kinds = {"optional": 0, "torch": 0, "other": 0}
    others = []
    for path, tree in trees.items():
        inside = module_name(path)
        for node, in_fn in import_sites(tree):
            if in_fn:
                for name in imported(node):
                    kind = import_kind(name, inside)
                    kinds[kind] += 1
                    if kind == "other":
                        others.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return {"all": sum(kinds.values()), **kinds, "others": others}


def largest(trees: dict[Path, ast.AST], sources: dict[Path, str]) -> dict:
    mod = max(sources, key=lambda p: len(sources[p].splitlines()))
    best = (0, "")
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > best[0]:
                    best = (n, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return {
        "module": str(mod.relative_to(ROOT)),
        "module_lines": len(sources[mod].splitlines()),
        "function": best[1],
        "function_lines": best[0],
    }


def _module_cap(path: Path) -> int:
    """The most lines the module at ``path`` may have: a command's cap, or every other module's."""
    return MAX_COMMAND_LINES if (PKG / "commands") in path.parents else MAX_MODULE_LINES


def oversized(trees: dict[Path, ast.AST], sources: dict[Path, str]) -> dict:
    """The modules over MAX_MODULE_LINES and the functions over MAX_FUNCTION_LINES (a method by Class.name),
    as {"modules": {path: lines}, "functions": {path:qualified name: lines}}."""
    mods = {str(p.relative_to(ROOT)): n for p, s in sources.items() if (n := len(s.splitlines())) > _module_cap(p)}
    funcs = {}
    for path, tree in trees.items():
        for qual, node in _functions(tree, ""):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                funcs[f"{path.relative_to(ROOT)}:{qual}"] = n
    return {"modules": mods, "functions": funcs}


def _functions(node: ast.AST, prefix: str):
    """(qualified name, node) of every function and method below ``node``, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qual = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                yield qual, child
            yield from _functions(child, qual + ".")
        else:
            yield from _functions(child, prefix)


def docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def name_spellings(trees: dict[Path, ast.AST]) -> dict:
    out = {}
    for kind, names in NAMES.items():
        for name in names:
            where = set()
            for path, tree in trees.items():
                docs = docstring_nodes(tree)
                for node in ast.walk(tree):
                    if isinstance(node, ast.Constant) and node.value == name and id(node) not in docs:
                        where.add(str(path.relative_to(ROOT)))
            out[f"{kind} {name}"] = sorted(where)
    return out


def files_touched() -> dict:
    doc = ROOT / "docs" / "extending.md"
    if not doc.exists():
        return {}
    found, section = {}, None
    for line in doc.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        m = re.match(r"Files touched:\s*(.*)", line.strip())
        if m and section:
            files = [f.strip(" `.") for f in m.group(1).split(",") if f.strip()]
            found[section] = files
    return found


def measure() -> dict:
    sources = {p: p.read_text() for p in modules()}
    trees = {p: ast.parse(s, str(p)) for p, s in sources.items()}
    spell = name_spellings(trees)
    return {
        "package_order": list(ORDER),
        "upward_imports": upward_imports(trees),
        "import_circles": import_circles(trees),
        "imports_in_functions": imports_in_functions(trees),
        "largest": largest(trees, sources),
        "oversized": oversized(trees, sources),
        "name_spellings": spell,
        "modules_spelling_names": sorted({m for ms in spell.values() for m in ms}),
        "files_touched": files_touched(),
        "door": door_bypasses(trees),
        "number_door": number_door_bypasses(trees),
    }


def _print_door(door: dict, found: str, title: str, allowed: str) -> None:
    """One door's lines of the printout: what passes outside it, what the allow-list does not name, stale entries."""
    print(
        f"{title}: {sum(map(len, door[found].values()))} in {len(door[found])} functions, "
        f"{len(door['unnamed'])} of them not in {allowed}"
    )
    for key, calls in door["unnamed"].items():
        print(f"  {key}: {'; '.join(calls)}")
    for key in door["stale"]:
        print(f"  stale {allowed} entry: {key}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    m = measure()
    print(f"upward imports: {len(m['upward_imports'])}")
    for line in m["upward_imports"]:
        print(f"  {line}")
    print(f"import circles between files: {len(m['import_circles'])}")
    for line in m["import_circles"]:
        print(f"  {line}")
    f = m["imports_in_functions"]
    print(
        f"imports inside functions: {f['all']} (optional extras {f['optional']}, the torch boundary "
        f"{f['torch']}, without a reason {f['other']})"
    )
    for line in f["others"]:
        print(f"  {line}")
    lg = m["largest"]
    print(f"largest module: {lg['module']} ({lg['module_lines']} lines)")
    print(f"largest function: {lg['function']} ({lg['function_lines']} lines)")
    big = m["oversized"]
    print(f"modules over {MAX_MODULE_LINES} lines ({MAX_COMMAND_LINES} for a command): {len(big['modules'])}")
    for name, n in big["modules"].items():
        print(f"  {name} ({n})")
    print(f"functions over {MAX_FUNCTION_LINES} lines: {len(big['functions'])}")
    for name, n in big["functions"].items():
        print(f"  {name} ({n})")
    print(f"modules spelling a registry's name: {len(m['modules_spelling_names'])}")
    for key, where in m["name_spellings"].items():
        print(f"  {key:24} {len(where):2}  {', '.join(where)}")
    _print_door(m["door"], "reads", "reads outside the door (userfiles.py)", "NOT_USER_FILES")
    _print_door(
        m["number_door"],
        "conversions",
        "text turned into numbers outside the door (usernumbers.py)",
        "NOT_USER_NUMBERS",
    )
    for section, files in m["files_touched"].items():
        print(f"files touched, {section}: {len(files)} ({', '.join(files)})")
    if args.json:
        Path(args.json).write_text(json.dumps(m, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
