"""`zfeed info` advice: each advice (small or large read chunks, time chunks misaligned with
t -> t+1 reads, compression that does not pay) appears on a store built to trigger it, in the tree
and in --json, and none appears on a well-chunked store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import zfeed_cli

import zfeed

DIMS = ["time", "lat", "lon"]


def run(*args, ok=True):
    return zfeed_cli.run(*args, ok=ok, timeout=120)


def advice_of(store: Path) -> list[dict]:
    return json.loads(run("info", "--json", store).stdout)["advice"]


def kinds(advice: list[dict], array: str) -> set[str]:
    return {item["kind"] for item in advice if item["array"].strip("/") == array}


def smooth(shape) -> np.ndarray:
    """Values that zstd compresses well."""
    return np.broadcast_to(np.linspace(250, 300, shape[-1], dtype="float32"), shape).copy()


def add_coordinates(group, nt, nlat, nlon):
    for name, n in (("time", nt), ("lat", nlat), ("lon", nlon)):
        coord = group.create_array(name, shape=(n,), chunks=(n,), dtype="float64", dimension_names=[name])
        coord[...] = np.arange(n, dtype="float64")


@pytest.fixture
def well_chunked(tmp_path) -> Path:
    root = tmp_path / "good.zarr"
    group = zfeed.create_group(root)
    add_coordinates(group, 4, 512, 512)
    # One 1 MiB step per chunk, compressed well.
    t2m = group.create_array("t2m", shape=(4, 512, 512), chunks=(1, 512, 512), dtype="float32",
                             compressor="zstd:3", dimension_names=DIMS)
    t2m[...] = smooth((4, 512, 512))
    # Small whole-step chunks, but sharded: nothing to gain.
    mask = group.create_array("mask", shape=(4, 512, 512), chunks=(1, 512, 512), shards=(4, 512, 512),
                              dtype="uint8", dimension_names=DIMS)
    mask[...] = 1
    group.consolidate()
    return root


def test_no_advice_on_a_well_chunked_store(well_chunked):
    assert advice_of(well_chunked) == []
    out = run("info", well_chunked).stdout
    assert "advice:" not in out


def test_small_chunks(tmp_path):
    root = tmp_path / "small.zarr"
    group = zfeed.create_group(root)
    tiles = group.create_array("tiles", shape=(16, 128, 128), chunks=(1, 32, 32), dtype="float32",
                               dimension_names=DIMS)
    tiles[...] = smooth((16, 128, 128))
    # Whole steps under 1 MiB unsharded: advised to shard, not to grow.
    steps = group.create_array("steps", shape=(16, 512, 512), chunks=(1, 512, 512), dtype="uint8",
                               dimension_names=DIMS)
    steps[...] = 1
    advice = advice_of(root)
    assert kinds(advice, "tiles") == {"small_chunks"}
    assert kinds(advice, "steps") == {"small_chunks"}
    text = {item["array"].strip("/"): item["advice"] for item in advice}
    assert "4.0 KiB" in text["tiles"] and "larger chunks" in text["tiles"]
    assert "zfeed rechunk --shards time=16" in text["steps"]
    out = run("info", root).stdout
    assert "advice:" in out and "under 1 MiB" in out
    assert out.index("advice:") > out.index("tiles  float32")  # after the tree


def test_large_chunks(tmp_path):
    root = tmp_path / "large.zarr"
    group = zfeed.create_group(root)
    # Nothing written: the advice comes from the metadata (a 67 MiB chunk).
    group.create_array("big", shape=(2, 4200, 4200), chunks=(1, 4200, 4200), dtype="float32",
                       dimension_names=DIMS)
    # Uncompressed, a read fetches only its part of a chunk: no advice.
    group.create_array("raw", shape=(2, 4200, 4200), chunks=(2, 4200, 4200), dtype="float32",
                       compressor=None, dimension_names=DIMS)
    advice = advice_of(root)
    assert kinds(advice, "big") == {"large_chunks"}
    assert kinds(advice, "raw") == set()
    assert "over 64 MiB" in advice[0]["advice"] and "--chunks" in advice[0]["advice"]
    assert "over 64 MiB" in run("info", root).stdout


def test_time_chunks(tmp_path):
    root = tmp_path / "time.zarr"
    group = zfeed.create_group(root)
    add_coordinates(group, 24, 256, 256)
    group.create_array("z500", shape=(24, 256, 256), chunks=(6, 256, 256), dtype="float32",
                       dimension_names=DIMS)
    # Sharded with multi-step inner chunks: the inner chunks are what a read decodes.
    group.create_array("t", shape=(24, 256, 256), chunks=(4, 256, 256), shards=(12, 256, 256),
                       dtype="float32", dimension_names=["valid_time", "lat", "lon"])
    # Uncompressed steps are read by byte range, one at a time.
    group.create_array("raw", shape=(24, 256, 256), chunks=(6, 256, 256), dtype="float32",
                       compressor=None, dimension_names=DIMS)
    advice = advice_of(root)
    assert kinds(advice, "z500") == {"time_chunks"}
    assert kinds(advice, "t") == {"time_chunks"}
    assert kinds(advice, "raw") == set()
    assert kinds(advice, "time") == set()  # a 1-D coordinate is read whole
    text = {item["array"].strip("/"): item["advice"] for item in advice}
    assert "6 time steps" in text["z500"] and "zfeed rechunk --chunks time=1" in text["z500"]
    assert "inner chunks of 4 valid_time steps" in text["t"]
    assert "--shards time=6 to keep the number of files" in text["z500"]
    assert "--shards valid_time=12 to keep the number of files" in text["t"]  # the shard's steps
    assert "zfeed rechunk --chunks time=1" in run("info", root).stdout


def test_compression_that_does_not_pay(tmp_path):
    root = tmp_path / "noise.zarr"
    group = zfeed.create_group(root)
    noise = group.create_array("noise", shape=(2, 512, 512), chunks=(1, 512, 512), dtype="uint32",
                               compressor="zstd:3", dimension_names=DIMS)
    noise[...] = np.random.default_rng(0).integers(0, 2**32, size=(2, 512, 512), dtype="uint32")
    smooth_field = group.create_array("smooth", shape=(2, 512, 512), chunks=(1, 512, 512), dtype="float32",
                                      compressor="zstd:3", dimension_names=DIMS)
    smooth_field[...] = smooth((2, 512, 512))
    raw = group.create_array("raw", shape=(2, 512, 512), chunks=(1, 512, 512), dtype="uint32",
                             compressor=None, dimension_names=DIMS)
    raw[...] = np.random.default_rng(1).integers(0, 2**32, size=(2, 512, 512), dtype="uint32")
    advice = advice_of(root)
    assert kinds(advice, "noise") == {"compression"}
    assert kinds(advice, "smooth") == set() and kinds(advice, "raw") == set()
    assert "--codec none" in advice[0]["advice"]
    assert "--codec none" in run("info", root).stdout


def test_advice_on_a_single_array(tmp_path):
    path = tmp_path / "single.zarr"
    zfeed.create(path, shape=(12, 300, 300), chunks=(3, 300, 300), dtype="float32", dimension_names=DIMS)
    advice = advice_of(path)
    assert [item["kind"] for item in advice] == ["time_chunks"]


def test_gpu_decode_advice_for_codecs_nvcomp_lacks(tmp_path):
    root = tmp_path / "blosc.zarr"
    group = zfeed.create_group(root)
    for name, compressor in (("blosc", "blosc:blosclz:5"), ("blosc_lz4", "blosc:lz4:5"), ("zstd", "zstd:3"),
                             ("raw", None)):
        array = group.create_array(name, shape=(2, 512, 512), chunks=(1, 512, 512), dtype="float32",
                                   compressor=compressor, dimension_names=DIMS)
        array[...] = smooth((2, 512, 512))
    advice = advice_of(root)
    if not zfeed.build_info()["cuda"]:  # the GPU path is not built: nothing to say about it
        assert all(kinds(advice, name) == set() for name in ("blosc", "blosc_lz4", "zstd", "raw"))
        return
    assert kinds(advice, "blosc") == {"gpu_decode"}  # blosclz inside: nvCOMP has no decoder for it
    # blosc with LZ4 inside decodes on the GPU (its streams on nvCOMP), as zstd does
    assert kinds(advice, "blosc_lz4") == set() and kinds(advice, "zstd") == set() and kinds(advice, "raw") == set()
    text = next(item["advice"] for item in advice if item["array"].strip("/") == "blosc")
    assert "blosclz inside" in text and "--codec zstd:3" in text
