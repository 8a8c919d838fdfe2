"""The number door (torus_train/usernumbers.py) and the issue-50 causes it closes, each as a user meets it: the
real entry point, exit code 2, one line naming the source (an option, a variable, a file and its field), no
traceback, and nothing started or written first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, invoke

from torus_train.usernumbers import NumberError, float_of, float_value, int_of, int_value, node_list

ROOT = Path(__file__).resolve().parents[1]
BIG = "9" * 5000


@pytest.mark.parametrize("text", ["\u00b2", "\u0664", "1_000", BIG, "", " ", "0x10", "1e3", "1.0", "nan"])
def test_int_of_takes_ascii_digits_only(text):
    """str.isdigit takes '²' (int refuses it), int takes '٤' and '1_000', and refuses 4,300 digits or more."""
    with pytest.raises(NumberError, match=r"^--x: .* is not a whole number; give an integer from 0 to 9$"):
        int_of(text, "--x", 0, 9)


def test_int_of_reads_and_bounds():
    assert int_of(" +7 ", "--x", 0, 9) == 7 and int_of("-3", "--x") == -3
    with pytest.raises(NumberError, match=r"^--x: 10 is out of range; give an integer from 0 to 9$"):
        int_of("10", "--x", 0, 9)
    with pytest.raises(NumberError, match=r"^--x: -1 is out of range; give an integer >= 0$"):
        int_of("-1", "--x", 0)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1_0", "\u0664", "0x1p3", "", "1e999"])
def test_float_of_takes_finite_ascii_numbers_only(text):
    with pytest.raises(NumberError, match=r"^X: .* is not a finite number; give a number > 0 and <= 8$"):
        float_of(text, "X", 0, 8, low_open=True)


def test_float_of_reads_and_bounds():
    assert float_of("2.5e-1", "X", 0, 8, low_open=True) == 0.25 and float_of(".5", "X") == 0.5
    with pytest.raises(NumberError, match=r"^X: 0 is out of range; give a number > 0 and <= 8$"):
        float_of("0", "X", 0, 8, low_open=True)


@pytest.mark.parametrize(
    "value, message",
    [
        ("8", "'8' is not an integer"),
        (True, "'True' is not an integer"),
        (2.5, "2.5 is not a whole number"),
        (float("nan"), "nan is not a whole number"),
        pytest.param(10**5000, "a 5001-digit number is out of range", id="10**5000"),
        (1e308, "1e+308 is out of range"),
    ],
)
def test_int_value_refuses_what_a_parser_read_wrongly(value, message):
    with pytest.raises(NumberError, match=f"^f[.]toml k: {re.escape(message)}"):
        int_value(value, "f.toml k", 1, 64)


def test_values_in_range_pass():
    assert int_value(8.0, "k", 1, 64) == 8 and isinstance(int_value(8.0, "k", 1, 64), int)
    assert float_value(3, "k", 0, 8) == 3.0 and isinstance(float_value(3, "k"), float)
    with pytest.raises(NumberError, match=r"^k: 'x' is not a number"):
        float_value("x", "k")
    with pytest.raises(NumberError, match=r"^k: a 401-digit number is out of range; give a number$"):
        float_value(10**400, "k")


def test_node_list_counts_before_it_expands():
    assert node_list("n[08-10],g[1-2]-ib", "L") == ["n08", "n09", "n10", "g1-ib", "g2-ib"]
    with pytest.raises(NumberError, match=r"^L 'n\[1-3\]': names 3 nodes, more than the 2 allowed$"):
        node_list("n[1-3]", "L", 2)


# ---- the causes, through the real entry point -----------------------------------------------------------


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """torus-train ARGS in a process of its own with ``env`` added (the variables a launcher would set)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "torus_train", *args], env=full, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def assert_refused(r: subprocess.CompletedProcess, message: str) -> None:
    assert_one_line_error(r.returncode, r.stderr, message)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "env, message",
    [
        ({"SLURM_JOB_NODELIST": "node[0-99999999]"}, "SLURM_JOB_NODELIST 'node[0-99999999]': names 100,000,000 nodes"),
        ({"SLURM_JOB_NODELIST": "a[" * 40 + "1" + "]" * 40}, "nested brackets"),
        (
            {"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "2"},
            "SLURM_JOB_NODELIST 'n[1-4]': names 4 nodes, more than the 2 allowed",
        ),
        ({"SLURM_GPUS_ON_NODE": "\u00b2"}, "SLURM_GPUS_ON_NODE: '\u00b2' is not a whole number"),
        ({"SLURM_NTASKS_PER_NODE": BIG}, "SLURM_NTASKS_PER_NODE: '99999999999999999999'...(5000 characters)"),
        ({"SLURM_CPUS_PER_TASK": "\u00b2"}, "SLURM_CPUS_PER_TASK: '\u00b2' is not a whole number"),
        ({"SLURM_JOB_CPUS_PER_NODE": BIG}, "SLURM_JOB_CPUS_PER_NODE: '99999999999999999999'...(5000 characters)"),
        (
            {"SLURM_TASKS_PER_NODE": "4(x99999)", "SLURM_JOB_NUM_NODES": "2"},
            "SLURM_TASKS_PER_NODE: 99999 is out of range",
        ),
    ],
)
def test_slurm_variables_are_refused_by_name_within_seconds(tmp_path, env, message):
    """The issue's hang (40 s and gigabytes, or never for nested brackets) and its ValueErrors, under
    `run --dry-run` inside a (pretended) Slurm allocation."""
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", **env}
    r = _run(["run", "--data", "synthetic", "--launcher", "srun", "--dry-run"], env, tmp_path)
    assert_refused(r, message)


