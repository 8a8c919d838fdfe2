"""`run --gpus N` without --grid chooses a grid for N (the default spec's grid gives way), `--grid` alone sets
the world size, and no message asks the user to leave out what they did not give."""
from __future__ import annotations

from click.testing import CliRunner

from torus_train.cli import cli


def dry(*args: str):
    return CliRunner().invoke(cli, ["run", "--dry-run", *args])


def test_gpus_alone_chooses_a_grid():
    r = dry("--gpus", "4")
    assert r.exit_code == 0, r.output
    assert "grid 2x2: 4 ranks" in r.output and "leave --grid out" not in r.output
    assert "grid 3x1: 3 ranks" in dry("--gpus", "3").output


def test_grid_alone_sets_the_world_size():
    r = dry("--grid", "2x2")
    assert r.exit_code == 0, r.output
    assert "grid 2x2: 4 ranks" in r.output


def test_both_given_and_disagreeing_is_the_users_error(capsys):
    import pytest

    from torus_train.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--dry-run", "--gpus", "4", "--grid", "3x3"])
    assert e.value.code == 2 and "grid 3x3 = 9 ranks but --gpus is 4" in capsys.readouterr().err


def test_a_spec_files_grid_gives_way_to_gpus_and_says_so(tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text('[grid]\ngpus = 2\ngrid = "2x1"\n[data]\nsource = "synthetic"\n[model]\narch = "resnet18"\n')
    r = dry("--spec", str(spec), "--gpus", "4")
    assert r.exit_code == 0, r.output
    assert f"{spec}: grid.grid = 2x1 does not fit the command line's --gpus; ignored" in r.output
    assert "grid 2x2: 4 ranks" in r.output


def test_gpus_per_node_zero_detects_and_help_says_so():
    r = dry("--gpus", "6", "--gpus-per-node", "0")
    assert r.exit_code == 0 and "grid 3x2: 6 ranks" in r.output and "6 per node, 1 node(s)" in r.output
    assert "0 = detect" in " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())


def test_a_spec_whose_grid_and_gpus_disagree_names_its_fields_not_flags(tmp_path):
    from clihelp import assert_one_line_error, invoke

    spec = tmp_path / "s.toml"
    spec.write_text('[grid]\ngpus = 4\ngrid = "2x1"\n')
    code, _, err = invoke("run", "--spec", str(spec), "--dry-run", "--out", str(tmp_path / "o"))
    assert_one_line_error(code, err, f"{spec}: grid.grid = 2x1 is 2 ranks but grid.gpus = 4")
    assert "--gpus" not in err and "--grid" not in err
