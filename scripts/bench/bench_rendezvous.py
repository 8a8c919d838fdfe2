#!/usr/bin/env python3
"""The rendezvous of N ranks on torch's TCPStore, on this machine (loopback), side by side for several N.

    python scripts/bench/bench_rendezvous.py                          # 8 and 2,176 ranks, 4 client processes
    python scripts/bench/bench_rendezvous.py --ranks 8,2176 --procs 4 --json rendezvous.json

What a rank does at start-up, as `dist.init_process_group(init_method="tcp://MASTER_ADDR:MASTER_PORT")` does it:
rank 0 creates the store server (``TCPStore(host, port, N, is_master=True, wait_for_workers=True)``, which also
connects rank 0's own client and returns once all N clients have joined); every other rank creates a client
(``TCPStore(host, port, N, is_master=False)``); then every rank passes a store barrier (``add`` a counter; the
last one sets a key; everyone ``wait``s for that key), the pattern torch's store-based barrier uses.

Rank 0 runs in this process; the other N-1 clients are threads spread over --procs worker processes (a rank's
client is a C++ object whose calls release the GIL). The worker processes import torch and start their threads
before the clock starts; the clock runs from "go" until the last client has passed the barrier. Columns:
connected = rank 0's server saw all N clients; barrier = every client passed the barrier (the figure).

Names: torch's client calls getnameinfo() on every socket it connects, to name it in a log line; for the
v4-mapped loopback address that is a reverse DNS query, and where the resolver cannot answer (a sandbox
without DNS) each query waits out the resolver timeout (5 s). By default the clients run with a tiny
LD_PRELOAD shim (built with cc) that asks getnameinfo for numeric hosts only, so the figure is the store's own
(rank 0's server names every socket it accepts too, so the script restarts itself with the shim preloaded);
--system-resolver measures with the machine's resolver as it is. A cluster's reverse DNS adds its own latency
per rank in the same place.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

HOST = "127.0.0.1"


SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
typedef int (*gni_t)(const struct sockaddr *, socklen_t, char *, socklen_t, char *, socklen_t, int);
int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen, char *serv,
                socklen_t servlen, int flags) {
    static gni_t real;
    if (!real) real = (gni_t)dlsym(RTLD_NEXT, "getnameinfo");
    return real(sa, salen, host, hostlen, serv, servlen, (flags | NI_NUMERICHOST) & ~NI_NAMEREQD);
}
"""


def numeric_names_shim(folder: str) -> str:
    """Build the getnameinfo shim; '' when there is no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return ""
    src, lib = os.path.join(folder, "numeric_names.c"), os.path.join(folder, "numeric_names.so")
    with open(src, "w") as f:
        f.write(SHIM)
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", lib, src, "-ldl"], capture_output=True, text=True)
    return lib if r.returncode == 0 else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def barrier(store, n: int) -> None:
    """Every rank: count in; the last one in opens the gate; everyone waits for the gate."""
    if store.add("bench/barrier", 1) == n:
        store.set("bench/open", "1")
    store.wait(["bench/open"])


def client_proc(port: int, n: int, count: int, timeout: float, ready, go, results) -> None:
    """Worker process: `count` client threads, each one rank's store client, started on `go`."""
    import torch.distributed as dist

    done: list[float] = []
    errors: list[str] = []
    start = threading.Barrier(count + 1)

    def one() -> None:
        start.wait()
        try:
            store = dist.TCPStore(HOST, port, n, False, timedelta(seconds=timeout))
            barrier(store, n)
            done.append(time.monotonic())
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    ready.put(True)
    go.wait()
    start.wait()
    for t in threads:
        t.join(timeout + 5)
    results.put({"done": max(done) if done else None, "ok": len(done), "errors": errors[:3]})


def round_once(n: int, procs: int, timeout: float) -> dict:
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    port = free_port()
    others = n - 1
    procs = max(1, min(procs, others)) if others else 0
    shares = [others // procs + (i < others % procs) for i in range(procs)]
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = [
        ctx.Process(target=client_proc, args=(port, n, k, timeout, ready, go, results), daemon=True) for k in shares
    ]
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=timeout)
    box: dict = {}

    def rank0() -> None:
        try:
            store = dist.TCPStore(HOST, port, n, True, timedelta(seconds=timeout), wait_for_workers=True)
            box["connected"] = time.monotonic()
            barrier(store, n)
            box["done"] = time.monotonic()
            box["store"] = store  # keep the server up until every client has passed
        except Exception as e:
            box["error"] = f"{type(e).__name__}: {e}"

    t0 = time.monotonic()
    server = threading.Thread(target=rank0, daemon=True)
    server.start()
    go.set()
    outs = [results.get(timeout=timeout + 10) for _ in workers]
    server.join(timeout + 5)
    for w in workers:
        w.join(10)
    errors = [e for o in outs for e in o["errors"]] + ([box["error"]] if "error" in box else [])
    ok = sum(o["ok"] for o in outs) + ("done" in box)
    if errors or ok != n:
        raise SystemExit(f"bench_rendezvous: {n} ranks: {ok} passed the barrier; {errors[:3]}")
    last = max([box["done"], *(o["done"] for o in outs)])
    return {"clients": n, "procs": procs, "connected_seconds": box["connected"] - t0, "seconds": last - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="8,2176", help="comma-separated numbers of ranks (clients incl. rank 0)")
    ap.add_argument("--procs", type=int, default=4, help="worker processes that hold the client threads")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per size; the table shows the median")
    ap.add_argument("--timeout", type=float, default=120.0, help="store timeout and wait bound, seconds")
    ap.add_argument(
        "--system-resolver",
        action="store_true",
        help="no getnameinfo shim: clients wait for this machine's reverse DNS as it is",
    )
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    sizes = [int(v) for v in args.ranks.split(",")]
    names = "system resolver"
    if not args.system_resolver:
        if "numeric_names.so" not in os.environ.get("LD_PRELOAD", ""):
            import tempfile

            lib = numeric_names_shim(tempfile.mkdtemp(prefix="bench_rendezvous-"))
            if lib:  # rank 0's server names every socket it accepts too: restart this process with the shim
                env = {**os.environ, "LD_PRELOAD": " ".join(filter(None, [os.environ.get("LD_PRELOAD"), lib]))}
                os.execve(sys.executable, [sys.executable, *sys.argv], env)
            names = "system resolver (no C compiler for the shim)"
        else:
            names = "numeric (getnameinfo shim)"
    print(
        f"# TCPStore rendezvous on {HOST}: {args.procs} client processes, median of {args.rounds} rounds, "
        f"client socket names: {names}"
    )
    rows = []
    for n in sizes:
        runs = sorted((round_once(n, args.procs, args.timeout) for _ in range(args.rounds)), key=lambda r: r["seconds"])
        mid = runs[len(runs) // 2]
        rows.append({**mid, "rounds": [round(r["seconds"], 4) for r in runs]})
        print(f"# {n} ranks: rounds {', '.join(f'{r:.3f}' for r in rows[-1]['rounds'])} s", file=sys.stderr)
    base = rows[0]["seconds"]
    print(f"{'clients':>8} {'procs':>6} {'connected s':>12} {'barrier s':>10} {'x first':>8}")
    for r in rows:
        print(
            f"{r['clients']:>8} {r['procs']:>6} {r['connected_seconds']:>12.3f} {r['seconds']:>10.3f} "
            f"{r['seconds'] / base:>8.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": HOST, "rounds": args.rounds, "names": names, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
