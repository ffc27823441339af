"""zfeed.Loader against NumPy reads of the same samples: contents, normalization, resume, ranks,
buffer reuse and errors, on a small ERA5-like store written by zfeed."""

from __future__ import annotations

import gc
import resource

import time

import numpy as np
import pytest

import zfeed

T, LAT, LON = 40, 16, 32
INPUTS = ["t2m", "u500", "v500", ("t", [2, 0]), "z500", "q500"]
TARGETS = ["t2m", "z500"]


@pytest.fixture(scope="module")
def era5(tmp_path_factory):
    path = tmp_path_factory.mktemp("loader") / "era5.zarr"
    root = zfeed.create_group(path)
    rng = np.random.default_rng(0)
    dims = ["time", "latitude", "longitude"]
    data = {}
    specs = {
        "t2m": ("float32", 280.0, 10.0, None),
        "u500": ("float32", 5.0, 8.0, {"mean": 5.0, "std": 8.0}),
        "v500": ("float32", 0.0, 6.0, {"mean": 0.25, "std": 6.5}),
        "z500": ("float64", 55000.0, 300.0, {"mean": 55000.0, "std": 300.0}),
        "q500": ("int16", 100.0, 20.0, {"mean": 100.0, "std": 20.0}),
    }
    for name, (dtype, mean, std, stats) in specs.items():
        values = (mean + std * rng.standard_normal((T, LAT, LON))).astype(dtype)
        root.create_array(name, shape=(T, LAT, LON), chunks=(1, LAT, LON), dtype=dtype, compressor="zstd:3",
                          dimension_names=dims, attributes={"zfeed_stats": stats} if stats else {}, data=values)
        data[name] = values
    values = (250.0 + 15.0 * rng.standard_normal((T, 3, LAT, LON))).astype("float32")
    root.create_array("t", shape=(T, 3, LAT, LON), chunks=(1, 1, LAT, LON), dtype="float32", compressor="zstd:3",
                      dimension_names=["time", "level", "latitude", "longitude"], data=values,
                      attributes={"zfeed_stats": {"mean": [240.0, 250.0, 260.0], "std": [10.0, 12.0, 14.0]}})
    data["t"] = values
    root.create_array("small", shape=(T, LAT, LON - 2), chunks=(1, LAT, LON - 2), dtype="float32")
    return path, data


def expected(data, channels, time):
    planes = []
    for channel in channels:
        values = data[channel["variable"]][time + channel["time_offset"]]
        if channel["level"] is not None:
            values = values[channel["level"]]
        values = values.astype(np.float32)
        if channel["normalized"]:
            values = (values - np.float32(channel["mean"])) / np.float32(channel["std"])
        planes.append(values)
    return np.stack(planes)


def copies(loader):
    return [{k: np.array(v, copy=True) for k, v in batch.items()} for batch in loader]


def test_batches_equal_numpy_reads(era5):
    path, data = era5
    loader = zfeed.Loader(path, inputs=INPUTS, targets=TARGETS, lead=2, history=2, batch_size=5, seed=3)
    assert len(loader) == (T - 2 - 1) // 5
    assert loader.input_shape == (5, 14, LAT, LON)
    channels = loader.input_channels
    assert [c["variable"] for c in channels[:7]] == ["t2m", "u500", "v500", "t", "t", "z500", "q500"]
    assert channels[3]["level"] == 2 and channels[3]["mean"] == 260.0 and channels[3]["time_offset"] == -1
    assert not channels[0]["normalized"]
    seen = []
    for batch in loader:
        assert batch["inputs"].dtype == np.float32 and batch["inputs"].shape == (5, 14, LAT, LON)
        assert batch["targets"].shape == (5, 2, LAT, LON)
        for i, t in enumerate(batch["times"]):
            np.testing.assert_array_equal(batch["inputs"][i], expected(data, channels, int(t)))
            np.testing.assert_array_equal(batch["targets"][i], expected(data, loader.target_channels, int(t)))
            seen.append(int(t))
    assert len(set(seen)) == len(seen) == len(loader) * 5
    assert all(1 <= t <= T - 3 for t in seen)
    stats = loader.stats()
    assert stats["batches"] == len(loader) and stats["samples"] == len(seen)
    assert stats["bytes_delivered"] == len(seen) * 16 * LAT * LON * 4
    assert stats["read_s"] > 0 and stats["bytes_decoded"] > 0


