#!/usr/bin/env python3
"""Writes the seed corpora of zfeed's libFuzzer targets into fuzz/corpus/<target>/.

Seeds are small valid inputs written by peers (numcodecs for the compressors, zarr-python for
chunks and shards), so the fuzzers start from what real stores hold, plus real metadata documents
from ../shared (zarrs snapshots, a zarr-python v2 group, the ECMWF v2 store). Run it with the
project's virtual environment:

    .venv/bin/python fuzz/make_corpus.py

The output is deterministic (fixed random seeds), so rerunning it changes nothing unless a peer's
encoder does. The cases below must stay in step with the tables in the *_fuzz.cc targets.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import numcodecs
import zarr

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
SHARED = ROOT.parent.parent / "shared"
if not SHARED.is_dir():
    SHARED = Path("/work/shared")

rng = np.random.default_rng(0)
warnings.filterwarnings("ignore", module="zarr")


def write_seed(target: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def sample_payloads() -> list[bytes]:
    """Byte strings a chunk might hold: empty, tiny, runs, smooth values, noise, exactly 4096."""
    smooth = (np.sin(np.arange(1024) / 20.0) * 1000).astype("<f4").tobytes()
    return [
        b"",
        b"z",
        b"zarr " * 7,
        bytes(4096),
        smooth,  # 4096 bytes: the decoder targets' fixed chunk size
        rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        rng.integers(0, 4, 3000, dtype=np.uint8).tobytes(),
    ]


# ---- decoders (numcodecs, the v2 peer; the same streams zarr-python 3 writes) -----------------


def decoder_seeds() -> None:
    payloads = sample_payloads()
    for payload in payloads:
        write_seed("zstd_fuzz", numcodecs.Zstd(level=1).encode(payload))
        write_seed("gzip_fuzz", numcodecs.GZip(level=1).encode(payload))
        write_seed("zlib_fuzz", numcodecs.Zlib(level=1).encode(payload))
        write_seed("lz4_fuzz", numcodecs.LZ4(acceleration=1).encode(payload))
        write_seed("crc32c_fuzz", bytes(numcodecs.CRC32C().encode(payload)))
    # Variants: checksums, several frames or members, other levels.
    smooth = payloads[4]
    write_seed("zstd_fuzz", numcodecs.Zstd(level=9, checksum=True).encode(smooth))
    write_seed("zstd_fuzz", numcodecs.Zstd(level=1).encode(smooth[:2048]) + numcodecs.Zstd(level=1).encode(smooth[2048:]))
    write_seed("gzip_fuzz", numcodecs.GZip(level=9).encode(smooth[:1000]) + numcodecs.GZip(level=1).encode(smooth[1000:]))
    write_seed("zlib_fuzz", numcodecs.Zlib(level=9).encode(smooth))
    write_seed("zlib_fuzz", numcodecs.Zlib(level=0).encode(smooth[:300]))
    # blosc: every inner compressor and shuffle c-blosc offers.
    for cname in ("lz4", "lz4hc", "blosclz", "zstd", "zlib"):
        for shuffle in (numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE):
            codec = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle)
            write_seed("blosc_fuzz", codec.encode(np.frombuffer(smooth, dtype="<f4")))
    write_seed("blosc_fuzz", numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1, blocksize=256).encode(np.frombuffer(smooth, dtype="<f4")))
    for payload in payloads[:3]:
        write_seed("blosc_fuzz", numcodecs.Blosc(cname="lz4").encode(np.frombuffer(payload, dtype="u1")))
    frame_check_seeds(payloads)


# ---- frame_check_fuzz: the GPU decoder's container checks (a 4-byte decoded size, then a stream) --


def frame_check_seeds(payloads: list[bytes]) -> None:
    """Every stored form gpu_payload checks, each behind the size it decodes to."""
    import gzip
    import io
    import struct
    import zlib

    def seed(decoded: bytes, stored: bytes) -> None:
        write_seed("frame_check_fuzz", struct.pack("<I", len(decoded)) + stored)

    def zstd_frame(descriptor: int, header: bytes, blocks: list[tuple[int, bytes]]) -> bytes:
        """A zstd frame by hand: (block type, content) blocks, the last one marked last."""
        out = struct.pack("<IB", 0xFD2FB528, descriptor) + header
        for i, (kind, content) in enumerate(blocks):
            size = len(content) if kind == 0 else content[1]
            last = 1 if i == len(blocks) - 1 else 0
            out += struct.pack("<I", size << 3 | kind << 1 | last)[:3] + content[:1 if kind == 1 else None]
        return out

    text, zeros, smooth, noise = payloads[2], payloads[3], payloads[4], payloads[6]
    for payload in (payloads[1], text, zeros, smooth, noise):
        seed(payload, numcodecs.Zstd(level=1).encode(payload))
        seed(payload, numcodecs.GZip(level=1).encode(payload))
        seed(payload, numcodecs.Zlib(level=1).encode(payload))
        lz4 = numcodecs.LZ4(acceleration=1).encode(payload)
        seed(payload, lz4)  # numcodecs LZ4: size header, block
        seed(payload, lz4[4:])  # a bare LZ4 block
    seed(smooth, numcodecs.Zstd(level=9, checksum=True).encode(smooth))
    # Without a content size (window 2 MiB): raw and RLE blocks; RLE content is (byte, run).
    seed(text, zstd_frame(0x00, bytes([0x58]), [(0, text)]))
    seed(b"a" * 200 + text, zstd_frame(0x04, bytes([0x58]), [(1, b"a" + bytes([200])), (0, text)]) + bytes(4))
    # A single-segment frame with a 2-byte content size (stored minus 256), a raw block.
    seed(smooth[:300], zstd_frame(0x60, struct.pack("<H", 300 - 256), [(0, smooth[:300])]))
    # gzip with a file name, raw deflate.
    with io.BytesIO() as buffer:
        with gzip.GzipFile(fileobj=buffer, mode="wb", filename="t2m.bin", mtime=0) as f:
            f.write(smooth)
        seed(smooth, buffer.getvalue())
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    seed(smooth, deflate.compress(smooth) + deflate.flush())


# ---- chunks written by zarr-python 3 for a given zarr.json ------------------------------------


def zarr_chunks(metadata: dict, metadata_key: str, values: np.ndarray) -> dict[str, bytes]:
    """Writes `values` into an array with exactly this metadata; returns its chunk objects."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / metadata_key).write_text(json.dumps(metadata))
        array = zarr.open_array(store=str(root), mode="r+")
        array[...] = values
        return {
            str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*"))
            if path.is_file() and path.name not in (".zarray", ".zattrs", "zarr.json")
        }


