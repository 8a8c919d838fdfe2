"""`torus-train run` through click's CliRunner: help, usage errors, dry run (no ranks start here)."""

from __future__ import annotations

from click.testing import CliRunner

from torus_train.cli import cli


def test_help_lists_the_flags():
    r = CliRunner().invoke(cli, ["run", "--help"])
    assert r.exit_code == 0
    for flag in (
        "--spec",
        "--gpus",
        "--grid",
        "--gpus-per-node",
        "--launcher",
        "--hostfile",
        "--container",
        "--data",
        "--model",
        "--image-size",
        "--steps",
        "--epochs",
        "--out",
        "--resume",
        "--dry-run",
        "--set",
        "--overwrite",
        "--backend",
    ):
        assert flag in r.output, flag


def test_usage_error_exits_2():
    r = CliRunner().invoke(cli, ["run", "--launcher", "pbsdsh"])
    assert r.exit_code == 2 and "pbsdsh" in r.output


def test_dry_run_of_the_default_job(tmp_path, monkeypatch):
    from torus_train.job import gpus

    monkeypatch.setattr(gpus, "local_gpu_count", lambda environ=None: 0)  # a machine without GPUs: 2 CPU ranks
    r = CliRunner().invoke(cli, ["run", "--dry-run", "--out", str(tmp_path / "x")])
    assert r.exit_code == 0, r.output
    assert "grid 2x1: 2 ranks" in r.output and "MASTER_PORT=" in r.output and "peak LR" in r.output
    assert f"output would go to {tmp_path / 'x'}" in r.output
    assert not (tmp_path / "x").exists()  # a dry run writes nothing


def test_resume_and_overwrite_exclude_each_other(capsys):
    """A UserError from the command becomes one line and exit 2 in main()."""
    import pytest

    from torus_train.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--resume", "--overwrite", "--dry-run"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "torus-train: error: --resume and --overwrite exclude each other\n"


def test_default_output_folder_moves_on_but_a_named_one_is_refused(tmp_path, monkeypatch):
    import pytest

    from torus_train.errors import UserError
    from torus_train.job.spec import load_spec
    from torus_train.ranks.rundir import choose_out, prepare_out

    monkeypatch.chdir(tmp_path)
    spec = load_spec(None)
    first = choose_out(spec, False, False)
    assert first == tmp_path / "runs" / "default"
    prepare_out(first, False, False)
    (first / "summary.json").write_text("{}")
    fresh = choose_out(load_spec(None), False, False)
    assert fresh.parent == first.parent and fresh.name.startswith("default-")
    assert choose_out(load_spec(None), True, False) == first  # --resume: the same folder
    named = load_spec(None, [("job.out", str(first))])
    assert choose_out(named, False, False) == first
    with pytest.raises(UserError, match="already holds results"):
        prepare_out(first, False, False)
    prepare_out(first, False, True)  # --overwrite clears the earlier results
    assert not (first / "summary.json").exists()


def test_dry_run_at_2176_gpus_keeps_the_default_per_rank_batches(tmp_path):
    """No spec: the default job's stages are per-rank batches, so 2176 ranks keep them."""
    f = tmp_path / "hosts"
    f.write_text("".join(f"host{i:03d} slots=4\n" for i in range(1, 545)))
    r = CliRunner().invoke(
        cli,
        [
            "run",
            "--dry-run",
            "--gpus",
            "2176",
            "--grid",
            "32x68",
            "--gpus-per-node",
            "4",
            "--launcher",
            "mpirun",
            "--hostfile",
            str(f),
        ],
    )
    assert r.exit_code == 0, r.output
    table = r.output.split("# batch schedule")[1].splitlines()
    assert [line.split()[2:4] for line in table[2:5]] == [["139264", "64"], ["278528", "128"], ["557056", "256"]]
    assert "mpirun" in r.output and "-np 2176" in r.output


def test_cuda_graphs_switch_takes_auto_and_off_only(tmp_path, capsys):
    import pytest

    from torus_train.cli import main

    for value in ("auto", "off"):
        r = CliRunner().invoke(
            cli, ["run", "--dry-run", "--out", str(tmp_path / value), "--set", f"model.cuda_graphs={value}"]
        )
        assert r.exit_code == 0, r.output
    with pytest.raises(SystemExit) as e:
        main(["run", "--dry-run", "--out", str(tmp_path / "on"), "--set", "model.cuda_graphs=on"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "torus-train: error: model.cuda_graphs: 'on' is not one of auto, off\n"
