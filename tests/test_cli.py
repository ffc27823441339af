"""The `zfeed` command: `zfeed info PATH` (and `--json`) on a sharded v3 store, a v2 store and the
shared ECMWF store; a missing path fails with a clear message."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import zfeed_cli

import zfeed

from conftest import SHARED


def run(*args, ok=True):
    return zfeed_cli.run(*args, ok=ok, timeout=120)


@pytest.fixture
def v3_sharded(tmp_path) -> Path:
    root = tmp_path / "v3.zarr"
    group = zfeed.create_group(root, attributes={"title": "test"})
    t = group.create_array("t2m", shape=(10, 12), chunks=(3, 5), shards=(6, 10), dtype="float32",
                           compressor="zstd:3", dimension_names=["lat", "lon"])
    t[...] = np.linspace(250, 300, 120, dtype="float32").reshape(10, 12)
    levels = group.create_group("levels")
    z = levels.create_array("z", shape=(2, 8), chunks=(1, 8), dtype="int16", compressor="gzip:5")
    z[0] = np.arange(8)  # the second chunk is missing
    return root


@pytest.fixture
def v2_store(tmp_path) -> Path:
    root = tmp_path / "v2.zarr"
    group = zfeed.create_group(root, zarr_format=2)
    arr = group.create_array("u", shape=(5, 7), chunks=(2, 3), dtype="int16", compressor="blosc:lz4",
                             dimension_names=["y", "x"])
    arr[...] = np.ones((5, 7), "int16")
    return root


def test_info_v3_sharded(v3_sharded):
    out = run("info", v3_sharded).stdout
    assert "t2m" in out and "levels" in out and "z" in out
    assert "float32" in out and "int16" in out
    assert "lat=10" in out and "lon=12" in out  # shape with dims
    assert "chunks 3x5" in out and "shards 6x10" in out
    assert "zstd" in out and "gzip" in out
    assert "stored" in out and "decoded" in out and "ratio" in out
    assert "480 B decoded" in out  # 10 x 12 float32
    assert "1 of 2 chunks" in out  # the missing chunk of z


def test_info_v2(v2_store):
    out = run("info", v2_store).stdout
    assert "zarr v2" in out and "int16" in out and "y=5" in out and "x=7" in out
    assert "chunks 2x3" in out and "blosc" in out and "ratio" in out


def test_info_single_array(v2_store):
    out = run("info", v2_store / "u").stdout
    assert "int16" in out and "chunks 2x3" in out


def test_info_ecmwf(shared):
    path = shared / "data" / "ecmwf-t-z-2007-01-01.zarr"
    if not path.is_dir():
        pytest.skip("ECMWF store absent")
    out = run("info", path).stdout
    for name in ["t", "z", "latitude", "longitude", "level", "time"]:
        assert f" {name} " in out, name
    assert "time=1, level=2, latitude=181, longitude=360" in out
    assert "consolidated" in out and "blosc" in out and "lz4" in out and "ratio" in out
    assert "chunks 1x1x181x360" in out


def test_info_json(v3_sharded, v2_store):
    doc = json.loads(run("info", "--json", v3_sharded).stdout)
    assert doc["node_type"] == "group" and doc["zarr_format"] == 3
    members = {m["name"]: m for m in doc["members"]}
    t = members["t2m"]
    assert t["shape"] == [10, 12] and t["data_type"] == "float32" and t["dimension_names"] == ["lat", "lon"]
    assert t["chunk_shape"] == [3, 5] and t["shard_shape"] == [6, 10]
    assert "zstd" in t["codecs"] and "sharding_indexed" in t["shard_codecs"]
    assert t["decoded_bytes"] == 480 and t["stored_bytes"] > 0
    assert t["compression_ratio"] == pytest.approx(t["decoded_bytes"] / t["stored_bytes"])
    assert t["objects_present"] == t["objects_total"] == 4
    z = {m["name"]: m for m in members["levels"]["members"]}["z"]
    assert z["objects_present"] == 1 and z["objects_total"] == 2
    # The ratio of what is stored: half the array's decoded size against the one chunk's bytes.
    assert z["compression_ratio"] == pytest.approx(z["decoded_bytes"] / 2 / z["stored_bytes"])

    v2 = json.loads(run("info", "--json", v2_store).stdout)
    assert v2["zarr_format"] == 2 and v2["members"][0]["dimension_names"] == ["y", "x"]

    ecmwf = SHARED / "data" / "ecmwf-t-z-2007-01-01.zarr"
    if ecmwf.is_dir():  # the shared data exists on the project machines
        doc = json.loads(run("info", "--json", ecmwf).stdout)
        members = {m["name"]: m for m in doc["members"]}
        assert members["t"]["shape"] == [1, 2, 181, 360] and members["t"]["data_type"] == "int16"
        assert members["t"]["dimension_names"] == ["time", "level", "latitude", "longitude"]
        assert members["t"]["decoded_bytes"] == 2 * 181 * 360 * 2


def test_info_missing_path(tmp_path):
    missing = tmp_path / "no-such.zarr"
    result = run("info", missing, ok=False)
    assert result.returncode != 0
    assert str(missing) in result.stderr and "no zarr" in result.stderr.lower()
    assert "Traceback" not in result.stderr and not result.stdout.strip()


def test_info_not_zarr(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "file.txt").write_text("hello")
    result = run("info", tmp_path / "plain", ok=False)
    assert result.returncode != 0 and "zarr" in result.stderr.lower()


def test_info_broken_metadata(tmp_path):
    path = tmp_path / "a.zarr"
    zfeed.create(path, shape=(4,), dtype="int8")
    (path / "zarr.json").write_text("{broken")
    result = run("info", path, ok=False)
    assert result.returncode != 0 and "zarr.json" in result.stderr and "json" in result.stderr.lower()


def test_help_and_unknown_verb():
    assert "info" in run("--help").stdout
    result = run("frobnicate", ok=False)
    assert result.returncode != 0


@pytest.mark.parametrize("args, message", [
    (["--grid", "-8x16"], 'bad --grid "-8x16"'),
    (["--grid", "8ax16"], 'bad --grid "8ax16"'),
    (["--lat", "-3"], "--lat: expected a whole number of 0 or more, got -3"),
    (["--times", "-1"], "--times: expected a whole number of 0 or more, got -1"),
    (["--seed", "-1"], "--seed: expected a whole number of 0 or more, got -1"),
    (["--shards", "time=-1"], 'bad --shards "time=-1"'),
    (["--grid", "100000x100000"], "past the 2^30 points a plane may hold"),
    (["--variables", "t2m,t2m"], '--variables names "t2m" twice'),
])
def test_synth_refuses_bad_counts_before_writing(tmp_path, args, message):
    out = tmp_path / "s.zarr"
    result = run("synth", "era5", out, "-q", "--times", "2", *args, ok=False)
    assert result.returncode != 0
    assert message in result.stderr
    assert not out.exists()


def test_convert_stats_and_stage_refuse_what_would_go_wrong(tmp_path):
    source = tmp_path / "x.zarr"
    run("synth", "era5", source, "-q", "--grid", "4x8", "--times", "4", "--variables", "t2m")
    # --isel takes one value per occurrence: the paths after it stay the paths.
    run("convert", "--isel", "time=0,1", source, tmp_path / "c.zarr", "-q")
    assert zfeed.open(str(tmp_path / "c.zarr"))["t2m"].shape[0] == 2
    # A time range of no step writes no statistics.
    result = run("stats", source, "--variables", "t2m", "--time", "3:3", ok=False)
    assert result.returncode != 0 and "selects none" in result.stderr
    assert "zfeed_stats" not in zfeed.open(str(source))["t2m"].attrs
    # A copy into its own source is refused before anything is made there.
    for destination in (source, source / "t2m"):
        result = run("stage", source, destination, ok=False)
        assert result.returncode != 0 and "lies inside the source" in result.stderr
    assert not list(source.rglob(".zfeed-stage.lock"))
    # A mistyped source is no complete copy of nothing; --time-dim alone would be ignored.
    result = run("stage", tmp_path / "typo.zarr", tmp_path / "copy", ok=False)
    assert result.returncode != 0 and "no Zarr store there to stage" in result.stderr
    assert result.stderr.startswith("zfeed: error:") and not (tmp_path / "copy").exists()
    result = run("stage", source, tmp_path / "copy", "--time-dim", "valid_time", ok=False)
    assert result.returncode != 0 and "--time-dim requires --time" in result.stderr
    # A trailing slash names the same input to a resumed rechunk.
    import os
    env_stop = dict(os.environ, ZFEED_CONVERT_STOP_AFTER="1")
    subprocess.run([zfeed_cli.zfeed_command(), "rechunk", str(source), str(tmp_path / "r.zarr"), "--chunks",
                    "time=2", "-q"], env=env_stop, capture_output=True, text=True, timeout=120)
    run("rechunk", f"{source}/", tmp_path / "r.zarr", "--chunks", "time=2", "-q")
    # Stray files beside the chunks are no chunks.
    (source / "t2m" / ".DS_Store").write_text("x")
    assert "(4 of 4 chunks stored)" in run("info", source / "t2m").stdout


def test_version_is_the_packages_and_says_what_the_build_holds():
    import importlib.metadata

    version = importlib.metadata.version("zfeed")
    assert zfeed.__version__ == version
    out = run("--version").stdout.splitlines()
    assert out[0] == f"zfeed {version}"
    info = zfeed.build_info()
    for name, key in (("netCDF", "netcdf"), ("GRIB", "grib"), ("CUDA", "cuda"), ("nvCOMP", "nvcomp")):
        assert f"{name} {'yes' if info[key] else 'no'}" in out[1]
