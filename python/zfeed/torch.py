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
        if array.dtype.name == "bfloat16":
            out[name] = torch.from_dlpack(array.view("uint16")).view(torch.bfloat16)
        else:
            out[name] = torch.from_dlpack(array)
    return out


class CudaCopier:
    """Copies a CPU batch to ``device`` (``Loader(device="cuda")``, first increment of issue 6):
    ``inputs`` and ``targets`` on a side stream, which the current stream then waits on through an
    event (no device-wide synchronize); ``times`` and ``crops`` stay on the CPU. The copies read
    the loader's pageable batch buffer, which CUDA stages before the copy call returns, so the
    buffer may go back to the loader at once. Not yet: pinned buffers, the kernel cast on the GPU
    and overlap of host assembly with the copy (zfeed's C++ cuda/ layer has the pieces)."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)

    def __call__(self, batch: Mapping[str, Any]) -> dict:
        tensors = to_torch(batch)
        consumer = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(consumer)  # the consumer's earlier work on reused memory
        out = {}
        with torch.cuda.stream(self.stream):
            for name, tensor in tensors.items():
                if name in ("inputs", "targets"):
                    moved = tensor.to(self.device, non_blocking=True)
                    moved.record_stream(consumer)  # freed only after the consumer's use
                    out[name] = moved
                else:
                    out[name] = tensor
        consumer.wait_stream(self.stream)  # an event wait on the GPU, not a host wait
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
