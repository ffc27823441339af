"""The training data loader: batches of samples from a Zarr group, read by zfeed's C++ engine.

::

    loader = zfeed.Loader("era5.zarr", inputs=["t2m", "u500", ("z", [3, 5])], targets=["t2m"],
                          lead=1, batch_size=16, seed=0)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader:            # {"inputs", "targets", "times"}: NumPy arrays
            x = torch.from_dlpack(batch["inputs"])   # zero-copy
            ...
        state = loader.state_dict()     # after any batch; load_state_dict() resumes exactly

A sample at time ``t`` stacks the input variables at ``t - (history - 1) * history_step, ...,
t - history_step, t`` (oldest first, the
variables in the order given, each variable's levels in the order given) and the targets at
``t + lead`` as channels: ``inputs`` is ``[batch, history * channels, lat, lon]`` and ``targets``
``[batch, channels, lat, lon]`` in ``dtype`` (float32, float16 or bfloat16, the last as
``ml_dtypes.bfloat16``), ``times`` int64 ``[batch]`` (the sample times ``t``). An integer target
variable (a segmentation mask) makes the targets labels: int64 ``[batch, lat, lon]``, never
normalized. With ``random_crop``, ``crops`` int64 ``[batch, 2]`` gives each sample's window origin.
With a list of leads (``lead=[1, 2, 3]``, a rollout) the targets hold each lead's channels in turn.

Variables are arrays of the group, or channels of a stacked array ``data(time, variable, lat,
lon)`` whose ``variables`` attribute names them (anemoi-datasets' layout). An input with dims
``(lat, lon)`` (a land-sea mask, the orography) is static: one channel, the same plane for every
sample (cropped with it), placed after the history's channels (``input_channels`` marks it
``"static": True``); it is read once, when the loader is made.

Where compressed chunks hold several time steps, the order is chunk-aware (``order="auto"``): the
epoch visits the time chunks in a shuffled order, ``window`` chunks at a time, shuffling the samples
within the window, so that each chunk is decoded once per epoch (the decoded-chunk cache holds the
window). Uncompressed planes are read by byte range, so uncompressed arrays keep a plain shuffle
unless ``order="chunks"``.

The arrays view the loader's batch buffers (no copy); a buffer is reused only once every array of
its batch has been dropped, and the loader keeps ``prefetch + 1`` buffers while the consumer holds
one batch at a time (more are lent, never overwritten, if the consumer keeps more). NumPy arrays
speak DLPack: ``torch.from_dlpack(batch["inputs"])`` is zero-copy (see :mod:`zfeed.torch` for
tensors directly, bfloat16 included).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import _core
from .array import Group, _store


# The keys of a variable given as a dict (LoaderSpec's variable spec).
_VARIABLE_KEYS = ("name", "levels", "level_values", "mean", "std")


def _integer(value: Any, name: str, integral_float: bool = False) -> int:
    """``value`` as an int: Python and NumPy integers only, so that ``batch_size=2.7`` is an error
    rather than 2 (and True is no 1). ``integral_float``: a float with no fraction is fine too
    (``cache_bytes=2e9``)."""
    if integral_float and isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise _core.ZarrError(f"loader: {name} must be an integer, got {value!r}")
    return int(value)


def _flag(value: Any, name: str) -> bool:
    """``value`` as a bool: True or False (NumPy's too); a string such as "no" is not taken as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise _core.ZarrError(f"loader: {name} must be True or False, got {value!r}")
    return bool(value)


def _statistic(value: Any, what: str) -> float | list[float]:
    """A mean or std for the spec: a number, or a list of numbers (one per level)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # a ragged list
        array = None
    # Numbers only: NumPy would take None as NaN, "1.5" as 1.5 and True as 1.
    if array is None or array.dtype.kind not in "iuf" or array.ndim > 1 or array.size == 0:
        raise _core.ZarrError(f"loader: {what} must be a number or a list of numbers, got {value!r}")
    return array.astype(np.float64).tolist()


def _variable(item: Any, role: str, normalize: Any) -> dict:
    if isinstance(item, str):
        spec: dict = {"name": item}
    elif isinstance(item, Mapping):
        spec = dict(item)
        unknown = [key for key in spec if key not in _VARIABLE_KEYS]
        if unknown:
            raise _core.ZarrError(
                f"loader: {role} variable {spec.get('name')!r}: unknown key {unknown[0]!r} (the keys are "
                f"{', '.join(_VARIABLE_KEYS)})")
    elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
        levels, what = item[1], f"a level of {role} variable {item[0]!r}"
        many = isinstance(levels, (tuple, list, range, np.ndarray))
        spec = {"name": item[0], "levels": [_integer(x, what) for x in levels] if many else [_integer(levels, what)]}
    else:
        raise _core.ZarrError(f"loader: each of the {role} is a name, (name, level or levels) or a dict, got {item!r}")
    if isinstance(normalize, Mapping) and spec.get("name") in normalize and "mean" not in spec:
        name = spec["name"]
        pair = normalize[name]
        if isinstance(pair, np.ndarray) and pair.ndim >= 1:
            pair = list(pair)
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise _core.ZarrError(f"loader: normalize[{name!r}] must be (mean, std), got {pair!r}")
        spec["mean"] = _statistic(pair[0], f"normalize[{name!r}]'s mean")
        spec["std"] = _statistic(pair[1], f"normalize[{name!r}]'s std")
    return spec


def _normalize_flag(normalize: Any, variables: Sequence[dict]) -> bool:
    """The spec's "normalize" after checking that ``normalize`` is True, False or ``{name: (mean,
    std)}`` naming only variables in use (an entry for another would be ignored without a word: a
    typo, or a variable left out)."""
    if isinstance(normalize, Mapping):
        names = list(dict.fromkeys(spec["name"] for spec in variables if isinstance(spec.get("name"), str)))
        unused = [name for name in normalize if name not in names]
        if unused:
            raise _core.ZarrError(
                f"loader: normalize gives statistics for {', '.join(map(repr, unused))}, which "
                f"{'is' if len(unused) == 1 else 'are'} not among the inputs and targets ({', '.join(names)})")
        return True
    if not isinstance(normalize, (bool, np.bool_)):
        raise _core.ZarrError(f"loader: normalize must be True, False or {{name: (mean, std)}}, got {normalize!r}")
    return bool(normalize)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    return int(text) if text else default


def default_rank_and_world_size() -> tuple[int, int]:
    """torch.distributed's rank and world size when a process group is initialized, else the
    ``RANK`` and ``WORLD_SIZE`` environment variables (as torchrun sets them), else (0, 1)."""
    import sys
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)


def node_layout(rank: int, world_size: int, local_world_size: int | None = None) -> tuple[int, int, int, int]:
    """``(node, nodes, local_rank, local_world_size)`` of this process in a job of ``world_size``
    processes: from ``local_world_size`` where given (ranks numbered node after node, as torchrun
    and srun number them), else torchrun's ``LOCAL_WORLD_SIZE`` (its ``GROUP_RANK`` the node),
    else SLURM's ``SLURM_NNODES`` and ``SLURM_NODEID``; a job of one process is one node."""
    if local_world_size is None:
        local_world_size = _env_int("LOCAL_WORLD_SIZE", 0) or None
        nodes = _env_int("SLURM_NNODES", 0)
        if local_world_size is None and nodes > 0 and world_size % nodes == 0:
            local_world_size = world_size // nodes
        if local_world_size is None:
            if world_size == 1:
                return 0, 1, 0, 1
            raise _core.ZarrError(
                f"loader: partition='node' needs to know the processes per node for rank {rank} of "
                f"{world_size}: run under torchrun (LOCAL_WORLD_SIZE) or srun (SLURM_NNODES), or give "
                "local_world_size")
    local_world_size = _integer(local_world_size, "local_world_size")
    if local_world_size < 1 or world_size % local_world_size != 0:
        raise _core.ZarrError(f"loader: {world_size} processes do not make nodes of local_world_size "
                              f"{local_world_size} each")
    return rank // local_world_size, world_size // local_world_size, rank % local_world_size, local_world_size


