"""zfeed demo, the whole story in a few minutes on a laptop-sized machine:

1. the Zarr engine: inspect a real store written by xarray, read it, rewrite it as sharded zstd
   Zarr v3, read it back, plot a field;
2. prepare training data: the real ERA5 hourly 2 m temperature (GRIB) converted to Zarr v3 with
   one time step per chunk (or `zfeed synth era5` data where ../shared is absent), `zfeed info`
   with its advice, `zfeed stats` for normalization;
3. the loader against the hackathon's xarray + DataLoader baseline (`zfeed bench --quick`);
4. a short training run of the forecast U-Net: its validation RMSE against persistence, and the
   three throughput bars (real data, loading only, synthetic data).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import zfeed

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "build" / "demo"
ZFEED = str(Path(sys.executable).parent / "zfeed")


def banner(text: str) -> None:
    print(f"\n== {text}")


def synthetic_source(path: Path) -> Path:
    """A small ECMWF-like group (t and z at two levels) when the shared data is absent."""
    lat = np.linspace(90, -90, 181, dtype="float32")
    lon = np.arange(0, 360, 1, dtype="float32")
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    group = zfeed.create_group(path, zarr_format=2, attributes={"title": "zfeed synthetic analysis"})
    for name, base, amp in (("t", 250.0, 30.0), ("z", 52000.0, 3000.0)):
        field = base + amp * np.cos(la) ** 2 + 0.1 * amp * np.sin(3 * lo) * np.cos(la)
        arr = group.create_array(name, shape=(1, 2, 181, 360), chunks=(1, 1, 181, 360), dtype="float32",
                                 compressor="blosc:lz4", dimension_names=["time", "level", "latitude", "longitude"])
        arr[...] = np.stack([field, field * 1.05])[None]
    for name, values in (("latitude", lat), ("longitude", lon)):
        group.create_array(name, shape=values.shape, dtype="float32", dimension_names=[name])[...] = values
    group.consolidate()
    return path


def run(*args) -> None:
    subprocess.run([str(a) for a in args], check=True)


def training_story() -> None:
    grib = SHARED / "era5-2mt-2019-03-uk.grib"
    store = OUT / "era5.zarr"
    if grib.exists():
        banner(f"prepare: {grib.name} (744 hourly ERA5 fields) -> Zarr v3, one time step per chunk")
        run(ZFEED, "convert", grib, store, "--chunks", "time=1", "--codec", "zstd:3", "--overwrite")
        variables = ["t2m"]
    else:
        banner("prepare: synthetic ERA5-like data (zfeed synth era5), one time step per chunk")
        run(ZFEED, "synth", "era5", store, "--grid", "32x64", "--times", "600", "--overwrite", "--quiet")
        variables = ["t2m", "u500", "v500", "t500", "z500", "q500"]
    run(ZFEED, "info", store)

    banner("statistics for normalization (zfeed stats; the training run computes its own over the training times)")
    run(ZFEED, "stats", store, "--variables", ",".join(variables), "--no-write")

    banner("the loader against the hackathon's xarray + DataLoader baseline (zfeed bench --quick)")
    run(ZFEED, "bench", "--quick", "--json", OUT / "loader_bench.json", "--plot", OUT / "loader_bench.png")

    banner("train the forecast U-Net briefly: skill against persistence, and real vs synthetic throughput")
    run(ZFEED, "train", "forecast", "--store", store, "--inputs", ",".join(variables), "--residual", "--history", "2",
        "--encoder-depth", "3", "--epochs", "1", "--mode", "real,load-only,synthetic", "--threads", "0",
        "--json", OUT / "forecast.json", "--plot", OUT / "forecast_throughput.png")
    print(f"\nplots: {OUT / 'loader_bench.png'}, {OUT / 'forecast_throughput.png'}")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    engine_story()
    training_story()


def engine_story() -> None:
    source = SHARED / "ecmwf-t-z-2007-01-01.zarr"
    if not source.exists():
        print(f"(the shared data at {SHARED} is absent: using built-in synthetic data)")
        source = synthetic_source(OUT / "synthetic-source.zarr")

    banner(f"zfeed info {source}")
    subprocess.run([ZFEED, "info", str(source)], check=True)

    banner("read with zfeed's Python API")
    group = zfeed.open(source)
    print(group)
    t = group["t"]
    print(t)
    packed = t[...]
    scale = t.attrs.get("scale_factor", 1.0)
    offset = t.attrs.get("add_offset", 0.0)
    kelvin = packed.astype("float64") * scale + offset
    print(f"t: {packed.dtype} values packed with scale_factor={scale:.6g}, add_offset={offset:.6g}")
    print(f"t at 500 and 850 hPa: min {kelvin.min():.1f} K, mean {kelvin.mean():.1f} K, max {kelvin.max():.1f} K")
    nc = SHARED / "ecmwf-t-z-2007-01-01.nc"
    if nc.exists():
        import netCDF4

        with netCDF4.Dataset(nc) as ds:
            ds.set_auto_maskandscale(False)
            same = np.array_equal(ds["t"][...], packed)
        print(f"equal to the netCDF file's packed values: {same}")

    banner("rewrite as Zarr v3: float32, sharded (one shard per level), zstd level 3")
    target = OUT / "ecmwf-v3.zarr"
    out_group = zfeed.create_group(target, attributes=dict(group.attrs), overwrite=True)
    for name, arr in group.arrays():
        values = arr[...]
        if "scale_factor" in arr.attrs:
            values = (values * arr.attrs["scale_factor"] + arr.attrs.get("add_offset", 0.0)).astype("float32")
        attrs = {k: v for k, v in arr.attrs.items() if k not in ("scale_factor", "add_offset", "_FillValue", "missing_value")}
        if values.ndim == 4:
            chunks, shards = (1, 1, 91, 90), (1, 1, 182, 360)
        else:
            chunks, shards = values.shape, None
        out = out_group.create_array(name, shape=values.shape, dtype=values.dtype, chunks=chunks, shards=shards,
                                     compressor="zstd:3", dimension_names=arr.dimension_names, attributes=attrs)
        out[...] = values
    out_group.consolidate()
    subprocess.run([ZFEED, "info", str(target)], check=True)

    banner("read back: one inner chunk by range reads, and the whole field")
    t3 = zfeed.open(target)["t"]
    print(t3)
    start = time.perf_counter()
    corner = t3[0, 0, :91, :90]
    whole = t3[...]
    elapsed = time.perf_counter() - start
    print(f"corner {corner.shape} and whole {whole.shape} read in {elapsed * 1000:.1f} ms; "
          f"max difference from the source: {np.abs(whole - kelvin.astype('float32')).max():.3g} K")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        image = ax.imshow(whole[0, 0], extent=(0, 360, -90, 90), cmap="RdYlBu_r")
        ax.set_title("ECMWF analysis: temperature at 500 hPa, read with zfeed")
        ax.set_xlabel("longitude")
        ax.set_ylabel("latitude")
        fig.colorbar(image, ax=ax, label="K")
        png = OUT / "t500.png"
        fig.savefig(png, dpi=100, bbox_inches="tight")
        print(f"\nplot: {png}")
    except ImportError:
        print("(matplotlib is not installed: no plot)")


if __name__ == "__main__":
    main()
