"""What every training recipe shares.

- :func:`setup_distributed`: the device and, under ``torchrun`` (``WORLD_SIZE`` > 1), a process
  group (NCCL on GPUs, gloo on CPUs); ``zfeed.Loader`` then shards its samples by rank on its own
  (its ``rank``/``world_size`` default to torch.distributed's).
- :func:`seed_everything`, :func:`set_deterministic` (deterministic algorithms: on CPU a resumed
  run ends bit-identical to an uninterrupted one).
- :func:`save_checkpoint` / :func:`load_checkpoint`: model, optimizer, grad scaler, step, epoch,
  the RNG states, every rank's loader ``state_dict`` and the task's options that must match on
  resume (:meth:`Task.checkpoint_settings`), written atomically (temp file + ``os.replace``) by
  rank 0; only the zfeed real-mode run resumes from and writes it, and rank 0 decides whether to
  resume (:func:`resume_decision`).
- :func:`read_decoded` / :func:`read_labels`: an array's values as the Loader decodes them (CF
  ``scale_factor``, ``add_offset``, missing values), for validation read straight from the store.
- :func:`train`: the loop skeleton a recipe fills with a :class:`Task` (model, batches, loss), in
  one of three modes, the blog's three bars: ``real`` (train on the source's batches),
  ``load-only`` (iterate the source, no training step) and ``synthetic`` (train on the first
  batch's tensors, kept in memory); sources ``zfeed`` (``zfeed.Loader``) or ``baseline``
  (the hackathon's xarray + DataLoader, :mod:`zfeed.baseline`).
- Throughput: per step (the wait for the batch included) samples/s, MB/s and model FLOP/s (the
  FLOPs of one forward + backward counted once with ``torch.utils.flop_counter.FlopCounterMode``),
  each as the median with the 10th and 90th percentiles over the timed steps. MB/s counts, as
  ``zfeed bench`` does, the decoded bytes of the data delivered from the store: inputs and targets
  as the batch holds them (float32), labels at their stored size (not the int64 the Loader widens
  them to), and nothing a recipe computes (time-feature channels). Under torchrun every figure is
  the job's: each step's rates summed over the processes (``rank0_samples_per_s`` keeps rank 0's
  own). :func:`summary_table`, :func:`write_json`, :func:`plot_throughput` (bars side by side, the
  headline real / synthetic fraction per source).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import math
import os
import random
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

MODES = ("real", "load-only", "synthetic")
SOURCES = ("zfeed", "baseline")


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------
# Device, distributed, seeding


@dataclasses.dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    initialized_here: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def all_gather_object(self, obj: Any) -> list:
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    def close(self) -> None:
        if self.initialized_here and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def setup_distributed(device: str = "auto") -> Dist:
    """The device (``auto``: ``cuda:LOCAL_RANK`` where CUDA is available, else the CPU) and, where
    torchrun set ``WORLD_SIZE`` > 1, the default process group (nccl on CUDA, gloo on the CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else local_rank % max(torch.cuda.device_count(), 1)
        dev = torch.device("cuda", index)
        torch.cuda.set_device(dev)
    dist = Dist(rank=rank, world_size=world, local_rank=local_rank, device=dev)
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world)
        dist.initialized_here = True
    if torch.distributed.is_initialized():
        dist.rank, dist.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return dist


def zfeed_device(dist: Dist) -> str:
    """Where zfeed's loader delivers batches: on the training GPU (copied on a side stream,
    normalized and cast there) when training on CUDA, else on the CPU."""
    return str(dist.device) if dist.device.type == "cuda" else "cpu"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_deterministic(device: torch.device) -> None:
    """Deterministic algorithms (errors on CPU where an op has none; a warning on CUDA, where some
    backward kernels have none), no cuDNN autotuning."""
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


# -------------------------------------------------------------------------------------------
# Checkpoints