def _device(device: Any) -> int | None:
    """None for the CPU, else the CUDA device index after checking that CUDA works ("cuda" is
    torch's current device where torch is loaded, else device 0)."""
    text = str(device).strip().lower()
    if text == "cpu":
        return None
    if text != "cuda" and not (text.startswith("cuda:") and text[5:].isdigit()):
        raise _core.ZarrError(f"loader: device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    status = _core.cuda_status()
    reason = status["reason"]
    if text.startswith("cuda:"):
        index = int(text[5:])
    else:
        import sys
        torch = sys.modules.get("torch")
        index = torch.cuda.current_device() if torch is not None and status["available"] else 0
    if status["available"] and index >= status["device_count"]:
        reason = f"no CUDA device {index} ({status['device_count']} found)"
    if not status["available"] or reason:
        raise _core.UnsupportedError(f"device={device!r} is unavailable: {reason}; use device='cpu'")
    return index


def _from_dlpack(framework: str):
    """The function that turns a zfeed CudaTensor into the framework's tensor (zero-copy; the
    framework passes its current stream, which then waits on the batch's copy)."""
    if framework == "torch":
        import torch
        return torch.from_dlpack
    if framework == "cupy":
        import cupy
        return cupy.from_dlpack
    if framework == "dlpack":
        return lambda tensor: tensor
    raise _core.ZarrError(f"loader: framework must be 'torch', 'cupy' or 'dlpack', got {framework!r}")


def _typed(array, dtype: str):
    if dtype == "float16":
        return array.view(np.float16)
    if dtype == "bfloat16":
        import ml_dtypes
        return array.view(ml_dtypes.bfloat16)
    return array


def _time_range(value) -> list | None:
    """``time_range`` as the spec's ``[start, stop]`` (either None)."""
    if value is None:
        return None
    if isinstance(value, (slice, range)):
        if value.step not in (None, 1):
            raise _core.ZarrError(f"loader: time_range takes no step, got {value!r}")
        value = (value.start, value.stop)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise _core.ZarrError(f"loader: time_range is (start, stop), a slice or a range, got {value!r}")
    ends = []
    for end in value:
        if end is not None and not isinstance(end, (int, np.integer)):
            raise _core.ZarrError(f"loader: time_range's ends are integers or None, got {value!r}")
        ends.append(None if end is None else int(end))
    return ends


def _lead(value) -> int | list[int]:
    """``lead`` as the spec takes it: a number, or a list of them (targets at each, in turn)."""
    leads = [value] if isinstance(value, (int, np.integer)) else value
    if isinstance(value, bool) or not isinstance(leads, (list, tuple, range)) or not leads or \
            not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in leads):
        raise _core.ZarrError(f"loader: lead is an integer or a non-empty list of integers, got {value!r}")
    if any(x < 0 for x in leads):
        raise _core.ZarrError(f"loader: lead must not be negative, got {value!r}")
    return int(value) if isinstance(value, (int, np.integer)) else [int(x) for x in leads]