def test_given_statistics_and_no_normalization(era5):
    path, data = era5
    loader = zfeed.Loader(path, inputs=["t2m", "u500"], targets=[], batch_size=4,
                          normalize={"t2m": (280.0, 10.0)}, lead=0)
    batch = next(iter(loader))
    t = int(batch["times"][0])
    np.testing.assert_array_equal(batch["inputs"][0, 0], (data["t2m"][t] - np.float32(280.0)) / np.float32(10.0))
    np.testing.assert_array_equal(batch["inputs"][0, 1], (data["u500"][t] - np.float32(5.0)) / np.float32(8.0))
    raw = zfeed.Loader(path, inputs=["u500", "q500"], targets=["u500"], normalize=False, batch_size=4, crop=(2, 8, 4, 16))
    batch = next(iter(raw))
    t = int(batch["times"][0])
    np.testing.assert_array_equal(batch["inputs"][0, 0], data["u500"][t, 2:10, 4:20])
    np.testing.assert_array_equal(batch["inputs"][0, 1], data["q500"][t, 2:10, 4:20].astype(np.float32))
    np.testing.assert_array_equal(batch["targets"][0, 0], data["u500"][t + 1, 2:10, 4:20])


def test_resume_yields_the_identical_remaining_batches(era5):
    path, _ = era5
    kwargs = dict(inputs=INPUTS, targets=TARGETS, batch_size=4, seed=17, epoch=2)
    full = copies(zfeed.Loader(path, **kwargs))
    for k in (0, 1, 4, len(full)):
        first = zfeed.Loader(path, **kwargs)
        iterator = iter(first)
        for _ in range(k):
            next(iterator)
        state = first.state_dict()
        assert state["epoch"] == 2 and state["batch"] == k and state["seed"] == 17
        resumed = zfeed.Loader(path, **kwargs)
        resumed.load_state_dict(state)
        resumed.set_epoch(2)  # the usual call at the top of a training loop keeps the position
        rest = copies(resumed)
        assert len(rest) == len(full) - k
        for a, b in zip(rest, full[k:]):
            for key in a:
                assert a[key].tobytes() == b[key].tobytes()


def test_time_range_splits_training_from_validation(era5):
    """A training loader on (None, split) and a validation loader on (split, None): every
    sample's inputs and targets inside its range, the two disjoint, each sample once per epoch
    across ranks; the forms a range takes; a resume inside a range."""
    path, data = era5
    split = T - 6
    kwargs = dict(inputs=INPUTS, targets=TARGETS, lead=2, history=2, batch_size=1, drop_last=False, seed=4)
    used = {}
    for name, time_range in (("train", (None, split)), ("val", slice(split, None))):
        loader = zfeed.Loader(path, time_range=time_range, **kwargs)
        times = []
        for batch in loader:
            for i, t in enumerate(batch["times"]):
                np.testing.assert_array_equal(batch["inputs"][i], expected(data, loader.input_channels, int(t)))
                times.append(int(t))
        used[name] = {u for t in times for u in range(t - 1, t + 3)}  # history 2, lead 2
        assert len(times) == len(set(times))
        if name == "train":
            assert sorted(times) == list(range(1, split - 2))
        else:
            assert sorted(times) == list(range(split + 1, T - 2))
    assert max(used["train"]) < split <= min(used["val"])
    # Two ranks share a range's samples out between them.
    ranks = [[int(t) for b in zfeed.Loader(path, time_range=range(3, 15), rank=r, world_size=2, **kwargs)
              for t in b["times"]] for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 5  # 9 samples, padded to equal counts
    assert set(ranks[0] + ranks[1]) == set(range(4, 13))
    # Negative ends count from the end; a resume stays in its range.
    ranged = dict(kwargs, batch_size=3, time_range=(-10, -1))
    full = copies(zfeed.Loader(path, **ranged))
    first = zfeed.Loader(path, **ranged)
    next(iter(first))
    resumed = zfeed.Loader(path, **ranged)
    resumed.load_state_dict(first.state_dict())
    rest = copies(resumed)
    assert [b["times"].tolist() for b in rest] == [b["times"].tolist() for b in full[1:]]
    assert all(T - 9 <= t <= T - 4 for b in full for t in b["times"])
    with pytest.raises(zfeed.ZarrError, match="holds 2 of the"):
        zfeed.Loader(path, time_range=(5, 7), **kwargs)
    with pytest.raises(zfeed.ZarrError, match="no step"):
        zfeed.Loader(path, time_range=slice(0, 10, 2), **kwargs)
    with pytest.raises(zfeed.ZarrError, match="integers or None"):
        zfeed.Loader(path, time_range=(0.5, 10), **kwargs)
    with pytest.raises(zfeed.ZarrError, match="time_start"):
        other = zfeed.Loader(path, **dict(ranged, time_range=(-11, -2)))
        other.load_state_dict(first.state_dict())


def test_epochs_shuffle_deterministically(era5):
    path, _ = era5
    loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], batch_size=8, seed=5)
    epoch0 = [b["times"].copy() for b in loader]
    epoch1 = [b["times"].copy() for b in loader]  # iterating again runs the next epoch
    assert loader.epoch == 1
    assert not all(np.array_equal(a, b) for a, b in zip(epoch0, epoch1))
    again = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], batch_size=8, seed=5)
    again.set_epoch(1)
    assert all(np.array_equal(a, b["times"]) for a, b in zip(epoch1, again))


