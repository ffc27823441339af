"""Round trips with the peers, both directions (issue 2, "Conformance (tests)").

Each case is drawn from the run's seed (ZFEED_TEST_SEED; see conftest.py): format (v3 or v2), data
type (all 14 of zfeed's scope), shape (0-d to 4-d, edge chunks), chunks, shards (v3), codecs
(bytes little/big, transpose, gzip, zstd, blosc variants, crc32c, sharding with its index at the
start or end; v2 compressors blosc, zstd, zlib, gzip, lz4, order C/F), chunk key encoding (default
or v2, "/" or "."), fill value (NaN, infinities, -0.0, extreme 64-bit integers, ...) and one or two
written regions that leave some chunks missing. A case has one writer (zfeed, zarr-python 3 or
tensorstore); what zfeed writes, both peers read back equal; what a peer writes, zfeed reads equal.

The case id starts with the seed: `s<seed>-<n>-<writer>-...`. ZFEED_PEER_CASES sets the number of
cases (default 240).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

import zfeed

zarr = pytest.importorskip("zarr")
ts = pytest.importorskip("tensorstore")
numcodecs = pytest.importorskip("numcodecs")

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {
    "bool": np.dtype(bool),
    "int8": np.dtype("int8"),
    "int16": np.dtype("int16"),
    "int32": np.dtype("int32"),
    "int64": np.dtype("int64"),
    "uint8": np.dtype("uint8"),
    "uint16": np.dtype("uint16"),
    "uint32": np.dtype("uint32"),
    "uint64": np.dtype("uint64"),
    "float16": np.dtype("float16"),
    "bfloat16": BF16,
    "float32": np.dtype("float32"),
    "float64": np.dtype("float64"),
    "complex64": np.dtype("complex64"),
    "complex128": np.dtype("complex128"),
}
WRITERS = ("zfeed", "zarr", "tensorstore")
DEFAULT_CASES = 240


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    seed: int
    number: int
    writer: str
    zarr_format: int
    dtype_name: str
    shape: tuple
    chunks: tuple  # the grid's chunk shape (the shard shape where sharded)
    fill: object  # a NumPy scalar of the data type
    regions: list  # [(tuple of slices, values)]
    # v3
    inner_chain: list = field(default_factory=list)  # codecs of one (inner) chunk
    sharding: dict | None = None  # {"chunk_shape", "index_codecs", "index_location"}
    key_encoding: tuple = ("default", "/")
    dimension_names: list | None = None
    # v2
    compressor: tuple | None = None  # (id, {config})
    order: str = "C"
    separator: str = "."

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.dtype_name]

    @property
    def id(self) -> str:
        shape = "x".join(map(str, self.shape)) or "0d"
        parts = [f"s{self.seed}", f"{self.number:03d}", self.writer, f"v{self.zarr_format}", self.dtype_name, shape]
        if self.sharding:
            parts.append("nested" if self.sharding.get("nested") else "sharded")
        return "-".join(parts)

    def expected(self) -> np.ndarray:
        out = np.full(self.shape, self.fill, dtype=self.dtype)
        for region, values in self.regions:
            out[region] = values
        return out

    def shard_codecs(self) -> list:
        """The codecs of one inner chunk of a shard: a nested shard where the case nests them."""
        nested = self.sharding.get("nested")
        if not nested:
            return self.inner_chain
        return [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(nested),
            "codecs": self.inner_chain,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end",
        }}]

    def v3_codecs(self) -> list:
        if not self.sharding:
            return self.inner_chain
        return [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(self.sharding["chunk_shape"]),
            "codecs": self.shard_codecs(),
            "index_codecs": self.sharding["index_codecs"],
            "index_location": self.sharding["index_location"],
        }}]

    def v3_metadata(self) -> dict:
        name, sep = self.key_encoding
        meta = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(self.shape),
            "data_type": self.dtype_name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(self.chunks)}},
            "chunk_key_encoding": {"name": name, "configuration": {"separator": sep}},
            "fill_value": fill_json(self.fill, self.dtype),
            "codecs": self.v3_codecs(),
            "attributes": {},
        }
        if self.dimension_names is not None:
            meta["dimension_names"] = self.dimension_names
        return meta

    def describe(self) -> str:
        if self.zarr_format == 3:
            return json.dumps({k: v for k, v in self.v3_metadata().items() if k not in ("zarr_format", "node_type")})
        return json.dumps({"shape": self.shape, "chunks": self.chunks, "dtype": self.dtype_name,
                           "fill": repr(self.fill), "compressor": self.compressor, "order": self.order,
                           "separator": self.separator})


def _float_json(value: float):
    value = float(value)
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def fill_json(fill, dtype: np.dtype):
    if dtype.kind == "b":
        return bool(fill)
    if dtype.kind in "iu":
        return int(fill)
    if dtype.kind == "c":
        return [_float_json(fill.real), _float_json(fill.imag)]
    return _float_json(float(fill))


def _specials(dtype):
    return [np.nan, np.inf, -np.inf, -0.0, 0.0]


def random_values(rng: np.random.Generator, dtype: np.dtype, shape) -> np.ndarray:
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        if values.size and rng.random() < 0.5:  # the extremes, exactly
            flat = values.reshape(-1)
            flat[rng.integers(0, flat.size)] = info.min
            flat[rng.integers(0, flat.size)] = info.max
        return values

    def reals():
        values = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4)).astype(np.float32 if dtype == BF16 else dtype if dtype.kind == "f" else np.float64)
        if values.size and rng.random() < 0.5:
            flat = values.reshape(-1)
            for special in _specials(dtype):
                flat[rng.integers(0, flat.size)] = special
        return values

    if dtype.kind == "c":
        out = np.empty(shape, dtype)
        out.real, out.imag = reals(), reals()
        return out
    return reals().astype(dtype)


def random_fill(rng: np.random.Generator, dtype: np.dtype):
    if dtype.kind == "b":
        return np.bool_(rng.random() < 0.5)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        choices = [0, 0, int(info.min), int(info.max), int(rng.integers(info.min, info.max, dtype=dtype)), 42]
        return dtype.type(choices[int(rng.integers(0, len(choices)))])
    choices = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, -1234.25]
    if dtype.kind == "c":
        return dtype.type(complex(choices[rng.integers(len(choices))], choices[rng.integers(len(choices))]))
    return dtype.type(choices[rng.integers(len(choices))])


def _random_region(rng, shape):
    if not shape or rng.random() < 0.25:
        return tuple(slice(0, n) for n in shape)
    region = []
    for n in shape:
        start = int(rng.integers(0, n))
        stop = int(rng.integers(start + 1, n + 1))
        region.append(slice(start, stop))
    return tuple(region)


def _random_b2b(rng, dtype) -> list:
    chain = []
    kind = rng.choice(["none", "gzip", "zstd", "blosc", "blosc"])
    if kind == "gzip":
        chain.append({"name": "gzip", "configuration": {"level": int(rng.integers(1, 10))}})
    elif kind == "zstd":
        chain.append({"name": "zstd", "configuration": {"level": int(rng.integers(0, 6)), "checksum": bool(rng.random() < 0.5)}})
    elif kind == "blosc":
        shuffle = str(rng.choice(["noshuffle", "shuffle", "bitshuffle"]))
        chain.append({"name": "blosc", "configuration": {
            "cname": str(rng.choice(["lz4", "lz4hc", "blosclz", "zstd", "zlib"])),
            "clevel": int(rng.integers(0, 10)),
            "shuffle": shuffle,
            "typesize": dtype.itemsize,
            "blocksize": 0,
        }})
    if rng.random() < 0.25:
        chain.append({"name": "crc32c"})
    return chain


def make_case(seed: int, number: int) -> Case:
    rng = np.random.default_rng([seed, number])
    zarr_format = 3 if rng.random() < 0.7 else 2
    names = list(DTYPES) if zarr_format == 3 else [n for n in DTYPES if n != "bfloat16"]  # v2 has no bfloat16 typestr
    dtype_name = str(rng.choice(names))
    dtype = DTYPES[dtype_name]
    ndim = int(rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4]))
    shape = tuple(int(rng.integers(1, 11 if ndim <= 2 else 6)) for _ in range(ndim))
    fill = random_fill(rng, dtype)
    case = dict(seed=seed, number=number, zarr_format=zarr_format, dtype_name=dtype_name, shape=shape, fill=fill)

    chunks = tuple(int(rng.integers(1, n + 1)) for n in shape)
    if zarr_format == 3:
        chain = []
        if ndim >= 2 and rng.random() < 0.3:
            chain.append({"name": "transpose", "configuration": {"order": [int(i) for i in rng.permutation(ndim)]}})
        if dtype.itemsize > 1:
            chain.append({"name": "bytes", "configuration": {"endian": str(rng.choice(["little", "big"]))}})
        else:
            chain.append({"name": "bytes"})
        chain += _random_b2b(rng, dtype)
        case["inner_chain"] = chain
        if ndim >= 1 and rng.random() < 0.35:
            inner = tuple(int(rng.integers(1, min(n, 4) + 1)) for n in shape)
            per_shard = tuple(int(rng.integers(1, 4)) for _ in shape)
            chunks = tuple(i * k for i, k in zip(inner, per_shard))
            index_codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
            if rng.random() < 0.7:
                index_codecs.append({"name": "crc32c"})
            case["sharding"] = {"chunk_shape": inner, "index_codecs": index_codecs,
                                "index_location": str(rng.choice(["end", "start"]))}
            if rng.random() < 0.2:  # nested sharding: the inner chunks are shards themselves
                case["sharding"]["nested"] = tuple(int(rng.choice([d for d in range(1, i + 1) if i % d == 0])) for i in inner)
        case["key_encoding"] = tuple(str(x) for x in [("default", "/"), ("default", "."), ("v2", "."), ("v2", "/")][int(rng.integers(0, 4))])
        if ndim and rng.random() < 0.3:
            case["dimension_names"] = [f"d{i}" if rng.random() < 0.8 else None for i in range(ndim)]
    else:
        kind = str(rng.choice(["none", "blosc", "zstd", "zlib", "gzip", "lz4"]))
        compressor = {
            "none": None,
            "blosc": ("blosc", {"cname": str(rng.choice(["lz4", "lz4hc", "blosclz", "zstd", "zlib"])),
                                "clevel": int(rng.integers(0, 10)), "shuffle": int(rng.choice([0, 1, 2])), "blocksize": 0}),
            "zstd": ("zstd", {"level": int(rng.integers(1, 6))}),
            "zlib": ("zlib", {"level": int(rng.integers(1, 10))}),
            "gzip": ("gzip", {"level": int(rng.integers(1, 10))}),
            "lz4": ("lz4", {"acceleration": int(rng.integers(1, 4))}),
        }[kind]
        case["compressor"] = compressor
        case["order"] = str(rng.choice(["C", "F"])) if ndim >= 2 else "C"  # tensorstore turns a 0-d/1-d "F" into "C"
        case["separator"] = str(rng.choice([".", "/"]))
    case["chunks"] = chunks

    regions = []
    for _ in range(int(rng.choice([1, 1, 2]))):
        region = _random_region(rng, shape)
        counts = tuple(s.stop - s.start for s in region)
        regions.append((region, random_values(rng, dtype, counts)))
    case["regions"] = regions

    probe = Case(writer="zfeed", **case)
    writers = [w for w in WRITERS if can_handle(w, probe) is None]
    case["writer"] = writers[int(rng.integers(0, len(writers)))]
    return Case(**case)


def can_handle(impl: str, case: Case) -> str | None:
    """None where impl can write and read the case; else the reason it cannot."""
    if impl == "zarr" and case.dtype_name == "bfloat16":
        return "zarr-python 3.1 has no bfloat16 data type"
    if impl == "tensorstore" and case.zarr_format == 2 and case.compressor and case.compressor[0] == "lz4":
        return "tensorstore's zarr v2 driver has no lz4 compressor"
    return None


# ---------------------------------------------------------------------------------------------
# Writers


def write_zfeed(case: Case, path: str):
    kwargs = dict(shape=case.shape, dtype=case.dtype_name, fill_value=case.fill.item() if case.dtype.kind != "V" else float(case.fill))
    if case.zarr_format == 3 and case.key_encoding[0] == "default":
        sharding = case.sharding
        default_index = sharding and sharding["index_location"] == "end" and len(sharding["index_codecs"]) == 2
        if sharding and default_index:  # zfeed.create's own sharding: bytes + crc32c index at the end
            arr = zfeed.create(path, chunks=sharding["chunk_shape"], shards=case.chunks, codecs=case.shard_codecs(),
                               chunk_key_encoding=case.key_encoding[1], dimension_names=case.dimension_names, **kwargs)
        else:
            arr = zfeed.create(path, chunks=case.chunks, codecs=case.v3_codecs(),
                               chunk_key_encoding=case.key_encoding[1], dimension_names=case.dimension_names, **kwargs)
    elif case.zarr_format == 3:
        # zfeed.create takes a default-encoding separator only; the v2 key encoding goes through
        # the engine's metadata entry point.
        store = zfeed._core.open_store(path, True)
        arr = zfeed.Array(zfeed._core.Array.create(store, "", json.dumps(case.v3_metadata()), "", False))
    else:
        compressor = None
        if case.compressor:
            cid, cfg = case.compressor
            compressor = {
                "blosc": lambda: {"name": "blosc", "configuration": {
                    "cname": cfg["cname"], "clevel": cfg["clevel"],
                    "shuffle": ["noshuffle", "shuffle", "bitshuffle"][cfg["shuffle"]], "blocksize": 0}},
                "zstd": lambda: {"name": "zstd", "configuration": {"level": cfg["level"], "checksum": False}},
                "zlib": lambda: {"name": "numcodecs.zlib", "configuration": {"level": cfg["level"]}},
                "gzip": lambda: {"name": "gzip", "configuration": {"level": cfg["level"]}},
                "lz4": lambda: {"name": "numcodecs.lz4", "configuration": {"acceleration": cfg["acceleration"]}},
            }[cid]()
        arr = zfeed.create(path, chunks=case.chunks, compressor=compressor or "none", zarr_format=2, order=case.order,
                           chunk_key_encoding=case.separator, **kwargs)
    for region, values in case.regions:
        arr[region] = values


def _numcodecs_compressor(case: Case):
    if not case.compressor:
        return None
    cid, cfg = case.compressor
    return {
        "blosc": lambda: numcodecs.Blosc(cname=cfg["cname"], clevel=cfg["clevel"], shuffle=cfg["shuffle"]),
        "zstd": lambda: numcodecs.Zstd(level=cfg["level"]),
        "zlib": lambda: numcodecs.Zlib(level=cfg["level"]),
        "gzip": lambda: numcodecs.GZip(level=cfg["level"]),
        "lz4": lambda: numcodecs.LZ4(acceleration=cfg["acceleration"]),
    }[cid]()


def write_zarr(case: Case, path: str):
    # write_empty_chunks: zarr-python 3.1 takes a complex chunk for "all fill" when both hold a NaN
    # anywhere ((nan+0j) "equals" a (1.5+nanj) fill) and drops it; store every chunk instead.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case.zarr_format == 3:
            arr = zarr.create(shape=case.shape, chunks=case.chunks, dtype=case.dtype, fill_value=case.fill, store=path,
                              zarr_format=3, codecs=case.v3_codecs(), chunk_key_encoding=case.key_encoding,
                              dimension_names=case.dimension_names, write_empty_chunks=True)
        else:
            arr = zarr.create(shape=case.shape, chunks=case.chunks, dtype=case.dtype, fill_value=case.fill, store=path,
                              zarr_format=2, compressor=_numcodecs_compressor(case), filters=None, order=case.order,
                              dimension_separator=case.separator, write_empty_chunks=True)
        for region, values in case.regions:
            arr[region] = values


def _ts_v2_metadata(case: Case) -> dict:
    dtype = case.dtype
    typestr = dtype.str if dtype.itemsize > 1 else "|" + dtype.str[1:]
    compressor = None
    if case.compressor:
        cid, cfg = case.compressor
        compressor = {"id": cid, **cfg}
    return {"shape": list(case.shape), "chunks": list(case.chunks), "dtype": typestr, "compressor": compressor,
            "order": case.order, "fill_value": fill_json(case.fill, dtype), "filters": None,
            "dimension_separator": case.separator}


def write_tensorstore(case: Case, path: str):
    if case.zarr_format == 3:
        meta = case.v3_metadata()
        meta.pop("zarr_format"), meta.pop("node_type"), meta.pop("attributes")
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}, "metadata": meta}
    else:
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": path}, "metadata": _ts_v2_metadata(case)}
    arr = ts.open(spec, create=True).result()
    for region, values in case.regions:
        arr[region].write(values).result()


# ---------------------------------------------------------------------------------------------
# Readers


def read_zfeed(case: Case, path: str) -> np.ndarray:
    arr = zfeed.open(path)
    assert isinstance(arr, zfeed.Array)
    assert arr.shape == case.shape and arr.dtype == case.dtype and arr.zarr_format == case.zarr_format
    if case.zarr_format == 3:
        names = tuple(case.dimension_names) if case.dimension_names is not None else None
        if case.writer == "tensorstore" and names and not any(names):
            names = None  # tensorstore leaves out dimension_names when all are null
        assert arr.dimension_names == names
        if case.sharding:
            # chunks is the unit of reading: the innermost chunk where shards nest
            assert arr.shards == case.chunks
            assert arr.chunks == (case.sharding.get("nested") or case.sharding["chunk_shape"])
        else:
            assert arr.chunks == case.chunks
    assert_same(np.array(arr.fill_value, dtype=case.dtype), np.array(case.fill, dtype=case.dtype), "zfeed fill_value")
    return np.asarray(arr[...])


def read_zarr(case: Case, path: str) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr = zarr.open_array(path, mode="r")
        assert tuple(arr.shape) == case.shape
        return np.asarray(arr[...])


def read_tensorstore(case: Case, path: str) -> np.ndarray:
    driver = "zarr3" if case.zarr_format == 3 else "zarr"
    arr = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": path}}, open=True).result()
    assert tuple(arr.shape) == case.shape
    return np.asarray(arr.read().result())


WRITE = {"zfeed": write_zfeed, "zarr": write_zarr, "tensorstore": write_tensorstore}
READ = {"zfeed": read_zfeed, "zarr": read_zarr, "tensorstore": read_tensorstore}


# ---------------------------------------------------------------------------------------------
# Comparison: bit patterns, except that any NaN equals any NaN (implementations may canonicalize
# NaN payloads); -0.0 is not 0.0.


def _as_reals(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return a.view(np.dtype(f"f{a.dtype.itemsize // 2}"))
    return a


def assert_same(actual: np.ndarray, expected: np.ndarray, what: str):
    actual = np.ascontiguousarray(np.asarray(actual))
    expected = np.ascontiguousarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype != expected.dtype:
        actual = actual.astype(expected.dtype)
    if expected.dtype.kind == "b":
        bad = actual != expected
    else:
        a, e = _as_reals(actual), _as_reals(expected)
        bits = f"u{a.dtype.itemsize}"
        bad = a.view(bits) != e.view(bits)
        if e.dtype.kind in "fV":
            nan_a = np.isnan(a.astype(np.float32) if a.dtype == BF16 else a)
            nan_e = np.isnan(e.astype(np.float32) if e.dtype == BF16 else e)
            bad = (bad & ~(nan_a & nan_e)) | (nan_a != nan_e)
        if expected.dtype.kind == "c":
            bad = bad.reshape(*expected.shape, 2).any(axis=-1)
    if bad.any():
        where = np.argwhere(bad)[0].tolist() if bad.ndim else []
        first = tuple(where)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values differ; first at {where}: "
                             f"got {actual[first]!r}, expected {expected[first]!r}")


# ---------------------------------------------------------------------------------------------
# The tests


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        seed = metafunc.config.zfeed_seed
        count = int(os.environ.get("ZFEED_PEER_CASES", DEFAULT_CASES))
        cases = [make_case(seed, n) for n in range(count)]
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])


def test_round_trip(case: Case, tmp_path, seed):
    path = str(tmp_path / "a.zarr")
    print(f"case {case.id}: writer {case.writer}, {case.describe()}")
    WRITE[case.writer](case, path)
    expected = case.expected()
    if case.writer == "zfeed":
        readers = ["zfeed"] + [r for r in ("zarr", "tensorstore") if can_handle(r, case) is None]
        assert len(readers) >= 2, "no peer can read this case"
    else:
        readers = ["zfeed"]
    for reader in readers:
        assert_same(READ[reader](case, path), expected, f"{case.writer} wrote, {reader} read")
    # The written regions read back through zfeed partially too (crossing chunk/shard borders).
    if case.shape:
        arr = zfeed.open(path)
        region = case.regions[-1][0]
        sub = tuple(slice(s.start, s.stop, 2) for s in region)
        assert_same(arr[sub], expected[sub], f"{case.writer} wrote, zfeed read {sub}")


def test_case_count(seed, request):
    count = int(os.environ.get("ZFEED_PEER_CASES", DEFAULT_CASES))
    cases = [make_case(seed, n) for n in range(count)]
    if "ZFEED_PEER_CASES" not in os.environ:
        assert len(cases) >= 200
    # Every writer, both formats, every data type and sharding all appear in a default run.
    if count >= DEFAULT_CASES:
        assert {c.writer for c in cases} == set(WRITERS)
        assert {c.zarr_format for c in cases} == {2, 3}
        assert {c.dtype_name for c in cases} == set(DTYPES)
        assert any(c.sharding for c in cases) and any(c.shape == () for c in cases)
        assert any(c.sharding and c.sharding.get("nested") for c in cases)


# Missing chunks and fill values: an array with nothing written, then one chunk written, reads the
# same in every implementation.

FILL_CASES = [
    ("float32", np.float32(np.nan)), ("float64", np.float64(-0.0)), ("float16", np.float16(np.inf)),
    ("bfloat16", BF16.type(-np.inf)), ("int64", np.int64(-2**63)), ("uint64", np.uint64(2**64 - 1)),
    ("int8", np.int8(-128)), ("uint32", np.uint32(2**32 - 1)), ("bool", np.bool_(True)),
    ("complex64", np.complex64(complex(np.nan, -0.0))), ("complex128", np.complex128(complex(-np.inf, 2.5))),
]


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("dtype_name,fill", FILL_CASES, ids=[f[0] for f in FILL_CASES])
def test_missing_chunks_read_as_fill(dtype_name, fill, writer, zarr_format, tmp_path):
    if zarr_format == 2 and dtype_name == "bfloat16":
        pytest.skip("Zarr v2 has no bfloat16 data type")
    dtype = DTYPES[dtype_name]
    base = dict(seed=0, number=0, writer=writer, zarr_format=zarr_format, dtype_name=dtype_name,
                shape=(5, 7), chunks=(2, 3), fill=fill, regions=[])
    if zarr_format == 3:
        base["inner_chain"] = [{"name": "bytes", "configuration": {"endian": "little"}} if dtype.itemsize > 1 else {"name": "bytes"},
                               {"name": "zstd", "configuration": {"level": 1, "checksum": False}}]
    case = Case(**base)
    reason = can_handle(writer, case)
    if reason:
        pytest.skip(reason)
    readers = [r for r in READ if can_handle(r, case) is None]
    empty = str(tmp_path / "empty.zarr")
    WRITE[writer](case, empty)
    for reader in readers:
        assert_same(READ[reader](case, empty), case.expected(), f"{writer} wrote nothing, {reader} read")
    # One chunk's worth of values: every other chunk is missing and reads as the fill value.
    case.regions = [((slice(2, 4), slice(3, 6)), random_values(np.random.default_rng(7), dtype, (2, 3)))]
    partial = str(tmp_path / "partial.zarr")
    WRITE[writer](case, partial)
    chunk_files = [f for f in os.listdir(partial) if not f.startswith(".") and f != "zarr.json"]
    assert chunk_files, "no chunk written"
    for reader in readers:
        assert_same(READ[reader](case, partial), case.expected(), f"{writer} wrote one chunk, {reader} read")


@pytest.mark.parametrize("fill,value", [
    (complex(1.5, np.nan), complex(np.nan, 0.0)),
    (complex(np.nan, 0.0), complex(0.0, np.nan)),
    (-0.0, 0.0),
    (0.0, -0.0),
], ids=["complex-nan-parts-1", "complex-nan-parts-2", "negative-zero-fill", "zero-fill"])
@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
def test_values_that_only_resemble_the_fill_are_stored(tmp_path, fill, value, sharded):
    """A chunk is left out only when its bits are the fill's: -0.0 is not 0.0, and (nan+0j) is not
    (1.5+nanj). zfeed writes, zfeed and tensorstore read."""
    dtype = np.dtype("complex128") if isinstance(fill, complex) else np.dtype("float64")
    path = tmp_path / "a.zarr"
    kwargs = dict(chunks=(2,), shards=(4,)) if sharded else dict(chunks=(2,))
    arr = zfeed.create(path, shape=(8,), dtype=dtype, fill_value=fill, **kwargs)
    arr[2:4] = np.array([value, value], dtype=dtype)
    expected = np.full(8, fill, dtype=dtype)
    expected[2:4] = value
    assert_same(zfeed.open(path)[...], expected, "zfeed read")
    ts_arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}, open=True).result()
    assert_same(ts_arr.read().result(), expected, "tensorstore read")
