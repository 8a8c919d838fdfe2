"""What the fuzz test (tests/test_fuzz_inputs.py) feeds the package, found from the code, never from a list kept
by hand: the click command tree (every command, group and option), the environment variables the package reads
(an AST scan of torus_train/), and the job spec's fields (the dataclasses of torus_train/job/). A new option,
variable or field is fuzzed the day it is added; tests/test_fuzz_walker.py proves the walker finds one.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click

# ------------------------------------------------------------------------------------------------------------
# the command tree
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One parameter of one command: where it sits in the tree and how it is spelled."""

    command: tuple[str, ...]
    param: click.Parameter

    @property
    def flag(self) -> str:
        """The long spelling (``--json``), an argument's metavar-less name (``BENCH``)."""
        if isinstance(self.param, click.Argument):
            return self.param.name.upper()
        longs = [o for o in self.param.opts if o.startswith("--")]
        return max(longs, key=len) if longs else self.param.opts[0]

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling a message may use for it (an argument: its metavar's first word, and "argument")."""
        if isinstance(self.param, click.Argument):
            return (self.flag, (self.param.metavar or self.flag).split()[0].split(".")[0], "argument ")
        return (*self.param.opts, *self.param.secondary_opts, self.flag)

    @property
    def kind(self) -> str:
        """flag, choice, int, float, path or text: what values are drawn for it."""
        p, t = self.param, self.param.type
        if isinstance(p, click.Option) and p.is_flag:
            return "flag"
        if isinstance(t, click.Choice):
            return "choice"
        if isinstance(t, (click.types.IntParamType, click.IntRange)):
            return "int"
        if isinstance(t, (click.types.FloatParamType, click.FloatRange)):
            return "float"
        if isinstance(t, click.types.StringParamType) or isinstance(p, click.Argument):
            return "text"
        return "path"  # click.Path and the project's own path types (OutputFile, OutputFolder)


def commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command below ``group`` with its path; a group that runs on its own (``plan``) is one too."""
    ctx = click.Context(group)
    if path and isinstance(group, click.Group) and group.invoke_without_command:
        yield path, group
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        if isinstance(sub, click.Group):
            yield from commands(sub, (*path, name))
        else:
            yield (*path, name), sub


def options(group: click.Group) -> list[Option]:
    """Every option and argument of every command (hidden ones too: a user can type them), --help left out."""
    found = []
    for path, cmd in commands(group):
        for p in cmd.params:
            if isinstance(p, click.Option) and p.name in ("help", "version"):
                continue
            found.append(Option(path, p))
    return found


# ------------------------------------------------------------------------------------------------------------
# the environment variables
# ------------------------------------------------------------------------------------------------------------


@dataclass
class EnvScan:
    """The variables read, each with where; the reads whose name could not be worked out (file:line: code)."""

    names: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    prefixes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    unresolved: list[str] = dataclasses.field(default_factory=list)


def _is_environ(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return "environ" in text or text == "env"


def _key_of_read(node: ast.AST) -> ast.AST | None:
    """The key expression of an environment read (``environ[K]``, ``environ.get(K)``, ``os.getenv(K)``,
    ``K in environ``), else None. Writes (``setdefault``, stores) are not reads of the user's environment."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and not isinstance(node.value, ast.Call):
        if not _is_environ(node.value):
            return None
        return node.slice
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and _is_environ(f.value):
            return node.args[0]
        if ast.unparse(f) in ("os.getenv", "getenv"):
            return node.args[0]
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.ops[0], (ast.In, ast.NotIn))
        and _is_environ(node.comparators[0])
    ):
        return node.left
    return None


def _strings(node: ast.AST | None) -> list[str] | None:
    """The strings a literal holds: a str, or a tuple/list/set of them, or a dict's str keys."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_strings(e) for e in node.elts]
        return None if any(i is None for i in items) else [s for i in items for s in i or ()]
    if isinstance(node, ast.Dict):
        keys = [_strings(k) for k in node.keys]
        return None if any(k is None for k in keys) else [s for k in keys for s in k or ()]
    return None


class _Constants:
    """Module-level string constants of the whole package (a name imported from another module resolves to its
    definition there), and each dataclass field's string values from the calls that build the class."""

    def __init__(self, trees: dict[Path, ast.Module]):
        self.by_module: dict[Path, dict[str, list[str]]] = {}
        self.anywhere: dict[str, list[str]] = {}
        self.fields: dict[str, list[str]] = {}
        classes: dict[str, list[str]] = {}
        for path, tree in trees.items():
            mine = self.by_module.setdefault(path, {})
            for node in tree.body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    values = _strings(node.value)
                    if values is not None:
                        mine[node.targets[0].id] = values
                        self.anywhere.setdefault(node.targets[0].id, values)
                if isinstance(node, ast.ClassDef):
                    classes[node.name] = [
                        s.target.id
                        for s in node.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    ]
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
                    self._field_values(classes[node.func.id], node)

    def _field_values(self, fields: list[str], call: ast.Call) -> None:
        pairs = list(zip(fields, call.args, strict=False)) + [(k.arg, k.value) for k in call.keywords if k.arg]
        for name, value in pairs:
            values = _strings(value)
            if values:
                self.fields.setdefault(name, []).extend(values)


