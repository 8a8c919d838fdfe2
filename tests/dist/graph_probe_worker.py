"""One rank of the graph probe's agreement check (started by tests/dist/test_graph_probe_dist.py): the real loop
on a 2x1 gloo grid with train/graphs.py's StepGraph over torch.cuda recorders (tests/graphfake.py); on the rank
named by FAIL_RANK the capture raises (FAIL=capture) or the replay differs (FAIL=mismatch). Writes JSON: the
choice, the lines said, the log of graph calls, the parameter digest."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: graphfake

from graphfake import install

from torus_train.check.smallrun import loop_run, small_spec
from torus_train.comm.consensus import consensus
from torus_train.job.topology import parse_grid
from torus_train.ranks.distributed import init_distributed, shutdown
from torus_train.train.graphs import StepGraph

rank = int(os.environ["RANK"])
out = Path(os.environ["CHECK_OUT"])
fake = install(setattr)
if rank == int(os.environ["FAIL_RANK"]):
    if os.environ["FAIL"] == "capture":
        fake.fail_capture = {1}
    else:
        fake.mismatch = True
boot = init_distributed(parse_grid("2x1"), 60)
said: list[str] = []
graph = StepGraph(said.append, warmup=1, agree=lambda why: consensus(why, boot.device))
try:
    run = loop_run(small_spec(out / f"run{rank}", 4, 4, cuda_graphs="off"), boot, out / f"run{rank}", graphs=graph)
finally:
    shutdown()
(out / f"rank{rank}.json").write_text(
    json.dumps(
        {"choice": run.choices["cuda_graphs"], "said": said, "log": [str(e) for e in fake.log], "digest": run.digest}
    )
)
