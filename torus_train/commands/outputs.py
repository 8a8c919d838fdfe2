"""The click types of every option that names a path a command writes: the writer rule applied as the option is
parsed, before any work, the same for every command.

    OutputFile(writer, "json" | "plot")   --json, --plot, --png: outfiles.py's rule (free, or this command's own
                                          earlier output, recognised by its content), the plot's format checked
    OutputFolder(kind)                    --out, --index, --keep: a folder of a kind this project replaces
                                          whole (a data index, a packed set: a name outdir.py can put a
                                          temporary beside; its writer applies the kind's rule, which needs the
                                          data folder too, before any work), else a folder that can be made
                                          where it is named (no file in the way)

An empty name is refused by both (`--json ''` is not "no --json"), as is a NUL; each refusal is one line naming
the flag (a UserError: exit 2). Checks that need more than the path (a packed set inside its data folder, two
flags naming one file) stay with the command or its writer, before any work too.
"""

from __future__ import annotations

import os
from typing import Any

import click
from click.shell_completion import CompletionItem

from torus_train.errors import UserError, check_output_folder
from torus_train.outdir import FolderKind, resolve_target
from torus_train.outfiles import Writer, check_json_output, check_plot_output

KINDS = ("json", "plot")


def flag_of(param: click.Parameter | None, default: str) -> str:
    """How messages name the option: its long form (``--json``), ``default`` without one."""
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return max(opts, key=len) if opts else default


def _named(value: Any, flag: str, what: str) -> str:
    """The path as text, refused when it names nothing (empty, only spaces) or holds a NUL."""
    text = os.fsdecode(value) if isinstance(value, bytes) else str(value)
    if "\0" in text:
        raise UserError(f"{flag}: the {what} name contains a NUL character")
    if not text.strip():
        raise UserError(f"{flag}: empty {what} name; give the {what} a name")
    return text


class OutputFile(click.ParamType):
    """A file the command writes: free, or its own earlier output of this kind (outfiles.py), checked as parsed."""

    name = "file"

    def __init__(self, writer: Writer, kind: str = "json"):
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        self.writer, self.kind = writer, kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        flag = flag_of(param, "--json" if self.kind == "json" else "--plot")
        path = _named(value, flag, "file")
        if self.kind == "json":
            check_json_output(path, self.writer, flag)
        else:
            check_plot_output(path, self.writer, flag)
        return path

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(incomplete, type="file")]


class OutputFolder(click.ParamType):
    """A folder the command writes, named: with ``kind`` (a folder written whole by outdir.write_folder, whose
    writer checks the kind's rule with the data folder before any work), a name a temporary can be put beside;
    without, a folder that can be made where it is named. Checked as parsed."""

    name = "folder"

    def __init__(self, kind: FolderKind | None = None):
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        flag = flag_of(param, "--out")
        path = _named(value, flag, "folder")
        if self.kind is not None:
            resolve_target(path, flag)  # the kind's rule (check_target) comes with the data folder's, in its writer
        else:
            check_output_folder(path, flag)
        return path

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(incomplete, type="dir")]