def v3_metadata(shape, dtype, codecs, chunk_shape=None, fill_value=0):
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk_shape or shape)}},
        "chunk_key_encoding": {"name": "default"},
        "fill_value": fill_value,
        "codecs": codecs,
    }


def values_for(shape, dtype, kind: str) -> np.ndarray:
    dtype = np.dtype(dtype).newbyteorder("=")
    count = int(np.prod(shape))
    if kind == "zeros":
        return np.zeros(shape, dtype)
    if dtype.kind == "c":
        flat = rng.standard_normal(count) + 1j * rng.standard_normal(count)
    elif dtype.kind == "f":
        flat = rng.standard_normal(count) * 100
    else:
        info = np.iinfo(dtype)
        flat = rng.integers(max(info.min, -1000), min(info.max, 1000), count, endpoint=True)
    values = flat.astype(dtype).reshape(shape)
    if kind == "partial":  # some inner chunks hold only the fill value
        values.reshape(-1)[: count // 2] = 0
    return values


BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}
BYTES_BE = {"name": "bytes", "configuration": {"endian": "big"}}

# chain_fuzz: (dtype, chunk shape, codecs); the index in this list is the seed's first byte.
CHAINS = [
    ("int32", (8, 16), [{"name": "transpose", "configuration": {"order": [1, 0]}}, BYTES_BE, {"name": "crc32c"}]),
    ("uint16", (3, 5, 7), [{"name": "transpose", "configuration": {"order": [2, 0, 1]}}, BYTES_LE]),
    ("float64", (16,), [BYTES_BE, {"name": "gzip", "configuration": {"level": 1}}, {"name": "crc32c"}]),
    ("complex64", (4, 6), [{"name": "transpose", "configuration": {"order": [1, 0]}}, BYTES_BE,
                           {"name": "zstd", "configuration": {"level": 1, "checksum": True}}]),
    ("uint8", (10, 10), [{"name": "bytes"}, {"name": "crc32c"}, {"name": "crc32c"}]),
    ("int16", (2, 3, 4, 5), [{"name": "transpose", "configuration": {"order": [3, 1, 0, 2]}},
                             {"name": "transpose", "configuration": {"order": [1, 0, 3, 2]}}, BYTES_LE,
                             {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 1, "shuffle": "bitshuffle",
                                                                 "typesize": 2, "blocksize": 0}}]),
]

