"""PyTorch integration: batches as torch tensors, and an IterableDataset for code that wants one.

::

    from zfeed.torch import ZarrIterableDataset, to_torch
    dataset = ZarrIterableDataset("era5.zarr", inputs=[...], targets=[...], batch_size=16)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None)   # zfeed batches already
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            x, y = batch["inputs"], batch["targets"]                    # torch tensors, zero-copy

zfeed reads with its own threads, so ``num_workers=0`` is the fast setting. With DataLoader
workers each worker reads a disjoint share of the rank's samples (the sharding multiplies ranks by
workers), so an epoch still sees every sample exactly once. Call ``dataset.set_epoch(epoch)`` before
each epoch, as the loop above does (and as PyTorch's DistributedSampler needs): with workers it is
what moves the order on (see :class:`ZarrIterableDataset`). The workers' positions stay in the
workers, though: ``dataset.state_dict()`` then says the epoch only, and a state saved in the middle
of an epoch cannot be restored into workers (it raises :class:`zfeed.ZarrError`): resume mid-epoch
with ``num_workers=0``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterator, Mapping

import torch

from ._core import ZarrError
from .loader import Loader, _integer, default_rank_and_world_size, node_layout


def to_torch(batch: Mapping[str, Any]) -> dict:
    """The batch's arrays as torch tensors sharing their memory (DLPack; bfloat16 through its
    bits, since NumPy has no bfloat16 of its own)."""
    out = {}
    for name, array in batch.items():
        if isinstance(array, torch.Tensor):  # a Loader(device="cuda") batch: already torch
            out[name] = array
        elif array.dtype.name == "bfloat16":
            out[name] = torch.from_dlpack(array.view("uint16")).view(torch.bfloat16)
        else:
            out[name] = torch.from_dlpack(array)
    return out


class ZarrIterableDataset(torch.utils.data.IterableDataset):
    """Batches of a :class:`zfeed.Loader` as dicts of torch tensors. Takes the Loader's arguments;
    ``rank`` and ``world_size`` default to torch.distributed's (or ``RANK``/``WORLD_SIZE``), read
    when the loader is made (at the first ``iter``, ``len``, ``state_dict`` or ``stats``), so a
    dataset may be built before ``init_process_group``.
    Use with ``DataLoader(dataset, batch_size=None)``; it pickles (for ``spawn`` and
    ``forkserver`` workers) without its loader, which each process makes anew.

    With DataLoader workers (``num_workers > 0``) each worker has a loader of its own: the rank's
    samples shared among them, ``partition="node"`` keeping every worker on its rank's node.
    ``state_dict()`` in the main process cannot see where the workers are: it says the epoch, not
    the batches handed out in it (and warns where this process has not iterated the dataset);
    ``load_state_dict()`` of a state from the middle of an epoch raises :class:`zfeed.ZarrError`
    in the workers. Resume mid-epoch with ``num_workers=0`` (zfeed reads in parallel on its own
    threads anyway).

    Epochs: call ``set_epoch(epoch)`` before each epoch (as PyTorch's DistributedSampler needs).
    With ``num_workers=0`` iterating the dataset again also moves on to the next epoch by itself,
    but DataLoader workers start from a copy of the dataset at each iteration of the DataLoader,
    so without ``set_epoch`` every epoch repeats the order of the same one; this process cannot
    see that happen (the workers iterate, not it), so nothing warns of it. With
    ``persistent_workers=True`` the workers keep their copies: each moves on to the next epoch by
    itself, and ``set_epoch`` in this process does not reach them.

    A copy for a worker (pickled for ``spawn``, or inherited by ``fork``) starts at the first batch
    of the dataset's epoch: a peek with ``next(iter(dataset))`` in this process does not move the
    workers. Only a position restored with ``load_state_dict`` travels to them (and, from the
    middle of an epoch, only to a single worker: see above)."""

    def __init__(self, store, **loader_args: Any):
        super().__init__()
        self._store = store
        self._args = dict(loader_args)
        rank, world = self._args.pop("rank", None), self._args.pop("world_size", None)
        # None: torch.distributed's, when the loader is made
        self._rank = None if rank is None else _integer(rank, "rank")
        self._world = None if world is None else _integer(world, "world_size")
        self._epoch = _integer(self._args.pop("epoch", 0), "epoch")
        self._state: dict | None = None  # a position to restore when the loader is made
        # load_state_dict was called (and no set_epoch has left its epoch): the loader's position
        # then goes along to a worker's copy (_state_for_a_copy).
        self._restored = False
        self._loader: Loader | None = None
        self._loader_pid: int | None = None  # the process that made _loader (a forked worker inherits it)
        self._layout: tuple | None = None  # (rank, world_size, worker id, workers) of the loader
        self._iterated = False  # whether this process has iterated the dataset

    def __getstate__(self) -> dict:
        """The dataset without its loader (a native object, made again where it is used). Where
        torch.distributed is initialized here, its rank and world size go along (a ``spawn``
        worker's process group is not); else the defaults stay to be read by the new process."""
        state = dict(self.__dict__)
        state["_state"] = self._state_for_a_copy()
        state["_loader"], state["_loader_pid"], state["_layout"], state["_iterated"] = None, None, None, False
        if self._rank is None or self._world is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                state["_rank"], state["_world"] = self._rank_and_world()
        return state

    def _state_for_a_copy(self) -> dict | None:
        """The position a copy of this dataset (a DataLoader worker's) starts from: a restored
        position (one still to apply, or as far as this process's loader has gone on from it);
        else None, the start of the epoch. A position this process merely iterated to (a peek)
        stays here: the workers start the epoch, under fork and spawn alike (two or more would
        refuse a position in the middle of one)."""
        if self._state is not None or not self._restored or self._loader is None:
            return self._state
        position = self._loader.state_dict()
        return position if position["batch"] > 0 else None  # at batch 0: its epoch alone (_epoch)

    def _rank_and_world(self) -> tuple[int, int]:
        default_rank, default_world = default_rank_and_world_size()
        return (default_rank if self._rank is None else self._rank,
                default_world if self._world is None else self._world)

    def _get_loader(self) -> Loader:
        info = torch.utils.data.get_worker_info()
        if info is not None and str(self._args.get("device", "cpu")).startswith("cuda"):
            raise RuntimeError("zfeed: device='cuda' batches are made in the main process (zfeed's own threads "
                               "read and copy them): use DataLoader(..., num_workers=0)")
        if self._loader is not None and self._loader_pid != os.getpid():
            # A forked child (a DataLoader worker) inherited this process's loader: start where a
            # pickled copy (a spawn worker) starts, so that fork and spawn agree.
            self._state = self._state_for_a_copy()
            self._loader, self._layout, self._iterated = None, None, False
        worker_id, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._rank_and_world()
        layout = (rank, world, worker_id, workers)
        if self._loader is None or self._layout != layout:
            args = dict(self._args)
            if workers > 1 and args.get("partition", "global") == "node":
                # The workers of a rank are the ranks of its node multiplied, as the ranks are:
                # rank * workers + id of world_size * workers, local_world_size * workers a node.
                _, _, _, local_world = node_layout(rank, world, args.get("local_world_size"))
                args["local_world_size"] = local_world * workers
            state = self._state
            if state is not None and workers > 1 and int(state.get("batch", 0)) > 0:
                raise ZarrError(
                    f"ZarrIterableDataset: the state to restore is {state['batch']} batches into epoch "
                    f"{state['epoch']}, and the {workers} DataLoader workers each read a share of the "
                    "epoch from a position of their own, which no state holds: resume it with "
                    "num_workers=0, or start an epoch (set_epoch) with workers")
            self._loader = Loader(self._store, rank=rank * workers + worker_id, world_size=world * workers,
                                  epoch=self._epoch, **args)
            self._loader_pid = os.getpid()
            self._layout = layout
            if state is not None and workers == 1:
                self._loader.load_state_dict(state)
                self._state = None
        return self._loader

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` at its first batch on the next iteration (kept if it is the current,
        restored epoch)."""
        epoch = _integer(epoch, "epoch")
        if epoch != self._epoch:
            self._restored = False  # a restored position in another epoch: moot now
        self._epoch = epoch
        if self._state is not None and int(self._state["epoch"]) != self._epoch:
            self._state = None
        if self._loader is not None:
            self._loader.set_epoch(self._epoch)

    def __iter__(self) -> Iterator[dict]:
        loader = self._get_loader()
        self._iterated = True
        for batch in loader:
            yield to_torch(batch)

    def __len__(self) -> int:
        """Batches per epoch on this rank (with workers: of each worker)."""
        return len(self._get_loader())

    def state_dict(self) -> dict:
        """Where the loader of this process stands. With DataLoader workers that loader does not
        iterate (the workers' do), so the state says the epoch only: a resume starts it over."""
        if torch.utils.data.get_worker_info() is None and not self._iterated:
            warnings.warn("ZarrIterableDataset.state_dict(): this process has not iterated the dataset; with "
                          "DataLoader workers (num_workers > 0) their positions are theirs, and this state holds "
                          "the epoch only (a resume starts it over); use num_workers=0 to resume mid-epoch",
                          stacklevel=2)
        return self._get_loader().state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        """Resume where ``state`` was saved (on the next iteration). With DataLoader workers, only
        at the start of an epoch: a state from the middle of one raises :class:`zfeed.ZarrError`
        when the workers start."""
        self._state = dict(state)
        self._restored = True
        self._epoch = int(state["epoch"])
        if self._loader is not None and self._layout is not None and self._layout[3] == 1:
            self._loader.load_state_dict(self._state)
            self._state = None

    def stats(self) -> dict:
        return self._get_loader().stats()
