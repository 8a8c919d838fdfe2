"""The command table: `torus-train --help` lists every command from COMMANDS without importing any of them,
and every entry loads a click command whose --help works."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from torus_train.cli import COMMANDS, cli
from torus_train.registry import load


def test_group_help_imports_no_command_and_no_torch():
    code = (
        "import sys; from click.testing import CliRunner; from torus_train.cli import cli; "
        "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m.startswith(('torus_train.commands.', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", COMMANDS.names())
def test_every_entry_is_a_command_with_help(name):
    ref, short = COMMANDS.get(name)
    assert isinstance(load(ref), click.Command) and short
    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0 and f"Usage: cli {name}" in r.output, r.output


def test_unknown_command_is_a_usage_error():
    r = CliRunner().invoke(cli, ["trian"])
    assert r.exit_code == 2 and "No such command 'trian'" in r.output
