"""torus_train/outfiles.py: a command's --json and plots replace only that command's own earlier output."""

from __future__ import annotations

import json
import os

import pytest

from torus_train.errors import UserError
from torus_train.outfiles import (
    Writer,
    check_distinct,
    check_json_output,
    check_plot_output,
    plot_format,
    save_figure,
    write_json,
)

A, B = Writer("plan"), Writer("report")
ROWS = Writer("bench allreduce", recognise=lambda d: isinstance(d, list) and d == [1])


def refused(fn, *args, match: str = "") -> str:
    with pytest.raises(UserError) as e:
        fn(*args)
    text = str(e.value)
    assert "\n" not in text and match in text, text
    return text


def test_json_is_written_with_the_marker_and_replaced_only_by_its_writer(tmp_path):
    out = tmp_path / "p.json"
    check_json_output(out, A)
    write_json(out, {"x": 1}, A)
    assert json.loads(out.read_text()) == {"written_by": "torus-train plan", "x": 1}
    check_json_output(out, A)  # its own earlier output: may be replaced
    write_json(out, {"x": 2}, A)
    assert json.loads(out.read_text())["x"] == 2
    before = out.read_bytes()
    refused(check_json_output, out, B, match="`torus-train report` did not write")
    with pytest.raises(UserError):
        write_json(out, {"y": 1}, B)
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary left behind


@pytest.mark.parametrize(
    "content,why",
    [
        ('{"step": 1}\n{"step": 2}\n', "it is not JSON"),  # a run's metrics.jsonl
        ('{"steps": 4, "world_size": 2}', "its JSON has no written_by"),  # a run's summary.json
        ('{"written_by": "torus-train report"}', "its JSON has no written_by"),  # another command's output
        ("[1, 2]", "its JSON has no written_by"),
        ("", "it is not JSON"),
        ("\xff\xfe", "it is not JSON"),
    ],
)
def test_foreign_files_are_refused_and_untouched(tmp_path, content, why):
    out = tmp_path / "f.json"
    out.write_text(content, encoding="latin-1")
    before = out.read_bytes()
    refused(check_json_output, out, A, match=why)
    assert out.read_bytes() == before


def test_a_list_output_is_recognised_by_its_shape(tmp_path):
    out = tmp_path / "rows.json"
    write_json(out, [1], ROWS)
    assert json.loads(out.read_text()) == [1]  # a list stays a list (no marker field)
    check_json_output(out, ROWS)
    out.write_text("[2]")
    refused(check_json_output, out, ROWS, match="not of that command's form")


def test_links_fifos_and_folders_are_refused_by_name_without_opening(tmp_path):
    (tmp_path / "mine.json").write_text(json.dumps({"written_by": "torus-train plan"}))
    os.symlink("mine.json", tmp_path / "link.json")
    refused(check_json_output, tmp_path / "link.json", A, match="a symbolic link")
    os.mkfifo(tmp_path / "fifo.json")
    refused(check_json_output, tmp_path / "fifo.json", A, match="a FIFO")  # returns: never opened
    refused(check_json_output, tmp_path, A, match="is a folder")
    refused(check_json_output, tmp_path / "no" / "x.json", A, match="does not exist")


def test_plot_suffix_must_be_a_format_matplotlib_writes(tmp_path):
    assert plot_format("a.PNG", "--png") == "png" and plot_format("a.svg", "--plot") == "svg"
    refused(plot_format, "a.xyz", "--png", match="'.xyz' is not a format matplotlib writes")
    refused(plot_format, "noext", "--png", match="the name has no suffix")
    refused(check_plot_output, tmp_path / "p.json", A, "--plot", match="'.json' is not a format")


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2])
    return plt, fig


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg", "eps"])
def test_plots_carry_the_marker_and_are_replaced_only_by_their_writer(tmp_path, fmt):
    plt, fig = _figure()
    out = tmp_path / f"p.{fmt}"
    try:
        save_figure(fig, out, A, "--plot")
        check_plot_output(out, A, "--plot")  # its own: may be replaced
        save_figure(fig, out, A, "--plot")
    finally:
        plt.close(fig)
    before = out.read_bytes()
    refused(check_plot_output, out, B, "--png", match="its metadata does not name 'torus-train report'")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"p.{fmt}"]


def test_a_plot_of_a_format_without_metadata_is_never_replaced(tmp_path):
    plt, fig = _figure()
    out = tmp_path / "p.jpg"
    try:
        save_figure(fig, out, A, "--plot")
    finally:
        plt.close(fig)
    assert out.stat().st_size > 0
    refused(check_plot_output, out, A, "--plot", match=".jpg files carry no metadata")


def test_a_png_the_user_made_is_refused(tmp_path):
    plt, fig = _figure()
    try:
        fig.savefig(tmp_path / "mine.png")  # matplotlib's own metadata, not ours
    finally:
        plt.close(fig)
    refused(check_plot_output, tmp_path / "mine.png", A, "--plot", match="did not write")


class HalfWritten:
    """A figure whose save writes part of the file, then fails (a full disk, a kill)."""

    def savefig(self, path, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    plt, fig = _figure()
    out = tmp_path / "p.png"
    try:
        save_figure(fig, out, A, "--plot")
    finally:
        plt.close(fig)
    before = out.read_bytes()
    with pytest.raises(OSError):
        save_figure(HalfWritten(), out, A, "--plot")
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["p.png"]


def test_two_flags_naming_one_file_are_refused():
    check_distinct({"--json": "a.json", "--png": "a.png", "--plot": None})
    refused(check_distinct, {"--json": "x.png", "--png": "./x.png"}, match="--json and --png name the same file")


def _commands():
    """(the command as typed, the click command) of every command and subcommand of the CLI."""
    from torus_train.cli import COMMANDS
    from torus_train.registry import load

    def walk(cmd, path):
        yield path, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, f"{path} {name}")

    for name in COMMANDS.names():
        yield from walk(load(COMMANDS.get(name)[0]), name)


OUTPUT_OPTIONS = {"--json", "--plot", "--png", "--out", "--keep"}
"""The options that name a path a command writes (and `data index --index`, the index it writes)."""


def _output_options() -> list[tuple[str, str, object]]:
    import click

    found = []
    for path, cmd in _commands():
        for p in cmd.params:
            outputs = set(p.opts) & (OUTPUT_OPTIONS | ({"--index"} if path == "data index" else set()))
            if isinstance(p, click.Option) and outputs:
                found.append((path, sorted(outputs)[0], p.type))
    return found


def test_every_output_path_option_is_one_of_the_writer_types():
    """Every option naming a path a command writes is commands/outputs.py's OutputFile or OutputFolder: the
    writer rule is applied as it is parsed, the same for every command."""
    from torus_train.commands.outputs import OutputFile, OutputFolder

    found = _output_options()
    assert len(found) >= 17, found
    wrong = [(path, opt, type(t).__name__) for path, opt, t in found if not isinstance(t, (OutputFile, OutputFolder))]
    assert wrong == []


@pytest.mark.parametrize(("command", "option"), [(path, opt) for path, opt, _ in _output_options()])
def test_an_empty_output_name_is_refused_in_one_line(tmp_path, monkeypatch, command, option):
    """`--json ''` is not `--json` left out (check took it so): every output option refuses it, exit 2, and
    nothing is written."""
    from clihelp import assert_one_line_error, invoke, tree_digest

    monkeypatch.chdir(tmp_path)
    before = tree_digest(tmp_path)
    code, _, err = invoke(*command.split(), option, "")
    assert_one_line_error(code, err, f"{option}: empty ")
    assert tree_digest(tmp_path) == before
