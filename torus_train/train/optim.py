"""Optimizers: momentum SGD and LARS, with BatchNorm parameters and biases exempt from weight decay.

``build_optimizer`` puts every parameter with more than one dimension (conv and linear weights) into a group
with weight decay, and every 1-D parameter (BatchNorm scale and shift, biases) into a group without it; for
LARS the 1-D group also skips the trust ratio and takes a plain momentum step (as in MLPerf's reference).
The training loop sets the LR each step (train/step.py set_lr): after ``use_device_lr`` every group's
``lr`` is one 0-dim float32 tensor on the parameters' device, written before each step and read by the step on
the device, so that a step captured in a CUDA graph takes each replay's LR. Checkpoints hold it as a float.

Both optimizers skip a step on the device (``_step_supports_amp_scaling``, as torch's fused optimizers do): the
GradScaler, or train/step.py for bf16/fp32, sets ``optimizer.found_inf`` (a 0-dim float tensor, 1 = skip) and,
for fp16, ``optimizer.grad_scale``; the step then unscales the gradients and leaves parameters and momentum as
they were when found_inf is 1, without the host ever reading the flag.
"""

from __future__ import annotations

import torch

from torus_train.errors import UserError

OPTIMIZERS = ("sgd", "lars")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights (decayed, LARS-adapted) and BatchNorm parameters + biases (neither)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim > 1 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "lars": True}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "lars": False})
    return groups


class DeviceLR(torch.optim.Optimizer):
    """The LR of every group in one device tensor (use_device_lr), saved and loaded as a float."""

    found_inf: torch.Tensor
    """Set for one step by GradScaler or train/step.step_unless (see the module docstring); absent otherwise."""
    grad_scale: torch.Tensor | None
    """Set with found_inf: the fp16 loss scale to take off the gradients, or None."""

    def use_device_lr(self, device) -> torch.Tensor:
        lr = torch.tensor(float(self.param_groups[0]["lr"]), dtype=torch.float32, device=device)
        for group in self.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self) -> dict:
        state = super().state_dict()
        for group in state["param_groups"]:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"] = float(group["lr"])  # a host read, at a checkpoint only
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        lr = self.param_groups[0]["lr"]
        super().load_state_dict(state_dict)
        if isinstance(lr, torch.Tensor):  # the step keeps reading the same tensor (a captured graph holds it)
            lr.fill_(float(self.param_groups[0]["lr"]))
            for group in self.param_groups:
                group["lr"] = lr


class SGD(DeviceLR, torch.optim.SGD):
    """torch's fused momentum SGD (one kernel per device and dtype, found_inf and grad_scale read on the device),
    with momentum buffers that start at zero.

    Zero buffers make every step the same kernel: torch's first step copies the gradient into a new buffer, and
    a first step skipped on the device would leave that buffer uninitialised; buffer = momentum * 0 + gradient
    is the same first step.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, nesterov: bool = False):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, fused=True)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            if group["momentum"]:
                for p in group["params"]:
                    if p.grad is not None and self.state[p].get("momentum_buffer") is None:
                        self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return super().step(closure)

    def load_state_dict(self, state_dict: dict) -> None:
        """Saved groups carry their own ``fused``; this class always runs fused (checkpoints of plain SGD load)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["fused"], group["foreach"] = True, None