# shard_index_fuzz: (dtype, shard shape, sharding configuration).
SHARDS = [
    ("uint16", (4, 6), {"chunk_shape": [2, 2], "codecs": [BYTES_LE],
                        "index_codecs": [BYTES_LE, {"name": "crc32c"}], "index_location": "end"}),
    ("uint16", (4, 6), {"chunk_shape": [2, 2], "codecs": [BYTES_LE], "index_codecs": [BYTES_LE],
                        "index_location": "start"}),
    ("float32", (8, 4), {"chunk_shape": [2, 4], "codecs": [BYTES_LE, {"name": "zstd", "configuration": {"level": 1}}],
                         "index_codecs": [BYTES_BE], "index_location": "end"}),
    ("uint8", (4, 4), {"chunk_shape": [2, 4],
                       "codecs": [{"name": "sharding_indexed", "configuration": {
                           "chunk_shape": [1, 2], "codecs": [{"name": "bytes"}], "index_codecs": [BYTES_LE]}}],
                       "index_codecs": [BYTES_LE], "index_location": "start"}),
    ("uint8", (4, 4), {"chunk_shape": [2, 2],
                       "codecs": [{"name": "sharding_indexed", "configuration": {
                           "chunk_shape": [1, 1], "codecs": [{"name": "bytes"}], "index_codecs": [BYTES_LE]}}],
                       "index_codecs": [BYTES_LE, {"name": "crc32c"}]}),
]


def sharding(configuration: dict) -> dict:
    return {"name": "sharding_indexed", "configuration": configuration}


