"""NCCL's rules and the costs that grow with the world, checked over the rehearsed ranks' traces (pure).

    findings = check_traces({rank: trace, ...}, gpu_memory_gib)     [] when every rule holds

A trace is what plan/rehearse/record.py wrote for one rank: {"rank", "world", "members": {label: ranks},
"events": [...]}. Each finding is a dict: rule, rank, phase, op, where, text (one line naming all of them).

The rules (nccl-at-scale.md, NCCL's user guide):
- same-order: every member of a communicator issues the same collectives (op, size, root, element count, dtype,
  captured or not) in the same order, else the job hangs at scale;
- same-groups: every rank makes the same groups in the same order; with a bound device torch may make even a
  group of members only (use_local_synchronization) by splitting the world's communicator, so that counts too;
- grid-groups: each rank's row and column groups, as torch made them at the full world size, hold the grid's
  row and column (record.py notes them; rank.py note_grid_groups);
- no-fan-in: after start-up nothing gathers or scatters to one rank, moves objects, or sends point to point
  over the device backend; and the communicators a rank holds, with NCCL's buffers, fit beside the model;
- timeouts: host work that can outlast the process group's timeout (staging) is followed by a wait on the
  store, never straight by a device collective whose timeout it would run into;
- capture: no rank captures a collective before every rank agreed to capture (a consensus in the graph
  probe); and on each communicator captured and uncaptured collectives are separated by a synchronisation
  (NCCL_GRAPH_MIXING_SUPPORT=0 then holds);
- replay: no uncaptured collective on a communicator while a replay may be outstanding on it (a graph launch
  returns at once; its collectives are in flight until a synchronisation), e.g. an eager step of another batch
  shape between replays.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise, zip_longest

STARTUP = ("start-up", "resume")
"""Phases that run once per process: object collectives there are a start-up cost, not a per-step one."""
DATA_KINDS = ("collective", "fan-in", "object", "p2p")
FAN_OPS = ("gather", "scatter", "gather_object", "scatter_object_list")
"""To or from one rank: on NCCL point to point with every peer."""
NCCL_BUFFSIZE_MIB = 4.0
NCCL_CHANNELS = 16
"""NCCL's documented defaults: NCCL_BUFFSIZE 4 MiB per channel and connection; up to 16 rings' channels (more
on NVSwitch systems). A communicator's buffers are then about BUFFSIZE x channels x 2 (send and receive)."""
P2P_CHANNELS = 2
"""NCCL_NCHANNELS_PER_NET_PEER: a point-to-point connection's channels (each with its own buffers)."""


def check_traces(traces: dict[int, dict], gpu_memory_gib: float = 16.0) -> list[dict]:
    found: list[dict] = []
    for rule in (same_order, same_groups, grid_groups, no_fan_in, timeouts, capture, replays):
        found += rule(traces)
    found += memory(traces, gpu_memory_gib)
    return found


def _finding(rule: str, rank: int, e: dict, text: str) -> dict:
    where = f"{e.get('phase', '?')}, {e.get('op', '?')} at {e.get('where', '?')}"
    return {
        "rule": rule,
        "rank": rank,
        "phase": e.get("phase"),
        "op": e.get("op"),
        "where": e.get("where"),
        "message": text,
        "text": f"{rule}: rank {rank} ({where}): {text}",
    }


def _signature(e: dict) -> tuple:
    numel = None if e["kind"] == "object" else e.get("numel")  # pickles differ in length from rank to rank
    return (e["op"], e.get("size"), e.get("root"), numel, e.get("dtype"), e.get("captured"))


def _on(trace: dict, label: str) -> list[dict]:
    return [e for e in trace["events"] if e["kind"] in DATA_KINDS and e["kind"] != "p2p" and e["group"] == label]


def same_order(traces: dict[int, dict]) -> list[dict]:
    """For each communicator, the rehearsed ranks that are its members issue the same sequence on it."""
    found = []
    labels = {"world": None} | {k: v for t in traces.values() for k, v in t.get("members", {}).items()}
    for label, members in labels.items():
        seqs = {r: _on(t, label) for r, t in sorted(traces.items()) if members is None or r in members}
        ref = _usual(seqs)
        for r, seq in seqs.items():
            if r != ref:
                found += _first_divergence(label, ref, seqs[ref], r, seq)
    return found