def _loop_bindings(func: ast.AST, resolve) -> dict[str, list[str]]:
    """Names bound by a for loop or comprehension over a literal or a constant (``for name in ENV_DIRS``,
    ``for name, value in TABLE.items()``), or assigned an expression of string literals: the strings each may
    hold."""
    bound: dict[str, list[str]] = {}
    for node in ast.walk(func):
        targets = []
        if isinstance(node, (ast.For, ast.comprehension)):
            targets = [(node.target, node.iter)]
        for target, it in targets:
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in ("items", "keys"):
                it = it.func.value
                if isinstance(target, ast.Tuple):
                    target = target.elts[0]
            values = resolve(it)
            if values and isinstance(target, ast.Name):
                bound[target.id] = values
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            # name = next((v for v in ("A", "B") if ...), ""): the names the expression can give
            held = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if [h for h in held if h]:
                bound.setdefault(node.targets[0].id, [h for h in held if h])
    return bound


def env_reads(root: Path) -> EnvScan:
    """Every environment variable the Python files under ``root`` read, by name; an f-string name with a fixed
    start and a part worked out at run time is kept as a prefix. A function that reads the variable its caller
    names (``env_int(environ, "SLURM_GPUS_ON_NODE")``) is an accessor: its callers' arguments are the names."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}
    consts = _Constants(trees)
    accessors: dict[str, tuple[int, str]] = {}
    while True:
        scan, found = EnvScan(), dict(accessors)
        for path, tree in trees.items():
            for func, reads in _reads_by_scope(tree, accessors):
                scope = _Scope(consts, consts.by_module[path], func)
                for node, key in reads:
                    where = f"{path.relative_to(root.parent)}:{node.lineno}"
                    if not scope.record(key, where, scan) and _accessor(func, key):
                        found.update(_accessor(func, key))
                        scan.unresolved.pop()  # named at its call sites instead
        if found == accessors:
            return scan
        accessors = found


def _accessor(func: ast.AST, key: ast.AST) -> dict[str, tuple[int, str]]:
    """{function name: (position, name) of the parameter it reads} when ``key`` is one of its parameters."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or not isinstance(key, ast.Name):
        return {}
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    return {func.name: (params.index(key.id), key.id)} if key.id in params else {}


def _reads_by_scope(
    tree: ast.Module, accessors: dict[str, tuple[int, str]]
) -> Iterator[tuple[ast.AST, list[tuple[ast.AST, ast.AST]]]]:
    """(scope, its environment reads): the module and each function, a read counted in its innermost one."""
    stack: list[tuple[ast.AST, list]] = [(tree, [])]
    found = []

    def visit(node: ast.AST) -> None:
        own = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if own:
            stack.append((node, []))
        key = _key_of_read(node) or _accessor_key(node, accessors)
        if key is not None:
            stack[-1][1].append((node, key))
        for child in ast.iter_child_nodes(node):
            visit(child)
        if own:
            found.append(stack.pop())

    for child in ast.iter_child_nodes(tree):
        visit(child)
    found.append(stack.pop())
    return iter(found)


def _accessor_key(node: ast.AST, accessors: dict[str, tuple[int, str]]) -> ast.AST | None:
    """The name argument of a call to an accessor (by its position or keyword), else None."""
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if name not in accessors:
        return None
    index, param = accessors[name]
    if index < len(node.args):
        return node.args[index]
    return next((k.value for k in node.keywords if k.arg == param), None)


class _Scope:
    def __init__(self, consts: _Constants, module: dict[str, list[str]], func: ast.AST):
        self.consts, self.module = consts, module
        self.loops = _loop_bindings(func, self.resolve) if not isinstance(func, ast.Module) else {}

    def resolve(self, node: ast.AST) -> list[str] | None:
        literal = _strings(node)
        if literal is not None:
            return literal
        if isinstance(node, ast.Name):
            for table in (getattr(self, "loops", {}), self.module, self.consts.anywhere):
                if node.id in table:
                    return table[node.id]
        if isinstance(node, ast.Attribute):
            return self.consts.fields.get(node.attr) or self.consts.anywhere.get(node.attr)
        if isinstance(node, ast.JoinedStr):
            parts = [[str(v.value)] if isinstance(v, ast.Constant) else self.resolve(v.value) for v in node.values]
            if all(parts):
                return ["".join(p) for p in itertools.product(*typing.cast(list, parts))]
        return None

    def record(self, key: ast.AST, where: str, scan: EnvScan) -> bool:
        """Add the read to ``scan``; False when its name could not be worked out."""
        names = self.resolve(key)
        if names:
            for n in names:
                scan.names.setdefault(n, []).append(where)
            return True
        first = key.values[0] if isinstance(key, ast.JoinedStr) and key.values else None
        if isinstance(first, ast.Constant) and str(first.value):
            scan.prefixes.setdefault(str(first.value), []).append(where)
            return True
        scan.unresolved.append(f"{where}: {ast.unparse(key)}")
        return False


# ------------------------------------------------------------------------------------------------------------
# the spec fields
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A leaf field of the job spec: its dotted path, its type, and the list it sits in (``schedule.stages``:
    the path of an element's field is ``schedule.stages[0].NAME``)."""

    path: str
    type: typing.Any
    section: str
    name: str
    in_list: str = ""


def spec_fields(cls: type, prefix: str = "") -> list[Field]:
    """Every leaf field below the dataclass ``cls`` (nested sections and lists of dataclasses walked)."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(t):
            found += spec_fields(typing.cast(type, t), f"{path}.")
            continue
        item = typing.get_args(t)[0] if typing.get_origin(t) is list and typing.get_args(t) else None
        found.append(Field(path, t, prefix.rstrip("."), f.name))
        if item is not None and dataclasses.is_dataclass(item):
            for sub in spec_fields(typing.cast(type, item)):
                found.append(Field(f"{path}[0].{sub.path}", sub.type, prefix.rstrip("."), sub.name, in_list=path))
    return found
