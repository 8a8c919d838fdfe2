"""`torus-train check`: what this machine can run, one verdict per part (torus_train.verdict.Verdict).

parts.py names the parts (a registry: name -> the function that checks it, what it shows); environment.py
(pure: torch reached inside its functions) the software and the GPUs; device.py (torch) NCCL, the graphed step
(train/graphs.py's probe), the decoders (data/decode_probe.py), the deterministic repeat; throughput.py (torch)
the loop against the bare step; smallrun.py (torch) the real loop in this process; report.py (pure) the table
and the JSON document. docs/check.md says what each part does and what it needs.
"""
