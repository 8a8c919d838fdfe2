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


# --- the default job on the GPUs this machine has (the probe replaced: no rank starts) ---------------------
import pytest  # noqa: E402


@pytest.fixture
def gpus_here(monkeypatch):
    """Make torus_train.job.gpus report `n` GPUs here (and no hostfile or scheduler in the environment)."""
    from torus_train.job import gpus

    for name in ("SLURM_JOB_ID", "PBS_NODEFILE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def set_to(n: int) -> None:
        monkeypatch.setattr(gpus, "local_gpu_count", lambda environ=None: n)

    return set_to


@pytest.mark.parametrize(
    "n, grid, note",
    [
        (0, "grid 2x1: 2 ranks", "2 CPU ranks on gloo"),
        (
            1,
            "grid 1x1: 1 rank",
            "one rank on one GPU (grid 1x1): its all-reduce has no peer; to see the torus, run "
            "CPU ranks (--backend gloo --gpus 4)",
        ),
        (4, "grid 2x2: 4 ranks", "4 ranks on NCCL, one per GPU (4 here)"),
    ],
)
def test_the_default_job_takes_the_gpus_here(gpus_here, tmp_path, n, grid, note):
    gpus_here(n)
    r = dry("--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    assert grid in r.output and note in r.output
    assert "cannot start here" not in r.output and "# preflight passed" in r.output


def test_backend_gloo_keeps_cpu_ranks_on_a_gpu_machine(gpus_here, tmp_path):
    gpus_here(1)
    r = dry("--backend", "gloo", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0 and "grid 2x1: 2 ranks" in r.output and "2 CPU ranks on gloo" in r.output
    r = dry("--backend", "gloo", "--gpus", "4", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0 and "grid 2x2: 4 ranks" in r.output and 'backend = "gloo"' in r.output


def test_a_world_size_or_grid_given_is_kept_on_a_gpu_machine(gpus_here, tmp_path):
    gpus_here(4)
    assert "grid 2x1: 2 ranks" in dry("--gpus", "2", "--out", str(tmp_path / "o")).output
    assert "grid 1x2: 2 ranks" in dry("--grid", "1x2", "--out", str(tmp_path / "o")).output


def test_more_ranks_than_gpus_is_one_line_before_anything_starts(gpus_here, tmp_path):
    from clihelp import assert_one_line_error, invoke

    gpus_here(1)
    out = tmp_path / "o"
    code, _, err = invoke("run", "--gpus", "2", "--out", str(out))
    assert_one_line_error(
        code,
        err,
        "2 ranks do not fit on this machine (1 GPU(s), one rank each); to run them "
        "here as CPU ranks pass --backend gloo",
    )
    assert "--hostfile FILE" in err and "Slurm or PBS job" in err
    assert not out.exists()
    r = dry("--gpus", "2", "--out", str(out))  # the dry run prints the plan and what stops it
    assert "grid 2x1: 2 ranks" in r.output and "cannot start here: 2 ranks do not fit" in r.output


def test_backend_nccl_without_a_gpu_is_refused(gpus_here, tmp_path):
    from clihelp import assert_one_line_error, invoke

    gpus_here(0)
    code, _, err = invoke("run", "--backend", "nccl", "--out", str(tmp_path / "o"))
    assert_one_line_error(code, err, "comm.backend = nccl needs one GPU per rank and CUDA shows none here")
