"""`zfeed bench` (python/zfeed/bench.py) and the baseline reader it measures (python/zfeed/baseline.py).

No timing assertions: the figures depend on the machine; only that every reader ran and reported
sane numbers, and that the baseline delivers the same values as zfeed.Loader."""

from __future__ import annotations

import json

import numpy as np
import pytest

import zfeed
from zfeed_cli import run

torch = pytest.importorskip("torch")
pytest.importorskip("xarray")

VARIABLES = ["t2m", "u500", "v500", "t500", "z500", "q500"]


def test_bench_quick_writes_json_and_plot(tmp_path):
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    done = run("bench", "--quick", "--workdir", tmp_path / "work", "--json", out_json, "--plot", out_png, timeout=600)
    assert "zfeed loader benchmark" in done.stdout
    result = json.loads(out_json.read_text())
    assert result["machine"]["cores"] >= 1 and result["machine"]["cpu"]
    assert result["versions"]["torch"] and result["versions"]["tensorstore"]
    assert set(result["stores"]) == {"1-step", "10-step"}
    assert result["stores"]["1-step"]["chunks"][0] == 1 and result["stores"]["10-step"]["chunks"][0] == 10
    rows = {(r["reader"], r["store"]): r for r in result["rows"]}
    expected = {(reader, store) for reader in ("zfeed", "baseline", "tensorstore", "limit")
                for store in ("1-step", "10-step")} | {("limit-cached", "10-step")}
    assert set(rows) == expected
    for key, row in rows.items():
        assert "error" not in row, (key, row.get("error"))
        assert row["samples_per_s"] > 0 and row["mb_per_s"] > 0 and row["seconds"] > 0, key
        assert row["samples"] == row["batches"] * 16, key
    assert rows[("baseline", "1-step")]["vs_baseline"] == pytest.approx(1.0)
    assert rows[("zfeed", "1-step")]["of_limit"] > 0
    assert "zfeed 10-step vs 1-step" in result["summary"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_help_passes_through_the_zfeed_command():
    done = run("bench", "--help")
    assert "usage: zfeed bench" in done.stdout and "--zfeed-option" in done.stdout


def test_bench_unknown_reader_is_refused(tmp_path):
    done = run("bench", "--quick", "--workdir", tmp_path, "--readers", "zfeed,nosuch", ok=False)
    assert done.returncode == 2 and "unknown reader nosuch" in done.stderr


def test_limit_units_per_use_and_once_per_epoch():
    from zfeed.bench import chunk_uses

    batches = [(0, [3, 9]), (0, [4]), (1, [3])]
    per_use = chunk_uses(batches, ["a", "b"], 1, 1, once_per_epoch=False)
    assert per_use[:4] == ["a 3 0 0", "b 3 0 0", "a 4 0 0", "b 4 0 0"]
    assert len(per_use) == 4 * 2 * 2  # 4 samples, 2 chunks each, 2 variables
    tens = chunk_uses(batches, ["a"], 1, 10, once_per_epoch=False)
    assert tens == ["a 0 0 0", "a 0 0 0", "a 1 0 0", "a 0 0 0", "a 0 0 0"]  # t=9 needs chunks 0 and 1
    once = chunk_uses(batches, ["a"], 1, 10, once_per_epoch=True)
    assert once == ["a 0 0 0", "a 1 0 0", "a 0 0 0"]  # epoch 0: chunks 0, 1; epoch 1: chunk 0 again


def test_limit_subsets_stay_within_the_budget_and_once_per_epoch_reaches_further():
    from zfeed.bench import chunk_uses, limit_subset

    # Batches of 4 samples walking through 10-step chunks: per use, each sample decodes 1 or 2
    # chunks; once per epoch, a chunk is decoded by the first batch that needs it only.
    batches = [(0, list(range(4 * b, 4 * b + 4))) for b in range(10)]
    budget = 12  # decodes, at 1 byte each
    per_use = limit_subset(batches, ["a"], 10, 1, budget)
    assert len(chunk_uses(per_use, ["a"], 1, 10, False)) <= budget
    assert per_use == batches[:2]  # 4 + 4 decodes; the third batch (t=9 needs chunk 1 too) makes 13
    once = limit_subset(batches, ["a"], 10, 1, budget, once_per_epoch=True)
    assert once == batches  # chunks 0..4: 5 decodes for every batch
    assert limit_subset(batches, ["a"], 10, 100, 1) == batches[:1]  # at least one batch


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("baseline") / "era5.zarr"
    run("synth", "era5", path, "--grid", "16x32", "--times", "14", "--step", "6h", "--quiet")
    return path


def _normalization(path):
    group = zfeed.open(str(path))
    out = {}
    for name in VARIABLES:
        values = group[name][...].astype(np.float64)
        out[name] = (float(values.mean()), float(values.std()))
    return out


def test_baseline_items_equal_zfeed_loader(small_store):
    from zfeed.baseline import HackathonDataset

    normalize = _normalization(small_store)
    loader = zfeed.Loader(str(small_store), inputs=VARIABLES, targets=VARIABLES, lead=1, batch_size=4, shuffle=True,
                          seed=3, normalize=normalize, prefetch=1)
    dataset = HackathonDataset(small_store, VARIABLES, lead=1, normalize=normalize)
    assert len(dataset) == loader.num_samples == 13
    compared = 0
    for batch in loader:
        for row, t in enumerate(batch["times"].tolist()):
            x, y = dataset[t]
            assert x.dtype == torch.float32 and tuple(x.shape) == (6, 16, 32)
            np.testing.assert_array_equal(x.numpy(), batch["inputs"][row], err_msg=f"inputs at t={t}")
            np.testing.assert_array_equal(y.numpy(), batch["targets"][row], err_msg=f"targets at t={t}")
            compared += 1
    assert compared == 12  # 3 batches of 4, the remainder dropped


def test_baseline_without_normalization_reads_raw_values(small_store):
    from zfeed.baseline import HackathonDataset

    dataset = HackathonDataset(small_store, ["t2m", "q500"], lead=2, normalize=False)
    x, y = dataset[5]
    group = zfeed.open(str(small_store))
    np.testing.assert_array_equal(x.numpy(), np.stack([group["t2m"][5], group["q500"][5]]))
    np.testing.assert_array_equal(y.numpy(), np.stack([group["t2m"][7], group["q500"][7]]))
    assert len(dataset) == 12
    with pytest.raises(IndexError):
        dataset[12]


def test_baseline_loader_is_seeded_and_shuffled(small_store):
    from zfeed.baseline import make_baseline_loader

    normalize = _normalization(small_store)

    def first_batches(seed, workers):
        loader = make_baseline_loader(small_store, VARIABLES, batch_size=4, num_workers=workers, seed=seed,
                                      normalize=normalize)
        return [x.clone() for x, _ in loader]

    a, b = first_batches(7, 0), first_batches(7, 2)
    assert len(a) == len(b) == 3  # drop_last: 13 samples -> 3 batches of 4
    assert all(tuple(x.shape) == (4, 6, 16, 32) for x in a)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)  # workers change nothing but the speed
    c = first_batches(8, 0)
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_the_clock_measures_at_least_min_seconds_and_never_past_the_cap():
    import time
    from zfeed.bench import Clock

    def count(clock: Clock, pause: float) -> tuple[int, float]:
        clock.begin()
        while True:
            time.sleep(pause)
            if not clock.tick():
                return clock.count, clock.elapsed()

    # A fast reader: 3 batches take 30 ms, so it goes on until 0.2 s.
    n, elapsed = count(Clock(3, seconds=10.0, min_seconds=0.2), 0.01)
    assert n > 3 and 0.2 <= elapsed < 1.0
    # Without min_seconds the batch count ends it; seconds caps a long min_seconds.
    n, elapsed = count(Clock(3, seconds=10.0, min_seconds=0.0), 0.01)
    assert n == 3
    n, elapsed = count(Clock(100, seconds=0.05, min_seconds=1.0), 0.01)
    assert 2 <= n < 100 and elapsed < 0.5
