"""Batches on the GPU (Loader(device="cuda")): equal to the CPU loader's bit for bit (float32,
float16, bfloat16, labels; NaNs included), into torch and CuPy through DLPack with stream
semantics, buffers not overwritten while the consumer holds them, exact resume, and the
ZarrIterableDataset; and, anywhere, that torch imports cleanly after zfeed (nvCOMP's library must
not capture libstdc++). Without a usable GPU the GPU tests skip with the reason (scripts/gpu-check
runs them on a GPU machine)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import zfeed

STATUS = zfeed._core.cuda_status()
needs_gpu = pytest.mark.skipif(not STATUS["available"], reason=f"no usable GPU: {STATUS['reason']}")

T, LAT, LON = 40, 24, 36
NAMES = ["t2m", "u500", "z500"]


def make_store(path, time_chunk=1):
    root = zfeed.create_group(path)
    rng = np.random.default_rng(3)
    for k, name in enumerate(NAMES):
        values = (100.0 * k + rng.standard_normal((T, LAT, LON)) * (k + 1)).astype("float32")
        if k == 0:
            values[3, 2, 5] = np.nan
        root.create_array(name, shape=values.shape, chunks=(time_chunk, LAT, LON), dtype="float32",
                          compressor="zstd:3", dimension_names=["time", "latitude", "longitude"], data=values,
                          attributes={"zfeed_stats": {"mean": 100.0 * k, "std": float(k + 1)}})
    labels = (rng.random((T, LAT, LON)) * 3).astype("uint8")
    root.create_array("labels", shape=labels.shape, chunks=(time_chunk, LAT, LON), dtype="uint8",
                      compressor="zstd:3", dimension_names=["time", "latitude", "longitude"], data=labels)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "era5.zarr"
    make_store(path, time_chunk=1)
    make_store(path.with_name("ten.zarr"), time_chunk=10)
    return path


def test_cuda_unavailable_says_why():
    if STATUS["available"]:
        pytest.skip("a GPU is usable here")
    with pytest.raises(zfeed.UnsupportedError, match="unavailable: .+; use device='cpu'"):
        zfeed.Loader("unused.zarr", inputs=["t2m"], device="cuda")


def bits(array):
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.kind == "f" or array.dtype.name == "bfloat16" else array


def torch_to_numpy(tensor):
    import torch
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).cpu().numpy().view(np.uint16)
    return tensor.cpu().numpy()


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("labels", [False, True])
@pytest.mark.parametrize("chunks", ["era5.zarr", "ten.zarr"])
def test_gpu_batches_equal_the_cpu_loaders_bit_for_bit(store, dtype, labels, chunks):
    import torch
    path = store.with_name(chunks)
    args = dict(inputs=NAMES, targets=["labels"] if labels else NAMES, lead=0 if labels else 1, batch_size=4,
                seed=1, dtype=dtype, drop_last=False)
    cpu = zfeed.Loader(path, **args)
    gpu = zfeed.Loader(path, device="cuda", **args)
    assert gpu.device == "cuda:0"
    count = 0
    for want, got in zip(cpu, gpu, strict=True):
        assert got["inputs"].is_cuda and got["targets"].is_cuda
        assert got["inputs"].dtype == getattr(torch, dtype)
        assert got["targets"].dtype == (torch.int64 if labels else getattr(torch, dtype))
        np.testing.assert_array_equal(got["times"], want["times"])
        np.testing.assert_array_equal(bits(torch_to_numpy(got["inputs"])), bits(want["inputs"]))
        np.testing.assert_array_equal(bits(torch_to_numpy(got["targets"])), bits(want["targets"]))
        count += 1
    assert count == len(cpu)
    stats = gpu.stats()["device"]
    assert stats["batches"] == count and stats["bytes_to_device"] > 0 and stats["copy_s"] > 0
    # At the epoch's end every copy is timed, with its bytes (the copy rate is their ratio).
    assert stats["copies_timed"] == count and stats["copy_bytes_timed"] == stats["bytes_to_device"]


@needs_gpu
def test_consumer_stream_waits_and_held_batches_are_not_overwritten(store):
    import torch
    cpu = list(zfeed.Loader(store, inputs=NAMES, targets=NAMES, batch_size=4, seed=2))
    side = torch.cuda.Stream()
    kept = []
    with torch.cuda.stream(side):  # the consumer works on a stream of its own
        gpu = zfeed.Loader(store, inputs=NAMES, targets=NAMES, batch_size=4, seed=2, device="cuda",
                           device_buffers=2)
        for batch in gpu:
            kept.append((batch["inputs"] * 1.0, batch["inputs"]))  # used on `side`, and held
    side.synchronize()
    for (product, held), want in zip(kept, cpu, strict=True):
        # The product went through the GPU's arithmetic, which gives NaN as 0x7fffffff: equal as
        # values (NaN where NaN). The held batch is zfeed's own output: equal bit for bit.
        np.testing.assert_array_equal(product.cpu().numpy(), want["inputs"])
        np.testing.assert_array_equal(bits(held.cpu().numpy()), bits(want["inputs"]))
    assert gpu.stats()["device"]["slots"] >= len(kept)  # more buffers, none overwritten


@needs_gpu
def test_buffers_are_recycled_once_the_consumer_lets_go(store):
    gpu = zfeed.Loader(store, inputs=NAMES, targets=NAMES, batch_size=4, seed=2, device="cuda",
                       device_buffers=3)
    for epoch in range(3):
        gpu.set_epoch(epoch)
        for batch in gpu:
            (batch["inputs"].sum() + batch["targets"].sum()).item()
    assert gpu.stats()["device"]["slots"] <= 4  # in flight (device_buffers) + the one in use


@needs_gpu
def test_cupy_and_raw_dlpack(store):
    cupy = pytest.importorskip("cupy")
    cpu = next(iter(zfeed.Loader(store, inputs=NAMES, targets=NAMES, batch_size=4, seed=4)))
    got = next(iter(zfeed.Loader(store, inputs=NAMES, targets=NAMES, batch_size=4, seed=4, device="cuda",
                                 framework="cupy")))
    assert isinstance(got["inputs"], cupy.ndarray)
    np.testing.assert_array_equal(bits(cupy.asnumpy(got["inputs"])), bits(cpu["inputs"]))
    raw = next(iter(zfeed.Loader(store, inputs=NAMES, targets=NAMES, batch_size=4, seed=4, device="cuda",
                                 framework="dlpack")))
    assert raw["inputs"].__dlpack_device__() == (2, 0)
    assert raw["inputs"].shape == list(cpu["inputs"].shape) and raw["inputs"].dtype == "float32"
    np.testing.assert_array_equal(bits(cupy.asnumpy(cupy.from_dlpack(raw["inputs"]))), bits(cpu["inputs"]))


@needs_gpu
def test_resume_on_the_gpu_is_exact(store):
    args = dict(inputs=NAMES, targets=NAMES, batch_size=3, seed=9, device="cuda")
    whole = [b["inputs"].cpu().numpy() for b in zfeed.Loader(store, **args)]
    first = zfeed.Loader(store, **args)
    iterator = iter(first)
    for _ in range(4):
        next(iterator)
    state = first.state_dict()
    assert state["batch"] == 4
    resumed = zfeed.Loader(store, **args)
    resumed.load_state_dict(state)
    rest = [b["inputs"].cpu().numpy() for b in resumed]
    assert len(rest) == len(whole) - 4
    for a, b in zip(rest, whole[4:], strict=True):
        np.testing.assert_array_equal(bits(a), bits(b))


@needs_gpu
def test_torch_dataset_on_the_gpu(store):
    import torch
    from zfeed.torch import ZarrIterableDataset
    dataset = ZarrIterableDataset(store, inputs=NAMES, targets=NAMES, batch_size=4, seed=0, device="cuda")
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=None))
    assert len(batches) == len(dataset) and all(b["inputs"].is_cuda for b in batches)


def make_codec_store(path, compressor, shards=None):
    root = zfeed.create_group(path)
    rng = np.random.default_rng(5)
    for k, name in enumerate(NAMES):
        values = (100.0 * k + np.cumsum(rng.standard_normal((T, LAT, LON)), axis=2) * (k + 1)).astype("float32")
        root.create_array(name, shape=values.shape, chunks=(1, LAT, LON), shards=shards, dtype="float32",
                          compressor=compressor, dimension_names=["time", "latitude", "longitude"], data=values,
                          attributes={"zfeed_stats": {"mean": 100.0 * k, "std": float(k + 1)}})
    return path


def test_gpu_decode_needs_a_cuda_device():
    with pytest.raises(zfeed.ZarrError, match="needs device='cuda'"):
        zfeed.Loader("unused.zarr", inputs=["t2m"], decode="gpu")


def test_gds_needs_a_cuda_device_and_a_known_policy():
    with pytest.raises(zfeed.ZarrError, match="gds='on' needs device='cuda'"):
        zfeed.Loader("unused.zarr", inputs=["t2m"], gds="on")
    with pytest.raises(zfeed.ZarrError, match="gds must be 'auto', 'on' or 'off', got 'yes'"):
        zfeed.Loader("unused.zarr", inputs=["t2m"], device="cuda", gds="yes")


@needs_gpu
@pytest.mark.parametrize("compressor", ["zstd:3", "gzip:5", "lz4", "zlib:1", "blosc:lz4:5", "blosc:zstd:3",
                                        "blosc:zlib:1", "blosc:blosclz:5"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_decoded_batches_equal_the_cpu_loaders(tmp_path, compressor, dtype):
    try:
        path = make_codec_store(tmp_path / "codec.zarr", compressor)
    except zfeed.ZarrError as error:
        pytest.skip(f"{compressor}: {error}")
    args = dict(inputs=NAMES, targets=NAMES, batch_size=4, seed=3, dtype=dtype, drop_last=False)
    cpu = zfeed.Loader(path, **args)
    gpu = zfeed.Loader(path, device="cuda", decode="gpu", **args)
    for want, got in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(bits(torch_to_numpy(got["inputs"])), bits(want["inputs"]))
        np.testing.assert_array_equal(bits(torch_to_numpy(got["targets"])), bits(want["targets"]))
    decode = gpu.stats()["device"]
    if compressor.startswith("blosc:blosclz"):  # nvCOMP has no blosclz: the CPU decodes, and says why
        assert decode["chunks_gpu_decoded"] == 0 and "blosclz inside" in decode["decode"]["reason"]
    else:  # blosc with lz4, zstd or zlib inside too: split into its streams
        assert decode["decode"]["mode"] == "gpu" and decode["chunks_gpu_decoded"] > 0


@needs_gpu
@pytest.mark.parametrize("decode", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fill_nan_on_the_gpu_equals_the_cpu_loader(store, decode, dtype):
    args = dict(inputs=NAMES, targets=NAMES, batch_size=4, seed=1, dtype=dtype, drop_last=False, fill_nan=-1.5)
    cpu = zfeed.Loader(store, **args)
    gpu = zfeed.Loader(store, device="cuda", decode=decode, **args)
    filled = 0
    for want, got in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(bits(torch_to_numpy(got["inputs"])), bits(want["inputs"]))
        np.testing.assert_array_equal(bits(torch_to_numpy(got["targets"])), bits(want["targets"]))
        filled += int((want["times"] == 3).sum())  # t2m[3] holds a NaN
    assert filled == 1


@needs_gpu
@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_static_inputs_and_several_leads_on_the_gpu_equal_the_cpu_loader(tmp_path, decode):
    path = tmp_path / "static.zarr"
    make_store(path)
    orog = (1000.0 * np.random.default_rng(4).random((LAT, LON))).astype("float32")
    zfeed.open(path).create_array("orog", shape=orog.shape, chunks=(LAT, LON), dtype="float32", data=orog,
                                  compressor="zstd:3", dimension_names=["latitude", "longitude"],
                                  attributes={"zfeed_stats": {"mean": 500.0, "std": 250.0}})
    args = dict(inputs=NAMES + ["orog"], targets=NAMES, history=2, lead=[1, 3], batch_size=4, seed=1,
                dtype="bfloat16")
    cpu = zfeed.Loader(path, **args)
    gpu = zfeed.Loader(path, device="cuda", decode=decode, **args)
    assert cpu.input_shape == gpu.input_shape == (4, 2 * len(NAMES) + 1, LAT, LON)
    assert cpu.target_shape == gpu.target_shape == (4, 2 * len(NAMES), LAT, LON)
    for want, got in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(bits(torch_to_numpy(got["inputs"])), bits(want["inputs"]))
        np.testing.assert_array_equal(bits(torch_to_numpy(got["targets"])), bits(want["targets"]))


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cf_packed_variables_on_the_gpu_equal_the_cpu_loader(tmp_path, dtype):
    """int16 with scale_factor, add_offset and a fill value: unpacked on the GPU from the raw values."""
    rng = np.random.default_rng(6)
    packed = rng.integers(-30000, 30000, (T, LAT, LON)).astype("int16")
    packed[:, 1, 1] = -32767
    root = zfeed.create_group(tmp_path / "packed.zarr")
    root.create_array("t2m", shape=packed.shape, chunks=(1, LAT, LON), dtype="int16", compressor="zstd:3",
                      data=packed, dimension_names=["time", "latitude", "longitude"],
                      attributes={"scale_factor": 0.002, "add_offset": 280.0, "_FillValue": -32767,
                                  "zfeed_stats": {"mean": 280.0, "std": 20.0}})
    args = dict(inputs=["t2m"], targets=["t2m"], batch_size=4, seed=1, dtype=dtype, drop_last=False)
    for fill_nan in (None, 0.0):
        cpu = zfeed.Loader(tmp_path / "packed.zarr", fill_nan=fill_nan, **args)
        gpu = zfeed.Loader(tmp_path / "packed.zarr", device="cuda", fill_nan=fill_nan, **args)
        for want, got in zip(cpu, gpu, strict=True):
            np.testing.assert_array_equal(bits(torch_to_numpy(got["inputs"])), bits(want["inputs"]))
            np.testing.assert_array_equal(bits(torch_to_numpy(got["targets"])), bits(want["targets"]))


@needs_gpu
def test_inner_chunks_of_shards_decode_on_the_gpu(tmp_path):
    path = make_codec_store(tmp_path / "sharded.zarr", "zstd:3", shards=(8, LAT, LON))
    args = dict(inputs=NAMES, targets=NAMES, batch_size=4, seed=3, drop_last=False)
    for want, got in zip(zfeed.Loader(path, **args), zfeed.Loader(path, device="cuda", decode="gpu", **args),
                         strict=True):
        np.testing.assert_array_equal(bits(torch_to_numpy(got["inputs"])), bits(want["inputs"]))
    # (the loader above is gone: read the stats of a fresh one after one batch)
    loader = zfeed.Loader(path, device="cuda", decode="gpu", **args)
    next(iter(loader))
    assert loader.stats()["device"]["chunks_gpu_decoded"] > 0


@needs_gpu
def test_a_corrupt_chunk_decoded_on_the_gpu_names_the_key_and_stops_cleanly(tmp_path):
    path = make_codec_store(tmp_path / "corrupt.zarr", "zstd:3")
    chunk = path / "u500" / "c" / "7" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-100])  # truncated: caught before the GPU sees it
    loader = zfeed.Loader(path, inputs=NAMES, targets=NAMES, batch_size=4, shuffle=False, device="cuda", decode="gpu")
    with pytest.raises(zfeed.ZarrError, match="u500/c/7/0/0"):
        for _ in loader:
            pass
    with pytest.raises(zfeed.ZarrError, match="u500/c/7/0/0"):  # the same batch again, not garbage
        for _ in loader:
            pass
    device = loader.stats()["device"]  # the GPU path rejected it first, then the CPU failed on it
    assert device["gpu_decode_failures"] >= 1 and "u500/c/7/0/0" in device["last_gpu_decode_error"]


@needs_gpu
def test_auto_decode_measures_both_paths_and_says_which(tmp_path):
    path = make_codec_store(tmp_path / "auto.zarr", "zstd:3")
    loader = zfeed.Loader(path, inputs=NAMES, targets=NAMES, batch_size=2, device="cuda", decode="auto")
    for _ in range(3):  # 19 batches an epoch; the probe measures 8 per path
        for batch in loader:
            pass
    decode = loader.stats()["device"]["decode"]
    assert decode["asked"] == "auto" and decode["mode"] in ("cpu", "gpu")
    assert decode["reason"].startswith("auto: ") and decode["auto_cpu_ms_per_batch"] > 0
    for path, parts in decode["auto_parts_ms"].items():  # a path's cost is its slowest stage
        assert parts["gpu"] > 0 and set(parts) == {"host_loader", "staging", "gpu"}
        assert max(parts.values()) == pytest.approx(decode[f"auto_{path}_ms_per_batch"])


def cufile_usable():
    status = zfeed.gds_status("on")
    return status["available"], status["reason"]


def test_gds_status_says_whether_cufile_reads_and_why():
    status = zfeed.gds_status("auto")
    assert status["mode"] in ("gds", "compat", "off") and status["reason"], status
    off = zfeed.gds_status("off")
    assert not off["available"] and off["mode"] == "off", off
    assert off["reason"].startswith("turned off") or off["reason"] == "zfeed was built without CUDA", off
    with pytest.raises(zfeed.ZarrError, match="gds='sometimes': expected off, auto or on"):
        zfeed.gds_status("sometimes")


@needs_gpu
@pytest.mark.parametrize("shards", [None, (8, LAT, LON)])
@pytest.mark.parametrize("compressor", ["zstd:3", "lz4", "zlib:1"])
def test_chunks_read_by_cufile_into_gpu_memory_decode_as_on_the_cpu(tmp_path, shards, compressor):
    usable, reason = cufile_usable()
    if not usable:
        pytest.skip(f"cuFile is unavailable: {reason}")
    path = make_codec_store(tmp_path / "gds.zarr", compressor, shards=shards)
    args = dict(inputs=NAMES, targets=NAMES, batch_size=4, seed=5, drop_last=False)
    gpu = zfeed.Loader(path, device="cuda", decode="gpu", gds="on", **args)
    for want, got in zip(zfeed.Loader(path, **args), gpu, strict=True):
        np.testing.assert_array_equal(bits(torch_to_numpy(got["inputs"])), bits(want["inputs"]))
        np.testing.assert_array_equal(bits(torch_to_numpy(got["targets"])), bits(want["targets"]))
    read = gpu.stats()["device"]["read"]
    assert read["asked"] == "on", read
    if read["mode"] == "host":
        # cuFile opened but cannot read this file system (an H200 VM without nvidia-fs:
        # cuFileHandleRegister error 5027): the loader went on with host reads, said why, and the
        # batches are exact (above).
        assert "cuFile read failed" in read["reason"] and "gds.zarr/" in read["reason"], read
        pytest.skip(f"cuFile cannot read files here; the fallback was checked: {read['reason']}")
    assert read["mode"] in ("gds", "compat"), read
    assert read["chunks_to_device"] > 0 and read["failures"] == 0, read


@needs_gpu
def test_a_corrupt_chunk_read_into_gpu_memory_is_caught_on_the_gpu(tmp_path):
    usable, reason = cufile_usable()
    if not usable:
        pytest.skip(f"cuFile is unavailable: {reason}")
    path = make_codec_store(tmp_path / "corrupt-gds.zarr", "zstd:3")
    chunk = path / "u500" / "c" / "7" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-100])  # truncated: the GPU's frame check catches it
    loader = zfeed.Loader(path, inputs=NAMES, targets=NAMES, batch_size=4, shuffle=False, device="cuda",
                          decode="gpu", gds="on")
    for _ in range(2):  # the same batch again, not garbage
        with pytest.raises(zfeed.ZarrError, match="u500/c/7/0/0"):
            for _ in loader:
                pass
    device = loader.stats()["device"]
    assert "u500/c/7/0/0: GPU zstd decode failed: frame truncated" in device["last_gpu_decode_error"], device


@needs_gpu
def test_gds_off_and_auto_say_how_chunks_are_read(tmp_path):
    path = make_codec_store(tmp_path / "read.zarr", "zstd:3")
    args = dict(inputs=NAMES, targets=NAMES, batch_size=4, device="cuda", decode="gpu")
    off = zfeed.Loader(path, gds="off", **args)
    next(iter(off))
    read = off.stats()["device"]["read"]
    assert (read["asked"], read["mode"], read["reason"]) == ("off", "host", "gds=off"), read
    auto = zfeed.Loader(path, gds="auto", **args)
    next(iter(auto))
    read = auto.stats()["device"]["read"]
    assert read["asked"] == "auto" and read["mode"] in ("gds", "host") and read["reason"], read


@needs_gpu
def test_gds_on_without_gpu_decoding_says_why(tmp_path):
    path = make_codec_store(tmp_path / "cpu.zarr", "zstd:3")
    with pytest.raises(zfeed.UnsupportedError, match="gds='on' reads the chunks that decode on the GPU, but decode='cpu'"):
        zfeed.Loader(path, inputs=NAMES, device="cuda", decode="cpu", gds="on")
    blosclz = make_codec_store(tmp_path / "blosclz.zarr", "blosc:blosclz:5")
    with pytest.raises(zfeed.UnsupportedError, match="gds='on' reads .* but no array's chunks decode on the GPU"):
        zfeed.Loader(blosclz, inputs=NAMES, device="cuda", decode="gpu", gds="on")
    # Blosc chunks decode on the GPU, but the host splits them into their streams, so it reads them.
    blosc = make_codec_store(tmp_path / "blosc.zarr", "blosc:lz4:5")
    with pytest.raises(zfeed.UnsupportedError, match="gds=on: no chunk can be read into GPU memory: the chunks are blosc's"):
        zfeed.Loader(blosc, inputs=NAMES, device="cuda", decode="gpu", gds="on")
    loader = zfeed.Loader(blosc, inputs=NAMES, device="cuda", decode="gpu", gds="auto")
    next(iter(loader))
    device = loader.stats()["device"]
    assert device["read"]["mode"] == "host" and device["chunks_gpu_decoded"] > 0, device


LOAD_ORDER = """
import ctypes, zfeed
class LinkMap(ctypes.Structure):
    pass