def _umask() -> int:
    """The process's umask: read from /proc on Linux (setting it to read it back would race with
    other threads' new files), else by setting it and back."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomically(path: str, write: Callable[[Any], None], binary: bool, prefix: str) -> None:
    """``write(file)`` to a temporary file beside ``path``, synced, given the permissions a new
    file gets (0o666 less the umask; mkstemp's are 0o600), then ``os.replace`` and a sync of the
    directory, so that the rename outlives a crash too. A write that fails (Ctrl-C included)
    leaves no temporary file and ``path`` as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        directory = os.open(folder, os.O_RDONLY)
    except OSError:  # a directory that cannot be opened (some platforms): the rename stands unsynced
        return
    try:
        os.fsync(directory)
    except OSError:  # file systems that do not sync directories
        pass
    finally:
        os.close(directory)


def save_checkpoint(path: str, state: dict) -> None:
    """``torch.save`` to a temporary file beside ``path``, then ``os.replace``: a reader (or a
    resume after a crash) sees the old checkpoint or the new one, never half of one. The file gets
    the usual permissions (0o666 less the umask), and a failed write (Ctrl-C too) leaves no
    temporary file behind."""
    _write_atomically(path, lambda f: torch.save(state, f), binary=True, prefix=".ckpt-")


def load_checkpoint(path: str) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def weights_digest(model: torch.nn.Module, parameters_only: bool = False) -> str:
    """SHA-256 over the parameters and buffers (names, dtypes, shapes and bytes): equal digests,
    bit-identical weights."""
    h = hashlib.sha256()
    inner = unwrap(model)
    items = inner.named_parameters() if parameters_only else inner.state_dict().items()
    for name, tensor in sorted(items):
        t = tensor.detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


# -------------------------------------------------------------------------------------------
# Reading values as the Loader decodes them


@dataclasses.dataclass(frozen=True)
class CfEncoding:
    """An array's CF encoding as zfeed's Loader and ``zfeed stats`` apply it (C++
    ``zfeed::zarr::cf_encoding``): a stored value equal to a missing value (``_FillValue``,
    ``missing_value``) is NaN (for a label: -100, PyTorch's ignore_index), the others are
    ``raw * scale_factor + add_offset`` in float64, then float32; ``wrap`` (2**bits where a signed
    integer holds unsigned values, ``_Unsigned = "true"``) is added to a negative raw value first."""

    packed: bool = False
    scale: float = 1.0
    offset: float = 0.0
    missing: tuple = ()
    wrap: float = 0.0

    @property
    def active(self) -> bool:
        return self.packed or bool(self.missing) or self.wrap != 0.0


def cf_encoding(array, what: str | None = None) -> CfEncoding:
    """The CF encoding of a ``zfeed.Array``, by the Loader's own rules (C++
    ``zfeed::zarr::cf_encoding``): none for half floats and non-numeric types; on Zarr v2 the
    array's fill_value counts as ``_FillValue`` where xarray's zarr backend takes it so."""
    from zfeed import ZarrError

    try:
        return CfEncoding(**array._core.cf_encoding())
    except ZarrError as error:
        raise SystemExit(f"{what or array.name}: {error}") from None


def _unsigned_raw(values: np.ndarray, encoding: CfEncoding) -> np.ndarray:
    raw = values.astype(np.float64)
    if encoding.wrap:
        raw = np.where(raw < 0, raw + encoding.wrap, raw)
    return raw


def read_decoded(array, start: int, stop: int, encoding: CfEncoding | None = None) -> np.ndarray:
    """``array[start:stop]`` as float32 physical values, decoded as the Loader decodes them
    (:class:`CfEncoding`); ``zfeed.Array`` indexing itself returns the stored values."""
    encoding = cf_encoding(array) if encoding is None else encoding
    values = np.asarray(array[start:stop])
    if not encoding.active:
        return values.astype(np.float32)
    raw = _unsigned_raw(values, encoding)
    out = raw * encoding.scale + encoding.offset
    if encoding.missing:
        out[np.isin(raw, encoding.missing)] = np.nan
    return out.astype(np.float32)


IGNORE_LABEL = -100  # the Loader's label for a missing value (PyTorch's ignore_index)


def read_labels(array, start: int, stop: int, encoding: CfEncoding | None = None) -> np.ndarray:
    """``array[start:stop]`` of an integer label array as the Loader delivers label targets:
    int64, the stored value itself, -100 where it is a missing value."""
    encoding = cf_encoding(array) if encoding is None else encoding
    values = np.asarray(array[start:stop])
    out = values.astype(np.int64)
    if encoding.missing:
        out[np.isin(_unsigned_raw(values, encoding), encoding.missing)] = IGNORE_LABEL
    return out


# -------------------------------------------------------------------------------------------
# Statistics of timings


def percentiles(values: Sequence[float]) -> dict:
    """``{"median", "p10", "p90", "n"}`` (None where there are no values)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"median": None, "p10": None, "p90": None, "n": 0}
    return {"median": float(np.median(v)), "p10": float(np.percentile(v, 10)),
            "p90": float(np.percentile(v, 90)), "n": int(v.size)}


# -------------------------------------------------------------------------------------------
# The training loop


class Task:
    """What a recipe fills in for :func:`train`."""

    name = "task"

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        raise NotImplementedError

    def make_source(self, source: str, dist: Dist, epoch: int) -> Any:
        """An iterable of batches (one epoch per iteration); a zfeed source also has
        ``set_epoch``, ``state_dict``, ``load_state_dict``."""
        raise NotImplementedError

    def prepare(self, batch: Any, device: torch.device) -> dict:
        """A source's batch as ``{"inputs", "targets", "times" (or None), "samples", "bytes",
        "full"}`` on ``device``. ``bytes``: the decoded bytes of the data the batch delivers from
        the store (the MB/s figure's count): inputs and targets at their batch dtype, labels at
        their stored size, no channel the recipe computes itself."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def validate(self, model: torch.nn.Module, dist: Dist) -> dict | None:
        return None

    def checkpoint_settings(self) -> dict:
        """Every option that changes what a resumed run computes, ``{"--flag": value}`` (a value
        may be a dict, compared key by key: the normalization statistics), saved in the checkpoint
        and compared on resume (``--amp`` is added by :func:`train`): the data (variables, split,
        batch size, normalization, ...), the model, the loss and the optimizer.

        Left out on purpose, since a resume with another value computes the same: how long to run
        (``--steps``, ``--epochs``), ``--seed`` (the checkpoint restores the weights, the random
        number generators and the loader's seed and sample order), output and logging
        (``--json``, ``--plot``, ``--log-every``, ``--times-log``, ``--checkpoint-every``),
        ``--no-flops`` (the count draws none of training's random numbers), ``--no-val``, where
        the same bytes are read from (``--stage-dir``, ``--stage-in-background``); ``--partition``
        is checked by the loader's state (its node layout). Nor is the machine: ``--device``, and
        ``--threads`` (another number of torch threads sums in another order, so the resumed run is
        not bit-identical: :func:`train` says so in a note, but a job may move to another node)."""
        return {}


@dataclasses.dataclass
class RunResult:
    source: str
    mode: str
    steps: int = 0
    epochs_done: int = 0
    samples: int = 0
    step_seconds: list = dataclasses.field(default_factory=list)
    step_samples: list = dataclasses.field(default_factory=list)
    step_bytes: list = dataclasses.field(default_factory=list)
    wait_seconds: list = dataclasses.field(default_factory=list)
    losses: list = dataclasses.field(default_factory=list)
    flops_per_sample: float | None = None
    validation: dict | None = None
    weights_sha256_by_rank: list | None = None
    parameters_sha256_by_rank: list | None = None
    loader_stats: dict | None = None
    # Every rank's per-step records (:meth:`own_steps`), rank 0's first, gathered by :func:`train`
    # at the end of the run; None: this process's alone.
    steps_by_rank: list | None = None

    def own_steps(self) -> dict:
        """This process's per-step records: seconds (the wait for data included), samples,
        bytes delivered from the store, seconds waiting for data."""
        return {"seconds": self.step_seconds, "samples": self.step_samples, "bytes": self.step_bytes,
                "wait": self.wait_seconds}

    def summary(self, warmup: int) -> dict:
        """The run's figures. samples/s, MB/s and FLOP/s are the job's: per step, the sum over the
        ranks of each rank's rate (the ranks run their steps side by side, in lockstep under
        DDP), so that they hold where ranks are given unequal work too; ``rank0_samples_per_s``
        is rank 0's alone. ``samples`` stays rank 0's count, ``samples_all_processes`` the job's."""
        ranks = self.steps_by_rank or [self.own_steps()]
        taken = min(len(r["seconds"]) for r in ranks)  # the steps every rank took (all, under DDP)
        timed = range(min(warmup, max(taken - 1, 0)), taken)
        timed_by_all = [k for k in timed if all(r["seconds"][k] > 0 for r in ranks)]

        def job_rates(key: str) -> list:
            return [sum(r[key][k] / r["seconds"][k] for r in ranks) for k in timed_by_all]

        sps = job_rates("samples")
        mbps = [b / 1e6 for b in job_rates("bytes")]
        train_mode = self.mode != "load-only"
        fps = [n * self.flops_per_sample for n in sps] if (train_mode and self.flops_per_sample) else []
        rank0 = ranks[0]
        rank0_sps = [rank0["samples"][k] / rank0["seconds"][k] for k in timed if rank0["seconds"][k] > 0]
        waited = sum(r["wait"][k] for r in ranks for k in timed)
        stepped = sum(r["seconds"][k] for r in ranks for k in timed)
        return {
            "source": self.source, "mode": self.mode, "steps": self.steps, "timed_steps": len(timed),
            "samples": self.samples, "samples_all_processes": int(sum(sum(r["samples"]) for r in ranks)),
            "processes": len(ranks), "epochs_done": self.epochs_done,
            "samples_per_s": percentiles(sps), "mb_per_s": percentiles(mbps), "flop_per_s": percentiles(fps),
            "rank0_samples_per_s": percentiles(rank0_sps),
            "flops_per_sample": self.flops_per_sample if train_mode else None,
            "wait_fraction": float(waited / stepped) if stepped > 0 else None,
            "first_loss": self.losses[0] if self.losses else None,
            "final_loss": self.losses[-1] if self.losses else None,
            "losses": self.losses,
            "validation": self.validation,
            "weights_sha256_by_rank": self.weights_sha256_by_rank,
            "parameters_sha256_by_rank": self.parameters_sha256_by_rank,
            "loader_stats": self.loader_stats,
        }


def count_flops(task: Task, model: torch.nn.Module, batch: dict) -> float | None:
    """FLOPs of one forward + backward on ``batch``, per sample, on the unwrapped model (no
    communication); gradients are dropped afterwards, the buffers (BatchNorm's running
    statistics) restored, the random number generators (CPU, and the CUDA devices of the model
    and the batch) left as they were and no optimizer step is taken, so the model, the optimizer
    and the random draws are as they were (a resumed run, which counts again, stays
    bit-identical)."""
    from torch.utils.flop_counter import FlopCounterMode

    inner = unwrap(model)
    buffers = {name: b.detach().clone() for name, b in inner.named_buffers()}  # BatchNorm's running stats
    # The pass draws random numbers (dropout): on forked generators, so that training draws the
    # same ones as in a run that does not count (a resumed run counts again).
    tensors = [*inner.parameters(), *inner.buffers(), *(v for v in batch.values() if isinstance(v, torch.Tensor))]
    devices = sorted({t.device.index if t.device.index is not None else torch.cuda.current_device()
                      for t in tensors if t.device.type == "cuda"})
    try:
        counter = FlopCounterMode(display=False)
        with torch.random.fork_rng(devices=devices), counter:
            loss = task.loss(inner, batch)
            loss.backward()
        total = counter.get_total_flops()
    finally:
        for p in inner.parameters():
            p.grad = None
        with torch.no_grad():
            for name, b in inner.named_buffers():
                b.copy_(buffers[name])
    return float(total) / max(int(batch["samples"]), 1) if total else None


def _sync(device: torch.device) -> None:
    """Waits for the training stream (for per-step timing): not for the whole device, so that
    zfeed's copies of the next batches on their own stream go on across the step boundary."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resume_decision(checkpoint: str, dist: Dist) -> bool:
    """Whether to resume from ``checkpoint``: rank 0 decides (the file exists there) and every
    rank follows; where rank 0 resumes, a rank that cannot find the file (a node-local path on
    another node) makes every rank stop with the same message, rather than one rank failing
    while the others wait for it."""
    seen = dist.all_gather_object(os.path.exists(checkpoint))
    if not seen[0]:
        return False
    lacking = [rank for rank, found in enumerate(seen) if not found]
    if lacking:
        ranks = ", ".join(map(str, lacking))
        raise SystemExit(f"--resume: {checkpoint} exists on rank 0 but not on rank{'s' if len(lacking) > 1 else ''} "
                         f"{ranks}: give --checkpoint a path every process can read (a shared file system)")
    return True


def _setting_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _setting_differences(name: str, saved: Any, value: Any) -> list[str]:
    """How a saved setting differs from this run's, as the error names it: a dict setting key by
    key (only the keys that differ)."""
    if isinstance(saved, dict) and isinstance(value, dict):
        return [f"{name} {key}: {_setting_text(saved.get(key, 'none'))} "
                f"(this run: {_setting_text(value.get(key, 'none'))})"
                for key in dict.fromkeys([*saved, *value]) if saved.get(key) != value.get(key)]
    return [f"{name} {_setting_text(saved)} (this run: {_setting_text(value)})"]


def statistics_setting(stats: dict) -> dict:
    """The normalization statistics ``{name: (mean, std)}`` as a checkpoint setting (``--stats``):
    ``{name: "mean M, std S"}``, the floats written exactly (repr), so that a resume normalizing
    with other values (another --stats, or zfeed_stats rewritten in the store) is refused."""
    return {name: f"mean {float(mean)!r}, std {float(std)!r}" for name, (mean, std) in stats.items()}


def check_checkpoint_settings(checkpoint: str, state: dict, task_name: str, settings: dict,
                              log_note: bool = True) -> None:
    """Refuses (SystemExit naming the checkpoint and the options) a checkpoint of another recipe
    or written with other :meth:`Task.checkpoint_settings`; one written before checkpoints held
    their settings resumes unchecked, with a note."""
    saved_task = state.get("task")
    if saved_task is not None and saved_task != task_name:
        raise SystemExit(f"{checkpoint} was written by the {saved_task} recipe; this is {task_name}: give another "
                         "--checkpoint")
    saved = state.get("settings")
    if saved is None:
        if log_note:
            log(f"{task_name}: {checkpoint} holds no record of its options (written by an older zfeed): resuming "
                "without checking that they match this run's")
        return
    differ = [text for name, value in settings.items() if name in saved and saved[name] != value
              for text in _setting_differences(name, saved[name], value)]
    if differ:
        raise SystemExit(f"{checkpoint} was written with {'; '.join(differ)}: resume with the options it was "
                         "written with, or give another --checkpoint to start afresh")


def _load_part(checkpoint: str, what: str, load: Callable[[], Any]) -> None:
    """``load()``, a checkpoint part that does not fit this run (another model or optimizer, an
    old checkpoint without settings) refused naming the checkpoint."""
    try:
        load()
    except (KeyError, ValueError, RuntimeError) as error:
        raise SystemExit(f"{checkpoint}: its {what} state does not fit this run ({type(error).__name__}: "
                         f"{str(error)[:300]}); resume with the options it was written with") from error


def _check_batches(task: Task, loader: Any, dist: Dist, source: str) -> None:
    """A training split too short for one batch (batches drop the remainder) would run no step
    and then validate an untrained model: refused."""
    if len(loader) > 0:
        return
    samples = getattr(loader, "num_samples", None)
    if samples is None and hasattr(loader, "dataset"):
        samples = len(loader.dataset)
    batch = getattr(loader, "batch_size", None) or getattr(loader, "input_shape", (None,))[0]
    per_process = f", {samples // dist.world_size} per process over {dist.world_size}" if dist.distributed else ""
    raise SystemExit(f"{task.name}: the training split holds {samples} samples{per_process}, fewer than one batch "
                     f"of {batch} (--batch-size; incomplete batches are dropped), so no training step would run "
                     f"({source} source): lower --batch-size or --val-fraction, or use a longer store")


def train(task: Task, dist: Dist, *, source: str = "zfeed", mode: str = "real", epochs: int = 1,
          steps: int = 0, warmup: int = 2, log_every: int = 10, checkpoint: str | None = None,
          checkpoint_every: int = 0, resume: bool = False, times_log: str | None = None,
          count_model_flops: bool = True, validate: bool = True, seed: int = 0,
          amp_dtype: torch.dtype | None = None) -> RunResult:
    """Run ``mode`` on ``source`` for ``epochs`` epochs or ``steps`` steps (0: no limit; synthetic
    runs need ``steps`` or take one epoch's worth of steps), and validate after a real run."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    device = dist.device
    seed_everything(seed)
    model = task.build_model().to(device)
    optimizer = task.build_optimizer(model)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    if dist.distributed:
        ddp_args = {"device_ids": [device.index]} if device.type == "cuda" else {}
        model = torch.nn.parallel.DistributedDataParallel(model, **ddp_args)

    result = RunResult(source=source, mode=mode)
    step, epoch = 0, 0
    if resume and checkpoint and (source, mode) != ("zfeed", "real"):
        raise SystemExit(f"{task.name}: --resume applies to the zfeed real-mode run only (the {source}/{mode} run "
                         "has no state to restore from a checkpoint)")
    loader = task.make_source(source, dist, epoch=0)
    _check_batches(task, loader, dist, source)
    settings = {**task.checkpoint_settings(), "--amp": AMP_NAMES[amp_dtype]}
    if resume and checkpoint and resume_decision(checkpoint, dist):
        state = load_checkpoint(checkpoint)
        if state.get("world_size", 1) != dist.world_size:
            raise SystemExit(f"{checkpoint} was written by {state.get('world_size')} processes, this run has "
                             f"{dist.world_size}")
        check_checkpoint_settings(checkpoint, state, task.name, settings, log_note=dist.main)
        saved_threads = state.get("torch_threads")
        if dist.main and saved_threads is not None and saved_threads != torch.get_num_threads():
            log(f"{task.name}: {checkpoint} was written with {saved_threads} torch threads, this run has "
                f"{torch.get_num_threads()} (--threads): it resumes, but CPU results will not be bit-identical "
                "to an uninterrupted run")
        _load_part(checkpoint, "model", lambda: unwrap(model).load_state_dict(state["model"]))
        _load_part(checkpoint, "optimizer", lambda: optimizer.load_state_dict(state["optimizer"]))
        _load_part(checkpoint, "grad scaler (--amp fp16)", lambda: scaler.load_state_dict(state["scaler"]))
        step, epoch = int(state["step"]), int(state["epoch"])
        try:
            loader.load_state_dict(state["loader"][dist.rank])
        except RuntimeError as error:  # zfeed.ZarrError: another store, split or batch size
            raise SystemExit(f"{checkpoint}: its loader state does not fit this run ({error}); resume with the "
                             "options and store it was written with (checkpoints from before the recipes read "
                             "only the training times, 2026-12-01, cannot resume)") from error
        _set_rng_state(state["rng"][dist.rank])
        result.losses = list(state.get("losses", []))
        if dist.main:
            log(f"{task.name}: resumed from {checkpoint} at step {step}, epoch {epoch}")

    def write_checkpoint() -> None:
        if not checkpoint or source != "zfeed" or mode != "real":
            return
        loader_states = dist.all_gather_object(loader.state_dict())
        rng_states = dist.all_gather_object(_rng_state())
        if dist.main:
            save_checkpoint(checkpoint, {
                "model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "step": step, "epoch": epoch, "loader": loader_states,
                "rng": rng_states, "world_size": dist.world_size, "losses": result.losses,
                "task": task.name, "settings": settings, "torch_threads": torch.get_num_threads(),
            })
        dist.barrier()

    times_file = open(f"{times_log}.rank{dist.rank}", "a") if times_log else None

    def train_step(batch: dict) -> float:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = task.loss(model, batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return float(loss.detach())

    synthetic: dict | None = None
    flops_done = not count_model_flops or mode == "load-only"
    limit = steps if steps > 0 else None
    if mode == "synthetic" and limit is None:
        limit = len(loader) * max(epochs, 1)

    def source_batches() -> Iterator[Any]:
        nonlocal epoch
        while mode == "synthetic" or epoch < epochs:
            if source == "zfeed":
                loader.set_epoch(epoch)
            any_batch = False
            for raw in loader:
                any_batch = True
                yield raw
            epoch += 1
            result.epochs_done += 1
            if not any_batch and mode == "synthetic":
                return

    raw_batches = source_batches()
    skipped_partial = 0
    started = time.perf_counter()
    while limit is None or step < limit:
        t0 = time.perf_counter()
        if synthetic is not None:
            batch = synthetic
        else:
            raw = next(raw_batches, None)
            if raw is None:
                break
            batch = task.prepare(raw, device)
        _sync(device)
        t1 = time.perf_counter()
        n = int(batch["samples"])
        if times_file is not None and synthetic is None and batch.get("times") is not None:
            times_file.write(f"{epoch} {step} {' '.join(str(int(t)) for t in batch['times'])}\n")
            times_file.flush()
        loss_value = None
        if mode != "load-only":
            if mode == "synthetic" and synthetic is None:
                if not batch.get("full", True) and skipped_partial < 2 * max(len(loader), 1):
                    skipped_partial += 1  # keep a full batch in memory, not a short one
                    continue
                synthetic = batch
            if not flops_done and n:
                result.flops_per_sample = count_flops(task, model, batch)
                flops_done = True
                _sync(device)
                t0 = t1 = time.perf_counter()  # the counting pass is not part of the step
            loss_value = train_step(batch)
            _sync(device)
        t2 = time.perf_counter()
        step += 1
        result.steps += 1
        result.samples += n
        result.step_seconds.append(t2 - t0)
        result.wait_seconds.append(t1 - t0)
        result.step_samples.append(n)
        result.step_bytes.append(int(batch["bytes"]))
        if loss_value is not None:
            result.losses.append(loss_value)
        if dist.main and log_every and step % log_every == 0:
            seconds = max(t2 - t0, 1e-12)
            text = f" loss {loss_value:.4f}" if loss_value is not None else ""
            log(f"{task.name} [{source}/{mode}] epoch {epoch} step {step}{text} "
                f"{n / seconds:.1f} samples/s {batch['bytes'] / seconds / 1e6:.1f} MB/s"
                f"{' (rank 0)' if dist.distributed else ''}")
        if checkpoint_every and step % checkpoint_every == 0:
            write_checkpoint()
    elapsed = time.perf_counter() - started
    if times_file is not None:
        times_file.close()
    write_checkpoint()
    if dist.main:
        log(f"{task.name} [{source}/{mode}]: {result.steps} steps, {result.samples} samples (rank 0) in {elapsed:.1f} s")
    result.steps_by_rank = dist.all_gather_object(result.own_steps())  # throughput is the job's
    result.parameters_sha256_by_rank = dist.all_gather_object(weights_digest(model, parameters_only=True))
    if dist.distributed:
        # DDP broadcasts rank 0's buffers (BatchNorm's running statistics) at the start of each
        # forward, so after the last step they differ by rank: make them rank 0's, as the
        # checkpoint has them (and as the next forward would).
        for b in unwrap(model).buffers():
            torch.distributed.broadcast(b.data, src=0)
    result.weights_sha256_by_rank = dist.all_gather_object(weights_digest(model))
    if source == "zfeed" and hasattr(loader, "stats"):
        result.loader_stats = loader.stats()
    if validate and mode == "real":
        result.validation = task.validate(model, dist)
    result.model = model  # for callers in the same process (tests, notebooks)
    return result


# -------------------------------------------------------------------------------------------
# Reporting


def headline(summaries: Sequence[dict]) -> dict:
    """Per source, median real-data samples/s as a fraction of median synthetic samples/s."""
    out = {}
    for source in SOURCES:
        real = next((s for s in summaries if s["source"] == source and s["mode"] == "real"), None)
        synth = next((s for s in summaries if s["source"] == source and s["mode"] == "synthetic"), None)
        if real and synth and real["samples_per_s"]["median"] and synth["samples_per_s"]["median"]:
            out[source] = real["samples_per_s"]["median"] / synth["samples_per_s"]["median"]
    return out


THROUGHPUT_DEFINITIONS = {
    "samples_per_s": "the job's samples per second: per step (the wait for data included), each process's rate, "
                     "summed over the processes; median, 10th and 90th percentiles over the timed steps",
    "mb_per_s": "the job's decoded bytes delivered from the store per second (10^6 bytes per MB), as zfeed bench "
                "counts them: inputs and targets at their batch dtype, labels at their stored size, no computed "
                "channel (time features)",
    "flop_per_s": "the job's model FLOP/s: samples_per_s times the FLOPs of one forward + backward per sample",
    "rank0_samples_per_s": "rank 0's samples per second alone (one process's share)",
    "samples": "samples rank 0 trained on (or loaded); samples_all_processes: the job's",
    "wait_fraction": "share of the step time, all processes together, spent waiting for data",
}


def run_record(args, dist, task, runs: Sequence[dict], validation) -> dict:
    """The keys every recipe's JSON ends with: normalization, where and how it ran, the runs and
    their headline, and the validation."""
    return {"statistics": {k: list(v) for k, v in task.stats.items()}, "statistics_source": task.stats_source,
            "world_size": dist.world_size, "device": str(dist.device), "torch_threads": torch.get_num_threads(),
            "config": vars(args), "runs": runs, "headline": headline(runs), "definitions": THROUGHPUT_DEFINITIONS,
            "validation": validation}


def check_loop_arguments(args, recipe: str, sources: Sequence[str], modes: Sequence[str]) -> None:
    """The training-loop options that cannot work together, refused before anything runs:
    checkpoints belong to the zfeed real-mode run (the baseline DataLoader has no state to
    restore, and the load-only and synthetic runs measure throughput from fresh weights)."""
    for name in ("epochs", "steps", "warmup", "checkpoint_every", "log_every"):
        if getattr(args, name) < 0:
            raise SystemExit(f"{recipe}: --{name.replace('_', '-')} must be 0 or more, got {getattr(args, name)}")
    if args.batch_size < 1:
        raise SystemExit(f"{recipe}: --batch-size must be at least 1, got {args.batch_size}")
    if args.resume and not args.checkpoint:
        raise SystemExit(f"{recipe}: --resume needs --checkpoint FILE (the checkpoint to continue from)")
    if args.checkpoint_every and not args.checkpoint:
        raise SystemExit(f"{recipe}: --checkpoint-every needs --checkpoint FILE")
    if args.checkpoint and not ("zfeed" in sources and "real" in modes):
        what = "--checkpoint and --resume apply" if args.resume else "--checkpoint applies"
        raise SystemExit(f"{recipe}: {what} to the zfeed real-mode run only (--source zfeed --mode real), and "
                         f"this invocation has none (--source {args.source} --mode {args.mode}); the baseline "
                         "DataLoader has no state to checkpoint")


def run_recipe(args, recipe: str, make_task: Callable[[Any, Dist], Task], sources: Sequence[str], *,
               describe: Callable[[Task], dict], plot_title: Callable[[Task], str],
               validation_table: Callable[[dict], str], before_run: Callable[[Task], None] | None = None,
               after_run: Callable[[Task, dict], None] | None = None) -> int:
    """What a recipe's main() does once its arguments are parsed: trains the task once per source
    and mode (--source, --mode), then on the main rank prints the throughput and validation tables
    and writes the JSON record (the recipe's `describe(task)` first) and the plot."""
    modes = parse_list(args.mode, MODES, "--mode")
    check_loop_arguments(args, recipe, sources, modes)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dist = setup_distributed(args.device)
    try:
        set_deterministic(dist.device)
        task = make_task(args, dist)
        others = [f"{source}/{mode}" for source in sources for mode in modes if (source, mode) != ("zfeed", "real")]
        if args.checkpoint and others and dist.main:
            log(f"{recipe}: --checkpoint{' and --resume' if args.resume else ''} apply to the zfeed/real run only: "
                f"the {', '.join(others)} run{'s' if len(others) > 1 else ''} neither load nor write {args.checkpoint}")
        runs = []
        for source in sources:
            for mode in modes:
                if before_run:
                    before_run(task)
                # Only the zfeed real-mode run resumes from and writes the checkpoint: the other
                # runs measure throughput from the same initial weights.
                keeps_checkpoint = (source, mode) == ("zfeed", "real")
                result = train(
                    task, dist, source=source, mode=mode, epochs=args.epochs, steps=args.steps, warmup=args.warmup,
                    log_every=args.log_every, checkpoint=args.checkpoint if keeps_checkpoint else None,
                    checkpoint_every=args.checkpoint_every, resume=args.resume and keeps_checkpoint,
                    times_log=args.times_log, count_model_flops=not args.no_flops,
                    validate=not args.no_val, seed=args.seed, amp_dtype=AMP_DTYPES[args.amp])
                summary = result.summary(args.warmup)
                if dist.main and 0 < result.steps <= args.warmup:
                    log(f"{recipe}: --warmup {args.warmup} is not below the {result.steps} steps of the "
                        f"{source}/{mode} run: its timing statistics hold its last step only")
                if after_run:
                    after_run(task, summary)
                runs.append(summary)
        if dist.main:
            print(summary_table(runs))
            validation = next((r["validation"] for r in runs if r["validation"]), None)
            if validation:
                print(validation_table(validation))
            document = {"recipe": recipe, "store": args.store, **describe(task),
                        **run_record(args, dist, task, runs, validation)}
            if args.json:
                write_json(args.json, document)
            if args.plot:
                plot_throughput(args.plot, runs, title=plot_title(task))
        dist.barrier()
    finally:
        dist.close()
    return 0


def _fmt(p: dict, scale: float = 1.0, digits: int = 1) -> str:
    if p["median"] is None:
        return "-"
    return (f"{p['median'] / scale:.{digits}f} [{p['p10'] / scale:.{digits}f}, "
            f"{p['p90'] / scale:.{digits}f}]")


def summary_table(summaries: Sequence[dict]) -> str:
    rows = [("source", "mode", "steps", "samples/s", "MB/s", "GFLOP/s", "wait", "final loss")]
    for s in summaries:
        rows.append((s["source"], s["mode"], str(s["timed_steps"]), _fmt(s["samples_per_s"]),
                     _fmt(s["mb_per_s"]), _fmt(s["flop_per_s"], 1e9),
                     f"{s['wait_fraction']:.0%}" if s["wait_fraction"] is not None else "-",
                     f"{s['final_loss']:.4f}" if s["final_loss"] is not None else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    text = "\n".join(lines)
    text += "\nmedian [10th, 90th percentile] over the timed steps; wait: share of step time spent waiting for data"
    processes = max((s.get("processes", 1) for s in summaries), default=1)
    text += (f"\nsamples/s, MB/s and GFLOP/s are the job's: each step's rates summed over its {processes} processes"
             if processes > 1 else "\nsamples/s, MB/s and GFLOP/s of the job's one process")
    text += "; MB/s: decoded input + target bytes delivered from the store"
    for source, fraction in headline(summaries).items():
        text += f"\n{source}: real-data throughput is {fraction:.0%} of synthetic"
    return text


def write_json(path: str, document: dict) -> None:
    """``document`` as indented JSON at ``path``, written atomically as :func:`save_checkpoint`
    writes (a document that does not serialize raises and leaves ``path`` as it was)."""
    def write(f) -> None:
        json.dump(document, f, indent=2, default=float)
        f.write("\n")

    _write_atomically(path, write, binary=False, prefix=".json-")


def plot_throughput(path: str, summaries: Sequence[dict], title: str = "") -> None:
    """Bars of median samples/s per mode, grouped by source, with 10th-90th percentile error bars;
    the headline fractions in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = [s for s in SOURCES if any(x["source"] == s for x in summaries)]
    modes = [m for m in MODES if any(x["mode"] == m for x in summaries)]
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(sources) * max(len(modes), 1), 4.2))
    width = 0.8 / max(len(modes), 1)
    colors = {"real": "#1f77b4", "load-only": "#ff7f0e", "synthetic": "#2ca02c"}
    for j, mode in enumerate(modes):
        xs, heights, lo, hi = [], [], [], []
        for i, source in enumerate(sources):
            s = next((x for x in summaries if x["source"] == source and x["mode"] == mode), None)
            p = s["samples_per_s"] if s else {"median": None}
            if p["median"] is None:
                continue
            xs.append(i + (j - (len(modes) - 1) / 2) * width)
            heights.append(p["median"])
            lo.append(p["median"] - p["p10"])
            hi.append(p["p90"] - p["median"])
        if xs:
            ax.bar(xs, heights, width * 0.95, yerr=[lo, hi], capsize=3, label=mode, color=colors.get(mode))
            for x, h in zip(xs, heights):
                ax.annotate(f"{h:.3g}", (x, h), ha="center", va="bottom", fontsize=8,
                            xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(sources)))
    ax.set_xticklabels(sources)
    # load-only can run orders of magnitude above training (its 90th percentile too, where batches
    # were already waiting): a log axis keeps every bar readable.
    spread = [x["samples_per_s"][k] for x in summaries for k in ("median", "p10", "p90")
              if x["samples_per_s"].get(k)]
    log_scale = bool(spread) and max(spread) > 20 * min(spread)
    if log_scale:
        ax.set_yscale("log")
    processes = max((x.get("processes", 1) for x in summaries), default=1)
    ax.set_ylabel("samples/s (median, 10th-90th pct)" + (f", job of {processes} processes" if processes > 1 else "")
                  + (", log scale" if log_scale else ""))
    heads = headline(summaries)
    sub = ", ".join(f"{k}: real = {v:.0%} of synthetic" for k, v in heads.items())
    ax.set_title("\n".join(t for t in (title, sub) if t), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------------------------
# Command-line pieces every recipe takes


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("training loop")
    g.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    g.add_argument("--steps", type=int, default=0, help="stop after this many steps in all (0: run the epochs)")
    g.add_argument("--batch-size", type=int, default=16, help="samples per batch per process (default 16)")
    g.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    g.add_argument("--weight-decay", type=float, default=1e-4, help="AdamW weight decay (default 1e-4)")
    g.add_argument("--seed", type=int, default=0, help="model initialization and sample order (default 0)")
    g.add_argument("--device", default="auto", help="auto (cuda:LOCAL_RANK where available), cpu, cuda")
    g.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none",
                   help="mixed precision (fp16 with loss scaling); default none")
    g.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    g.add_argument("--checkpoint", help="checkpoint file of the zfeed real-mode run (written atomically at the end "
                                        "and every --checkpoint-every steps; other sources and modes neither "
                                        "load nor write it)")
    g.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: only at the end)")
    g.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint where it exists (rank 0's file decides; it must have been "
                        "written with the same data, normalization, model, loss and optimizer options)")
    g.add_argument("--log-every", type=int, default=10, help="steps between progress lines (0: none)")
    g.add_argument("--times-log", help="append each rank's sample times per step to PREFIX.rankN")
    d = parser.add_argument_group("data placement")
    d.add_argument("--stage-dir", help="a node-local directory: copy the store's training data there first "
                                       "(resumable; one copy per node; {node} in it becomes the node's index) "
                                       "and train from the copy")
    d.add_argument("--stage-in-background", action="store_true",
                   help="with --stage-dir: train at once, reading the store while the copy is made, and "
                        "from the copy alone in the epochs that start after it is done")
    d.add_argument("--partition", choices=("global", "node"), default="global",
                   help="global: every rank draws from all training samples; node: each node trains on "
                        "its own contiguous block of them (with --stage-dir, copying only its block)")
    t = parser.add_argument_group("throughput accounting")
    t.add_argument("--mode", default="real",
                   help="real, load-only, synthetic, or several comma-separated (each run in turn)")
    t.add_argument("--source", default="zfeed", help="zfeed, baseline, or both comma-separated")
    t.add_argument("--warmup", type=int, default=2, help="steps left out of the timing statistics (default 2)")
    t.add_argument("--no-flops", action="store_true", help="skip counting the model's FLOPs")
    t.add_argument("--baseline-workers", type=int, default=2, help="DataLoader workers of the baseline (default 2)")
    t.add_argument("--json", help="write the results as JSON here")
    t.add_argument("--plot", help="write the throughput bar chart (PNG) here")


def loader_placement(args) -> dict:
    """The Loader arguments of --stage-dir, --stage-in-background and --partition."""
    return {"stage": args.stage_dir, "stage_in_background": bool(args.stage_in_background),
            "partition": args.partition}


def parse_list(text: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SystemExit(f"{what} must be among {', '.join(allowed)}, got {text!r}")
    return items


AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
AMP_NAMES = {dtype: name for name, dtype in AMP_DTYPES.items()}


def parse_int_list(text: str, what: str, minimum: int = 1) -> list[int]:
    """Comma-separated integers, each at least ``minimum``; SystemExit naming ``what`` for an
    empty item, a non-integer or a value below the minimum."""
    items = [x.strip() for x in str(text).split(",")]
    try:
        values = [int(x) for x in items]
    except ValueError:
        values = None
    if not values or any(v < minimum for v in values):
        raise SystemExit(f"{what} must be comma-separated integers of at least {minimum}, got {text!r}")
    return values
