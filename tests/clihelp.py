"""The real entry point run in process, and the shape every user error must have (one line, exit 2)."""
from __future__ import annotations

from click.testing import CliRunner

from torus_train.cli import main


def invoke(*args: str) -> tuple[int, str, str]:
    """Run ``torus-train ARGS`` in this process; (exit code, stdout, stderr)."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        code = 0
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        return code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


def assert_one_line_error(code: int, stderr: str, message: str = "") -> None:
    assert code == 2, stderr
    assert stderr.startswith("torus-train: error:") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    assert message in stderr, stderr
