"""Singularity.def: the recipe has what the cluster scripts rely on (parsed here; no runtime on this machine)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "Singularity.def"


def parse(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(header, sections) of a Singularity definition file."""
    header, sections, current = {}, {}, None
    for line in text.splitlines():
        m = re.match(r"^%(\w+)\s*$", line)
        if m:
            current = m.group(1)
            assert current not in sections, f"section %{current} twice"
            sections[current] = ""
        elif current is None:
            if line.strip() and not line.lstrip().startswith("#"):
                key, sep, value = line.partition(":")
                assert sep, f"header line without 'Key: value': {line!r}"
                header[key.strip()] = value.strip()
        else:
            sections[current] += line + "\n"
    return header, sections


def test_header_and_sections():
    header, sections = parse(RECIPE.read_text())
    assert header["Bootstrap"] == "docker" and header["From"].startswith("nvcr.io/nvidia/pytorch:")
    for name in ("post", "environment", "runscript", "files", "help", "test", "labels"):
        assert sections.get(name, "").strip(), f"%{name} is missing or empty"
    assert set(sections) <= {"labels", "help", "files", "environment", "post", "runscript", "test", "setup"}


def test_installs_what_the_ranks_import_and_runs_the_cli():
    _, sections = parse(RECIPE.read_text())
    post = sections["post"]
    for pkg in ("mpi4py", "click", "nvidia-dali-cuda120", "/opt/torus-train"):
        assert pkg in post
    assert shlex.split(sections["runscript"].strip()) == ["exec", "torus-train", "$@"]
    assert sections["files"].split() == [".", "/opt/torus-train"]  # the package source goes where %post installs it


def test_launch_plan_uses_the_same_container_command():
    """`--container IMG` puts `singularity exec --nv IMG` in front of the worker, as %help documents."""
    from torus_train.job.hosts import Host
    from torus_train.job.launch import build_plan
    from torus_train.job.spec import load_spec
    from torus_train.job.topology import Grid

    _, sections = parse(RECIPE.read_text())
    spec = load_spec(None, [("launch.container", "torus-train.sif")])
    plan = build_plan(spec, Grid(4, 2, 4), "mpirun", "", [Host("a", 4), Host("b", 4)], hostfile="hosts.txt",
                      job_file="runs/NAME/job.json", python="python3", environ={})
    i = plan.argv.index("singularity")
    tail = " ".join(plan.argv[i:])
    assert tail == "singularity exec --nv torus-train.sif python3 -m torus_train.ranks.worker --job runs/NAME/job.json"
    assert tail in " ".join(sections["help"].replace("\\\n", " ").split())
