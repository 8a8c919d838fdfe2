"""One rank of the transport test, started by `mpirun` across the namespace nodes (each process a rank).

Builds the grid groups as training does (torus_train.ranks.distributed.init_distributed), then runs one torus
all-reduce of SIZE bytes while counting the bytes this node sent on eth0 (the link to the other node) and on
lo (loopback TCP), from /proc/net/dev, which belongs to the node's network namespace. Prints one JSON line.
"""

from __future__ import annotations

import json
import socket
import sys

SIZE = 16 << 20


def tx_bytes() -> dict[str, int]:
    out = {}
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            out[name.strip()] = int(data.split()[8])
    return out


def main() -> None:
    import torch
    import torch.distributed as dist

    from torus_train.comm.algos import allreduce
    from torus_train.job.topology import Grid
    from torus_train.ranks.distributed import init_distributed

    grid = Grid(2, 2, 2)
    boot = init_distributed(grid, timeout_s=60)
    g = boot.groups
    rank = boot.info.rank
    names = [None] * grid.size
    dist.all_gather_object(names, socket.gethostname())
    t = torch.full((SIZE // 4,), float(rank + 1))
    allreduce(t.clone(), "torus", g)  # warm-up: connections and shared memory set up outside the count
    dist.barrier()
    before = tx_bytes()
    dist.barrier()
    out = allreduce(t, "torus", g)
    dist.barrier()
    after = tx_bytes()
    expected = float(sum(range(1, grid.size + 1)))
    print(
        json.dumps(
            {
                "rank": rank,
                "host": socket.gethostname(),
                "row": g.row,
                "col": g.col,
                "row_hosts": sorted({names[r] for r in grid.row_ranks(g.row)}),
                "col_hosts": sorted({names[r] for r in grid.col_ranks(g.col)}),
                "shm_row": g.rows.kind == "shm",
                "notes": g.notes,
                "sent_eth0": after.get("eth0", 0) - before.get("eth0", 0),
                "sent_lo": after.get("lo", 0) - before.get("lo", 0),
                "correct": bool(torch.all(out == expected)),
            }
        ),
        flush=True,
    )
    g.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
