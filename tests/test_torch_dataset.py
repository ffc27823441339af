"""zfeed.torch.ZarrIterableDataset with DataLoader workers and process groups: partition="node"
keeps every worker on its rank's node, the dataset pickles (spawn workers) once it holds a loader,
states that workers cannot honour are errors, and rank and world size are read when the loader
is made, not when the dataset is built."""

from __future__ import annotations

import json
import os
import pickle
import socket
import types
import warnings

import numpy as np
import pytest

import zfeed

torch = pytest.importorskip("torch")
from zfeed.torch import ZarrIterableDataset  # noqa: E402

T = 41


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch-dataset") / "tiny.zarr"
    root = zfeed.create_group(path)
    values = np.arange(T * 3 * 4, dtype="float32").reshape(T, 3, 4)
    root.create_array("t2m", shape=values.shape, chunks=(1, 3, 4), dtype="float32", data=values,
                      dimension_names=["time", "latitude", "longitude"])
    return path


@pytest.fixture
def no_launcher(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SLURM_NNODES", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _quiet_state(dataset) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dataset.state_dict()


def _times(batches) -> list[int]:
    return [int(t) for batch in batches for t in batch["times"].tolist()]


def test_node_partition_keeps_each_worker_on_its_rank_s_node(store, no_launcher, tmp_path):
    """Rank 1 of 4, two per node, is on node 0; so are both its DataLoader workers (rank 1 * 2 +
    id of 8 "ranks", 4 per node), and they stage node 0's block."""
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "4")
    no_launcher.setenv("LOCAL_WORLD_SIZE", "2")
    kwargs = dict(inputs=["t2m"], targets=["t2m"], batch_size=1, seed=2, partition="node", drop_last=False)
    plain = zfeed.Loader(store, **kwargs)
    want = plain.state_dict()
    assert (want["node"], want["nodes"]) == (0, 2)
    start, stop = plain.time_span
    dataset = ZarrIterableDataset(store, **kwargs)
    seen = []
    for worker in range(2):
        no_launcher.setattr(torch.utils.data, "get_worker_info",
                            lambda worker=worker: types.SimpleNamespace(id=worker, num_workers=2))
        state = dataset.state_dict()
        assert (state["node"], state["nodes"]) == (0, 2), state
        assert (state["rank"], state["world_size"]) == (2 + worker, 4), state  # within the node: 4 "ranks"
        times = _times(dataset)
        assert times and all(start <= t < stop for t in times), (times, plain.time_span)
        seen.append(times)
    assert not set(seen[0]) & set(seen[1])
    no_launcher.undo()
    # Real workers (fork), staging to a directory per node: only node 0's is made.
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "4")
    no_launcher.setenv("LOCAL_WORLD_SIZE", "2")
    dataset = ZarrIterableDataset(store, stage=tmp_path / "node{node}" / "tiny.zarr", stage_progress=False, **kwargs)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    times = _times(loader)
    assert times and all(start <= t < stop for t in times)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node0"]


