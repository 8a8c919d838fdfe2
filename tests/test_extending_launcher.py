"""docs/extending.md, "Adding a launcher": the toy launcher's code, taken from the page itself, registered from
the test and checked exact (argv, environment, auto, the rank a started process reads, the dry run shown)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from torus_train.cli import cli
from torus_train.job.hosts import Host
from torus_train.job.launch import build_plan, choose_launcher, inside_launched_rank, plan_launch
from torus_train.job.launchers import LAUNCHERS, choices
from torus_train.job.rank import RankInfo
from torus_train.job.spec import load_spec
from torus_train.job.topology import Grid
from torus_train.ranks.bootstrap import rank_info

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
JOB = "/shared/run/job.json"
TOY_ENV = {"TOY_JOB": "9", "TOY_HOSTS": "a:2,b:2"}


def section() -> str:
    text = DOC.read_text()
    return text.split("## Adding a launcher", 1)[1].split("\n## ", 1)[0]


@pytest.fixture
def toyrun():
    """The page's Toyrun class, registered in the table for the test and taken out after it."""
    code = re.search(r"```python\n(.*?)```", section(), re.S).group(1)
    ns: dict = {"__name__": "toyrun_from_docs"}
    exec(compile(code, f"{DOC}#adding-a-launcher", "exec"), ns)
    entry = ns["Toyrun"]()
    LAUNCHERS.add(entry.name, entry)
    try:
        yield entry
    finally:
        LAUNCHERS.remove(entry.name)


def test_the_toy_launchers_argv_and_env_are_exact(toyrun):
    spec = load_spec(
        None, [("launch.launcher", "toyrun"), ("launch.env", ["A=1"]), ("launch.launcher_args", ["--quiet"])]
    )
    plan = build_plan(
        spec,
        Grid(2, 2, 2),
        "toyrun",
        "why",
        [Host("a", 2), Host("b", 2), Host("c", 2)],
        hostfile="",
        job_file=JOB,
        python="/py",
        environ={},
        cpu_count=8,
    )
    assert plan.argv == [
        "toyrun",
        "-n",
        "4",
        "--per-host",
        "2",
        "--hosts",
        "a,b",
        "--quiet",
        "/py",
        "-m",
        "torus_train.ranks.worker",
        "--job",
        JOB,
    ]
    assert plan.env == {"OMP_NUM_THREADS": "4", "A": "1", "MASTER_ADDR": "a", "MASTER_PORT": "21473"}
    assert plan.launcher == "toyrun" and plan.entry is toyrun and not plan.entry.runs_here
    assert plan.hosts == [Host("a", 2), Host("b", 2)]


def test_auto_picks_it_inside_a_toy_allocation_and_reads_its_hosts(toyrun):
    assert choose_launcher("auto", TOY_ENV, "") == ("toyrun", "auto: inside toy job 9")
    assert choose_launcher("auto", {**TOY_ENV, "SLURM_JOB_ID": "5"}, "")[0] == "srun"  # Slurm's comes first
    assert choose_launcher("auto", {}, "hosts.txt")[0] == "mpirun"
    four = load_spec(None, [("grid.gpus", 4), ("grid.grid", "")])
    plan = plan_launch(
        four, TOY_ENV, job_file=JOB, python="/py", as_root=False, master_port=1, cpu_count=2, local_gpus=0
    )
    assert plan.argv[:7] == ["toyrun", "-n", "4", "--per-host", "2", "--hosts", "a,b"]
    with pytest.raises(Exception, match="launcher toyrun needs a toy allocation"):
        plan_launch(
            load_spec(None, [("launch.launcher", "toyrun")]),
            {},
            job_file=JOB,
            python="/py",
            as_root=False,
            master_port=1,
            cpu_count=2,
            local_gpus=0,
        )


def test_a_process_it_started_knows_its_rank(toyrun):
    env = {"TOY_RANK": "3", "TOY_SIZE": "4", "TOY_LOCAL_RANK": "1", "TOY_LOCAL_SIZE": "2"}
    assert inside_launched_rank(env) and not inside_launched_rank(TOY_ENV)
    assert rank_info(env) == RankInfo(3, 4, 1, 2, "toyrun")


def test_the_spec_takes_it_only_while_it_is_registered(toyrun):
    assert load_spec(None, [("launch.launcher", "toyrun")]).launch.launcher == "toyrun"
    LAUNCHERS.remove("toyrun")
    with pytest.raises(Exception, match=re.escape(f"launch.launcher: 'toyrun' is not one of {', '.join(choices())}")):
        load_spec(None, [("launch.launcher", "toyrun")])
    LAUNCHERS.add("toyrun", toyrun)


def test_the_dry_run_the_page_shows(toyrun, monkeypatch, tmp_path):
    for k, v in TOY_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("SLURM_JOB_ID", "PBS_NODEFILE"):
        monkeypatch.delenv(k, raising=False)
    r = CliRunner().invoke(cli, ["run", "--gpus", "4", "--dry-run", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    example = section().split("    $ ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]  # the lines after the $ line
    shown = [ln for ln in example if ln.strip() != "command:"]
    assert len(shown) == 2
    for line in shown:  # the page's lines, "..." standing for what differs by machine, python for its path
        pattern = ".*".join(re.escape(part) for part in line.strip().split("..."))
        pattern = pattern.replace(r"\ python", r"\ \S*python\S*")
        assert re.search(pattern, r.output), (line, r.output)


def test_the_page_names_the_files_a_contributor_touches():
    line = next(ln for ln in section().splitlines() if ln.startswith("Files touched: "))
    files = [f.strip() for f in line.split(":", 1)[1].split(",")]
    assert "torus_train/job/launchers/__init__.py" in files
    root = DOC.parents[1]
    assert all((root / f).exists() for f in files if "toyrun" not in f), files


def test_the_run_docs_list_every_launcher_of_the_table():
    text = (DOC.parent / "run.md").read_text().split("## Launchers", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split("|")[1].strip() for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert rows[1:] == list(LAUNCHERS.names())
