"""The `torus-train` command line: one click group, commands added from torus_train.commands.

Errors a user can cause print one line (``torus-train: error: ...``) and exit 2; a failed run exits 1.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import click

from torus_train import __version__
from torus_train.errors import PeerLost, RunFailed, UserError
from torus_train.registry import Registry, load

# Every command by name: its module is imported only when the command runs (or its own --help is asked for),
# so `torus-train --help` and `run --dry-run` never pay for the others' imports (torch among them).
COMMANDS: Registry[tuple[str, str]] = Registry("command")
for _name, _ref, _short in (
    (
        "bench",
        "torus_train.commands.bench:bench",
        "Benchmarks: the all-reduce sweep (nccl-tests columns), the input pipeline.",
    ),
    ("check", "torus_train.commands.check:check", "What this machine can run: GPUs, NCCL, graphs, decoders, speed."),
    ("data", "torus_train.commands.data:data", "Data sets: the demo set, packing a folder, checks."),
    ("plan", "torus_train.commands.plan:plan", "Plan a job without running it: grid, cost model, NCCL comparison."),
    ("report", "torus_train.commands.report:report", "Read a finished run's folder: curves, summary, comparison."),
    ("run", "torus_train.commands.run:run", "Train: launch the ranks of a job spec on this machine or a cluster."),
):
    COMMANDS.add(_name, (_ref, _short))


class LazyGroup(click.Group):
    """A click group whose commands are loaded from COMMANDS on first use."""

    def list_commands(self, ctx) -> list[str]:
        return sorted(COMMANDS.names())

    def get_command(self, ctx, name: str):
        if name not in COMMANDS:
            return None
        ref, short = COMMANDS.get(name)
        command = load(ref)
        command.short_help = command.short_help or short
        return command

    def format_commands(self, ctx, formatter) -> None:
        # the listing of `torus-train --help` from the table, without importing any command
        rows = [(name, COMMANDS.get(name)[1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="torus-train")
def cli() -> None:
    """Data-parallel image-classification training on a 2D torus of GPUs, with staged batch-size growth."""


def error(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error and exit (line breaks inside the message are shown as spaces)."""
    message = " ".join(str(message).split("\n"))
    click.echo(f"torus-train: error: {message}", err=True)
    sys.exit(code)


def os_error_text(e: OSError) -> str:
    """One line for an OSError on a user path: 'PATH: what went wrong' (the path cut when very long)."""
    what = e.strerror or str(e) or type(e).__name__
    names = [n for n in (e.filename, getattr(e, "filename2", None)) if n is not None]
    if not names:
        return what
    shown = []
    for n in names:
        n = os.fsdecode(n) if isinstance(n, bytes) else str(n)
        shown.append(n if len(n) <= 80 else f"{n[:40]}...{n[-30:]} ({len(n)} characters)")
    return f"{' -> '.join(shown)}: {what}"


def _where(e: UnicodeDecodeError) -> str:
    return f"byte {e.start}: " if e.start is not None else ""


def nul_argument(argv: list[str]) -> str:
    """The flag whose value holds a NUL character ('' when none does): no path or name can hold one."""
    for i, arg in enumerate(argv):
        if "\0" in arg:
            if arg.startswith("--") and "=" in arg:
                return arg.split("=", 1)[0]
            if i and argv[i - 1].startswith("-") and argv[i - 1] != "--":  # after "--": an argument
                return argv[i - 1]
            return f"argument {i + 1} ({arg.split(chr(0))[0][:20]!r}...)"
    return ""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the group, turning every user error into one line and an exit code."""
    nul = nul_argument(sys.argv[1:] if argv is None else argv)
    if nul:
        error(f"{nul}: the value contains a NUL character")
    try:
        rv = cli.main(args=argv, prog_name="torus-train", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("torus-train: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        hint = ""
        if isinstance(e, click.UsageError) and e.ctx is not None:
            hint = f" (see '{e.ctx.command_path} --help')"
        error(e.format_message().replace("\n", " ") + hint, e.exit_code)
    except UserError as e:
        error(str(e), e.exit_code)
    except (RunFailed, PeerLost) as e:
        error(str(e), e.exit_code)
    except UnicodeError as e:  # a user file or argument that is not UTF-8
        error(f"{_where(e)}not UTF-8 text ({e.reason})" if isinstance(e, UnicodeDecodeError) else str(e), 2)
    except OSError as e:  # a user path: missing folder, a file where a folder belongs, a name too long, ...
        error(os_error_text(e), 2)
    except ValueError as e:
        if "null byte" not in str(e) and "null character" not in str(e):
            raise
        error("a path or value contains a NUL character", 2)
    except (RecursionError, MemoryError) as e:
        error(f"input too large or nested too deeply ({type(e).__name__})", 2)
    except KeyboardInterrupt:
        click.echo("torus-train: interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)