def test_a_dataset_that_holds_its_loader_pickles(store, no_launcher):
    """After len(), state_dict() or stats() the dataset holds a native loader; it pickles without
    it (spawn and forkserver workers), and the copy makes its own, at the same position."""
    dataset = ZarrIterableDataset(store, inputs=["t2m"], targets=["t2m"], batch_size=4, seed=6)
    assert len(dataset) == (T - 1) // 4
    dataset.stats()
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(copy) == len(dataset)
    assert _times(copy) == _times(dataset)
    # A resumed dataset: the copy resumes where the state says.
    resumed = ZarrIterableDataset(store, inputs=["t2m"], targets=["t2m"], batch_size=4, seed=6)
    first = iter(dataset)
    next(first), next(first)
    resumed.load_state_dict(dataset.state_dict())
    len(resumed)
    assert _times(pickle.loads(pickle.dumps(resumed))) == _times(first)
    # A spawn worker.
    dataset = ZarrIterableDataset(store, inputs=["t2m"], targets=["t2m"], batch_size=4, seed=6, drop_last=False)
    len(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    assert sorted(_times(loader)) == list(range(T - 1))


def test_workers_refuse_a_state_from_the_middle_of_an_epoch(store, no_launcher):
    """DataLoader workers each read from a position of their own, which no state holds: a
    mid-epoch state is an error there (num_workers=0 resumes it), an epoch's start is fine, and
    state_dict() in a process that has not iterated says what it lacks."""
    kwargs = dict(inputs=["t2m"], targets=["t2m"], batch_size=2, seed=4, drop_last=False)
    source = ZarrIterableDataset(store, **kwargs)
    with pytest.warns(UserWarning, match="has not iterated the dataset.*num_workers=0"):
        source.state_dict()
    batches = iter(torch.utils.data.DataLoader(source, batch_size=None, num_workers=0))
    next(batches), next(batches), next(batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = source.state_dict()  # iterated here: no warning
    assert state["batch"] == 3
    rest = _times(batches)
    mid = ZarrIterableDataset(store, **kwargs)
    mid.load_state_dict(state)
    with pytest.raises(zfeed.ZarrError, match="3 batches into epoch 0.*num_workers=0"):
        list(torch.utils.data.DataLoader(mid, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    resumed = ZarrIterableDataset(store, **kwargs)
    resumed.load_state_dict(state)
    assert _times(torch.utils.data.DataLoader(resumed, batch_size=None, num_workers=0)) == rest
    # The start of an epoch restores with workers: its epoch.
    start = dict(state, epoch=3, batch=0)
    at_start = ZarrIterableDataset(store, **kwargs)
    at_start.load_state_dict(start)
    times = _times(torch.utils.data.DataLoader(at_start, batch_size=None, num_workers=2,
                                               multiprocessing_context="fork"))
    assert sorted(times) == list(range(T - 1))
    epoch3 = ZarrIterableDataset(store, epoch=3, **kwargs)
    epoch3_times = _times(torch.utils.data.DataLoader(epoch3, batch_size=None, num_workers=2,
                                                      multiprocessing_context="fork"))
    assert times == epoch3_times
    # A state from the end of an epoch, and the next epoch started as a training loop starts it.
    ended = ZarrIterableDataset(store, **kwargs)
    ended.load_state_dict(dict(state, batch=len(source)))
    ended.set_epoch(1)
    times = _times(torch.utils.data.DataLoader(ended, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    assert sorted(times) == list(range(T - 1))


def _epoch_times(dataset, workers, context="fork", **options) -> list[int]:
    return _times(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                              multiprocessing_context=context if workers else None, **options))


def test_a_peek_in_this_process_does_not_move_the_workers(store, no_launcher):
    """next(iter(dataset)) before the DataLoader (a look at the shapes) leaves the workers at the
    start of the epoch under fork and spawn alike: spawn workers were handed the peek's position
    (and two of them refused it, "1 batches into epoch 0"), a single forked worker went on after it."""
    kwargs = dict(inputs=["t2m"], targets=["t2m"], batch_size=4, seed=5, drop_last=False)
    whole = _epoch_times(ZarrIterableDataset(store, **kwargs), 0)
    assert sorted(whole) == list(range(T - 1))
    for context, workers in (("spawn", 2), ("fork", 1), ("fork", 2)):
        dataset = ZarrIterableDataset(store, **kwargs)
        peeked = next(iter(dataset))
        assert tuple(peeked["inputs"].shape) == (4, 1, 3, 4)
        times = _epoch_times(dataset, workers, context)
        assert sorted(times) == list(range(T - 1)), (context, workers)
        if workers == 1:  # one worker reads as the rank itself: the same order
            assert times == whole, context
    assert _times(pickle.loads(pickle.dumps(dataset))) == whole  # a pickled copy, as a spawn worker's
    assert _times(dataset) == whole[4:]  # this process goes on after its peek


def test_a_restored_position_travels_to_the_workers(store, no_launcher):
    """A position given to load_state_dict reaches a worker's copy under fork and spawn, also once
    this process has made its loader (which takes the position): a single worker goes on from it,
    two refuse it (forked, they started the epoch over without a word); set_epoch to another
    epoch drops it."""
    kwargs = dict(inputs=["t2m"], targets=["t2m"], batch_size=2, seed=4, drop_last=False)
    source = ZarrIterableDataset(store, **kwargs)
    batches = iter(source)
    next(batches), next(batches), next(batches)
    state = source.state_dict()
    rest = _times(batches)

    def restored() -> ZarrIterableDataset:
        dataset = ZarrIterableDataset(store, **kwargs)
        dataset.load_state_dict(state)
        assert len(dataset) == len(source)  # makes the loader here, which takes the position
        return dataset

    for context in ("fork", "spawn"):
        assert _epoch_times(restored(), 1, context) == rest, context
    with pytest.raises(zfeed.ZarrError, match="3 batches into epoch 0.*num_workers=0"):
        _epoch_times(restored(), 2, "fork")
    moved_on = restored()
    moved_on.set_epoch(1)
    assert sorted(_epoch_times(moved_on, 2, "fork")) == list(range(T - 1))


def test_with_workers_set_epoch_moves_the_order_on(store, no_launcher):
    """As documented: DataLoader workers start from a copy of the dataset each time, so without
    set_epoch every pass repeats the epoch's order (num_workers=0 moves on by itself); set_epoch
    moves it on, as persistent workers move on by themselves."""
    kwargs = dict(inputs=["t2m"], targets=["t2m"], batch_size=4, seed=9, drop_last=False)
    alone = ZarrIterableDataset(store, **kwargs)
    main_process = [_epoch_times(alone, 0) for _ in range(2)]
    assert main_process[0] != main_process[1]
    dataset = ZarrIterableDataset(store, **kwargs)
    repeated = [_epoch_times(dataset, 2) for _ in range(2)]
    assert repeated[0] == repeated[1]
    stepped = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        stepped.append(_epoch_times(dataset, 2))
    assert stepped[0] == repeated[0] and stepped[1] != stepped[0]
    assert all(sorted(times) == list(range(T - 1)) for times in stepped)
    persistent = ZarrIterableDataset(store, **kwargs)
    loader = torch.utils.data.DataLoader(persistent, batch_size=None, num_workers=2, multiprocessing_context="fork",
                                         persistent_workers=True)
    assert [_times(loader) for _ in range(2)] == stepped


def test_rank_and_world_size_are_read_when_the_loader_is_made(store, no_launcher):
    """A dataset built before the launcher's rank is known (mp.spawn sets no RANK; the process
    group comes later) takes the rank the process has when it makes its loader."""
    dataset = ZarrIterableDataset(store, inputs=["t2m"], targets=["t2m"], batch_size=1)
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "2")
    state = _quiet_state(dataset)
    assert (state["rank"], state["world_size"]) == (1, 2)
    assert len(dataset) == (T - 1) // 2
    given = ZarrIterableDataset(store, inputs=["t2m"], targets=["t2m"], batch_size=1, rank=0, world_size=3)
    state = _quiet_state(given)
    assert (state["rank"], state["world_size"]) == (0, 3)


def _spawned(rank: int, world: int, port: int, dataset, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        state = _quiet_state(dataset)
        carried = pickle.loads(pickle.dumps(dataset))  # as for a spawn worker, whose group is not initialized
        result = {"rank": state["rank"], "world_size": state["world_size"], "batches": len(dataset),
                  "carried": list(carried._rank_and_world())}
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        torch.distributed.destroy_process_group()


def test_a_dataset_passed_to_mp_spawn_takes_each_process_s_rank(store, no_launcher, tmp_path):
    """torch.multiprocessing.spawn: the dataset is built (and pickled) in the launcher, which has
    no rank; each process reads its own from the process group it starts."""
    dataset = ZarrIterableDataset(store, inputs=["t2m"], targets=["t2m"], batch_size=1)
    len(dataset)  # a loader made in the launcher (rank 0 of 1) does not travel
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_spawned, args=(2, port, dataset, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result == {"rank": rank, "world_size": 2, "batches": (T - 1) // 2, "carried": [rank, 2]}, result


def test_zfeed_torch_is_there_after_a_plain_import():
    """The README's zfeed.torch.to_torch(batch) after `import zfeed` alone: the submodule (which
    imports torch) is loaded on first use."""
    import subprocess
    import sys

    script = "import sys, zfeed\nassert 'torch' not in sys.modules\nprint(zfeed.torch.to_torch.__name__)\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "to_torch"
