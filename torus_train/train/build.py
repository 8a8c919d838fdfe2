"""The parts a rank trains with, each built from the spec: model, owned gradient buckets exchanged with
comm.algo, loaders, AMP."""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
import torchvision

from torus_train.comm.buckets import BucketedModel
from torus_train.comm.hooks import TorusHookState
from torus_train.data import loader_config
from torus_train.data.base import LoaderRequest
from torus_train.data.readers import decode_threads
from torus_train.data.stage import NodesWait, stage_key, stage_on_node
from torus_train.errors import UserError
from torus_train.job.algorithms import ALGORITHMS
from torus_train.job.models import HOUSE_ARCHS
from torus_train.job.rank import Bootstrap
from torus_train.job.sources import source_of
from torus_train.job.spec import JobSpec
from torus_train.train.models import build_house_model
from torus_train.train.optim import DeviceLR
from torus_train.train.optim import build_optimizer as optimizer_for

log = logging.getLogger("torus_train.train")


def seed_everything(seed: int, rank: int) -> None:
    """Same model initialisation everywhere (seed), rank-specific randomness for the rest."""
    torch.manual_seed(seed)
    random.seed(seed * 1000 + rank)
    np.random.seed((seed * 1000 + rank) % 2**32)


DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
"""What cuBLAS needs for repeatable results (a fixed workspace per stream); read when its handle is made, so the
worker sets it before torch touches the GPU (ranks/worker.py)."""


def set_determinism(deterministic: bool, device: torch.device, environ=None) -> None:
    """The rank's kernel choice (job.deterministic), before the model is built.

    On: only deterministic kernels (an op that has none raises, naming itself), cuDNN's deterministic
    algorithms and no autotuning, cuBLAS's fixed workspace: two identical runs end with the same bits. Off:
    cuDNN autotunes on a GPU (fixed input shapes per stage: the fastest kernels, picked once), whose choice
    and atomics may differ from run to run.
    """
    environ = os.environ if environ is None else environ
    if deterministic:
        for name, value in DETERMINISTIC_ENV.items():
            environ.setdefault(name, value)  # a value the user set (":16:8" is also deterministic) stands
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = device.type == "cuda" and not deterministic


def build_model(spec: JobSpec, device: torch.device) -> nn.Module:
    if spec.model.arch in HOUSE_ARCHS:
        return _placed(build_house_model(HOUSE_ARCHS[spec.model.arch], spec.model.num_classes), spec, device)
    try:
        model = torchvision.models.get_model(spec.model.arch, weights=None, num_classes=spec.model.num_classes)
    except ValueError:
        raise UserError(
            f"model.arch: {spec.model.arch!r} is not a torchvision classification model (e.g. resnet18, resnet50)"
        ) from None
    return _placed(model, spec, device)


def _placed(model: nn.Module, spec: JobSpec, device: torch.device) -> nn.Module:
    model = model.to(device)
    if spec.model.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def build_optimizer(model: nn.Module, spec: JobSpec) -> DeviceLR:
    o = spec.optimizer
    return optimizer_for(
        model,
        o.name,
        spec.schedule.base_lr,
        o.momentum,
        o.weight_decay,
        nesterov=o.nesterov,
        trust_coefficient=o.trust_coefficient,
    )


def wrap_ddp(model: nn.Module, spec: JobSpec, boot: Bootstrap) -> BucketedModel:
    """Data parallelism with owned gradient buckets (comm/buckets.py: overlap with backward as DDP, and
    capturable in a CUDA graph, which DDP's reducer is not), exchanged with comm.algo.

    comm.algo names an entry of torus_train.job.algorithms: its `hook` says whether the torus hook's algorithm
    or the backend's own all-reduce (ddp: flat, with fp16/bf16 compression as DDP's compress hooks) exchanges,
    its `asynchronous` whether the exchange overlaps (torus-sync does not, for comparisons). BatchNorm
    statistics are not broadcast before every forward (training uses batch statistics); step.sync_buffers
    makes them rank 0's before evaluation and checkpoints.
    """
    compression = None if spec.comm.compression == "none" else spec.comm.compression
    mode = ALGORITHMS.get(spec.comm.algo)
    state = TorusHookState(
        boot.groups, algo=mode.same_as or mode.name, compression=compression, asynchronous=mode.asynchronous
    )
    # the stats slot carries each rank's squared gradient norm to the noise scale (train/noise.py)
    stats = spec.noise.enabled and boot.info.world_size > 1
    return BucketedModel(model, state, spec.comm.bucket_mb, stats=stats)