def test_set_epoch_starts_an_epoch_that_is_over_again(era5):
    """A validation loader set to epoch 0 before each evaluation reads the same samples each time
    (set_epoch of the epoch just finished used to be ignored, and the next epoch ran)."""
    path, _ = era5
    loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], batch_size=8, seed=5)
    first = [b["times"].copy() for b in loader]
    loader.set_epoch(0)
    assert loader.epoch == 0
    assert all(np.array_equal(a, b["times"]) for a, b in zip(first, loader))


def test_threads_sharing_a_loader_take_turns(era5):
    """Two threads iterating one loader share its batches (each once, none lost); a set_epoch from
    a third while they iterate neither hangs nor crashes them."""
    import threading

    path, _ = era5
    loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], batch_size=4, seed=5, drop_last=False)
    seen = [[], []]
    errors = []

    def iterate(mine):
        try:
            for batch in loader:
                mine.append(batch["times"].copy())
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=iterate, args=(seen[i],)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads) and not errors, errors
    times = np.sort(np.concatenate(seen[0] + seen[1]))
    assert np.array_equal(times, np.sort(np.concatenate([b["times"] for b in zfeed.Loader(
        path, inputs=["t2m"], targets=["t2m"], batch_size=4, seed=5, drop_last=False)])))

    def set_epochs():
        for epoch in range(10, 30):
            loader.set_epoch(epoch)
            time.sleep(0.002)

    setter = threading.Thread(target=set_epochs)
    reader = threading.Thread(target=iterate, args=([],))
    setter.start()
    reader.start()
    setter.join(timeout=60)
    reader.join(timeout=60)  # the epoch it is in when the setter is done runs to its end
    assert not reader.is_alive() and not setter.is_alive() and not errors, errors


def reference_order(n, seed, epoch):
    """SplitMix64 + Fisher-Yates as the C++ sampler documents it (the order is part of resume)."""
    mask = (1 << 64) - 1

    class SplitMix64:
        def __init__(self, state):
            self.state = state & mask

        def next(self):
            self.state = (self.state + 0x9E3779B97F4A7C15) & mask
            z = self.state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            return z ^ (z >> 31)

        def below(self, bound):
            threshold = ((1 << 64) - bound) % bound
            while True:
                r = self.next()
                if r >= threshold:
                    return r % bound

    mix = SplitMix64(epoch ^ 0xD1B54A32D192ED03)
    rng = SplitMix64(seed ^ mix.next())
    order = list(range(n))
    for i in range(n, 1, -1):
        j = rng.below(i)
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def test_order_matches_the_documented_prng(era5):
    path, _ = era5
    loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], batch_size=1, seed=123, epoch=4)
    times = [int(b["times"][0]) for b in loader]
    assert times == reference_order(T - 1, 123, 4)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_see_disjoint_samples_covering_the_epoch(era5, world_size, drop_last):
    path, _ = era5
    n = T - 1
    per_rank = []
    for rank in range(world_size):
        loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], batch_size=1, seed=9, rank=rank,
                              world_size=world_size, drop_last=drop_last)
        per_rank.append([int(t) for b in loader for t in b["times"]])
    counts = {len(times) for times in per_rank}
    assert len(counts) == 1
    everything = [t for times in per_rank for t in times]
    if drop_last or n % world_size == 0:
        assert len(everything) == len(set(everything)) == n - n % world_size  # disjoint
    else:
        assert set(everything) == set(range(n))  # every sample, a few repeated as padding
        assert len(everything) == -(-n // world_size) * world_size


def test_rank_and_world_size_default_from_the_environment(era5, monkeypatch):
    path, _ = era5
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], batch_size=1, seed=9)
    state = loader.state_dict()
    assert state["rank"] == 1 and state["world_size"] == 2
    assert len(loader) == (T - 1) // 2


