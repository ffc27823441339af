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


# -------------------------------------------------------------------------------------------
# Errors are one line, and what the benchmark measures follows its store.


def _one_line_error(done, *expected):
    """A refused run: non-zero exit, one line on stderr holding every `expected` text, no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])


@pytest.fixture(scope="module")
def two_variable_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("two") / "only2.zarr"
    run("synth", "era5", path, "--grid", "8x16", "--times", "4", "--variables", "t2m,msl", "--quiet")
    return path


def test_bench_refuses_a_bad_store_or_result_in_one_line(tmp_path, two_variable_store):
    done = run("bench", "--store", two_variable_store, "--quick", "--stores", "1-step", "--workdir", tmp_path,
               ok=False)
    _one_line_error(done, f"--store {two_variable_store} lacks u500", "(it has msl, t2m)", "pass --variables")
    done = run("bench", "--store", tmp_path / "nonexist.zarr", "--quick", "--workdir", tmp_path, ok=False)
    _one_line_error(done, "--store", "nonexist.zarr does not exist")
    done = run("bench", "--from-json", tmp_path / "missing.json", ok=False)
    _one_line_error(done, "--from-json", "missing.json", "No such file")
    done = run("bench", "--from-json", two_variable_store / "zarr.json", ok=False)
    _one_line_error(done, "--from-json", "is not a result of zfeed bench --json")
    # A 10-step store alone would be compared with a synthetic store of other values.
    done = run("bench", "--chunked-store", two_variable_store, "--quick", "--workdir", tmp_path, ok=False)
    _one_line_error(done, f"--chunked-store {two_variable_store} needs --store")


def test_bench_refuses_stores_too_short_for_one_batch_up_front(tmp_path, small_store):
    # 14 time steps make 13 samples: no batch of 16 (the zfeed reader used to spin until its timeout).
    done = run("bench", "--store", small_store, "--stores", "1-step", "--readers", "zfeed", "--quick",
               "--workdir", tmp_path, ok=False, timeout=60)
    _one_line_error(done, f"--store {small_store} has 14 time steps", "--batch-size 16")
    done = run("bench", "--quick", "--times", "10", "--workdir", tmp_path, ok=False, timeout=60)
    _one_line_error(done, "--times 10", "--batch-size 16")
    assert not list(tmp_path.glob("*.zarr"))  # refused before any store was made


def test_zfeed_reader_ends_when_no_batch_fits(small_store):
    spec = {"store": str(small_store), "variables": VARIABLES, "lead": 1, "batch_size": 16, "seed": 0, "warmup": 1,
            "batches": 2, "seconds": 5.0, "options": {}, "normalize": {v: [0.0, 1.0] for v in VARIABLES}}
    done = run("bench", "--child", "zfeed", json.dumps(spec), ok=False, timeout=30)
    assert done.returncode != 0 and "yields no batch of 16" in done.stderr and "Traceback" not in done.stderr


def test_rechunked_store_is_rebuilt_for_other_variables_or_a_changed_source(tmp_path):
    from zfeed.bench import rechunked_store

    source = tmp_path / "src.zarr"

    def synth(seed):
        run("synth", "era5", source, "--grid", "4x8", "--times", "12", "--seed", seed,
            "--variables", "t2m,u500,v500", "--quiet")

    synth(1)
    work = tmp_path / "work"
    work.mkdir()
    first = rechunked_store(source, work, 10, ["t2m", "u500"], {"version": 1})
    marker = first / "zfeed-bench-store.json"
    written = marker.stat().st_mtime_ns
    assert rechunked_store(source, work, 10, ["u500", "t2m"], {"version": 1}) == first
    assert marker.stat().st_mtime_ns == written  # the same variables and source: reused
    second = rechunked_store(source, work, 10, ["t2m", "v500"], {"version": 1})
    group = zfeed.open(str(second))
    assert group["v500"].chunks[0] == 10
    np.testing.assert_array_equal(group["v500"][...], zfeed.open(str(source))["v500"][...])
    # The source written again (other values, same path): the cached store follows it.
    import shutil
    shutil.rmtree(source)
    synth(2)
    third = rechunked_store(source, work, 10, ["t2m", "v500"], {"version": 1})
    np.testing.assert_array_equal(zfeed.open(str(third))["t2m"][...], zfeed.open(str(source))["t2m"][...])


def test_limit_units_list_every_chunk_of_a_plane():
    from zfeed.bench import chunk_uses, limit_subset

    batches = [(0, [3]), (1, [9])]
    per_use = chunk_uses(batches, ["a", "b"], 1, 10, False, grid=(2, 1))
    assert per_use == ["a 0 0 0", "a 0 1 0", "b 0 0 0", "b 0 1 0",  # t=3, t+1=4: chunk 0
                       "a 0 0 0", "a 0 1 0", "b 0 0 0", "b 0 1 0",  # t=9: chunks 0 and 1
                       "a 1 0 0", "a 1 1 0", "b 1 0 0", "b 1 1 0"]
    assert chunk_uses(batches, ["a"], 1, 1, True, grid=(1, 3))[:3] == ["a 3 0 0", "a 3 0 1", "a 3 0 2"]
    # The budget counts every chunk of a plane: 2 x 2 decodes per time chunk.
    assert limit_subset(batches, ["a"], 10, 1, 4, grid=(2, 2)) == batches[:1]
    assert limit_subset(batches, ["a"], 10, 1, 12, grid=(2, 2)) == batches


def test_bench_limit_on_a_store_chunked_in_space_and_quick_keeps_explicit_options(tmp_path, small_store):
    spaced = tmp_path / "lat4.zarr"
    run("rechunk", small_store, spaced, "--chunks", "latitude=4")  # 16 latitudes: 4 chunks per plane
    out_json = tmp_path / "out.json"
    done = run("bench", "--store", spaced, "--stores", "1-step", "--readers", "zfeed,limit", "--quick",
               "--batch-size", "4", "--batches", "2", "--warmup", "0", "--workdir", tmp_path / "work",
               "--json", out_json, "--plot", tmp_path / "plots" / "out", timeout=120)
    result = json.loads(out_json.read_text())
    assert result["config"]["batches"] == 2 and result["config"]["warmup"] == 0  # not --quick's 3 and 1
    assert result["stores"]["1-step"]["read_grid"] == [14, 4, 1]
    rows = {r["reader"]: r for r in result["rows"]}
    limit = rows["limit"]
    assert "error" not in limit, limit.get("error")
    # Each sample decodes its two planes of every variable: all 4 chunks of each.
    assert limit["decoded_chunk_bytes"] == limit["samples"] * result["config"]["sample_bytes"]
    assert limit["chunks"] == limit["samples"] * 2 * len(VARIABLES) * 4
    png = tmp_path / "plots" / "out.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and f"PNG:  {png}" in done.stdout


def _saved_result(tmp_path) -> dict:
    def row(reader, store, samples_per_s):
        return {"reader": reader, "store": store, "notes": [], "samples": 32, "batches": 2, "seconds": 1.0,
                "samples_per_s": samples_per_s, "mb_per_s": samples_per_s * 0.01}

    store = {"path": str(tmp_path), "shape": [14, 16, 32], "chunks": [1, 16, 32], "stored_bytes": 80,
             "decoded_bytes": 100}
    rows = [row("zfeed", "1-step", 100.0), row("baseline", "1-step", 50.0),
            row("zfeed", "10-step", 155.0), row("baseline", "10-step", 14.0)]
    summary = {"zfeed 10-step vs 1-step": {"loss": 1 - 155 / 100, "slowdown": 100 / 155, "one_samples_per_s": 100.0,
                                           "multi_samples_per_s": 155.0},
               "baseline 10-step vs 1-step": {"loss": 1 - 14 / 50, "slowdown": 50 / 14, "one_samples_per_s": 50.0,
                                              "multi_samples_per_s": 14.0}}
    return {"title": "zfeed loader benchmark: saved", "machine": {"cores": 2, "cpu": "cpu"}, "versions": {"zfeed": "0"},
            "load_average": {"before": [0.1, 0, 0], "after": [0.2, 0, 0]}, "page_cache": "warm",
            "stores": {"1-step": store, "10-step": {**store, "chunks": [10, 16, 32]}},
            "config": {"channels": 6, "grid": [16, 32], "sample_bytes": 24576, "batch_size": 16},
            "rows": rows, "summary": summary}


def test_bench_from_json_plots_into_a_new_folder_and_says_faster_for_a_gain(tmp_path):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(_saved_result(tmp_path)))
    png = tmp_path / "new" / "dir" / "p.png"
    done = run("bench", "--from-json", saved, "--plot", png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "zfeed on the 10-step store: 155.0 samples/s against 100.0 on the 1-step store, no loss: 1.55x faster" \
        in done.stdout
    assert "baseline on the 10-step store: 14.0 samples/s against 50.0 on the 1-step store, a loss of 72%" \
        in done.stdout


def test_bench_without_the_limit_helper(tmp_path, small_store, monkeypatch, capsys):
    from zfeed import bench

    monkeypatch.setattr(bench, "limit_binary", lambda given: None)
    common = ["--store", str(small_store), "--stores", "1-step", "--quick", "--batch-size", "4", "--batches", "2",
              "--warmup", "0", "--workdir", str(tmp_path / "work")]
    # Only the limit asked for (zfeed gives it its samples): refused before measuring.
    with pytest.raises(SystemExit) as refused:
        bench.main(common + ["--readers", "zfeed,limit"])
    assert "zfeed_read_limit is not found" in str(refused.value.code)
    # Beside other readers: left out with a note, and the run succeeds.
    out_json = tmp_path / "out.json"
    assert bench.main(common + ["--readers", "zfeed,tensorstore,limit", "--json", str(out_json)]) == 0
    result = json.loads(out_json.read_text())
    assert [r["reader"] for r in result["rows"]] == ["zfeed", "tensorstore"]
    assert any("the limit is left out" in note for note in result["notes"])
    assert "note: zfeed_read_limit not found" in capsys.readouterr().out