class LARS(DeviceLR, torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017) with momentum, in MLPerf's form.

    For each parameter tensor w of a group with ``lars=True``:

    1. trust = eta * ||w|| / (||g|| + wd * ||w||), or 1 where either norm is 0;
    2. v = momentum * v + lr * trust * (g + wd * w);
    3. w = w - v (nesterov: w = w - (momentum * v + lr * trust * (g + wd * w))).

    Groups with ``lars=False`` (BatchNorm, biases) take the same step with trust = 1 and no weight decay.
    With ``found_inf`` set (see the module docstring) the gradients are unscaled by ``grad_scale`` and a step
    whose flag is 1 changes nothing, decided on the device.
    """

    _step_supports_amp_scaling = True

    def __init__(
        self,
        params,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        nesterov: bool = False,
        eps: float = 0.0,
    ):
        if lr < 0 or momentum < 0 or weight_decay < 0 or trust_coefficient <= 0:
            raise ValueError("LARS: lr, momentum, weight_decay must be >= 0 and trust_coefficient > 0")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            nesterov=nesterov,
            eps=eps,
            lars=True,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params, grad_scale, found_inf)
        return loss

    def _step_group(self, group: dict, params: list, grad_scale=None, found_inf=None) -> None:
        """One group in a few multi-tensor kernels (torch._foreach_*), not a handful per parameter tensor."""
        lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
        grads: list[torch.Tensor] | tuple[torch.Tensor, ...] = [p.grad for p in params]
        keep = None
        if grad_scale is not None:  # GradScaler's inverse, computed as it does (double reciprocal, then float)
            torch._foreach_mul_(grads, grad_scale.double().reciprocal().float())
        if found_inf is not None:
            # skip on the device: zero gradients, momentum 1, lr 0 and keep * buffer leave every tensor as it
            # was. The gradients need a select (masked_fill), not a multiply: inf * 0 and NaN * 0 are NaN.
            skip = found_inf.to(torch.bool)
            for g in grads:
                g.masked_fill_(skip, 0)
            keep = 1 - found_inf.float()
            lr = lr * keep
            mom = torch.where(skip, torch.ones_like(keep), torch.full_like(keep, mom))
        if group["lars"]:
            w_norm = torch.stack(torch._foreach_norm(params))
            g_norm = torch.stack(torch._foreach_norm(grads))
            trust = torch.where(
                (w_norm > 0) & (g_norm > 0),
                group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm + group["eps"]),
                torch.ones_like(w_norm),
            )
            if wd:
                grads = torch._foreach_add(grads, params, alpha=wd)
            scaled = torch._foreach_mul(grads, list((trust * lr).unbind()))
        else:
            scaled = torch._foreach_mul(grads, lr)
        bufs = [self.state[p].get("momentum_buffer") for p in params]
        if any(b is None for b in bufs):
            bufs = [s.clone() for s in scaled]
            for p, b in zip(params, bufs, strict=True):
                self.state[p]["momentum_buffer"] = b
        else:
            torch._foreach_mul_(bufs, mom)
            torch._foreach_add_(bufs, scaled)
        update = torch._foreach_add(torch._foreach_mul(bufs, mom), scaled) if group["nesterov"] else bufs
        if keep is not None:
            update = torch._foreach_mul(update, keep)
        torch._foreach_sub_(params, update)


def build_optimizer(
    model: torch.nn.Module,
    name: str,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 5e-5,
    nesterov: bool = False,
    trust_coefficient: float = 0.001,
) -> DeviceLR:
    """The optimizer named ``sgd`` or ``lars`` over ``param_groups(model, weight_decay)``."""
    if name not in OPTIMIZERS:
        raise UserError(f"optimizer.name: {name!r} is not one of {', '.join(OPTIMIZERS)}")
    if not lr > 0:
        raise UserError(f"optimizer lr: {lr!r} must be positive")
    if not 0 <= momentum < 1:
        raise UserError(f"optimizer.momentum: {momentum!r} must be in [0, 1)")
    if weight_decay < 0:
        raise UserError(f"optimizer.weight_decay: {weight_decay!r} must be >= 0")
    if nesterov and momentum == 0:
        raise UserError("optimizer.nesterov: true needs optimizer.momentum > 0")
    if trust_coefficient <= 0:
        raise UserError(f"optimizer.trust_coefficient: {trust_coefficient!r} must be positive")
    groups = param_groups(model, weight_decay)
    if name == "sgd":
        for g in groups:
            g.pop("lars")
        return SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov)
    return LARS(groups, lr=lr, momentum=momentum, nesterov=nesterov, trust_coefficient=trust_coefficient)
