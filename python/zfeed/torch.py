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
workers), so an epoch still sees every sample exactly once.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch

from .loader import Loader, default_rank_and_world_size


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
    ``rank`` and ``world_size`` default to torch.distributed's (or ``RANK``/``WORLD_SIZE``).
    Use with ``DataLoader(dataset, batch_size=None)``."""

    def __init__(self, store, **loader_args: Any):
        super().__init__()
        self._store = store
        self._args = dict(loader_args)
        rank, world = self._args.pop("rank", None), self._args.pop("world_size", None)
        default_rank, default_world = default_rank_and_world_size()
        self._rank = default_rank if rank is None else int(rank)
        self._world = default_world if world is None else int(world)
        self._epoch = int(self._args.pop("epoch", 0))
        self._state: dict | None = None
        self._loader: Loader | None = None
        self._worker: tuple[int, int] | None = None

    def _get_loader(self) -> Loader:
        info = torch.utils.data.get_worker_info()
        if info is not None and str(self._args.get("device", "cpu")).startswith("cuda"):
            raise RuntimeError("zfeed: device='cuda' batches are made in the main process (zfeed's own threads "
                               "read and copy them): use DataLoader(..., num_workers=0)")
        worker = (info.id, info.num_workers) if info is not None else (0, 1)
        if self._loader is None or self._worker != worker:
            self._loader = Loader(self._store, rank=self._rank * worker[1] + worker[0],
                                  world_size=self._world * worker[1], epoch=self._epoch, **self._args)
            self._worker = worker
            if self._state is not None and worker[1] == 1:
                self._loader.load_state_dict(self._state)
                self._state = None
        return self._loader

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` at its first batch on the next iteration (kept if it is the current,
        restored epoch)."""
        self._epoch = int(epoch)
        if self._loader is not None:
            self._loader.set_epoch(self._epoch)

    def __iter__(self) -> Iterator[dict]:
        loader = self._get_loader()
        for batch in loader:
            yield to_torch(batch)

    def __len__(self) -> int:
        """Batches per epoch on this rank (with workers: of each worker)."""
        return len(self._get_loader())

    def state_dict(self) -> dict:
        """Where the loader stands (in the main process; workers keep their own state)."""
        return self._get_loader().state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self._state = dict(state)
        self._epoch = int(state["epoch"])
        if self._loader is not None and self._worker == (0, 1):
            self._loader.load_state_dict(self._state)
            self._state = None

    def stats(self) -> dict:
        return self._get_loader().stats()
