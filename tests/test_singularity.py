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
    assert "/opt/torus-train" in post
    assert shlex.split(sections["runscript"].strip()) == ["exec", "torus-train", "$@"]
    # only what the package needs goes in: the build file, the readme it names, the package itself
    files = [line.split() for line in sections["files"].strip().splitlines()]
    assert files == [
        ["pyproject.toml", "/opt/torus-train/pyproject.toml"],
        ["README.md", "/opt/torus-train/README.md"],
        ["torus_train", "/opt/torus-train/torus_train"],
    ]


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((RECIPE.parent / "pyproject.toml").read_text())["project"]


def test_packages_match_pyproject():
    """Every dependency of pyproject.toml is installed by %post with the same bounds, or named as coming from
    the base image; nothing else is installed."""
    from packaging.requirements import Requirement

    _, sections = parse(RECIPE.read_text())
    post = sections["post"].replace("\\\n", " ")
    installed = {}
    for line in post.splitlines():
        words = shlex.split(line) if line.strip().startswith("python3 -m pip install") else []
        if words[:4] == ["python3", "-m", "pip", "install"]:
            for w in words[4:]:
                if not w.startswith("-") and not w.startswith("/"):
                    r = Requirement(w)
                    installed[r.name] = str(r.specifier)
    base = set(re.search(r"\(base image: ([^)]*)\)", post).group(1).replace(",", " ").split())
    wanted = {Requirement(d).name: str(Requirement(d).specifier) for d in _pyproject()["dependencies"]}
    assert set(installed) | base == set(wanted), (installed, base, wanted)
    assert not set(installed) & base
    for name, spec in installed.items():
        assert spec == wanted[name], f"{name}: recipe {spec!r}, pyproject {wanted[name]!r}"


def test_pins_the_project_version():
    _header, sections = parse(RECIPE.read_text())
    version = _pyproject()["version"]
    assert f"Version {version}" in sections["labels"]
    assert f"__version__ == '{version}'" in sections["post"]
    import torus_train

    assert torus_train.__version__ == version


def test_launch_plan_uses_the_same_container_command():
    """`--container IMG` puts `singularity exec --nv IMG` in front of the worker, as %help documents."""
    from torus_train.job.hosts import Host
    from torus_train.job.launch import build_plan
    from torus_train.job.spec import load_spec
    from torus_train.job.topology import Grid

    _, sections = parse(RECIPE.read_text())
    spec = load_spec(None, [("launch.container", "torus-train.sif")])
    plan = build_plan(
        spec,
        Grid(4, 2, 4),
        "mpirun",
        "",
        [Host("a", 4), Host("b", 4)],
        hostfile="hosts.txt",
        job_file="runs/NAME/job.json",
        python="python3",
        environ={},
    )
    i = plan.argv.index("singularity")
    tail = " ".join(plan.argv[i:])
    assert tail == (
        "singularity exec --nv --bind runs/NAME torus-train.sif python3 -m torus_train.ranks.worker "
        "--job runs/NAME/job.json"
    )
    assert tail in " ".join(sections["help"].replace("\\\n", " ").split())


def test_the_base_is_the_documented_one_and_refuses_a_torch_without_the_split_or_v100():
    """The NGC tag in From is the one docs/cluster.md gives versions and sources for, and %test refuses a base
    whose torch cannot split the grid's groups (dist.split_group, torch.accelerator) or has no V100 kernels."""
    header, sections = parse(RECIPE.read_text())
    tag = header["From"].removeprefix("nvcr.io/nvidia/pytorch:")
    docs = (RECIPE.parent / "docs" / "cluster.md").read_text()
    assert f"The base is NGC PyTorch {tag.removesuffix('-py3')} (`{header['From']}`)" in docs
    assert f"| **{tag.removesuffix('-py3')}** |" in docs  # its row in the table of releases
    test = sections["test"]
    for needed in ("hasattr(d, 'split_group')", "hasattr(torch, 'accelerator')", "'sm_70' in f"):
        assert needed in test, needed
    assert "_cuda_getArchFlags()" in test  # get_arch_list() is empty on a build host without a GPU
