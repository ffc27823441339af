"""Optimization pieces of the SC18 / DeepCAM segmentation recipe: LARC, gradient lag and mixed
precision.

::

    optimizer = LARC(torch.optim.Adam(model.parameters(), lr=1e-3), eta=0.002)
    lag = GradientLag(model.parameters(), optimizer)          # optional, lag 1
    amp = MixedPrecision("bf16", device_type="cuda")          # or "fp16" (loss scaling), "fp32"
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        with lag.no_sync(ddp_model), amp.autocast():          # no_sync: only with DDP and lag
            loss = loss_fn(ddp_model(x), y)
        amp.backward(loss)
        lag.step(scaler=amp.scaler) if lag else amp.step(optimizer)

**LARC** (layer-wise adaptive rate clipping, as SC18's code and NVIDIA apex's ``LARC``): for each
parameter tensor ``w`` with gradient ``g`` and its group's weight decay ``wd``, the trust ratio is
``eta * ||w|| / (||g|| + wd * ||w|| + eps)``; the gradient becomes ``(g + wd * w) * factor`` before
the base optimizer's step (whose own weight decay is switched off for that step, as apex does: the
decay goes through the trust ratio instead; with AdamW this turns its decoupled decay into L2).
``factor`` by ``mode``:

- ``"clip"`` (default, SC18's description): ``min(trust, 1)``: the gradient only ever shrinks.
- ``"clip_lr"`` (apex ``clip=True``, OpenSeq2Seq): ``min(trust / lr, 1)``, so the effective
  learning rate is ``min(lr, trust)``.
- ``"scale"`` (apex ``clip=False``): ``trust``, unclipped.

Tensors whose weight or gradient norm is 0 are left as they are (no trust ratio and, as in apex,
no weight decay that step). Everything stays on the device (no host synchronization).

**Gradient lag 1** (SC18 on Summit): the update at step ``k`` applies the gradients of step
``k - 1``, all-reduced while step ``k`` computed. :class:`GradientLag` does its own
communication: after each backward, :meth:`GradientLag.step` copies the local gradients into a flat
buffer (one per dtype and device), divides it by the world size and launches an asynchronous
``all_reduce`` on it; then it waits for the *previous* step's all-reduce (launched a whole step
ago, so normally long done), writes that average into ``.grad`` and calls the base optimizer. Step
0 makes no update (there are no earlier gradients); :meth:`GradientLag.flush` applies the last
pending gradients at the end of training if wanted. Without an initialized process group it is a
plain one-step delay. Weights: ``w[k+1] = w[k] - update(g[k-1])``, ``g[k]`` computed at ``w[k]``.

With DistributedDataParallel, DDP must not all-reduce too: run every forward and backward inside
``ddp_model.no_sync()`` (:meth:`GradientLag.no_sync` returns it, or a null context for a plain
module). DDP still broadcasts the initial weights at construction; under ``no_sync`` it stops
broadcasting the buffers after the first forward, so the batch-norm running statistics drift
apart by rank during training (the recipe's ``train()`` makes them rank 0's at the end). The
parameters stay identical because every rank applies the same averaged gradients. Without DDP, call :func:`broadcast_parameters` once before training. DDP's own
overlap (bucketed all-reduce during backward) ends when backward ends; the lag buys the overlap of
the whole all-reduce with the next step's data loading, forward and backward.

With fp16 loss scaling pass ``scaler`` to :meth:`GradientLag.step`: the current gradients are
unscaled (``scaler.unscale_``, which also records whether they overflowed so ``scaler.update``
adapts the scale) before they enter the buffer; an applied buffer holding inf/NaN (an overflow a step
ago) skips that update. The buffers always hold unscaled gradients, so a scale change between the
two steps does not matter.

**Mixed precision**: :class:`MixedPrecision` (``"fp32"``, ``"bf16"``, ``"fp16"``) gives the
autocast context and a ``torch.amp.GradScaler`` that is enabled for fp16 only (on CPU too:
``torch.amp.GradScaler("cpu")``); its ``state_dict`` is the scaler's, for checkpoints.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["OptimizerWrapper", "LARC", "GradientLag", "MixedPrecision", "broadcast_parameters"]


class OptimizerWrapper:
    """The optimizer interface (``param_groups``, ``state``, ``defaults``, ``zero_grad``,
    ``state_dict``, ``add_param_group``) forwarded to ``self.optim``, for wrappers that change only
    ``step`` (and what they checkpoint), so that ``GradScaler.step`` and training loops take them
    as any optimizer."""

    def __init__(self, optimizer):
        self.optim = optimizer

    @property
    def param_groups(self):
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    @property
    def defaults(self):
        return self.optim.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)

    def add_param_group(self, group: dict) -> None:
        self.optim.add_param_group(group)


class LARC(OptimizerWrapper):
    """LARC around ``optimizer`` (any torch.optim.Optimizer); see the module docstring. Behaves as
    an optimizer: ``param_groups``, ``state``, ``zero_grad``, ``step``, ``state_dict`` (the base
    optimizer's), so ``GradScaler.step(larc)`` works (it unscales before LARC sees the gradients)."""

    def __init__(self, optimizer: torch.optim.Optimizer, eta: float = 0.002, mode: str = "clip",
                 eps: float = 1e-8):
        if mode not in ("clip", "clip_lr", "scale"):
            raise ValueError(f"LARC: mode must be 'clip', 'clip_lr' or 'scale', got {mode!r}")
        super().__init__(optimizer)
        self.eta = float(eta)
        self.mode = mode
        self.eps = float(eps)

    def __repr__(self) -> str:
        return f"LARC(eta={self.eta}, mode={self.mode!r}, {self.optim!r})"

    @torch.no_grad()
    def apply_trust_ratio(self) -> None:
        """Rewrite every ``.grad`` as ``(g + wd * w) * factor`` (the step's first half)."""
        for group in self.optim.param_groups:
            wd = float(group.get("weight_decay", 0.0) or 0.0)
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                w_norm = torch.linalg.vector_norm(p.detach().float())
                g_norm = torch.linalg.vector_norm(g.float())
                trust = self.eta * w_norm / (g_norm + wd * w_norm + self.eps)
                if self.mode == "clip":
                    factor = trust.clamp(max=1.0)
                elif self.mode == "clip_lr":
                    factor = (trust / lr).clamp(max=1.0)
                else:
                    factor = trust
                ok = (w_norm > 0) & (g_norm > 0)
                new = (g.float() + wd * p.detach().float()) * factor
                g.copy_(torch.where(ok, new, g.float()))

    def step(self, closure: Callable | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.apply_trust_ratio()
        decays = [group.get("weight_decay") for group in self.optim.param_groups]
        for group in self.optim.param_groups:
            if "weight_decay" in group:
                group["weight_decay"] = 0.0
        try:
            self.optim.step()
        finally:
            for group, wd in zip(self.optim.param_groups, decays):
                if wd is not None:
                    group["weight_decay"] = wd
        return loss


def _dist():
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def broadcast_parameters(module: torch.nn.Module, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (no-op when not distributed)."""
    dist = _dist()
    if dist is None:
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src, group=group)


class GradientLag:
    """Gradient lag 1 around ``optimizer`` (plain or :class:`LARC`) for the parameters ``params``;
    see the module docstring. ``lag=0`` makes it a plain synchronous all-reduce + step (for A/B
    comparisons with the same code path)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], optimizer, lag: int = 1, group=None):
        if lag not in (0, 1):
            raise ValueError(f"gradient lag: only lag 0 or 1 is supported, got {lag}")
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = optimizer
        self.lag = int(lag)
        self.group = group
        self.steps = 0           # calls to step()
        self.updates = 0         # optimizer steps made
        # buckets: parameter indices with one dtype and device, flattened together
        buckets: dict = {}
        for i, p in enumerate(self.params):
            buckets.setdefault((p.dtype, p.device), []).append(i)
        self._buckets = list(buckets.values())
        self._pending: list[torch.Tensor] | None = None
        self._works: list = []

    def no_sync(self, model: torch.nn.Module):
        """``model.no_sync()`` for a DistributedDataParallel model (its all-reduce is ours now),
        else a null context."""
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def __bool__(self) -> bool:
        return True

    def _launch(self) -> tuple[list[torch.Tensor], list]:
        dist = _dist()
        world = dist.get_world_size(self.group) if dist is not None else 1
        buffers, works = [], []
        for bucket in self._buckets:
            grads = [self.params[i].grad if self.params[i].grad is not None
                     else torch.zeros_like(self.params[i]) for i in bucket]
            flat = _flatten_dense_tensors([g.detach() for g in grads]).clone()
            if world > 1:
                flat.div_(world)
                works.append(dist.all_reduce(flat, group=self.group, async_op=True))
            buffers.append(flat)
        return buffers, works

    def _wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works = []

    def _apply(self, buffers: list[torch.Tensor], step_fn: Callable | None) -> bool:
        finite = all(bool(torch.isfinite(b).all()) for b in buffers) if self._check_finite else True
        if not finite:
            return False
        with torch.no_grad():
            for bucket, flat in zip(self._buckets, buffers):
                views = _unflatten_dense_tensors(flat, [self.params[i] for i in bucket])
                for i, v in zip(bucket, views):
                    p = self.params[i]
                    if p.grad is None:
                        p.grad = v.clone()
                    else:
                        p.grad.copy_(v)
        (step_fn or self.optimizer.step)()
        self.updates += 1
        return True

    _check_finite = False

    def step(self, step_fn: Callable | None = None, scaler: "torch.amp.GradScaler | None" = None) -> bool:
        """Call after backward: launch the all-reduce of this step's gradients and apply the
        previous step's (``step_fn`` or ``optimizer.step``). Returns whether an update was made.
        Leaves ``.grad`` holding the applied gradients; zero them before the next backward."""
        use_scaler = scaler is not None and scaler.is_enabled()
        if use_scaler:
            scaler.unscale_(self.optimizer)   # records this step's overflow for scaler.update()
        self._check_finite = use_scaler
        buffers, works = self._launch()
        applied = False
        if self.lag == 0:
            self._pending, self._works = buffers, works
            self._wait()
            applied = self._apply(self._pending, step_fn)
            self._pending = None
        else:
            if self._pending is not None:
                self._wait()
                applied = self._apply(self._pending, step_fn)
            self._pending, self._works = buffers, works
        if use_scaler:
            scaler.update()
        self.steps += 1
        return applied

    def flush(self, step_fn: Callable | None = None) -> bool:
        """Apply the pending gradients (the last step's) now, e.g. at the end of training."""
        if self._pending is None:
            return False
        self._wait()
        applied = self._apply(self._pending, step_fn)
        self._pending = None
        return applied

    def state_dict(self) -> dict:
        """The pending (already averaged) gradients and counters, for exact resume."""
        self._wait()
        pending = None if self._pending is None else [b.clone() for b in self._pending]
        return {"lag": self.lag, "steps": self.steps, "updates": self.updates, "pending": pending}

    def load_state_dict(self, state: dict) -> None:
        self._wait()
        self.steps, self.updates = int(state["steps"]), int(state["updates"])
        pending = state.get("pending")
        if pending is None:
            self._pending = None
        else:
            self._pending = [b.to(device=ref.device, dtype=ref.dtype).clone()
                             for b, ref in zip(pending, (self.params[bucket[0]] for bucket in self._buckets))]


_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


class MixedPrecision:
    """Autocast and loss scaling for ``precision`` "fp32", "bf16" or "fp16" on ``device_type``
    ("cuda" or "cpu"). fp16 enables a ``torch.amp.GradScaler``; bf16 needs none."""

    def __init__(self, precision: str = "fp32", device_type: str = "cuda", init_scale: float = 2.0 ** 16):
        if precision not in _DTYPES:
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
        self.dtype = _DTYPES[precision]
        self.precision = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]
        self.device_type = device_type
        self.enabled = self.dtype != torch.float32
        self.scaler = torch.amp.GradScaler(device_type, init_scale=init_scale,
                                           enabled=self.dtype == torch.float16)

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer) -> None:
        """``optimizer.step()`` through the scaler (skipped on overflow) and the scale update."""
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict:
        return {"precision": self.precision, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