@pytest.mark.timeout(120)
def test_pbs_ncpus_is_refused_by_name(tmp_path):
    nodes = tmp_path / "nodes"
    nodes.write_text("n1\nn1\n")
    env = {"PBS_JOBID": "1.pbs", "PBS_NODEFILE": str(nodes), "NCPUS": "\u00b2"}
    r = _run(["run", "--data", "synthetic", "--launcher", "mpirun", "--dry-run"], env, tmp_path)
    assert_refused(r, "NCPUS: '\u00b2' is not a whole number; give an integer from 0 to 65536")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("line", ["n1 slots=\u00b2", f"n1 slots=2 max_slots={BIG}"])
def test_hostfile_slots_are_refused_with_the_line(tmp_path, line):
    (tmp_path / "hosts.txt").write_text(f"# nodes\n{line}\n")
    r = _run(
        ["run", "--data", "synthetic", "--launcher", "mpirun", "--hostfile", "hosts.txt", "--dry-run"], {}, tmp_path
    )
    assert_refused(r, "hosts.txt:2 ")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "env, source",
    [
        ({"RANK": "\u00b2", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": BIG}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE"),
        ({"OMPI_COMM_WORLD_RANK": "nan", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK"),
    ],
)
def test_a_rank_started_with_a_bad_place_is_refused_by_name(tmp_path, env, source):
    """A process a launcher started (torchrun, mpirun) whose variables are no rank: one line naming the
    variable, before it joins any group."""
    r = _run(["run", "--data", "synthetic", "--grid", "2x1", "--steps", "1", "--out", "o"], env, tmp_path)
    assert_refused(r, f"{source}: ")
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["abc", "nan", "inf", "0", "1e9"])
def test_shm_piece_size_is_refused_before_launch(tmp_path, value):
    """TORUS_TRAIN_SHM_PIECE_MB=abc crashed every rank after the launch; now the preflight refuses it."""
    r = _run(
        ["run", "--data", "synthetic", "--gpus", "2", "--grid", "2x1", "--steps", "1", "--out", "o"],
        {"TORUS_TRAIN_SHM_PIECE_MB": value},
        tmp_path,
    )
    assert_refused(r, "TORUS_TRAIN_SHM_PIECE_MB: ")
    assert not (tmp_path / "o").exists()


def _bench(path: Path, grid: str) -> str:
    sizes = ((1024, 50.0), (1 << 20, 900.0), (4 << 20, 3000.0))
    rows = [{"algo": "torus", "grid": grid, "size_bytes": s, "time_us": t, "wrong": 0} for s, t in sizes]
    path.write_text(json.dumps(rows))
    return str(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "1x1"], "--grid 1x1: one rank exchanges nothing"),
        (["--compare", "{one}"], "has no rows of torus on 2 ranks or more with wrong == 0"),
        (["--compare", ""], "--compare '': empty"),
        (["--algo", ""], "--algo '': empty"),
        (["--grid", ""], "--grid '': empty"),
    ],
)
def test_calibrate_refusals(tmp_path, args, message):
    """The issue's ZeroDivisionError (a 1x1 target or 1x1 rows) and options given as '' read as not given."""
    bench, one = _bench(tmp_path / "b.json", "2x2"), _bench(tmp_path / "one.json", "1x1")
    code, _, err = invoke("plan", "calibrate", bench, *[a.replace("{one}", one) for a in args])
    assert_one_line_error(code, err, message)