def test_buffers_are_reused_and_memory_does_not_grow(era5):
    path, _ = era5
    loader = zfeed.Loader(path, inputs=INPUTS, targets=TARGETS, batch_size=4, prefetch=2)
    addresses = set()
    for _ in loader:  # warm up
        pass
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(20):
        for batch in loader:
            addresses.add(batch["inputs"].__array_interface__["data"][0])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert len(addresses) <= 3
    assert loader.stats()["buffers"] == 3  # prefetch + 1
    assert after - before < 20 * 1024  # KiB: far below 20 epochs of batches (~30 MiB)


def test_batches_are_zero_copy_and_outlive_the_loader(era5):
    path, data = era5
    loader = zfeed.Loader(path, inputs=["u500"], targets=["u500"], batch_size=2, normalize=False, prefetch=1)
    kept = list(loader)  # the consumer keeps every batch: none is overwritten, no deadlock
    assert len({b["inputs"].__array_interface__["data"][0] for b in kept}) == len(kept)
    view = np.from_dlpack(kept[0]["inputs"])
    assert np.shares_memory(view, kept[0]["inputs"])
    del loader
    gc.collect()
    t = int(kept[0]["times"][0])
    np.testing.assert_array_equal(view[0, 0], data["u500"][t])
    np.testing.assert_array_equal(kept[-1]["targets"][0, 0], data["u500"][int(kept[-1]["times"][0]) + 1])


def test_works_with_torch_without_workers(era5):
    torch = pytest.importorskip("torch")
    path, data = era5
    loader = zfeed.Loader(path, inputs=["u500"], targets=["u500"], batch_size=2, normalize=False)

    class Dataset(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(loader)

    for batch in torch.utils.data.DataLoader(Dataset(), batch_size=None, num_workers=0):
        x = torch.from_dlpack(batch["inputs"])
        t = int(batch["times"][0])
        assert np.array_equal(x[0, 0].numpy(), data["u500"][t])
        break


def test_errors_raise_zarr_error(era5):
    path, _ = era5
    with pytest.raises(zfeed.ZarrError, match="input variable 'nope' not found in .*it holds: .*t2m"):
        zfeed.Loader(path, inputs=["t2m", "nope"], targets=["t2m"])
    with pytest.raises(zfeed.ZarrError, match=r"'small' has shape \(40, 16, 30\) but 't2m' has \(40, 16, 32\)"):
        zfeed.Loader(path, inputs=["t2m"], targets=["small"])
    with pytest.raises(zfeed.ZarrError, match="no level dimension"):
        zfeed.Loader(path, inputs=[("t2m", 0)], targets=["t2m"])
    with pytest.raises(zfeed.ZarrError, match="no valid samples"):
        zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], lead=40)
    with pytest.raises(zfeed.ZarrError, match="rank 2 is not below world_size 2"):
        zfeed.Loader(path, inputs=["t2m"], rank=2, world_size=2)
    loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"])
    with pytest.raises(zfeed.ZarrError, match="world_size 1, this loader has 2"):
        zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], world_size=2).load_state_dict(loader.state_dict())


def test_a_corrupt_chunk_surfaces_from_the_iterator(tmp_path):
    root = zfeed.create_group(tmp_path / "bad.zarr")
    root.create_array("x", shape=(6, 4, 4), chunks=(1, 4, 4), dtype="float32", data=np.ones((6, 4, 4), "float32"))
    (tmp_path / "bad.zarr" / "x" / "c" / "3" / "0" / "0").write_bytes(b"garbage")
    loader = zfeed.Loader(tmp_path / "bad.zarr", inputs=["x"], targets=["x"], batch_size=1, shuffle=False)
    with pytest.raises(zfeed.ZarrError, match="x/c/3/0/0"):
        for _ in loader:
            pass