# array_read_fuzz: (metadata key, metadata, chunk key), as in array_read_fuzz.cc.
ARRAYS = [
    ("zarr.json", {**v3_metadata((6, 10), "uint16", [BYTES_LE, {"name": "zstd", "configuration": {"level": 1}}],
                                 chunk_shape=(6, 8), fill_value=7)}, "c/0/0"),
    ("zarr.json", v3_metadata((8, 8), "float32", [sharding({
        "chunk_shape": [4, 4], "codecs": [BYTES_LE, {"name": "gzip", "configuration": {"level": 1}}],
        "index_codecs": [BYTES_LE, {"name": "crc32c"}], "index_location": "end"})], fill_value="NaN"), "c/0/0"),
    ("zarr.json", v3_metadata((8, 8), "int8", [sharding({
        "chunk_shape": [4, 8],
        "codecs": [sharding({"chunk_shape": [2, 2], "codecs": [{"name": "bytes"}], "index_codecs": [BYTES_LE],
                             "index_location": "start"})],
        "index_codecs": [BYTES_LE], "index_location": "start"})], fill_value=-1), "c/0/0"),
    (".zarray", {"zarr_format": 2, "shape": [5, 9], "chunks": [5, 7], "dtype": ">i4", "order": "F",
                 "fill_value": 0, "filters": None,
                 "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}}, "0.0"),
    ("zarr.json", v3_metadata((4, 12), "float64", [{"name": "transpose", "configuration": {"order": [1, 0]}},
                                                   BYTES_BE, {"name": "crc32c"}], chunk_shape=(4, 6),
                              fill_value=0.5), "c/0/0"),
    ("zarr.json", v3_metadata((8, 8), "int16", [sharding({
        "chunk_shape": [4, 4],
        "codecs": [sharding({"chunk_shape": [2, 2], "codecs": [BYTES_LE],
                             "index_codecs": [BYTES_LE, {"name": "crc32c"}]})],
        "index_codecs": [BYTES_LE, {"name": "crc32c"}]})], fill_value=3), "c/0/0"),
    ("zarr.json", v3_metadata((6, 10), "uint32", [BYTES_LE], chunk_shape=(6, 8), fill_value=5), "c/0/0"),
]


def chain_seeds() -> None:
    for index, (dtype, shape, codecs) in enumerate(CHAINS):
        for kind in ("random", "zeros"):
            fill = [1.0, 0.0] if dtype.startswith("complex") else 1
            chunks = zarr_chunks(v3_metadata(shape, dtype, codecs, fill_value=fill), "zarr.json",
                                 values_for(shape, dtype, kind))
            write_seed("chain_fuzz", bytes([index]) + chunks["c/0" + "/0" * (len(shape) - 1)])


def shard_seeds() -> None:
    for index, (dtype, shape, configuration) in enumerate(SHARDS):
        for kind in ("random", "partial"):
            chunks = zarr_chunks(v3_metadata(shape, dtype, [sharding(configuration)]), "zarr.json",
                                 values_for(shape, dtype, kind))
            write_seed("shard_index_fuzz", bytes([index]) + chunks["c/0/0"])


def array_seeds() -> None:
    for index, (key, metadata, chunk_key) in enumerate(ARRAYS):
        shape = metadata["shape"]
        dtype = metadata.get("data_type") or np.dtype(metadata["dtype"]).newbyteorder("=").name
        for kind in ("random", "partial"):
            chunks = zarr_chunks(metadata, key, values_for(shape, dtype, kind))
            if chunk_key in chunks:
                write_seed("array_read_fuzz", bytes([index]) + chunks[chunk_key])


# ---- metadata: real documents --------------------------------------------------------------


def metadata_seeds() -> None:
    snapshots = SHARED / "conformance" / "zarrs-snapshots" / "supported" / "regular"
    # Every codec variant of a few data types, and the plain bytes variant of every data type
    # (zfeed rejects many of them: the fuzzer starts from both sides of that line).
    picked: list[Path] = []
    for dtype in ("float32", "uint16", "int64", "complex128", "bool", "bfloat16"):
        picked += sorted((snapshots / dtype).glob("*/*/*/zarr.json"))
    picked += sorted(snapshots.glob("*/a2b/bytes/*/zarr.json"))
    seen = set()
    for path in picked:
        text = path.read_bytes()
        if text not in seen:
            seen.add(text)
            write_seed("metadata_fuzz", text)

    astronaut = SHARED / "conformance" / "zarr-v2-astronaut.zarr"
    for zarray in sorted(astronaut.glob("*/.zarray")):
        write_seed("metadata_fuzz", zarray.read_bytes())
        zattrs = zarray.with_name(".zattrs")
        if zattrs.exists():
            pair = {"zarray": json.loads(zarray.read_text()), "zattrs": json.loads(zattrs.read_text())}
            write_seed("metadata_fuzz", json.dumps(pair, indent=2).encode())
    ecmwf = SHARED / "data" / "ecmwf-t-z-2007-01-01.zarr"
    write_seed("metadata_fuzz", (ecmwf / ".zmetadata").read_bytes())
    write_seed("metadata_fuzz", (ecmwf / ".zgroup").read_bytes())
    for name in ("t", "time", "level"):
        zarray = json.loads((ecmwf / name / ".zarray").read_text())
        zattrs = json.loads((ecmwf / name / ".zattrs").read_text())
        write_seed("metadata_fuzz", (ecmwf / name / ".zarray").read_bytes())
        write_seed("metadata_fuzz", json.dumps({"zarray": zarray, "zattrs": zattrs}, indent=2).encode())

    # A v3 group with consolidated metadata (zarr-python 3 writes it inline in zarr.json), and
    # the metadata of the other targets' arrays.
    with tempfile.TemporaryDirectory() as tmp:
        group = zarr.open_group(store=tmp, mode="w", attributes={"title": "seed"})
        group.create_array("a", shape=(4, 6), chunks=(2, 3), dtype="float32", compressors=None,
                           dimension_names=["y", "x"])
        group.create_array("b", shape=(8,), shards=(8,), chunks=(4,), dtype="int16")
        zarr.consolidate_metadata(tmp)
        write_seed("metadata_fuzz", (Path(tmp) / "zarr.json").read_bytes())
        write_seed("metadata_fuzz", (Path(tmp) / "b" / "zarr.json").read_bytes())
    for _, metadata, _ in ARRAYS:
        write_seed("metadata_fuzz", json.dumps(metadata, indent=2).encode())


# ---- GRIB: real messages cut from ../shared/data, and GRIB 2 made from ecCodes' samples ------


def grib_message_bytes(path: Path, count: int) -> list[bytes]:
    """The first `count` messages of a GRIB file, each exactly its own bytes."""
    import eccodes

    messages = []
    with open(path, "rb") as f:
        for _ in range(count):
            handle = eccodes.codes_grib_new_from_file(f)
            messages.append(eccodes.codes_get_message(handle))
            eccodes.codes_release(handle)
    return messages


def grib_sample(sample: str, ni: int, nj: int, bitmap: bool, hour: int = 0) -> bytes:
    import eccodes

    handle = eccodes.codes_grib_new_from_samples(sample)
    if sample.startswith("regular_ll"):
        for key, value in (("Ni", ni), ("Nj", nj), ("latitudeOfFirstGridPointInDegrees", 10.0),
                           ("latitudeOfLastGridPointInDegrees", 10.0 - (nj - 1)),
                           ("longitudeOfFirstGridPointInDegrees", 0.0),
                           ("longitudeOfLastGridPointInDegrees", float(ni - 1)),
                           ("iDirectionIncrementInDegrees", 1.0), ("jDirectionIncrementInDegrees", 1.0)):
            eccodes.codes_set(handle, key, value)
        if eccodes.codes_get(handle, "edition") == 2:
            eccodes.codes_set(handle, "numberOfDataPoints", ni * nj)
    eccodes.codes_set(handle, "dataTime", hour)
    eccodes.codes_set(handle, "bitsPerValue", 12)
    size = ni * nj if sample.startswith("regular_ll") else eccodes.codes_get_size(handle, "values")
    values = 250.0 + np.arange(size, dtype=float) % 17
    if bitmap:
        eccodes.codes_set(handle, "missingValue", 9999.0)
        eccodes.codes_set(handle, "bitmapPresent", 1)
        values[::5] = 9999.0
    eccodes.codes_set_values(handle, values)
    message = eccodes.codes_get_message(handle)
    eccodes.codes_release(handle)
    return message


def grib_seeds() -> None:
    """Seeds for grib_fuzz, each under 50 KB: a file of one or a few messages."""
    hourly = grib_message_bytes(SHARED / "data" / "era5-2mt-2019-03-uk.grib", 3)
    members = grib_message_bytes(SHARED / "data" / "era5-levels-members.grib", 2)
    write_seed("grib_fuzz", hourly[0])
    write_seed("grib_fuzz", b"".join(hourly))
    write_seed("grib_fuzz", members[0])
    write_seed("grib_fuzz", b"".join(members))  # two ensemble members
    write_seed("grib_fuzz", b"".join(grib_sample("regular_ll_sfc_grib2", 6, 4, True, hour) for hour in (0, 600)))
    write_seed("grib_fuzz", grib_sample("regular_ll_sfc_grib2", 5, 3, False))
    write_seed("grib_fuzz", grib_sample("regular_gg_sfc_grib1", 0, 0, False))


def list_objects_seeds() -> None:
    """ListObjectsV2 responses as S3 and S3-compatible servers send them."""
    contents = "".join(
        f"<Contents><Key>{key}</Key><LastModified>2026-12-01T10:00:00.000Z</LastModified>"
        f"<ETag>&quot;5d41402abc4b2a76b9719d911017c592&quot;</ETag><Size>{size}</Size>"
        "<StorageClass>STANDARD</StorageClass></Contents>"
        for key, size in (("era5.zarr/zarr.json", 612), ("era5.zarr/t2m/c/0/0/0", 3145728),
                          ("era5.zarr/a&amp;b/&#x63;&#47;1", 0)))
    for truncated in (False, True):
        token = "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
        write_seed("list_objects_fuzz", (
            '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>weather</Name><Prefix>era5.zarr/</Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{contents}"
            f"{token if truncated else ''}</ListBucketResult>").encode())
    write_seed("list_objects_fuzz", b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>")


def main() -> int:
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    decoder_seeds()
    chain_seeds()
    shard_seeds()
    array_seeds()
    metadata_seeds()
    grib_seeds()
    list_objects_seeds()
    total = 0
    for folder in sorted(CORPUS.iterdir()):
        files = list(folder.iterdir())
        size = sum(f.stat().st_size for f in files)
        total += size
        print(f"{folder.name}: {len(files)} seeds, {size} bytes")
    print(f"total: {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
