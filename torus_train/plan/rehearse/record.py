"""What one rehearsed rank issues to torch.distributed, in order (imports torch; plan/rehearse/rank.py installs it).

Recorder.install() wraps the public functions of torch.distributed that make groups or move data. Every call the
package makes through ``dist.<name>`` is recorded as one event (op, the group's members, root, element count,
dtype, captured or not, the run's phase, the calling line), then passed on to the fake backend, whose collectives
return at once. Calls torch makes inside those functions go to distributed_c10d's own globals and are not
recorded twice.

The fake backend moves no data, so values that would come from other ranks are filled in as a "symmetric
world" would give them: every peer sent what this rank sent (an all-gather repeats this rank's input), and what
rank 0 broadcast as an object is what rank 0's own rehearsal recorded (the oracle: rank 0 is rehearsed first).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import json
import pickle
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# name -> (kind, the argument holding the tensor this rank sends, the root argument)
COLLECTIVES: dict[str, tuple[str, str | None, str | None]] = {
    "all_reduce": ("collective", "tensor", None),
    "broadcast": ("collective", "tensor", "src"),
    "reduce": ("collective", "tensor", "dst"),
    "all_gather": ("collective", "tensor", None),
    "all_gather_into_tensor": ("collective", "input_tensor", None),
    "all_gather_single": ("collective", "input_tensor", None),
    "reduce_scatter": ("collective", "input_list", None),
    "reduce_scatter_tensor": ("collective", "input", None),
    "reduce_scatter_single": ("collective", "input", None),
    "all_to_all_single": ("collective", "input", None),
    "barrier": ("collective", None, None),
    "monitored_barrier": ("host-barrier", None, None),
    "gather": ("fan-in", "tensor", "dst"),
    "scatter": ("fan-in", "tensor", "src"),
    "send": ("p2p", "tensor", "dst"),
    "recv": ("p2p", "tensor", "src"),
    "isend": ("p2p", "tensor", "dst"),
    "irecv": ("p2p", "tensor", "src"),
    "gather_object": ("object", None, "dst"),
    "all_gather_object": ("object", None, None),
    "broadcast_object_list": ("object", None, "src"),
    "scatter_object_list": ("object", None, "src"),
}
GROUP_MAKERS = ("new_group", "split_group", "new_subgroups_by_enumeration", "new_subgroups")

_PACKAGE = "torus_train"
_SELF = "torus_train/plan/rehearse/"


def span_text(members: list[int]) -> str:
    """A member list in a few characters: '0-31', '31,63,...,2175 (68)', '0,5,9'."""
    if not members:
        return "-"
    if len(members) <= 3:
        return ",".join(map(str, members))
    step = members[1] - members[0]
    if all(b - a == step for a, b in itertools.pairwise(members)):
        if step == 1:
            return f"{members[0]}-{members[-1]}"
        return f"{members[0]},{members[1]},...,{members[-1]} ({len(members)})"
    return f"{members[0]},{members[1]},...,{members[-1]} ({len(members)}, irregular)"


def caller() -> str:
    """'train/state.py:140 checkpoint_state': the package's innermost line outside the rehearsal (else the
    innermost line outside torch and the rehearsal: a test's own workload)."""
    other = "?"
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        at = path.rfind(_PACKAGE + "/")
        if _SELF in path or "/torch/" in path:
            continue
        if at >= 0:
            return f"{path[at + len(_PACKAGE) + 1 :]}:{frame.lineno} {frame.name}"
        if other == "?":
            other = f"{path.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}"
    return other