LinkMap._fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p), ("l_ld", ctypes.c_void_p),
                    ("l_next", ctypes.POINTER(LinkMap)), ("l_prev", ctypes.POINTER(LinkMap))]
entry = ctypes.POINTER(LinkMap)()
RTLD_DI_LINKMAP = 2
ctypes.CDLL(None).dlinfo(ctypes.c_void_p(ctypes.CDLL(None)._handle), RTLD_DI_LINKMAP, ctypes.byref(entry))
while entry:
    print((entry.contents.l_name or b"").decode())
    entry = entry.contents.l_next
"""


def test_libstdcxx_is_loaded_before_nvcomp():
    """The PyPI libnvcomp.so.6 exports its own static copies of libstdc++ code; loaded ahead of
    libstdc++, it captured libstdc++'s own calls and `import zfeed` then `import torch` crashed in
    free() on a GPU image. `import zfeed` loads libstdc++ first: the process's libraries, in the
    order they were loaded, name libstdc++ before nvCOMP. (On that image the module's own list of
    libraries came out without libstdc++ however it was linked, so the order is zfeed's to make.)"""
    if not sys.platform.startswith("linux"):
        pytest.skip("the link map is read through glibc's dlinfo")
    if not zfeed.build_info()["nvcomp"]:
        pytest.skip("zfeed was built without nvCOMP: nothing to order")
    done = subprocess.run([sys.executable, "-c", LOAD_ORDER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = [line.rsplit("/", 1)[-1] for line in done.stdout.splitlines()]
    index = {name: i for i, name in reversed(list(enumerate(loaded)))}
    assert "libstdc++.so.6" in index and "libnvcomp.so.6" in index, loaded
    assert index["libstdc++.so.6"] < index["libnvcomp.so.6"], loaded


def test_importing_torch_after_zfeed_works():
    """The crash the order above prevents: `import zfeed` then `import torch` (and their C++ string
    streams), in a fresh process."""
    pytest.importorskip("torch")
    code = ("import zfeed, torch\n"
            "torch.empty(8, pin_memory=torch.cuda.is_available())\n"
            "x = torch.arange(6.0).reshape(2, 3)\n"
            "assert repr(torch.nn.functional.relu(x)).startswith('tensor')\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