def _fill_nan(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value):
        raise _core.ZarrError(f"loader: fill_nan must be a finite number or None, got {value!r}")
    return float(value)


class Loader:
    """Batches of (inputs, targets) from variables of a Zarr group; see the module docstring.

    ``store``: a path, URL (``s3://``, ``gs://``, ``https://``: read with ``ZFEED_IO_THREADS``
    requests in flight; or stage it to local disk first with :func:`zfeed.stage`), store or
    :class:`zfeed.Group`. ``inputs``/``targets``: variable names,
    ``(name, level_index or [level_indices])`` for (time, level, lat, lon) arrays, or dicts
    ``{"name", "levels", "level_values", "mean", "std"}`` (``level_values``: levels by the values
    of the coordinate named like the level dimension, as xarray's ``.sel``: ``[500, 850]``). ``normalize``: True (given statistics, else each
    array's ``zfeed_stats`` attribute ``{"mean": .., "std": ..}``, else none), False, or a dict
    ``{name: (mean, std)}`` of variables among the inputs and targets (the others as True does).
    Integer arguments take Python or NumPy integers (``batch_size=2.7`` is an error, not 2), and
    flags (``shuffle``, ``drop_last``, ...) True or False; a dict variable takes the keys above only.
    ``crop``: ``(lat_start, lat_size, lon_start, lon_size)``.
    ``random_crop``: ``(lat_size, lon_size)``, a window per sample drawn from (seed, epoch, time).
    ``dtype``: "float32", "float16" or "bfloat16" for the inputs (and float targets).
    ``order``: "auto", "random" or "chunks"; ``window``: time chunks per window (0: automatic);
    ``cache_bytes``: the decoded-chunk cache budget (None: automatic). ``stacked``: the name of the
    stacked array (default "data").
    ``rank``/``world_size`` default to torch.distributed's (when initialized), else to the
    ``RANK``/``WORLD_SIZE`` environment variables.
    ``device``: "cpu" (NumPy batches), or "cuda" / "cuda:N": inputs and targets arrive on the GPU
    as ``framework`` tensors ("torch", "cupy", or "dlpack": zfeed's own CudaTensor objects that
    any DLPack consumer takes). Host threads assemble raw values into pinned buffers, a copy
    stream moves each batch while the previous one trains, and a kernel normalizes and casts it
    (the values equal the CPU path's bit for bit). ``device_buffers``: device batches in flight
    (2: double buffering, 3: triple). A batch's memory is reused only after the tensors made from
    it are freed and the stream that used them has passed that point. Raises
    :class:`zfeed.UnsupportedError` with the reason where CUDA is unavailable.
    ``decode`` (with a CUDA device): "cpu" (zfeed's threads decode), "gpu" (the host only reads
    the stored chunks; nvCOMP decodes zstd, gzip, zlib and LZ4 chunks on the GPU in one batched
    call per codec; other codecs still decode on the CPU, in the same batch) or "auto" (measures
    both on the first batches, keeps the faster); ``stats()["device"]["decode"]`` says which runs
    and why. ``gds`` (chunks that decode on the GPU, from a local store): "auto" (cuFile reads
    them straight into GPU memory where GPUDirect Storage runs in full, with the nvidia-fs
    driver; elsewhere the host reads them into pinned memory), "on" (always cuFile, also in its
    compat mode; an error where it is unavailable), "off" (the host reads); None takes the
    ``ZFEED_GDS`` environment variable, else "auto". ``stats()["device"]["read"]`` says which
    and why. Chunks read into GPU memory are checked on the GPU before nvCOMP sees them, by the
    same code as the host's check.
    ``time_range``: the part of the time axis the loader uses, ``(start, stop)``, ``slice(start,
    stop)`` or ``range(start, stop)`` as Python slices take them (None for an end of the axis,
    negative from the end): every sample's inputs (history included) and targets lie in
    ``[start, stop)``, so a training loader on ``(None, split)`` and a validation loader on
    ``(split, None)`` share no time step.
    ``history_step``: the time steps between two input steps of the history (6 for 6-hourly
    inputs from an hourly store; ``lead`` counts the store's steps too).
    ``lead``: the target time step ``t + lead``, or a list of leads (a rollout: ``[1, 2, 3]``):
    the targets' channels at each lead in turn, ``[batch, len(lead) * channels, lat, lon]``; every
    sample's furthest lead stays inside the time axis (and ``time_range``).
    CF-encoded variables (``scale_factor``, ``add_offset``, ``_FillValue``, ``missing_value``) are
    decoded as xarray decodes them before the normalization.
    ``fill_nan``: NaN values (missing data, as sea surface temperature over land) become this
    number in the batches, after normalization (so 0.0 is the channel's mean); None (the default)
    leaves them NaN. Label targets are not affected (a NaN label is already -100, PyTorch's
    ignore_index).
    ``drop_last``: True drops the remainder of the epoch that does not divide evenly among the
    ranks and the last incomplete batch; False pads every rank to the same count by repeating the
    epoch's first samples (as PyTorch's DistributedSampler does) and keeps the last, smaller batch.
    ``stage``: a node-local directory: the loader first copies what it reads there (the time
    steps of its samples, of the arrays along time; the rest of the store whole) and then reads
    the copy; resumable, and the processes of a node share one copy (see :func:`zfeed.stage`);
    ``{node}`` in it becomes the node's index (for nodes that stage to one shared file system).
    Progress goes to stderr unless ``stage_progress=False``; ``staged`` says what was done; Ctrl-C
    stops the copy (the next loader goes on from there).
    ``stage_in_background``: make the copy on a thread of the loader's while the batches come at
    once, read from the source and from what the copy holds already (the first epoch then runs
    at the source's speed, and no rank waits for its node's copy, which on a cluster could
    outlast the process group's timeout); the epochs that start once the copy is done read the
    copy alone. ``staged`` shows the copy's progress meanwhile; a copy that fails (a node's disk
    full, a source that drops a connection) leaves the loader reading from the source as it did
    while the copy ran, with a warning on stderr and the error in ``staged["failed"]``.
    ``partition``: "global" (every rank draws from all samples) or "node": the samples split into
    one contiguous block of equal count per node (the remainder left out), the ranks of a node
    sharing their node's block, shuffled within it each epoch; with ``stage`` each node copies
    only its block's time steps (a fraction of the data per node, as MLPerf HPC's DeepCAM stages
    its data). The node layout comes from ``local_world_size`` where given, else from torchrun or
    srun (see :func:`node_layout`); a global batch still mixes every node's block.
    """

    def __init__(self, store, inputs: Sequence, targets: Sequence = (), lead: int | Sequence[int] = 1,
                 history: int = 1, history_step: int = 1,
                 batch_size: int = 16, shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = True, normalize: Any = True,
                 prefetch: int = 2, epoch: int = 0, crop: Sequence[int] | None = None, path: str | None = None,
                 random_crop: Sequence[int] | None = None, dtype: str = "float32", order: str = "auto",
                 window: int = 0, cache_bytes: int | None = None, stacked: str = "data",
                 device: str = "cpu", framework: str = "torch", device_buffers: int = 3, decode: str = "cpu",
                 gds: str | None = None, time_range=None, fill_nan: float | None = None,
                 stage: str | os.PathLike | None = None, partition: str = "global",
                 local_world_size: int | None = None, stage_progress: bool = True,
                 stage_in_background: bool = False):
        if decode not in ("cpu", "gpu", "auto"):
            raise _core.ZarrError(f"loader: decode must be 'cpu', 'gpu' or 'auto', got {decode!r}")
        if gds not in (None, "auto", "on", "off"):
            raise _core.ZarrError(f"loader: gds must be 'auto', 'on' or 'off', got {gds!r}")
        self._device = _device(device)
        if self._device is None and decode != "cpu":
            raise _core.ZarrError(f"loader: decode={decode!r} needs device='cuda' (the batches go to the GPU)")
        if self._device is None and gds is not None:
            raise _core.ZarrError(f"loader: gds={gds!r} needs device='cuda' (it reads chunks into GPU memory)")
        if self._device is not None:
            self._convert = _from_dlpack(framework)
            if _integer(device_buffers, "device_buffers") < 2:
                raise _core.ZarrError(f"loader: device_buffers must be at least 2, got {device_buffers}")
        if isinstance(store, Group):
            core_store, group_path = store._core.store, store.path
        else:
            core_store, group_path = _store(store), ""
        if path:
            group_path = f"{group_path}/{path}".strip("/")
        if isinstance(inputs, (str, Mapping)):
            inputs = [inputs]
        if isinstance(targets, (str, Mapping)):
            targets = [targets]
        default_rank, default_world = default_rank_and_world_size()
        rank = _integer(rank, "rank") if rank is not None else default_rank
        world_size = _integer(world_size, "world_size") if world_size is not None else default_world
        node, nodes = 0, 1
        if partition == "node":
            node, nodes, rank, world_size = node_layout(rank, world_size, local_world_size)
        elif partition != "global":
            raise _core.ZarrError(f"loader: partition must be 'global' or 'node', got {partition!r}")
        dtype = np.dtype(dtype).name if dtype != "bfloat16" else dtype
        variables = {role: [_variable(v, role, normalize) for v in given]
                     for role, given in (("inputs", inputs), ("targets", targets))}
        spec = {
            "path": group_path,
            "inputs": variables["inputs"],
            "targets": variables["targets"],
            "lead": _lead(lead),
            "history": _integer(history, "history"),
            "history_step": _integer(history_step, "history_step"),
            "batch_size": _integer(batch_size, "batch_size"),
            "shuffle": _flag(shuffle, "shuffle"),
            "seed": _integer(seed, "seed"),
            "rank": rank,
            "world_size": world_size,
            "node": node,
            "nodes": nodes,
            # "{node}" in the path: the node's index, for nodes that share one file system.
            "stage_dir": os.fspath(stage).replace("{node}", str(node)) if stage is not None else None,
            "stage_in_background": _flag(stage_in_background, "stage_in_background"),
            "drop_last": _flag(drop_last, "drop_last"),
            "normalize": _normalize_flag(normalize, variables["inputs"] + variables["targets"]),
            "prefetch": _integer(prefetch, "prefetch"),
            "epoch": _integer(epoch, "epoch"),
            "crop": [_integer(c, "each value of crop") for c in crop] if crop is not None else None,
            "random_crop": [_integer(c, "each value of random_crop") for c in random_crop]
                           if random_crop is not None else None,
            "dtype": dtype,
            "order": str(order),
            "window": _integer(window, "window"),
            "cache_bytes": (_integer(cache_bytes, "cache_bytes", integral_float=True)
                            if cache_bytes is not None else None),
            "stacked": str(stacked),
            "time_range": _time_range(time_range),
            "fill_nan": _fill_nan(fill_nan),
        }
        for name in ("history", "history_step", "batch_size", "seed", "rank", "world_size", "prefetch", "epoch", "window"):
            if spec[name] < 0:
                raise _core.ZarrError(f"loader: {name} must not be negative, got {spec[name]}")
        if spec["cache_bytes"] is not None and spec["cache_bytes"] < 0:
            raise _core.ZarrError(f"loader: cache_bytes must not be negative, got {spec['cache_bytes']}")
        progress = _flag(stage_progress, "stage_progress")
        if self._device is None:
            self._core = _core.Loader(core_store, json.dumps(spec), progress)
        else:
            self._core = _core.DeviceLoader(core_store, json.dumps(spec), self._device, int(device_buffers) - 1,
                                            decode, gds or "", progress)
        self._random_crop = random_crop is not None

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self._core.batches_per_epoch

    def __iter__(self) -> Iterator[dict]:
        """The rest of the current epoch (all of it, unless resumed or interrupted); once an
        iteration has reached the end of an epoch, iterating again runs the next one."""
        self._core.begin_iteration()
        while True:
            item = self._core.next()
            if item is None:
                return
            inputs, targets, times, _epoch, _index, crops = item
            if self._device is not None:
                batch = {"inputs": self._convert(inputs), "targets": self._convert(targets), "times": times}
            else:
                batch = {"inputs": _typed(inputs, self._core.input_dtype),
                         "targets": targets[:, 0] if self._core.label_targets else _typed(targets, self._core.target_dtype),
                         "times": times}
            if self._random_crop:
                batch["crops"] = crops
            yield batch

    @property
    def device(self) -> str:
        """"cpu" or "cuda:N": where the batches are."""
        return "cpu" if self._device is None else f"cuda:{self._device}"

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (a no-op for the current epoch, so that a restored
        position survives the usual ``set_epoch`` at the top of the training loop)."""
        self._core.set_epoch(_integer(epoch, "epoch"))

    @property
    def epoch(self) -> int:
        return self._core.epoch

    @property
    def num_samples(self) -> int:
        """Valid sample times in the dataset (all ranks)."""
        return self._core.num_samples

    @property
    def time_span(self) -> tuple[int, int]:
        """The time steps ``[start, stop)`` this loader's samples read: ``time_range``, narrowed
        to the node's block with ``partition="node"``."""
        return tuple(self._core.time_span)

    @property
    def staged(self) -> dict | None:
        """With ``stage``: keys, copied, present, missing, bytes_copied, seconds,
        already_complete, time_range (the steps copied, or None for the whole store) and
        running (False); while a copy runs in the background (``stage_in_background``):
        running (True), keys_done, keys, bytes_copied and seconds so far; where that copy
        failed, running (False) and failed (the error; the loader reads the source); else None."""
        return json.loads(self._core.staged_json())

    @property
    def input_shape(self) -> tuple:
        return tuple(self._core.input_shape)

    @property
    def target_shape(self) -> tuple:
        """``[batch, channels, lat, lon]``, or ``[batch, lat, lon]`` for label targets."""
        shape = tuple(self._core.target_shape)
        return (shape[0],) + shape[2:] if self._core.label_targets else shape

    @property
    def dtype(self) -> str:
        """The element type of the inputs."""
        return self._core.input_dtype

    @property
    def target_dtype(self) -> str:
        """The element type of the targets ("int64" for labels)."""
        return self._core.target_dtype

    @property
    def order(self) -> str:
        """The sample order in use: "random" or "chunks" (chunk-aware)."""
        return self._core.order

    @property
    def memory_bound(self) -> int:
        """Bytes of memory the loader holds at most while the consumer keeps one batch at a time:
        batch buffers, the decoded-chunk cache budget, one batch's chunks in flight, and per thread
        its scratch buffers. The chunk files it reads stay mapped: those pages are the page
        cache's (the kernel reclaims them as it needs), though the resident size counts them."""
        return self._core.memory_bound

    @property
    def input_channels(self) -> list[dict]:
        """Per input channel: variable, level, time_offset, the mean/std applied (or None), static
        (a (lat, lon) field, time_offset then meaningless), fill_nan (or None) and cf (the CF
        decoding applied first: scale_factor, add_offset, missing; or None)."""
        return json.loads(self._core.input_channels_json())

    @property
    def target_channels(self) -> list[dict]:
        return json.loads(self._core.target_channels_json())

    def state_dict(self) -> dict:
        """Where this loader stands: epoch, batches handed out in it, seed and layout."""
        return json.loads(self._core.state_json())

    def load_state_dict(self, state: Mapping) -> None:
        """Continue after the last batch the saved loader handed out, bit for bit."""
        self._core.restore_json(json.dumps(dict(state)))

    def stats(self) -> dict:
        """Seconds per stage, summed over zfeed's threads: read_s (storage reads), decode_s
        (codecs), assemble_s (scatter, cast, normalize); wall seconds: batch_s (producing batches),
        wait_s (the consumer waiting in the iterator), prefetch_idle_s; bytes read (compressed),
        decoded and delivered; chunks decoded through the cache, cache hits and bytes held;
        batches, samples and batch buffers allocated. With a CUDA device, ``device``: batches,
        bytes_to_device (raw values copied), bytes_delivered (in the output types), host_wait_s
        (waiting for host batches), copy_wait_s (waiting for a copy to free a host buffer), slots
        (device batch buffers), registered_bytes (host batch memory pinned), copy_s (GPU time of
        the copies, nvCOMP decodes included), copies_timed and copy_bytes_timed (the batches and
        bytes in copy_s: their ratio is the copy rate), chunks_gpu_decoded, bytes_gpu_decoded, compressed_to_device,
        gpu_decode_failures and last_gpu_decode_error (such batches decode again on the CPU), decode:
        {asked, mode, reason, auto_cpu_ms_per_batch, auto_gpu_ms_per_batch, auto_parts_ms: {cpu, gpu:
        {host_loader, staging, gpu}}} (decode="auto": each stage's median time per batch on each
        path; the stages overlap while batches stream, so a path's cost is its slowest), and read:
        {asked, mode
        ("gds" or "compat": cuFile into GPU memory; "host"), reason, chunks_to_device,
        bytes_to_device, cufile_bytes, fallback_bytes, failures, last_error}."""
        return json.loads(self._core.stats_json())

    def __repr__(self) -> str:
        return (f"<zfeed.Loader inputs={self.input_shape} targets={self.target_shape} "
                f"batches={len(self)} epoch={self.epoch}>")