class Recorder:
    """The trace of one rank: a list of event dicts, in the order the rank issued them."""

    def __init__(self, rank: int, world: int, oracle: list | None = None):
        self.rank, self.world = rank, world
        self.events: list[dict] = []
        self.phase = "start-up"
        self.mode = "eager"
        """eager | capture | replay: set by the rehearsal's CUDA graph stand-in (plan/rehearse/cuda.py)."""
        self.oracle = oracle
        """Rank 0's object broadcasts, in order (None on rank 0 itself, which records them)."""
        self.sent: list = []
        """Rank 0: the objects it broadcast, for the other ranks' oracle."""
        self._labels: dict[int, str] = {}
        self.members: dict[str, list[int]] = {}
        """Each communicator's label and its global ranks (for comparing the ranks that share it)."""
        self._depth = 0
        self._saved: dict[str, Any] = {}

    # --- installing -------------------------------------------------------------------------------------------
    def install(self) -> None:
        for name in (*COLLECTIVES, *GROUP_MAKERS):
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._saved[name] = original
            setattr(dist, name, self._wrap(name, original))
        self._saved["get_backend"] = dist.get_backend
        dist.get_backend = lambda group=None: "nccl"  # the fake backend plays NCCL

    def uninstall(self) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved = {}

    def _wrap(self, name: str, original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            if self._depth:
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            self._depth += 1
            try:
                if name in GROUP_MAKERS:
                    return self._group_made(name, bound.arguments, original(*args, **kwargs))
                event = self._collective(name, bound.arguments)
                self.events.append(event)
                if self._received(name, bound.arguments):
                    return None
                result = original(*args, **kwargs)
                self._after(name, bound.arguments)
                return result
            finally:
                self._depth -= 1

        return recorded

    # --- events -----------------------------------------------------------------------------------------------
    def note(self, kind: str, name: str, **fields) -> None:
        """A non-collective event: host work, a device synchronisation, a decision, a store barrier."""
        self.events.append({"kind": kind, "op": name, "phase": self.phase, "where": caller(), **fields})

    def label(self, group) -> tuple[str, list[int] | None]:
        if group is None or group is dist.GroupMember.WORLD:
            return "world", None
        key = id(group)
        members = dist.get_process_group_ranks(group)
        if key not in self._labels:
            self._labels[key] = span_text(members)
            self.members[self._labels[key]] = members
        return self._labels[key], members

    def _collective(self, name: str, a: dict) -> dict:
        kind, tensor_arg, root_arg = COLLECTIVES[name]
        group, members = self.label(a.get("group"))
        numel, dtype = _size(a.get(tensor_arg) if tensor_arg else None)
        if name in ("gather_object", "all_gather_object", "broadcast_object_list", "scatter_object_list"):
            numel, dtype = len(_pickled(a)), "pickle"
        root = a.get(root_arg) if root_arg else None
        if root is None and root_arg and a.get("group_" + root_arg) is not None:
            root = a.get("group_" + root_arg)
        return {
            "kind": kind,
            "op": name,
            "group": group,
            "size": len(members) if members is not None else self.world,
            "root": root,
            "numel": numel,
            "dtype": dtype,
            "captured": self.mode != "eager",
            "replay": self.mode == "replay",
            "phase": self.phase,
            "where": caller(),
        }

    def _group_made(self, name: str, a: dict, made):
        if name == "split_group":
            lists = [list(map(int, r)) for r in a["split_ranks"]]
        elif name == "new_subgroups_by_enumeration":
            lists = [list(map(int, r)) for r in a["ranks_per_subgroup_list"]]
        else:
            lists = [sorted(map(int, a.get("ranks") or range(self.world)))]
        local = bool(a.get("use_local_synchronization"))
        mine = next((r for r in lists if self.rank in r), None)
        self.events.append(
            {
                "kind": "group",
                "op": name,
                "groups": len(lists),
                "sizes": sorted({len(r) for r in lists}),
                "members": json.dumps(lists) if len(lists) == 1 else _digest(lists),
                "mine": span_text(mine) if mine is not None else None,
                "local": local,
                "phase": self.phase,
                "where": caller(),
            }
        )
        return made

    # --- what the fake backend does not fill in ---------------------------------------------------------------
    def _received(self, name: str, a: dict) -> bool:
        """An object broadcast this rank receives: filled in here (the fake backend would unpickle garbage) and
        not passed on. What rank 0 sends is kept for the oracle; from another root, the rank keeps its own."""
        if name != "broadcast_object_list":
            return False
        if a.get("src") == self.rank:
            if self.rank == 0:
                self.sent.append(list(a["object_list"]))
            return False
        if a.get("src") == 0 and self.oracle:
            a["object_list"][:] = self.oracle.pop(0)
        return True

    def _after(self, name: str, a: dict) -> None:
        if name == "all_gather":
            for out in a["tensor_list"]:
                out.copy_(a["tensor"])
        elif name in ("all_gather_into_tensor", "all_gather_single"):
            src, out = a.get("input_tensor", a.get("input")), a.get("output_tensor", a.get("output"))
            assert src is not None and out is not None
            out.view(-1).copy_(src.reshape(-1).repeat(out.numel() // max(src.numel(), 1)))
        elif name == "all_gather_object":
            a["object_list"][:] = [a["obj"]] * len(a["object_list"])
        elif name == "gather_object" and a.get("object_gather_list") is not None:
            a["object_gather_list"][:] = [a["obj"]] * len(a["object_gather_list"])

    def save(self, path: Path) -> None:
        path.write_text(
            json.dumps({"rank": self.rank, "world": self.world, "members": self.members, "events": self.events}) + "\n"
        )

    def save_oracle(self, path: Path) -> None:
        path.write_bytes(pickle.dumps(self.sent))


def _size(t) -> tuple[int, str | None]:
    if isinstance(t, torch.Tensor):
        return t.numel(), str(t.dtype).removeprefix("torch.")
    if isinstance(t, (list, tuple)) and t and isinstance(t[0], torch.Tensor):
        return sum(x.numel() for x in t), str(t[0].dtype).removeprefix("torch.")
    return 0, None


def _pickled(a: dict) -> bytes:
    obj = a.get("obj", a.get("object_list", a.get("scatter_object_input_list")))
    try:
        return pickle.dumps(obj)
    except Exception:
        return b""


def _digest(lists: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(lists).encode()).hexdigest()[:16]
