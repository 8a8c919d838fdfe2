"""Host lists: OpenMPI hostfiles, PBS node files, Slurm compressed node lists."""

from __future__ import annotations

import re

import pytest

from torus_train.errors import UserError
from torus_train.job.hosts import (
    Host,
    HostsError,
    expand_nodelist,
    expand_tasks_per_node,
    format_hostfile,
    parse_hostfile,
    read_hostfile,
    slurm_hosts,
    total_slots,
)


def test_openmpi_hostfile():
    hosts = parse_hostfile("# rack 1\nnode01 slots=4\nnode02 slots=4 max_slots=8\n\nnode03\n")
    assert hosts == [Host("node01", 4), Host("node02", 4), Host("node03", 1)]
    assert total_slots(hosts) == 9
    assert parse_hostfile(format_hostfile(hosts)) == hosts


def test_pbs_nodefile_one_line_per_slot():
    text = "g0001\ng0001\ng0001\ng0001\ng0002\ng0002\ng0002\ng0002\n"
    assert parse_hostfile(text) == [Host("g0001", 4), Host("g0002", 4)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("node01 slots=four\n", "hostfile:1 slots: 'four' is not a whole number; give an integer from 1 to 4096"),
        ("node01 slots=\u00b2\n", "hostfile:1 slots: '\u00b2' is not a whole number"),
        ("node01 slots=4 max_slots=\u00b2\n", "hostfile:1 max_slots: '\u00b2' is not a whole number"),
        ("node01 slots=" + "9" * 5000 + "\n", "hostfile:1 slots: '99999999999999999999'...(5000 characters)"),
        ("node01 slots=0\n", "hostfile:1 slots: 0 is out of range; give an integer from 1 to 4096"),
        ("node01 cpus=4\n", "unknown option 'cpus=4'"),
        ("node01:4\n", "is not a host line"),
        ("\n# nothing\n", "lists no hosts"),
    ],
)
def test_bad_hostfiles_show_the_format(text, message):
    with pytest.raises(HostsError) as e:
        parse_hostfile(text)
    assert message in str(e.value) and ("slots=K" in str(e.value) or "slots=" in str(e.value))


def test_missing_hostfile_is_named(tmp_path):
    with pytest.raises(HostsError, match=r"--hostfile .*nope: no such file"):
        read_hostfile(tmp_path / "nope", "--hostfile")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node[001-004,010]", ["node001", "node002", "node003", "node004", "node010"]),
        ("a1,b[8-10]", ["a1", "b8", "b9", "b10"]),
        ("gpu[1-2]-ib,login", ["gpu1-ib", "gpu2-ib", "login"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("single", ["single"]),
    ],
)
def test_slurm_nodelists(text, expected):
    assert expand_nodelist(text) == expected


@pytest.mark.parametrize("text", ["node[1-", "node]1[", "node[a-b]", "node[5-3]", "node[]", "n[\u00b2]", "n[1-2]]"])
def test_bad_slurm_nodelists(text):
    with pytest.raises(UserError, match=r"^SLURM_JOB_NODELIST "):
        expand_nodelist(text)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text, why",
    [
        ("node[0-99999999]", "names 100,000,000 nodes, more than the 1,048,576 allowed"),
        ("a[1-9999]b[1-9999]c[1-9999]", "names 999,700,029,999 nodes"),
        ("n" + "[1-2]" * 40, "names 1,099,511,627,776 nodes"),
        ("a[" * 40 + "1" + "]" * 40, "nested brackets"),
        ("n[1-" + "9" * 5000 + "]", "bad range"),
    ],
)
def test_node_lists_are_counted_before_they_are_expanded(text, why):
    """The issue's hang: a node list is refused in one line before anything is expanded, not after 40 s and
    gigabytes (or never, for nested brackets)."""
    with pytest.raises(UserError, match=f"^SLURM_JOB_NODELIST .*{re.escape(why)}"):
        slurm_hosts({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": text})


def test_node_list_is_bounded_by_the_allocation():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_NUM_NODES": "2"}
    with pytest.raises(UserError, match=r"^SLURM_JOB_NODELIST 'n\[1-3\]': names 3 nodes, more than the 2 allowed$"):
        slurm_hosts(env)
    assert [h.name for h in slurm_hosts({**env, "SLURM_JOB_NUM_NODES": "3"})] == ["n1", "n2", "n3"]
    with pytest.raises(UserError, match=r"^SLURM_TASKS_PER_NODE: 99999 is out of range"):
        slurm_hosts({**env, "SLURM_JOB_NUM_NODES": "3", "SLURM_TASKS_PER_NODE": "4(x99999)"})


@pytest.mark.parametrize("name", ["SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_NUM_NODES"])
@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "-1"])
def test_slurm_counts_are_refused_by_name(name, value):
    with pytest.raises(UserError, match=f"^{name}: "):
        slurm_hosts({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", name: value})


def test_zero_gpus_on_a_node_offers_one_slot_as_when_nothing_is_said():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_GPUS_ON_NODE": "0"}
    assert slurm_hosts(env) == [Host("n1", 1), Host("n2", 1)]
    with pytest.raises(UserError, match=r"^SLURM_JOB_NUM_NODES: 0 is out of range"):
        slurm_hosts({**env, "SLURM_JOB_NUM_NODES": "0"})


def test_slurm_tasks_per_node_and_allocation():
    assert expand_tasks_per_node("4(x2),3") == [4, 4, 3]
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4(x2),3"}
    assert slurm_hosts(env) == [Host("n1", 4), Host("n2", 4), Host("n3", 3)]
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "8"}
    assert slurm_hosts(env) == [Host("n1", 8), Host("n2", 8)]
    with pytest.raises(HostsError, match="SLURM_JOB_NODELIST"):
        slurm_hosts({"SLURM_JOB_ID": "7"})


def test_pbs_pro_node_file_shapes():
    """select=2:ncpus=40:ngpus=4:mpiprocs=4 lists each host 4 times (fully qualified names as PBS writes
    them); without mpiprocs each host once, which offers 1 slot per node, not 4."""
    with_mpiprocs = "".join(f"r{n}i0n{n}.ib0.cluster\n" for n in (1, 2) for _ in range(4))
    assert parse_hostfile(with_mpiprocs) == [Host("r1i0n1.ib0.cluster", 4), Host("r2i0n2.ib0.cluster", 4)]
    assert parse_hostfile("r1i0n1.ib0.cluster\nr2i0n2.ib0.cluster\n") == [
        Host("r1i0n1.ib0.cluster", 1),
        Host("r2i0n2.ib0.cluster", 1),
    ]