def time_step(dp: BucketedModel, spec: JobSpec, device: torch.device, micro_batch: int, accumulation: int) -> float:
    """Seconds of a throw-away training step (forward, backward and exchange of ``accumulation`` passes of
    ``micro_batch`` zero images; no data, no update; the second of two), for the ETA before the first step. Every rank calls
    it (the backward exchanges). Parameters and BatchNorm statistics are left as they were, gradients zero."""
    saved = {k: v.clone() for k, v in dp.module.state_dict().items()}
    size = spec.data.image_size
    x = torch.zeros(micro_batch, 3, size, size, device=device)
    if spec.model.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    seconds = 0.0
    for _ in range(2):  # the second pass is timed: the first at a new shape pays one-time kernel set-up
        t0 = time.perf_counter()
        dp.zero_grad()
        dp(x).float().sum().backward()
        dp.finish()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - t0) * accumulation
    dp.module.load_state_dict(saved)
    dp.zero_grad()
    return seconds


def build_loader(
    spec: JobSpec, boot: Bootstrap, split: str, per_rank_batch: int, corrupt=None, decoder: str | None = None
):
    """The loader of ``split`` from the spec's data source (job/sources.py; data/base.py's Loader contract);
    ``corrupt``: the run's data.base.CorruptLog (the files skipped so far); ``decoder``: the data.decoder entry
    to build it with (the run's resolved choice, train/decoder.py), else the spec's."""
    source = source_of(spec.data.source)
    d = spec.data
    cfg = loader_config(
        split,
        boot.info.rank,
        boot.info.world_size,
        per_rank_batch,
        d.image_size,
        spec.job.seed,
        spec.model.channels_last,
        d.num_threads or decode_threads(boot.info.local_world_size),
        image_dtype(spec, boot.device),
        d.on_corrupt,
        d.io_workers,
        d.prefetch,
        d.shuffle_buffer,
    )
    root = staged_root(spec, boot, source.path(spec)) if source.stageable else source.path(spec)
    request = LoaderRequest(
        cfg,
        boot.device,
        root,
        d.loader,
        spec.model.num_classes,
        d.index or None,
        samples=d.synthetic_samples,
        corrupt=corrupt,
        decoder=decoder or d.decoder,
    )
    return source.open_loader(request)


_staged: dict[str, str] = {}


def staged_root(spec: JobSpec, boot: Bootstrap, root: str | None) -> str | None:
    """``root``, or with data.stage = node its node-local copy (made once per node, before the first step:
    data/stage.py); every rank waits until all nodes have theirs."""
    if root is None or spec.data.stage == "none":
        return root
    if root not in _staged:
        wait = nodes_wait(spec, boot, root)
        _staged[root] = str(stage_on_node(root, spec.data.stage_dir, boot.info.local_rank, wait, log.info))
    return _staged[root]


def nodes_wait(spec: JobSpec, boot: Bootstrap, root: str) -> NodesWait | None:
    """The wait for every node's copy on the rendezvous store (data/stage.py's NodesWait says why not a
    dist.barrier: a copy may outlast comm.timeout_s); None outside a process group, and on torch's fake
    backend, whose store answers without holding anything (a rehearsal plays one rank: no node to wait for)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    store = c10d._get_default_store()
    if dist.get_backend() == "fake" or not all(hasattr(store, m) for m in ("add", "set", "get", "check", "wait")):
        log.info("data.stage: a store that holds nothing (fake backend); not waiting for the other nodes")
        return None
    i = boot.info
    return NodesWait(
        store,
        stage_key(root),
        i.rank,
        i.local_rank,
        i.local_world_size,
        i.world_size,
        spec.data.stage_timeout_s,
        socket.gethostname(),
    )


def image_dtype(spec: JobSpec, device: torch.device) -> str:
    """The dtype the loader delivers: the autocast dtype on GPUs (CPU ranks run fp32)."""
    if device.type != "cuda":
        return "float32"
    return {"fp16": "float16", "bf16": "bfloat16"}.get(spec.model.precision, "float32")


def amp_settings(spec: JobSpec, device: torch.device) -> tuple[torch.dtype | None, Any]:
    """(autocast dtype or None, GradScaler or None). CPU ranks run fp32 (said once by the caller)."""
    if device.type != "cuda" or spec.model.precision == "fp32":
        return None, None
    if spec.model.precision == "bf16":
        return torch.bfloat16, None
    return torch.float16, torch.amp.GradScaler("cuda")
