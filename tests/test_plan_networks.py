"""Network descriptions: presets with sources, TOML files, bad figures named by field."""

from __future__ import annotations

import re

import pytest

from torus_train.plan.networks import PRESETS, NetworkError, load_network, network_from_dict
from torus_train.plan.search import make_plan


@pytest.mark.parametrize(
    "field,value",
    [
        ("inter.bandwidth_gbytes_per_s", -1),
        ("intra.bandwidth_gbytes_per_s", 0),
        ("gpus_per_node", 0),
        ("inter.latency_us", -2),
    ],
)
def test_bad_network_figures_name_the_field(field, value):
    d = {
        "gpus_per_node": 4,
        "nics_per_node": 2,
        "intra": {"bandwidth_gbytes_per_s": 50, "latency_us": 2},
        "inter": {"bandwidth_gbytes_per_s": 12.5, "latency_us": 2},
    }
    sec, _, key = field.rpartition(".")
    (d[sec] if sec else d)[key] = value
    shown = f"[{sec}] {key}" if sec else key
    with pytest.raises(NetworkError, match=f"^mynet {re.escape(shown)}: {value} is out of range; give "):
        network_from_dict(d, where="mynet")


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "gpus_per_node",
            10**30,
            "mynet gpus_per_node: a 31-digit number is out of range; give an integer from 1 to 1024",
        ),
        ("nics_per_node", 1e308, "mynet nics_per_node: 1e+308 is out of range; give an integer from 1 to 256"),
        ("nics_per_node", 2.5, "mynet nics_per_node: 2.5 is not a whole number"),
        ("gpus_per_node", "8", "mynet gpus_per_node: '8' is not an integer"),
        ("gpus_per_node", True, "mynet gpus_per_node: 'True' is not an integer"),
        ("inter.bandwidth_gbytes_per_s", float("nan"), "mynet [inter] bandwidth_gbytes_per_s: nan is not a finite"),
        ("inter.bandwidth_gbytes_per_s", 1e300, "mynet [inter] bandwidth_gbytes_per_s: 1e+300 is out of range"),
        ("intra.latency_us", float("inf"), "mynet [intra] latency_us: inf is not a finite number"),
        ("reduce_gbytes_per_s", 0, "mynet reduce_gbytes_per_s: 0 is out of range; give a number > 0"),
        ("sources", 5, "mynet sources: '5' must be a list of strings"),
        ("sources", [1], "mynet sources: '[1]' must be a list of strings"),
    ],
)
def test_network_fields_are_bounded_and_named(field, value, message):
    """The issue's TypeError (sources = 5) and OverflowErrors in the cost model (gpus_per_node = 10**30,
    nics_per_node = 1e308): each is one line naming the file and the field."""
    d = {
        "gpus_per_node": 4,
        "nics_per_node": 2,
        "intra": {"bandwidth_gbytes_per_s": 50, "latency_us": 2},
        "inter": {"bandwidth_gbytes_per_s": 12.5, "latency_us": 2},
    }
    sec, _, key = field.rpartition(".")
    (d[sec] if sec else d)[key] = value
    with pytest.raises(NetworkError, match=f"^{re.escape(message)}"):
        network_from_dict(d, where="mynet")


def test_network_from_toml_file(tmp_path):
    f = tmp_path / "lab.toml"
    f.write_text(
        'name = "lab"\ngpus_per_node = 8\nnics_per_node = 4\n'
        '[intra]\nbandwidth_gbytes_per_s = 300\nlatency_us = 3\n'
        '[inter]\nbandwidth_gbytes_per_s = 25\nlatency_us = 4\n'
        '[images_per_second]\nresnet50 = 2000\n'
    )
    net = load_network(str(f))
    assert (net.name, net.gpus_per_node, net.nics_per_node, net.inter.bandwidth_gbytes_per_s) == ("lab", 8, 4, 25)
    assert make_plan(64, net).images_per_second == 2000
    f.write_text("colour = 1\n" + f.read_text())
    with pytest.raises(NetworkError, match="unknown key 'colour'"):
        load_network(str(f))
    with pytest.raises(NetworkError, match="unknown network 'nope'"):
        load_network("nope")


def test_presets_are_valid_and_state_sources():
    for name, net in PRESETS.items():
        assert net.check() is net and net.name == name
        assert net.sources and "resnet50" in net.images_per_second
