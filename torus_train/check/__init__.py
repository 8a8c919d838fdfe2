"""`torus-train check`: what this machine can run, one verdict per part (torus_train.verdict.Verdict).

parts.py names the parts (a registry: name -> the function that checks it, what it shows); environment.py
(pure: torch reached inside its functions) the software and the GPUs; device.py (torch) NCCL, the graphed step
(train/graphs.py's probe), the decoders (data/decode_probe.py), the deterministic repeat; throughput.py (torch)
the loop against the bare step; smallrun.py (torch) the real loop in this process; report.py (pure) the table
and the JSON document. docs/check.md says what each part does and what it needs.

`--acceptance` (the acceptance test for one GPU): acceptance.py (pure) names its parts (a second registry), runs
each in its own process (``python -m torus_train.check PART OUT``, __main__.py) and writes the schema-3 document;
shrunk.py (pure) is the production spec shrunk to one GPU; accept_loop.py (torch) host syncs (counted by
syncs.py), speed against a bare loop, the deterministic digest; accept_production.py (pure) the production run; accept_graphs.py (torch)
the graphed and eager loop against the bare step.
"""