def _usual(seqs: dict[int, list[dict]]) -> int:
    """The rank whose sequence most ranks share (the lowest of them): the others are compared with it, so that
    one odd rank is named once rather than by each of its neighbours."""
    keys = {r: tuple(map(_signature, seq)) for r, seq in seqs.items()}
    counts = Counter(keys.values())
    return min(keys, key=lambda r: (-counts[keys[r]], r))


def _first_divergence(label: str, a: int, ea: list[dict], b: int, eb: list[dict]) -> list[dict]:
    for i in range(max(len(ea), len(eb))):
        x = ea[i] if i < len(ea) else None
        y = eb[i] if i < len(eb) else None
        if x is not None and y is not None and _signature(x) == _signature(y):
            continue
        if x is None:
            assert y is not None
            return [
                _finding(
                    "same-order",
                    b,
                    y,
                    f"issues it as collective #{i + 1} on communicator {label}, "
                    f"which rank {a} never issues (a hang at scale)",
                )
            ]
        other = "nothing" if y is None else f"{y['op']} ({y['phase']}, {y['where']})"
        return [
            _finding(
                "same-order",
                a,
                x,
                f"collective #{i + 1} on communicator {label} differs from rank "
                f"{b}'s: {_describe(x)} against {other}; {_describe(y) if y else ''}".rstrip("; "),
            )
        ]
    return []


def _describe(e: dict) -> str:
    root = f", root {e['root']}" if e.get("root") is not None else ""
    cap = ", captured" if e.get("captured") else ""
    return f"{e['op']} of {e.get('numel')} {e.get('dtype')}{root}{cap}"


def same_groups(traces: dict[int, dict]) -> list[dict]:
    """Every rehearsed rank makes the same groups in the same order; a group of members only is flagged."""
    found = []
    made = {r: [e for e in t["events"] if e["kind"] == "group"] for r, t in traces.items()}
    for r, events in made.items():
        found += [
            _finding(
                "same-groups",
                r,
                e,
                "a group of members only (use_local_synchronization): with a bound "
                "device torch may split the world's communicator for it, which every rank must join",
            )
            for e in events
            if e.get("local")
        ]
    for a, b in pairwise(sorted(made)):
        for i, (x, y) in enumerate(zip_longest(made[a], made[b])):
            if x is not None and y is not None and _made(x) == _made(y):
                continue
            r, e, other = (a, x, b) if x is not None else (b, y, a)
            found.append(
                _finding(
                    "same-groups",
                    r,
                    e,
                    f"group creation #{i + 1} is not rank {other}'s "
                    f"({'it makes none' if (y if r == a else x) is None else 'it makes another'})",
                )
            )
            break
    return found


def _made(e: dict) -> tuple:
    return (e["op"], e["groups"], e["sizes"], e["members"])


def grid_groups(traces: dict[int, dict]) -> list[dict]:
    """Each rehearsed rank's row and column groups hold the grid's row and column."""
    return [
        _finding(
            "grid-groups",
            r,
            e,
            f"its {e['side']} group holds {e['got']}, not {e['side']} {e['index']} of the grid ({e['want']})",
        )
        for r, t in traces.items()
        for e in t["events"]
        if e["kind"] == "grid-group" and not e["ok"]
    ]


def no_fan_in(traces: dict[int, dict]) -> list[dict]:
    """No gather, scatter, object collective or point-to-point after start-up."""
    return [
        _finding(
            "no-fan-in",
            r,
            e,
            f"{e['kind']} collective over the device backend after start-up "
            f"(every step or checkpoint pays it; at {t['world']} ranks a fan-in is {t['world'] - 1} transfers)",
        )
        for r, t in traces.items()
        for e in t["events"]
        if e["kind"] in ("fan-in", "object", "p2p") and e["phase"] not in STARTUP
    ]


def timeouts(traces: dict[int, dict]) -> list[dict]:
    """After slow host work, the next wait is on the store, not a device collective."""
    found = []
    for r, t in traces.items():
        pending = None
        for e in t["events"]:
            if e["kind"] == "host-work" and e.get("slow"):
                pending = e
            elif e["kind"] == "store-barrier":
                pending = None
            elif pending is not None and e["kind"] in DATA_KINDS:
                found.append(
                    _finding(
                        "timeouts",
                        r,
                        e,
                        f"waits in a device collective right after "
                        f"{pending['op']} ({pending['where']}), which can outlast the group's timeout",
                    )
                )
                pending = None
    return found


