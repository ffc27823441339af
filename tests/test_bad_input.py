"""Bad input (issue 2, "Bad input"): each fault raises zfeed.ZarrError whose message names the key
and the fault, never a crash or a hang. The broken stores are real stores, written by zfeed or
zarr-python into tmp_path and then corrupted on disk."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
from pathlib import Path

import numcodecs
import numpy as np
import pytest

import zfeed

DATA = np.arange(64, dtype="float32").reshape(8, 8)


def expect(fn, key: str, *fault: str, kind=zfeed.ZarrError) -> str:
    """fn raises `kind`; its message names `key` and at least one of the `fault` words."""
    with pytest.raises(kind) as info:
        fn()
    message = str(info.value)
    assert key in message, f"the message does not name {key!r}: {message}"
    assert any(word.lower() in message.lower() for word in fault), f"the message names none of {fault}: {message}"
    return message


def make(path: Path, **kwargs) -> Path:
    kwargs.setdefault("chunks", (4, 4))
    zfeed.create(path, shape=(8, 8), dtype="float32", data=DATA, **kwargs)
    return path


def rewrite(path: Path, change):
    path.write_bytes(change(path.read_bytes()))


def read_all(path: Path):
    return lambda: zfeed.open(path)[...]


# ---------------------------------------------------------------------------------------------
# Metadata


@pytest.fixture
def store(tmp_path) -> Path:
    return make(tmp_path / "a.zarr", compressor="zstd")


def _with_meta(store: Path, change) -> Path:
    meta = json.loads((store / "zarr.json").read_text())
    change(meta)
    (store / "zarr.json").write_text(json.dumps(meta))
    return store


@pytest.mark.parametrize("text", ['{"zarr_format": 3, "node_type": ', "", "[1, 2]", '{"zarr_format": 3,, }', "\x00\xff",
                                  '{"zarr_format": 3} trailing'])
def test_malformed_json(store, text):
    (store / "zarr.json").write_bytes(text.encode("latin-1"))
    expect(lambda: zfeed.open(store), "zarr.json", "json", "object")


def test_truncated_json(store):
    rewrite(store / "zarr.json", lambda b: b[: len(b) // 2])
    expect(lambda: zfeed.open(store), "zarr.json", "invalid json", "truncated")


@pytest.mark.parametrize("field", ["zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding",
                                   "fill_value", "codecs"])
def test_missing_required_field(store, field):
    _with_meta(store, lambda m: m.pop(field))
    message = expect(lambda: zfeed.open(store), "zarr.json", "missing", "required")
    assert field in message


@pytest.mark.parametrize("change,words", [
    (lambda m: m.update(zarr_format=4), ("zarr_format",)),
    (lambda m: m.update(node_type="table"), ("node_type",)),
    (lambda m: m.update(shape="8x8"), ("shape",)),
    (lambda m: m.update(shape=[8.5, 8]), ("shape",)),
    (lambda m: m["chunk_grid"].update(name="rectilinear"), ("rectilinear", "chunk grid", "chunk_grid")),
    (lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[4]), ("chunk_shape", "dimensions")),
    (lambda m: m["chunk_key_encoding"].update(name="v9"), ("v9", "chunk_key_encoding", "key encoding")),
    (lambda m: m.update(fill_value="lots"), ("fill_value", "fill value")),
    (lambda m: m.update(fill_value=[1, 2]), ("fill_value", "fill value")),
    (lambda m: m.update(codecs={"name": "bytes"}), ("codecs",)),
    (lambda m: m["codecs"][0].update(configuration={"endian": "middle"}), ("endian",)),
    (lambda m: m["codecs"][1]["configuration"].update(level="high"), ("level",)),
    (lambda m: m["codecs"][1]["configuration"].update(colour="blue"), ("colour",)),
    (lambda m: m.update(dimension_names=["y"]), ("dimension_names",)),
    (lambda m: m.update(storage_transformers=[{"name": "magic"}]), ("storage_transformers", "magic", "unsupported")),
    (lambda m: m.update(new_core_feature={"must_understand": True}), ("new_core_feature",)),
], ids=["zarr_format", "node_type", "shape-string", "shape-float", "grid-name", "chunk-rank", "key-encoding",
        "fill-string", "fill-list", "codecs-object", "endian", "zstd-level", "unknown-config", "dimension-names",
        "storage-transformer", "unknown-field"])
def test_invalid_fields(store, change, words):
    _with_meta(store, change)
    expect(read_all(store), "zarr.json", *words)


def test_unknown_field_that_need_not_be_understood_is_accepted(store):
    _with_meta(store, lambda m: m.update(extension_note={"must_understand": False, "text": "hi"}))
    np.testing.assert_array_equal(zfeed.open(store)[...], DATA)


@pytest.mark.parametrize("dtype", ["float128", "int128", "string", "r24", {"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 1}}])
def test_unknown_data_type(store, dtype):
    _with_meta(store, lambda m: m.update(data_type=dtype))
    name = dtype if isinstance(dtype, str) else dtype["name"]
    message = expect(lambda: zfeed.open(store), "zarr.json", "unsupported", kind=zfeed.UnsupportedError)
    assert name in message


@pytest.mark.parametrize("codec", [{"name": "superzip"}, {"name": "bz2", "configuration": {"level": 1}},
                                   {"name": "numcodecs.adler32"}])
def test_unknown_codec(store, codec):
    _with_meta(store, lambda m: m["codecs"].append(codec))
    message = expect(lambda: zfeed.open(store), "zarr.json", "unsupported", kind=zfeed.UnsupportedError)
    assert codec["name"] in message


@pytest.mark.parametrize("change", [
    lambda c: c.reverse(),  # zstd before bytes
    lambda c: c.insert(1, {"name": "transpose", "configuration": {"order": [1, 0]}}),  # array->array after bytes
    lambda c: c.pop(0),  # no array->bytes codec
    lambda c: c.insert(0, dict(c[0])),  # two array->bytes codecs
    lambda c: c.clear(),  # nothing at all
], ids=["bytes-to-bytes-first", "transpose-after-bytes", "no-array-to-bytes", "two-array-to-bytes", "empty"])
def test_codec_chain_out_of_order(store, change):
    _with_meta(store, lambda m: change(m["codecs"]))
    expect(lambda: zfeed.open(store), "zarr.json", "codec chain", "codecs", "array->bytes", "order")


@pytest.mark.parametrize("what,value,words", [
    ("shape", [-8, 8], ("negative",)),
    ("shape", [2**63, 2**63], ("overflow",)),
    ("shape", [2**64, 1], ("shape",)),
    ("chunks", [0, 4], ("positive", "zero")),
    ("chunks", [-4, 4], ("negative",)),
    ("chunks", [2**40, 2**40], ("overflow",)),
    ("chunks", [2**31, 2**31], ("overflow",)),  # exactly 2**64 bytes of float32
])
def test_bad_extents(store, what, value, words):
    if what == "shape":
        _with_meta(store, lambda m: m.update(shape=value))
    else:
        _with_meta(store, lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=value))
    expect(read_all(store), "zarr.json", *words)


def test_sharding_configuration_errors(tmp_path):
    path = make(tmp_path / "s.zarr", chunks=(2, 2), shards=(4, 4))
    meta = json.loads((path / "zarr.json").read_text())
    cfg = meta["codecs"][0]["configuration"]
    cfg["chunk_shape"] = [3, 3]  # does not divide the shard
    (path / "zarr.json").write_text(json.dumps(meta))
    expect(read_all(path), "zarr.json", "divide")
    cfg["chunk_shape"] = [2, 2]
    cfg["index_codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}]
    (path / "zarr.json").write_text(json.dumps(meta))
    expect(read_all(path), "zarr.json", "fixed")
    cfg["index_codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    cfg["index_location"] = "middle"
    (path / "zarr.json").write_text(json.dumps(meta))
    expect(read_all(path), "zarr.json", "index_location")


# Zarr v2 metadata, written by zarr-python


@pytest.fixture
def v2store(tmp_path) -> Path:
    zarr = pytest.importorskip("zarr")
    path = tmp_path / "v2.zarr"
    arr = zarr.create(shape=(8, 8), chunks=(4, 4), dtype="float32", store=str(path), zarr_format=2,
                      compressor=numcodecs.Zstd(level=1))
    arr[...] = DATA
    np.testing.assert_array_equal(zfeed.open(path)[...], DATA)
    return path


@pytest.mark.parametrize("change,words", [
    (lambda m: m.pop("shape"), ("missing", "shape")),
    (lambda m: m.pop("dtype"), ("missing", "dtype")),
    (lambda m: m.update(dtype="<f16"), ("unsupported", "<f16")),
    (lambda m: m.update(dtype=[["a", "<f4"]]), ("unsupported", "structured", "dtype")),
    (lambda m: m.update(compressor={"id": "bz2", "level": 1}), ("unsupported", "bz2")),
    (lambda m: m.update(filters=[{"id": "delta", "dtype": "<f4"}]), ("unsupported", "filters")),
    (lambda m: m.update(order="K"), ("order",)),
    (lambda m: m.update(dimension_separator="-"), ("dimension_separator",)),
    (lambda m: m.update(chunks=[0, 4]), ("positive", "zero", "chunks")),
    (lambda m: m.update(zarr_format=3), ("zarr_format",)),
])
def test_v2_metadata(v2store, change, words):
    meta = json.loads((v2store / ".zarray").read_text())
    change(meta)
    (v2store / ".zarray").write_text(json.dumps(meta))
    expect(read_all(v2store), ".zarray", *words)


def test_v2_truncated_zarray(v2store):
    rewrite(v2store / ".zarray", lambda b: b[:20])
    expect(read_all(v2store), ".zarray", "json")


def test_v2_bad_zattrs(v2store):
    (v2store / ".zattrs").write_text("{not json")
    expect(read_all(v2store), ".zattrs", "json")


# ---------------------------------------------------------------------------------------------
# Chunks


def test_chunk_too_short_for_its_shape(tmp_path):
    path = make(tmp_path / "a.zarr", compressor=None)
    rewrite(path / "c" / "0" / "1", lambda b: b[:-3])
    message = expect(read_all(path), "c/0/1", "61 bytes", "too short", "expected 64")
    assert "64" in message


def test_chunk_too_long_for_its_shape(tmp_path):
    path = make(tmp_path / "a.zarr", compressor=None)
    rewrite(path / "c" / "1" / "1", lambda b: b + b"extra")
    expect(read_all(path), "c/1/1", "69 bytes", "expected 64")


def test_compressed_chunk_decoding_to_too_few_bytes(tmp_path):
    path = make(tmp_path / "a.zarr", compressor="zstd")
    (path / "c" / "0" / "0").write_bytes(numcodecs.Zstd(level=1).encode(bytes(10)))
    expect(read_all(path), "c/0/0", "10 bytes", "expected 64")


def test_v2_chunk_too_short(v2store):
    (v2store / "1.0").write_bytes(numcodecs.Zstd(level=1).encode(bytes(20)))
    expect(read_all(v2store), "1.0", "expected")


@pytest.mark.parametrize("damage", ["truncate", "invert", "zeros", "empty"])
def test_corrupt_zstd(tmp_path, damage):
    path = make(tmp_path / "a.zarr", compressor="zstd")
    rewrite(path / "c" / "1" / "0", _damage(damage, keep=4))
    expect(read_all(path), "c/1/0", "zstd")


@pytest.mark.parametrize("damage", ["truncate", "invert", "zeros", "empty", "trailer"])
def test_corrupt_gzip(tmp_path, damage):
    path = make(tmp_path / "a.zarr", compressor="gzip")
    rewrite(path / "c" / "1" / "0", _damage(damage, keep=10))
    expect(read_all(path), "c/1/0", "gzip")


@pytest.mark.parametrize("damage", ["truncate", "invert", "zeros", "empty", "header"])
@pytest.mark.parametrize("cname", ["lz4", "zstd", "blosclz", "zlib"])
def test_corrupt_blosc(tmp_path, damage, cname):
    # A chunk large and smooth enough that blosc really compresses it (a tiny one is stored raw,
    # and raw bytes carry no checksum to catch a flipped byte).
    path = tmp_path / "a.zarr"
    data = (np.arange(64 * 64, dtype="float32") // 7).reshape(64, 64)
    zfeed.create(path, shape=(64, 64), chunks=(64, 64), dtype="float32", data=data,
                 codecs=[{"name": "bytes", "configuration": {"endian": "little"}},
                         {"name": "blosc", "configuration": {"cname": cname, "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}}])
    rewrite(path / "c" / "0" / "0", _damage(damage, keep=16))
    expect(read_all(path), "c/0/0", "blosc")


def test_corrupt_v2_blosc_from_zarr_python(tmp_path):
    zarr = pytest.importorskip("zarr")
    path = tmp_path / "v2.zarr"
    arr = zarr.create(shape=(64, 64), chunks=(64, 64), dtype="float32", store=str(path), zarr_format=2,
                      compressor=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
    arr[...] = (np.arange(64 * 64, dtype="float32") // 7).reshape(64, 64)
    rewrite(path / "0.0", lambda b: b[: len(b) // 2])
    expect(read_all(path), "0.0", "blosc")


def _damage(kind: str, keep: int):
    def apply(b: bytes) -> bytes:
        if kind == "truncate":
            return b[: max(keep + 1, len(b) // 2)]
        if kind == "invert":
            return b[:keep] + bytes(255 - x for x in b[keep:])
        if kind == "zeros":
            return b[:keep] + bytes(len(b) - keep)
        if kind == "empty":
            return b""
        if kind == "trailer":  # gzip: damage the CRC-32 of the trailer
            return b[:-8] + bytes([b[-8] ^ 0x01]) + b[-7:]
        if kind == "header":  # blosc: claim 2 GiB of decoded bytes
            return b[:4] + struct.pack("<I", 2**31) + b[8:]
        raise ValueError(kind)
    return apply


def test_crc32c_mismatch(tmp_path):
    path = make(tmp_path / "a.zarr", codecs=[{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}])
    rewrite(path / "c" / "0" / "1", lambda b: bytes([b[0] ^ 0x40]) + b[1:])
    expect(read_all(path), "c/0/1", "crc32c", "checksum")
    rewrite(path / "c" / "1" / "1", lambda b: b[:2])
    expect(lambda: zfeed.open(path)[4:, 4:], "c/1/1", "crc32c", "short")


def test_crc32c_intact_chunks_still_read(tmp_path):
    path = make(tmp_path / "a.zarr", codecs=[{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}])
    rewrite(path / "c" / "0" / "1", lambda b: b[:-1] + bytes([b[-1] ^ 0x01]))  # the stored checksum itself
    expect(read_all(path), "c/0/1", "crc32c", "checksum")
    np.testing.assert_array_equal(zfeed.open(path)[:4, :4], DATA[:4, :4])


# ---------------------------------------------------------------------------------------------
# Shards


def _shard(tmp_path, index_location="end", crc=True) -> Path:
    index_codecs = [{"name": "bytes", "configuration": {"endian": "little"}}] + ([{"name": "crc32c"}] if crc else [])
    path = tmp_path / "s.zarr"
    zfeed.create(path, shape=(8, 8), chunks=(8, 8), dtype="float32", data=DATA, codecs=[{
        "name": "sharding_indexed", "configuration": {
            "chunk_shape": [2, 2],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_codecs": index_codecs, "index_location": index_location}}])
    return path


def _edit_index(b: bytes, change, index_location="end", crc=True, n=16) -> bytes:
    size = 16 * n + (4 if crc else 0)
    index_bytes = b[-size:] if index_location == "end" else b[:size]
    entries = np.frombuffer(index_bytes[: 16 * n], "<u8").copy().reshape(n, 2)
    change(entries)
    body = entries.tobytes()
    if crc:
        body = bytes(numcodecs.CRC32C().encode(body))
    return b[:-size] + body if index_location == "end" else body + b[size:]


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("read", ["whole", "one inner chunk"])
def test_shard_index_outside_the_shard(tmp_path, index_location, read):
    path = _shard(tmp_path, index_location)
    size = (path / "c" / "0" / "0").stat().st_size

    def change(entries):
        entries[5] = (size + 100, 16)

    rewrite(path / "c" / "0" / "0", lambda b: _edit_index(b, change, index_location))
    fn = read_all(path) if read == "whole" else (lambda: zfeed.open(path)[2:4, 2:4])
    message = expect(fn, "c/0/0", "outside")
    if read == "whole":  # the whole shard in hand: the index entry itself is refused
        assert "inner chunk [1, 1]" in message, message


def test_shard_index_offset_overflow(tmp_path):
    path = _shard(tmp_path)

    def change(entries):
        entries[0] = (2**64 - 8, 16)

    rewrite(path / "c" / "0" / "0", lambda b: _edit_index(b, change))
    expect(read_all(path), "c/0/0", "overflow", "outside")


def test_shard_index_crc_mismatch(tmp_path):
    path = _shard(tmp_path)
    rewrite(path / "c" / "0" / "0", lambda b: b[:-20] + bytes([b[-20] ^ 0xFF]) + b[-19:])
    expect(read_all(path), "c/0/0", "crc32c", "checksum")
    expect(lambda: zfeed.open(path)[0, 0], "c/0/0", "crc32c", "checksum")  # the range-read path too


def test_shard_shorter_than_its_index(tmp_path):
    path = _shard(tmp_path)
    (path / "c" / "0" / "0").write_bytes(b"\x00" * 10)
    expect(read_all(path), "c/0/0", "too short", "index")
    expect(lambda: zfeed.open(path)[1, 1], "c/0/0", "too short", "index", "bytes")


def test_shard_inner_chunk_wrong_size(tmp_path):
    path = _shard(tmp_path, crc=False)

    def change(entries):
        entries[3, 1] = 9  # an inner chunk of 2x2 float32 needs 16 bytes

    rewrite(path / "c" / "0" / "0", lambda b: _edit_index(b, change, crc=False))
    expect(read_all(path), "c/0/0", "9 bytes", "expected 16")
    expect(lambda: zfeed.open(path)[0:2, 6:8], "c/0/0", "9 bytes", "expected 16")


# ---------------------------------------------------------------------------------------------
# Decompression bombs: a chunk whose stream decodes to more than the chunk's size


def _strip_zstd_content_size(frame: bytes) -> bytes:
    """The same zstd frame without its content size field (as TensorStore's old writer made)."""
    assert frame[:4] == b"\x28\xb5\x2f\xfd"
    descriptor = frame[4]
    fcs_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
    assert descriptor & 3 == 0  # no dictionary id
    fcs_size = [1 if single_segment else 0, 2, 4, 8][fcs_flag]
    header_end = 5 + (0 if single_segment else 1)
    window = frame[5:6] if not single_segment else bytes([17 << 3])  # a 128 MiB window descriptor
    return frame[:4] + bytes([descriptor & 0b100]) + window + frame[header_end + fcs_size:]


def test_zstd_frame_without_content_size_reads(tmp_path):
    path = make(tmp_path / "a.zarr", compressor="zstd")
    (path / "c" / "0" / "0").write_bytes(_strip_zstd_content_size(numcodecs.Zstd(level=1).encode(DATA[:4, :4].tobytes())))
    np.testing.assert_array_equal(zfeed.open(path)[...], DATA)


@pytest.mark.parametrize("content_size", [True, False], ids=["with-content-size", "without-content-size"])
def test_zstd_bomb(tmp_path, content_size):
    path = make(tmp_path / "a.zarr", compressor="zstd")
    frame = numcodecs.Zstd(level=1).encode(bytes(10**7))  # 10 MB of zeros into a 64-byte chunk
    (path / "c" / "0" / "0").write_bytes(frame if content_size else _strip_zstd_content_size(frame))
    expect(read_all(path), "c/0/0", "more than the expected 64", "expected 64")


def test_gzip_bomb(tmp_path):
    path = make(tmp_path / "a.zarr", compressor="gzip")
    (path / "c" / "0" / "0").write_bytes(gzip.compress(bytes(10**7)))
    expect(read_all(path), "c/0/0", "more than the expected 64", "expected 64")


def test_blosc_bomb(tmp_path):
    path = make(tmp_path / "a.zarr", compressor="blosc:lz4")
    (path / "c" / "0" / "0").write_bytes(numcodecs.Blosc("lz4").encode(bytes(10**7)))
    expect(read_all(path), "c/0/0", "10000000", "expected 64")


def test_v2_zlib_bomb(tmp_path):
    path = make(tmp_path / "a.zarr", compressor="zlib", zarr_format=2)
    (path / "0.0").write_bytes(numcodecs.Zlib(1).encode(bytes(10**7)))
    expect(read_all(path), "0.0", "more than the expected 64", "expected 64")


def test_v2_lz4_bomb(tmp_path):
    path = make(tmp_path / "a.zarr", compressor="lz4", zarr_format=2)
    (path / "0.0").write_bytes(numcodecs.LZ4().encode(bytes(10**6)))
    expect(read_all(path), "0.0", "expected 64", "1000000")


# ---------------------------------------------------------------------------------------------
# Keys that climb out of the store


@pytest.mark.parametrize("path", ["../outside", "a/../../b", "/etc"])
def test_keys_outside_the_store_are_refused(tmp_path, path):
    make(tmp_path / "a.zarr")
    with pytest.raises(zfeed.ZarrError) as info:
        zfeed.open(tmp_path / "a.zarr", path=path)
    assert ".." in str(info.value) or "absolute" in str(info.value) or path in str(info.value)


FOREIGN_SIGBUS = """
import mmap, os, sys
import numpy as np
import zfeed
arr = zfeed.create(sys.argv[1], shape=(512, 512), chunks=(512, 512), dtype="float32", compressor="zstd:3")
arr[...] = np.random.default_rng(0).standard_normal((512, 512)).astype("float32")
assert zfeed.open(sys.argv[1])[...].shape == (512, 512)  # a mapped read: zfeed's SIGBUS handler is in
path = sys.argv[1] + ".foreign"
with open(path, "wb") as f:
    f.write(b"x" * 8192)
def touch():
    with open(path, "r+b") as f:
        view = mmap.mmap(f.fileno(), 8192)
        os.truncate(path, 0)
        print("read", view[4096], flush=True)  # SIGBUS in a mapping that is not zfeed's
if sys.argv[2] == "main":
    touch()
else:  # a thread that never read through zfeed (the handler must not need anything of it)
    import threading
    t = threading.Thread(target=touch)
    t.start()
    t.join()
print("survived", flush=True)
"""


@pytest.mark.parametrize("where", ["main", "new thread"])
def test_a_sigbus_outside_zfeeds_mapped_reads_is_not_swallowed(tmp_path, where):
    """zfeed handles SIGBUS only for its own mapped reads (a chunk file shrunk while read); any
    other still ends the process as it would without zfeed, on the thread that read or another."""
    import signal
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", FOREIGN_SIGBUS, str(tmp_path / "a.zarr"), where],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "survived" not in done.stdout


SHRUNK_WHILE_READ = """
import os, sys, threading
import numpy as np
import zfeed
root = sys.argv[1]
arr = zfeed.create(root, shape=(40, 512, 512), chunks=(1, 512, 512), dtype="float32", compressor="zstd:1")
values = np.random.default_rng(1).standard_normal((40, 512, 512)).astype("float32")
arr[...] = values
stop = False
def shrink():  # rewrites chunk files in place, as a non-atomic writer would
    i = 0
    while not stop:
        path = os.path.join(root, "c", str(i % 40), "0", "0")
        data = open(path, "rb").read()
        with open(path, "r+b") as f:
            f.truncate(len(data) // 3)
            f.seek(0)
            f.write(data[: len(data) // 3])
        with open(path, "r+b") as f:
            f.write(data)
        i += 1
t = threading.Thread(target=shrink)
t.start()
errors = 0
for _ in range(30):
    try:
        zfeed.open(root)[...]
    except zfeed.ZarrError:
        errors += 1
stop = True
t.join()
print("done", errors, flush=True)
"""


def test_chunk_files_rewritten_in_place_while_read_give_errors_not_crashes(tmp_path):
    """A chunk file shrunk in place under a mapped read is read again (or fails with an error naming
    it): the process never dies of SIGBUS."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", SHRUNK_WHILE_READ, str(tmp_path / "b.zarr")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "done" in done.stdout
