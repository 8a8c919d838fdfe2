"""The job spec: defaults, TOML files, overrides, and errors that name the dotted field path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torus_train.job.spec import JobSpec, SpecError, load_spec, parse_override, spec_from_table


def write(tmp_path, text):
    p = tmp_path / "job.toml"
    p.write_text(text)
    return p


def test_embedded_default_is_the_demo_job():
    s = load_spec(None)
    assert (s.grid.gpus, s.grid.grid, s.data.source) == (2, "2x1", "demo")
    assert s.eval.every_epochs >= 1 and len(s.schedule.stages) >= 2


def test_file_values_and_defaults(tmp_path):
    s = load_spec(
        write(
            tmp_path,
            """
[grid]
gpus = 8
grid = "4x2"
[comm]
algo = "flat"
bucket_mb = 10
[schedule]
epochs = 3
stages = [{until_epoch = 1, global_batch = 64}, {until_epoch = 3, global_batch = 128}]
""",
        )
    )
    assert s.grid.gpus == 8 and s.comm.algo == "flat"
    assert s.comm.bucket_mb == 10.0 and isinstance(s.comm.bucket_mb, float)  # ints accepted for floats
    assert s.model.arch == "resnet50"  # untouched sections keep the dataclass defaults
    assert [(st.until_epoch, st.global_batch) for st in s.schedule.stages] == [(1, 64), (3, 128)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[grid]\ngpu = 4\n", "grid.gpu: unknown key"),
        ("[gird]\ngpus = 4\n", "gird: unknown key"),
        ('[grid]\ngpus = "four"\n', "grid.gpus: expected an integer, got string 'four'"),
        ("[model]\nchannels_last = 1\n", "model.channels_last: expected true or false, got integer 1"),
        ("[grid]\ngpus = true\n", "grid.gpus: expected an integer, got boolean True"),
        ("[launch]\nenv = \"A\"\n", "launch.env: expected a list"),
        ("[schedule]\nstages = [{until_epoch = 1, global_batch = 8, x = 1}]\n", "schedule.stages[0].x: unknown key"),
        (
            "[schedule]\nstages = [{until_epoch = 2, global_batch = 64}, {until_epoch = 1, global_batch = 128}]\n",
            "schedule.stages[1].until_epoch: 1 must be greater",
        ),
        (
            "[schedule]\nstages = [{until_epoch = 2, global_batch = 64}, {until_epoch = 4, global_batch = 32}]\n",
            "schedule.stages[1].global_batch: 32 is smaller",
        ),
        ('[comm]\nalgo = "ring"\n', "comm.algo: 'ring' is not one of"),
        ('[grid]\ngrid = "3by3"\n', "grid.grid:"),
        ("[comm]\ntimeout_s = 0\n", "comm.timeout_s: 0.0 must be > 0"),
        ("[eval]\ntarget_top1 = 75\n", "eval.target_top1: 75.0 must be a fraction"),
    ],
)
def test_bad_fields_are_named(tmp_path, text, message):
    with pytest.raises(SpecError) as e:
        load_spec(write(tmp_path, text))
    assert message in str(e.value)


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(write(tmp_path, "[grid\n"))
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.toml")


def test_overrides_go_through_the_same_checks(tmp_path):
    s = load_spec(
        write(tmp_path, "[comm]\nalgo = 'torus'\n"),
        [
            parse_override("comm.algo=flat"),
            parse_override("grid.gpus=6"),
            parse_override("launch.env=['NCCL_DEBUG', 'A=1']"),
        ],
    )
    assert (s.comm.algo, s.grid.gpus, s.launch.env) == ("flat", 6, ["NCCL_DEBUG", "A=1"])
    with pytest.raises(SpecError, match=re.escape("grid.gpus: expected an integer")):
        load_spec(None, [parse_override("grid.gpus=lots")])
    with pytest.raises(SpecError, match=re.escape("comm.nope: unknown key")):
        load_spec(None, [parse_override("comm.nope=1")])
    with pytest.raises(SpecError, match="FIELD=VALUE"):
        parse_override("comm.algo")


def test_stages_follow_the_epoch_count():
    stages = ("schedule.stages", [{"until_epoch": 2, "global_batch": 64}, {"until_epoch": 4, "global_batch": 128}])

    def cut(epochs):
        s = load_spec(None, [stages, ("schedule.epochs", epochs)]).schedule.at(4)
        return [(st.until_epoch, st.global_batch) for st in s.stages]

    assert cut(1) == [(1, 64)]
    assert cut(3) == [(2, 64), (3, 128)]
    assert cut(6) == [(2, 64), (6, 128)]


def test_round_trip_through_job_json(tmp_path):
    s = load_spec(None, [("comm.algo", "flat"), ("launch.launcher_args", ["--mca", "btl", "^openib"])])
    import json

    p = tmp_path / "job.json"
    p.write_text(json.dumps(s.to_dict()))
    assert spec_from_table(json.loads(p.read_text())) == s
    assert spec_from_table({}) == JobSpec()
    import tomllib

    assert spec_from_table(tomllib.loads(s.to_toml())) == s  # what --dry-run prints is a loadable spec


def test_example_specs_load():
    from pathlib import Path

    specs = sorted((Path(__file__).resolve().parents[1] / "scripts" / "specs").glob("*.toml"))
    assert len(specs) >= 3
    for path in specs:
        s = load_spec(path)
        assert s.schedule.at(s.grid.gpus or 8).stages[-1].until_epoch == s.schedule.epochs, path


def test_the_production_spec_reads_the_set_its_comment_packs():
    """2,176 ranks on a plain folder would open a file per image on the shared file system's metadata server:
    the production spec reads a packed set, the one its comment's `data pack` command writes."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "specs" / "imagenet_2176.toml"
    packs = re.findall(r"^#\s+torus-train data pack --data (\S+) --out (\S+)$", path.read_text(), re.M)
    assert len(packs) == 1 and load_spec(path).data.source == packs[0][1] != packs[0][0]


def test_deterministic_and_decoder_fields():
    """job.deterministic is off by default (speed); data.decoder takes the decoders' table's names."""
    from torus_train.job.sources import DECODERS
    from torus_train.job.spec import load_spec, parse_override

    spec = load_spec(None)
    assert spec.job.deterministic is False and spec.data.decoder == "auto"
    assert DECODERS.names() == ("auto", "cpu", "gpu")
    on = load_spec(None, [parse_override("job.deterministic=true"), parse_override("data.decoder=gpu")])
    assert on.job.deterministic is True and on.data.decoder == "gpu"
    with pytest.raises(SpecError, match=re.escape("data.decoder: 'nvjpeg' is not one of auto, cpu, gpu")):
        load_spec(None, [parse_override("data.decoder=nvjpeg")])
    with pytest.raises(SpecError, match=re.escape("job.deterministic: expected true or false")):
        load_spec(None, [parse_override("job.deterministic=1")])