def capture(traces: dict[int, dict]) -> list[dict]:
    """No captured collective before the probe's consensus; no mixing without a synchronisation between (an
    uncaptured collective right after a replay's is the replay rule's finding, named once there)."""
    found = []
    for r, t in traces.items():
        decided, last_mode, after_replay = False, dict[str, bool](), set[str]()
        for e in t["events"]:
            if e["kind"] == "decision" and "graph probe" in e["phase"]:
                decided = decided or e.get("ok", False)
            elif e["kind"] == "sync":
                last_mode, after_replay = {}, set()
            elif e["kind"] in DATA_KINDS:
                if e.get("captured") and not e.get("replay") and not decided:
                    found.append(_finding("capture", r, e, "captured before every rank agreed to capture"))
                    decided = True  # one finding per probe is enough
                mode, group = bool(e.get("captured")), e["group"]
                if last_mode.get(group, mode) != mode and not (group in after_replay and not mode):
                    found.append(
                        _finding(
                            "capture",
                            r,
                            e,
                            f"communicator {group} switches between captured "
                            "and uncaptured collectives with no synchronisation between",
                        )
                    )
                last_mode[group] = mode
                if e.get("replay"):
                    after_replay.add(group)
                else:
                    after_replay.discard(group)
            if e["kind"] == "probe":
                decided = False
    return found


def replays(traces: dict[int, dict]) -> list[dict]:
    """No uncaptured collective on a communicator with a replay outstanding on it: a graph launch returns at
    once and its collectives stay in flight until a device synchronisation, and with NCCL_GRAPH_MIXING_SUPPORT=0
    (ranks/worker.py) NCCL does not order an uncaptured collective after them."""
    found = []
    for r, t in traces.items():
        outstanding: set[str] = set()
        for e in t["events"]:
            if e["kind"] == "sync":
                outstanding = set()
            elif e["kind"] in DATA_KINDS and e.get("replay"):
                outstanding.add(e["group"])
            elif e["kind"] in DATA_KINDS and not e.get("captured") and e["group"] in outstanding:
                found.append(
                    _finding(
                        "replay",
                        r,
                        e,
                        f"an uncaptured {e['op']} on communicator {e['group']} while a replay's collectives may "
                        "still be in flight on it (no synchronisation since the replay)",
                    )
                )
                outstanding.discard(e["group"])  # one finding per replay and communicator
    return found


def memory(traces: dict[int, dict], gpu_memory_gib: float) -> list[dict]:
    """The communicators and point-to-point peers of each rank, with NCCL's buffers, against the GPU's memory:
    a finding when they would take more than a tenth of it."""
    found = []
    for r, t in traces.items():
        comms, peers = communicators(t)
        mib = comms * NCCL_BUFFSIZE_MIB * NCCL_CHANNELS * 2 + peers * NCCL_BUFFSIZE_MIB * P2P_CHANNELS * 2
        if mib > gpu_memory_gib * 1024 / 10:
            data = [e for e in t["events"] if e["kind"] in DATA_KINDS]
            first = next((e for e in data if e["op"] in FAN_OPS or e["kind"] == "p2p"), data[0])
            found.append(
                _finding(
                    "no-fan-in",
                    r,
                    first,
                    f"{comms} communicators and {peers} point-to-point "
                    f"peers: about {mib / 1024:.1f} GiB of NCCL buffers on a {gpu_memory_gib:g} GiB GPU",
                )
            )
    return found


def communicators(trace: dict) -> tuple[int, int]:
    """(communicators this rank uses, point-to-point peers it has); a gather or object collective to or from
    one rank over NCCL is point to point from every peer (the root connects to world - 1 of them)."""
    events = [e for e in trace["events"] if e["kind"] in DATA_KINDS]
    comms = len({e["group"] for e in events if e["kind"] != "p2p"})
    fan = any(e["op"] in FAN_OPS for e in events)
    peers = len({e.get("root") for e in events if e["kind"] == "p2p"})
    if fan:
        peers = max(peers, trace["world"] - 1 if trace["rank"] == 0 else 1)
    return comms, peers