def test_calibrate_fits_no_1x1_rows(tmp_path):
    code, _, err = invoke("plan", "calibrate", _bench(tmp_path / "one.json", "1x1"))
    assert_one_line_error(code, err, "BENCH.json: torus on 1x1: one rank exchanges nothing")


@pytest.mark.timeout(120)
def test_a_huge_cuda_visible_devices_entry_reads_as_cuda_reads_it(tmp_path):
    """5,000 digits crashed `run --dry-run` (int() past 4,300 digits); CUDA's strtoul saturates, so the entry
    names a GPU no driver lists and CUDA shows none from there on."""
    r = _run(["run", "--data", "synthetic", "--dry-run"], {"CUDA_VISIBLE_DEVICES": BIG}, tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_master_port_is_read_through_the_door():
    from torus_train.job.rank import RankInfo
    from torus_train.ranks.bootstrap import rendezvous

    info = RankInfo(0, 2, 0, 2, "torchrun")
    assert rendezvous(info, {"MASTER_ADDR": "n1", "MASTER_PORT": "29500"}) == ("n1", 29500)
    for port in ("\u00b2", "0", "65536", BIG):
        with pytest.raises(NumberError, match=r"^MASTER_PORT: "):
            rendezvous(info, {"MASTER_ADDR": "n1", "MASTER_PORT": port})


def test_a_job_key_of_odd_digits_is_hashed_not_converted():
    from torus_train.job.launchers.rendezvous import rendezvous_port

    assert rendezvous_port("4242") == 20000 + 4242
    assert 20000 <= rendezvous_port("\u00b2") <= 32767 and 20000 <= rendezvous_port(BIG) <= 32767


@pytest.mark.parametrize(
    "line, message",
    [
        ("sources = 5", "net.toml sources: '5' must be a list of strings"),
        (
            "gpus_per_node = 1000000000000000000000000000000",
            "net.toml gpus_per_node: a 31-digit number is out of range",
        ),
        ("nics_per_node = 1e308", "net.toml nics_per_node: 1e+308 is out of range; give an integer from 1 to 256"),
    ],
)
def test_a_network_file_past_its_bounds_is_one_line(tmp_path, line, message):
    """The issue's TypeError (sources = 5) and the cost model's OverflowErrors, through `plan --network`."""
    key = line.split(" ")[0]
    base = {"gpus_per_node": "4", "nics_per_node": "2", "sources": '["lab"]'}
    top = "".join(f"{k} = {v}\n" for k, v in base.items() if k != key) + line + "\n"
    links = "".join(f"[{s}]\nbandwidth_gbytes_per_s = 12.5\nlatency_us = 2\n" for s in ("intra", "inter"))
    net = tmp_path / "net.toml"
    net.write_text(top + links)
    code, _, err = invoke("plan", "--gpus", "64", "--network", str(net))
    assert_one_line_error(code, err, f"{tmp_path}/{message}")


def test_refusals_of_plans_options_name_the_option(tmp_path):
    """Two of the refusals that named no option: calibrate's --grid read by the grid parser, and a --network
    name too long for the file system."""
    code, _, err = invoke("plan", "calibrate", _bench(tmp_path / "b.json", "2x2"), "--grid", "x")
    assert_one_line_error(code, err, "--grid: grid 'x' is not of the form XxY")
    code, _, err = invoke("plan", "--gpus", "64", "--network", BIG)
    assert_one_line_error(code, err, "--network 99999")
    assert "File name too long" in err
