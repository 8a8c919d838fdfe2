"""Click callbacks that check an option's value as it is parsed, so that a refusal names the option: a path the
command reads (an empty name is not the current folder) and a grid (XxY)."""

from __future__ import annotations

from typing import Any

import click

from torus_train.commands.outputs import flag_of
from torus_train.errors import UserError
from torus_train.job.topology import parse_grid


def input_path(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """An option naming a path the command reads (--data): an empty or blank name is refused naming the flag,
    not read as the current folder."""
    if value is not None and not str(value).strip():
        raise UserError(f"{flag_of(param, '--data')}: empty path name; give the path a name")
    return value


def grid_text(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """--grid XxY: a grid that does not parse (or is too large) is refused naming the flag; the text is kept
    for the command, which reads it as before."""
    if value is None:
        return value
    flag = flag_of(param, "--grid")
    if not str(value).strip():  # '' is not "not given"
        raise UserError(f"{flag} {value!r}: empty; give a grid (e.g. {flag} 2x4) or leave {flag} out")
    try:
        parse_grid(value)
    except UserError as e:
        raise UserError(f"{flag}: {e}") from None
    return value
