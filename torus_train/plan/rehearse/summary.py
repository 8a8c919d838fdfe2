"""The rehearsal's tables and verdict (pure): per phase of the run, what the busiest rehearsed rank issued."""

from __future__ import annotations

from torus_train.plan.rehearse.rules import DATA_KINDS, communicators

DTYPE_BYTES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "bool": 1}


def nbytes(e: dict) -> int:
    """Bytes this rank puts into the collective (a pickle's own length for an object collective)."""
    return int(e.get("numel") or 0) * (1 if e.get("dtype") == "pickle" else DTYPE_BYTES.get(e.get("dtype") or "", 4))


def phase_table(traces: dict[int, dict]) -> list[dict]:
    """One row per phase, in the order phases first appear: collectives, bytes, communicators used, groups
    made and captured collectives, each the largest over the rehearsed ranks."""
    rows: dict[str, dict] = {}
    for t in traces.values():
        mine: dict[str, dict] = {}
        for e in t["events"]:
            row = mine.setdefault(
                e["phase"], {"collectives": 0, "bytes": 0, "comms": set(), "groups": 0, "captured": 0}
            )
            if e["kind"] == "group":
                row["groups"] += 1
            elif e["kind"] in DATA_KINDS:
                row["collectives"] += 1
                row["bytes"] += nbytes(e)
                row["comms"].add(e["group"])
                row["captured"] += bool(e.get("captured"))
        for phase, row in mine.items():
            best = rows.setdefault(
                phase,
                {"phase": phase, "collectives": 0, "bytes": 0, "communicators": 0, "groups_made": 0, "captured": 0},
            )
            best["collectives"] = max(best["collectives"], row["collectives"])
            best["bytes"] = max(best["bytes"], row["bytes"])
            best["communicators"] = max(best["communicators"], len(row["comms"]))
            best["groups_made"] = max(best["groups_made"], row["groups"])
            best["captured"] = max(best["captured"], row["captured"])
    return [r for r in rows.values() if r["collectives"] or r["groups_made"]]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def report_text(result: dict, traces_comms: dict[str, dict[int, tuple[int, int]]] | None = None) -> str:
    """The tables (one per leg), the communicators per rank, the findings and the verdict line."""
    lines = [
        f"# rehearsal of {result['spec']}: world {result['world']} (grid {result['grid']}), ranks "
        f"{', '.join(map(str, result['ranks']))}, {result['image_size']} px synthetic images"
    ]
    for leg, rows in result["phases"].items():
        lines.append(
            f"# {leg} leg{' (resumed from the first leg' + chr(39) + 's checkpoint)' if leg == 'resumed' else ''}"
        )
        lines.append(f"{'phase':<36} {'collectives':>11} {'bytes':>11} {'comms':>6} {'groups':>7} {'captured':>9}")
        for row in rows:
            lines.append(
                f"{row['phase']:<36} {row['collectives']:>11} {_size(row['bytes']):>11} "
                f"{row['communicators']:>6} {row['groups_made']:>7} {row['captured']:>9}"
            )
    for leg, per_rank in (result.get("communicators") or {}).items():
        text = ", ".join(f"rank {r}: {c[0]} communicators, {c[1]} p2p peers" for r, c in per_rank.items())
        lines.append(f"# {leg}: {text}")
    lines += findings_text(result["findings"])
    n = len(result["findings"])
    verdict = "passes every rule" if n == 0 else f"FAILS: {n} finding(s)"
    lines.append(
        f"# verdict: {verdict} ({result['seconds']:.0f} s, {result['seconds_per_rank']:.1f} s per rehearsed rank)"
    )
    return "\n".join(lines)


def communicator_counts(traces: dict[int, dict]) -> dict[int, tuple[int, int]]:
    return {r: communicators(t) for r, t in traces.items()}


def findings_text(findings: list[dict]) -> list[str]:
    """One line per kind of finding (rule, collective, line of code, what is wrong), with the ranks and phases
    that showed it and how often: a broken rule repeats at every step of every rank."""
    groups: dict[tuple, list[dict]] = {}
    for f in findings:
        said = f.get("message") or f["text"]
        groups.setdefault((f["leg"], f["rule"], f["op"], f["where"], said), []).append(f)
    lines = []
    for (leg, rule, op, where, said), found in groups.items():
        ranks = ",".join(str(r) for r in sorted({f["rank"] for f in found}))
        phases = ", ".join(dict.fromkeys(str(f["phase"]) for f in found))
        times = f", {len(found)} times" if len(found) > 1 else ""
        lines.append(f"FLAGGED ({leg} leg) {rule}: rank {ranks} ({phases}{times}; {op} at {where}): {said}")
    return lines
