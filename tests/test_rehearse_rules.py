"""The rehearsal's rules (plan/rehearse/rules.py) over traces that the recorder (record.py) took of real
torch.distributed calls on the fake backend, one rank at a time in this process: each test breaks one rule on
purpose and the finding names the rank, the phase and the collective; the same workload without the break passes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from torus_train.comm import collectives
from torus_train.plan.rehearse.record import Recorder, span_text
from torus_train.plan.rehearse.rules import check_traces

WORLD = 4


def traces_of(workload, world: int = WORLD, ranks=range(WORLD)) -> dict[int, dict]:
    """workload(rank, recorder) run as each rank of a fake world; {rank: trace}."""
    out = {}
    for rank in ranks:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        rec = Recorder(rank, world)
        rec.install()
        try:
            workload(rank, rec)
        finally:
            rec.uninstall()
            dist.destroy_process_group()
        out[rank] = {"rank": rank, "world": world, "members": rec.members, "events": rec.events}
    return out


def steps(rank: int, rec: Recorder, extra=None) -> None:
    rec.phase = "start-up"
    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    row = rows[rank // 2]
    rec.phase = "steps (stage 1)"
    for _ in range(2):
        collectives.reduce_scatter(torch.zeros(3), torch.zeros(6), group=row)  # the name this torch gives it
        dist.all_reduce(torch.zeros(2))
    if extra:
        extra(rank, rec)


def test_the_same_workload_on_every_rank_passes():
    assert check_traces(traces_of(steps)) == []


def test_a_collective_only_some_ranks_issue_is_named_with_its_rank_and_phase():
    def lone(rank, rec):
        if rank == 2:
            dist.all_reduce(torch.zeros(5))  # only rank 2: the others would wait for ever at scale

    found = check_traces(traces_of(lambda r, rec: steps(r, rec, lone)))
    assert [f["rule"] for f in found] == ["same-order"]
    f = found[0]
    assert f["rank"] == 2 and f["phase"] == "steps (stage 1)" and f["op"] == "all_reduce"
    assert "collective #3 on communicator world" in f["text"] and "rank 0 never issues" in f["text"]
    assert "test_rehearse_rules.py" in f["where"]


def test_a_gather_to_rank_0_after_start_up_is_named():
    def gather(rank, rec):
        rec.phase = "checkpoint"
        dist.gather_object({"rank": rank}, [None] * WORLD if rank == 0 else None, dst=0)

    found = check_traces(traces_of(lambda r, rec: steps(r, rec, gather)))
    assert {f["rule"] for f in found} == {"no-fan-in"}
    assert {f["rank"] for f in found} == set(range(WORLD))
    assert all(f["phase"] == "checkpoint" and f["op"] == "gather_object" for f in found)
    assert "object collective over the device backend after start-up" in found[0]["text"]


def test_a_gather_at_start_up_is_a_start_up_cost_not_a_finding():
    def at_start(rank, rec):
        rec.phase = "start-up"
        dist.all_gather_object([None] * WORLD, rank)

    assert check_traces(traces_of(lambda r, rec: steps(r, rec, at_start))) == []


def test_groups_made_in_another_order_are_named():
    def workload(rank, rec):
        rec.phase = "start-up"
        order = ([0, 1], [2, 3]) if rank != 3 else ([2, 3], [0, 1])
        for members in order:
            dist.new_group(members)

    found = check_traces(traces_of(workload))
    assert found and all(f["rule"] == "same-groups" for f in found)
    assert found[0]["rank"] == 2 and found[0]["phase"] == "start-up" and found[0]["op"] == "new_group"
    assert "group creation #1 is not rank 3's" in found[0]["text"]


def test_a_group_of_members_only_is_flagged():
    def workload(rank, rec):
        rec.phase = "resume"
        node = [0, 1] if rank < 2 else [2, 3]
        dist.new_group(node, use_local_synchronization=True)

    found = check_traces(traces_of(workload))
    assert any("use_local_synchronization" in f["text"] and f["phase"] == "resume" for f in found)


def test_slow_host_work_then_a_device_barrier_is_named_and_a_store_wait_passes():
    def staged(wait_on_store):
        def workload(rank, rec):
            rec.phase = "start-up"
            if rank % 2 == 0:
                rec.note("host-work", "staging the data set on the node", slow=True)
            if wait_on_store:
                rec.note("store-barrier", "staged")
            dist.barrier()

        return workload

    found = check_traces(traces_of(staged(False)))
    assert [f["rule"] for f in found] == ["timeouts", "timeouts"] and {f["rank"] for f in found} == {0, 2}
    assert "staging the data set on the node" in found[0]["text"] and found[0]["op"] == "barrier"
    assert check_traces(traces_of(staged(True))) == []


def test_a_capture_before_the_decision_and_mixing_without_a_sync_are_named():
    def capture(decide_first, sync):
        def workload(rank, rec):
            rec.phase = "steps (stage 1): graph probe"
            rec.note("probe", "graph probe")
            if decide_first:
                rec.note("decision", "consensus", ok=True)
            rec.mode = "capture"
            dist.all_reduce(torch.zeros(2))
            rec.mode = "eager"
            if sync:
                rec.note("sync", "torch.cuda.synchronize")
            dist.all_reduce(torch.zeros(2))

        return workload

    found = check_traces(traces_of(capture(False, True), ranks=[0, 1]))
    assert {f["rule"] for f in found} == {"capture"} and "before every rank agreed" in found[0]["text"]
    found = check_traces(traces_of(capture(True, False), ranks=[0, 1]))
    assert [f["rule"] for f in found] == ["capture", "capture"] and "no synchronisation" in found[0]["text"]
    assert check_traces(traces_of(capture(True, True), ranks=[0, 1])) == []


def test_a_fan_in_at_full_size_is_weighed_against_the_gpu():
    def gather(rank, rec):
        rec.phase = "start-up"
        dist.gather_object(rank, [None] * 2176 if rank == 0 else None, dst=0)

    found = check_traces(traces_of(gather, world=2176, ranks=[0]), gpu_memory_gib=16)
    assert len(found) == 1 and "2175 point-to-point peers" in found[0]["text"] and "16 GiB GPU" in found[0]["text"]


@pytest.mark.parametrize(
    "members, text",
    [
        ([0, 1, 2, 3], "0-3"),
        (list(range(31, 2176, 32)), "31,63,...,2175 (68)"),
        ([5], "5"),
        ([0, 1, 5, 9], "0,1,...,9 (4, irregular)"),
    ],
)
def test_a_group_is_named_in_a_few_characters(members, text):
    assert span_text(members) == text


def test_every_recorded_collective_names_what_this_rank_sends():
    """The recorder's table names each collective's input argument as torch spells it (a wrong name records 0)."""
    from torus_train.comm.collectives import all_gather, reduce_scatter

    def workload(rank, rec):
        rec.phase = "steps (stage 1)"
        reduce_scatter(torch.zeros(3), torch.zeros(6))
        all_gather(torch.zeros(6), torch.zeros(3))

    events = traces_of(workload, world=2, ranks=[0])[0]["events"]
    assert [(e["numel"], e["dtype"]) for e in events] == [(6, "float32"), (3, "float32")], events


def test_a_rank_whose_row_or_column_group_is_not_the_grids_is_named():
    """The groups build_grid_groups makes at the full world size hold the grid's row and column; a row group that
    holds a column is named with the rank and both member lists."""
    from torus_train.comm.groups import build_grid_groups
    from torus_train.job.topology import Grid
    from torus_train.plan.rehearse.rank import note_grid_groups

    grid = Grid(32, 68, 4)

    def workload(swap):
        def run(rank, rec):
            g = build_grid_groups(grid)
            if swap:
                g.row_group, g.col_group = g.col_group, g.row_group
            note_grid_groups(rec, g)

        return run

    assert check_traces(traces_of(workload(False), world=grid.size, ranks=[0, 2175])) == []
    found = check_traces(traces_of(workload(True), world=grid.size, ranks=[33]))
    assert [(f["rule"], f["rank"]) for f in found] == [("grid-groups", 33), ("grid-groups", 33)]
    assert "its row group holds 1,33,...,2145 (68), not row 1 of the grid (32-63)" in found[0]["text"]


def test_an_uncaptured_collective_with_a_replay_outstanding_is_named_once():
    """A replay's collectives stay in flight until a synchronisation: an uncaptured one on the same communicator
    before it is the replay rule's finding (named once, not also as mixing); on another communicator, or after
    a synchronisation, it passes."""

    def workload(sync, other_group=False):
        def run(rank, rec):
            rec.phase = "steps (stage 1)"
            row = dist.new_group([0, 1])
            rec.mode = "replay"
            dist.all_reduce(torch.zeros(2), group=row)
            rec.mode = "eager"
            if sync:
                rec.note("sync", "torch.cuda.synchronize")
            dist.all_reduce(torch.zeros(2), group=None if other_group else row)

        return run

    found = check_traces(traces_of(workload(False), ranks=[0, 1]))
    assert [f["rule"] for f in found] == ["replay", "replay"] and {f["rank"] for f in found} == {0, 1}
    assert "while a replay's collectives may still be in flight on it" in found[0]["text"]
    assert check_traces(traces_of(workload(True), ranks=[0, 1])) == []
    assert check_traces(traces_of(workload(False, other_group=True), ranks=[0, 1])) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("synchronised", [True, False])
def test_the_eager_step_of_another_shape_between_replays_keeps_the_rules(tmp_path, monkeypatch, synchronised):
    """The graphed step as a rehearsed rank runs it (the fake backend at 2x2, torch.cuda's graph calls played on
    the CPU): warm-up, probe, replays, a batch of another shape (eager), a replay. With its synchronisations the
    trace passes every rule; without them (the old path) the replay rule names the eager step's first
    collective and the capture rule the next replay's."""
    from torus_train.check.smallrun import small_spec
    from torus_train.comm import consensus as consensus_module
    from torus_train.job.topology import Grid
    from torus_train.plan.rehearse.cuda import CudaStandIn
    from torus_train.plan.rehearse.rank import bind_device, bootstrap, install_phases
    from torus_train.train import graphs, loop
    from torus_train.train.stop import StopRequest

    if not synchronised:  # the old path: the eager step straight after a replay
        monkeypatch.setattr(
            graphs.StepGraph, "_eager_between_replays", lambda self, rs, x, y: graphs.step_body(rs, x, y, 1)
        )
    extra = ("grid.gpus=4", "grid.grid=2x2")
    spec = small_spec(tmp_path, 16, 8, cuda_graphs="auto", extra=extra)
    rec = Recorder(0, 4)
    standin = CudaStandIn(rec)
    rec.install()
    standin.install()
    try:
        with install_phases(rec):
            boot = bootstrap(spec, Grid(2, 2), 0)
            with bind_device():
                rs = loop.start(spec, boot, tmp_path, StopRequest())
                g = graphs.StepGraph(agree=lambda why: consensus_module.consensus(why, boot.device), warmup=1)
                rec.phase = "steps (stage 1)"
                for n in (4, 4, 4, 4, 3, 4):  # warm-up, probe, two replays, another shape, a replay
                    g.step(rs, torch.zeros(n, 3, 32, 32), torch.zeros(n, dtype=torch.long), 1)
                rs.ddp.close()
    finally:
        standin.uninstall()
        rec.uninstall()
        dist.destroy_process_group()
    events = rec.events
    assert sum(1 for e in events if e.get("replay")) > 0 and any(e["kind"] == "probe" for e in events)
    replayed = [i for i, e in enumerate(events) if e.get("replay")]
    between = [e for e in events[replayed[0] :] if e["kind"] == "collective" and not e["captured"]]
    assert between and events[replayed[-1]]["replay"]  # the other shape's eager exchange, after a replay
    found = check_traces({0: {"rank": 0, "world": 4, "members": rec.members, "events": events}})
    if synchronised:
        assert found == []
    else:
        rules = [f["rule"] for f in found]
        assert "replay" in rules and "capture" in rules and set(rules) == {"replay", "capture"}, rules
        first = next(f for f in found if f["rule"] == "replay")
        assert "uncaptured" in first["text"] and first["phase"] == "steps (stage 1)"
