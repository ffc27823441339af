#!/usr/bin/env python3
"""The read benchmark: zfeed against tensorstore, zarr-python 3 and the machine's limit.

Creates (once, cached under --workdir) a float32 array of smooth, weather-like values (a 2 m
temperature-like field in K at 0.01 K precision: a climatology, planetary waves in latitude and
longitude that drift in time, a diurnal and a seasonal cycle, static small-scale structure like
orography, and a little smooth noise; zstd level 3 stores it at about 0.47 of its size) of shape (time, 1024, 1024) with one
time step per chunk, written by zfeed in three variants:

  zstd       chunks (1, 1024, 1024), bytes + zstd(level 3)
  sharded    shards (16, 1024, 1024) of inner chunks (1, 1024, 1024), bytes + zstd(level 3)
  raw        chunks (1, 1024, 1024), bytes only (uncompressed)

Then, per variant, in one run, side by side, it reads the array with

  zfeed        zfeed.open(path)[...]               (the C++ read, GIL released, into numpy)
  zfeed-out    the same reads into reused, already-touched buffers: arr.read(key, out=buf) for
               "whole" and "list", and arr.read_many(sample, outs=bufs) for "random" (all K chunks
               in one parallel pass, as a loader issues a batch); the conditions the limit runs under
  tensorstore  ts.open(zarr3 driver)[...].read().result()   (default context and concurrency)
  zarr-python  zarr.open_array(path, mode="r")[...]
  limit        bench/read_limit.cc: the same chunks' zstd frames, in memory, decompressed by
               libzstd alone on all cores (compressed variants), or open + pread of the same files
               into a preallocated buffer on all cores (raw)

in three patterns: "whole" (the whole array in one read), "random" (the same seeded list of K
single read chunks for every reader, one read after another as a training loader issues them; a
read chunk is an inner chunk where the array is sharded) and "list" (the same K time steps in one
read by an index array, each step once, as `ds.isel(time=[...])` asks: zfeed `arr[steps]`,
tensorstore `store[steps]`, zarr-python `arr.oindex[steps]`, each with its own concurrency).
MB/s counts decoded bytes (10^6 B/MB); each figure is the best of --reps after one warm-up read,
so the files are in the page cache.

    .venv/bin/python bench/read_bench.py                  # 1 GiB, the full benchmark
    .venv/bin/python bench/read_bench.py --size-mib 64    # a quick check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA_VERSION = 2  # bump when the generated values or layouts change
LAT, LON = 1024, 1024
SHARD_T = 16

VARIANTS = {
    "zstd": dict(compressor="zstd:3", shards=None),
    "sharded": dict(compressor="zstd:3", shards=True),
    "raw": dict(compressor=None, shards=None),
}
READERS = ["zfeed", "zfeed-out", "tensorstore", "zarr-python", "limit"]
GOALS = {"limit": 0.85, "zarr-python": 4.0, "tensorstore": 1.5}


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------
# Data


class WeatherField:
    """A temperature-like field (K) on a LAT x LON grid, smooth in space and slow in time."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.lat = np.deg2rad(np.linspace(89.9, -89.9, LAT))
        self.lon = np.deg2rad(np.linspace(0.0, 360.0, LON, endpoint=False))
        coslat = np.cos(self.lat)
        # Climatology: warm tropics, cold poles, a little hemispheric asymmetry.
        self.base = 250.0 + 45.0 * coslat**2 + 3.0 * np.sin(self.lat)
        # Planetary and synoptic waves: (zonal wavenumber, meridional wavenumber, amplitude K,
        # phase speed rad/step) with random phases; plus smooth noise at higher wavenumbers.
        waves = []
        for m, n, amp in [(1, 1, 6.0), (2, 2, 4.0), (3, 2, 3.0), (4, 3, 2.5), (5, 4, 2.0), (7, 5, 1.5)]:
            waves.append((m, n, amp, rng.uniform(0, 2 * np.pi), rng.uniform(-0.05, 0.05)))
        for _ in range(10):
            m, n = int(rng.integers(8, 40)), int(rng.integers(6, 30))
            waves.append((m, n, rng.uniform(0.1, 0.5), rng.uniform(0, 2 * np.pi), rng.uniform(-0.3, 0.3)))
        self.waves = waves
        # Static small-scale structure (orography, coastlines): constant in time, 0.7 K rms.
        self.static = np.zeros((LAT, LON))
        for _ in range(40):
            m, n = int(rng.integers(10, 160)), int(rng.integers(10, 160))
            amp = rng.uniform(0.05, 0.4)
            self.static += amp * np.outer(np.sin(n * self.lat + rng.uniform(0, 2 * np.pi)),
                                          np.cos(m * self.lon + rng.uniform(0, 2 * np.pi)))

    def step(self, t: int) -> np.ndarray:
        lat, lon = self.lat, self.lon
        coslat = np.cos(lat)
        field = np.empty((LAT, LON), dtype=np.float64)
        field[:] = self.static
        field += self.base[:, None]
        # Diurnal cycle (6-hourly steps): strongest in the tropics.
        day = 2 * np.pi * t / 4.0
        field += (3.0 * coslat)[:, None] * np.cos(lon - day)[None, :]
        # Seasonal swing: one year of 1460 steps.
        field += (8.0 * np.sin(lat) * np.cos(2 * np.pi * t / 1460.0))[:, None]
        for m, n, amp, phase, speed in self.waves:
            # cos(m lon + phase + speed t) * sin(n lat) * cos(lat): separable, so two outer products.
            a = m * lon + phase + speed * t
            meridional = amp * np.sin(n * lat + 0.3 * t * speed) * coslat
            field += meridional[:, None] * np.cos(a)[None, :]
        return np.round(field, 2).astype(np.float32)


def shape_for(size_mib: int) -> tuple[int, int, int]:
    steps = max(1, round(size_mib * 2**20 / (LAT * LON * 4)))
    return (steps, LAT, LON)


def create_data(workdir: Path, size_mib: int, seed: int, regenerate: bool) -> dict[str, Path]:
    import zfeed

    shape = shape_for(size_mib)
    data_dir = workdir / f"data-{size_mib}mib"
    marker = data_dir / "complete.json"
    params = {"version": DATA_VERSION, "shape": list(shape), "seed": seed, "variants": sorted(VARIANTS)}
    paths = {name: data_dir / f"{name}.zarr" for name in VARIANTS}
    if not regenerate and marker.exists():
        try:
            if json.loads(marker.read_text()) == params and all(p.exists() for p in paths.values()):
                log(f"data: reusing {data_dir} (shape {shape})")
                return paths
        except (OSError, ValueError):
            pass
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    shard_t = min(SHARD_T, shape[0])
    arrays = {}
    for name, spec in VARIANTS.items():
        arrays[name] = zfeed.create(
            str(paths[name]), shape=shape, dtype="float32", chunks=(1, LAT, LON),
            shards=(shard_t, LAT, LON) if spec["shards"] else None, compressor=spec["compressor"],
            fill_value=0.0, dimension_names=["time", "latitude", "longitude"],
            attributes={"units": "K", "long_name": "synthetic 2 m temperature", "precision": 0.01},
            overwrite=True)
    field = WeatherField(seed)
    total = shape[0]
    start = time.perf_counter()
    log(f"data: writing {shape} float32 ({np.prod(shape) * 4 / 2**30:.2f} GiB per variant) x {len(VARIANTS)} "
        f"variants to {data_dir}")
    for t0 in range(0, total, shard_t):
        t1 = min(total, t0 + shard_t)
        block = np.stack([field.step(t) for t in range(t0, t1)])
        for array in arrays.values():
            array[t0:t1] = block
        elapsed = time.perf_counter() - start
        eta = elapsed / t1 * (total - t1)
        print(f"\rdata: {t1}/{total} time steps ({100 * t1 / total:.0f}%), {elapsed:.0f} s, ~{eta:.0f} s left   ",
              end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    marker.write_text(json.dumps(params))
    return paths


def stored_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name != "zarr.json")


# -------------------------------------------------------------------------------------------
# Readers


def cpu_seconds() -> float:
    """User + system CPU time of this process, all threads (robust to other load on the machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_chunk_slices(index, read_shape, shape):
    return tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, read_shape, shape))


def make_readers(path: Path, sample_slices):
    """name -> (whole(), random()) callables; each returns the decoded bytes it produced."""
    import tensorstore as ts
    import zarr

    import zfeed

    readers = {}
    # The "list" pattern: the sample's time steps at once, each once (in the sample's order).
    steps = list(dict.fromkeys(s[0].start for s in sample_slices))

    zf = zfeed.open(str(path))

    def zf_whole():
        return zf[...].nbytes

    def zf_random():
        return sum(zf[s].nbytes for s in sample_slices)

    def zf_list():
        return zf[steps].nbytes

    readers["zfeed"] = {"whole": zf_whole, "random": zf_random, "list": zf_list}

    # Buffers allocated and touched once, as a loader's batch pool would be.
    whole_buffer = np.ones(zf.shape, dtype=zf.dtype)
    sample_buffers = [np.ones(zf[s].shape, dtype=zf.dtype) for s in sample_slices]

    def zf_out_whole():
        return zf.read(..., out=whole_buffer).nbytes

    def zf_out_random():
        return sum(b.nbytes for b in zf.read_many(sample_slices, outs=sample_buffers))

    list_buffer = np.ones((len(steps),) + tuple(zf.shape[1:]), dtype=zf.dtype)

    def zf_out_list():
        return zf.read(steps, out=list_buffer).nbytes

    readers["zfeed-out"] = {"whole": zf_out_whole, "random": zf_out_random, "list": zf_out_list}

    store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}, read=True).result()

    def ts_whole():
        return store.read().result().nbytes

    def ts_random():
        return sum(store[s].read().result().nbytes for s in sample_slices)

    def ts_list():
        return store[steps].read().result().nbytes

    readers["tensorstore"] = {"whole": ts_whole, "random": ts_random, "list": ts_list}

    za = zarr.open_array(str(path), mode="r")

    def za_whole():
        return za[...].nbytes

    def za_random():
        return sum(za[s].nbytes for s in sample_slices)

    def za_list():
        return za.oindex[steps].nbytes

    readers["zarr-python"] = {"whole": za_whole, "random": za_random, "list": za_list}
    return readers


def check_same(path: Path, sample_slices) -> None:
    """Every reader returns the same values (one chunk), so the race is between equals."""
    import tensorstore as ts
    import zarr

    import zfeed

    s = sample_slices[0]
    a = zfeed.open(str(path))[s]
    b = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}).result()[s].read().result()
    c = zarr.open_array(str(path), mode="r")[s]
    if not (np.array_equal(a, b) and np.array_equal(a, c)):
        raise SystemExit(f"{path}: readers disagree on chunk {s}")
    steps = [s[0].start for s in sample_slices[:4]]
    a = zfeed.open(str(path))[steps]
    b = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}).result()[steps].read().result()
    c = zarr.open_array(str(path), mode="r").oindex[steps]
    if not (np.array_equal(a, b) and np.array_equal(a, c)):
        raise SystemExit(f"{path}: readers disagree on time steps {steps}")


def limit_binary(args) -> Path:
    if args.limit_bin:
        return Path(args.limit_bin)
    build = ROOT / "build" / "release"
    binary = build / "zfeed_read_limit"
    if not (build / "build.ninja").exists():
        log(f"limit: configuring a Release build in {build}")
        quiet_run(["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                   "-DZFEED_BUILD_TESTS=OFF"])
    log("limit: building zfeed_read_limit (ninja)")
    quiet_run(["ninja", "-C", str(build), f"-j{os.cpu_count() or 1}", "zfeed_read_limit"])
    return binary


def quiet_run(command: list[str]) -> None:
    """Runs a build step, showing its output only if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"failed: {' '.join(command)}")


def run_limit(binary: Path, path: Path, sample_file: Path, reps: int) -> dict:
    out = subprocess.run([str(binary), str(path), "--sample", str(sample_file), "--reps", str(reps)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


# -------------------------------------------------------------------------------------------
# Report


def fmt_ratio(value, goal, na=False):
    if value is None:
        return "-"
    shown = math.floor(value * 100) / 100  # never print 0.85 for 0.849
    if na:
        return f"{shown:.2f}x (n/a)"
    return f"{shown:.2f}{'x' if goal > 1 else ''} {'ok' if value >= goal else 'MISS'}"


def table(rows) -> str:
    head = ["variant", "pattern", "zfeed", "zfeed-out", "tensorstore", "zarr-python", "limit", "limit 1 thr",
            "zfeed-out/limit (>=0.85)", "zfeed/zarr-py (>=4x)", "zfeed/ts (>=1.5x)", "zfeed/limit 1 thr"]
    lines = []
    for r in rows:
        m = r["mbps"]
        lines.append([r["variant"], r["pattern"]] + [f"{m[k]:.0f}" if k in m else "-" for k in READERS] +
                     [f"{r['limit_serial_mbps']:.0f}" if r.get("limit_serial_mbps") else "-",
                      fmt_ratio(r["ratios"].get("limit"), GOALS["limit"]),
                      fmt_ratio(r["ratios"].get("zarr-python"), GOALS["zarr-python"]),
                      fmt_ratio(r["ratios"].get("tensorstore"), GOALS["tensorstore"],
                                na=r.get("tensorstore_near_limit", False)),
                      f"{r['zfeed_over_limit_serial']:.2f}" if r.get("zfeed_over_limit_serial") else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    for line in lines:
        out.append("  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(line, widths))))
    return "\n".join(out)


def plot(rows, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"zfeed": "#d62728", "zfeed-out": "#ff9896", "tensorstore": "#1f77b4", "zarr-python": "#2ca02c",
              "limit": "#7f7f7f"}
    # Compressed and uncompressed rows differ tenfold in MB/s: one panel each, own scale.
    groups = [("zstd-compressed", [r for r in rows if r["variant"] != "raw"]),
              ("uncompressed", [r for r in rows if r["variant"] == "raw"])]
    groups = [(name, group) for name, group in groups if group]
    fig, axes = plt.subplots(1, len(groups), figsize=(12, 5),
                             gridspec_kw={"width_ratios": [len(g) for _, g in groups]}, squeeze=False)
    width = 0.16
    for ax, (name, group) in zip(axes[0], groups):
        x = np.arange(len(group))
        for i, reader in enumerate(READERS):
            values = [r["mbps"].get(reader, np.nan) for r in group]  # none: no bar, no label
            bars = ax.bar(x + (i - (len(READERS) - 1) / 2) * width, values, width, label=reader, color=colors[reader])
            ax.bar_label(bars, labels=[f"{v:.0f}" if v == v else "" for v in values], fontsize=7, rotation=90,
                         padding=2)
        ax.set_xticks(x, [f"{r['variant']}\n{r['pattern']}" for r in group])
        ax.set_title(name, fontsize=10)
        ax.margins(y=0.3)
    axes[0][0].set_ylabel("MB/s of decoded float32 (higher is better)")
    axes[0][0].legend(fontsize=8, ncol=len(READERS), loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def report(result: dict, png: Path) -> None:
    """Prints the table (and CPU time per GB) of a result and draws its bar chart."""
    rows, load = result["rows"], result["load_average"]
    print()
    print(result["title"])
    print(f"machine: {result['machine']['cores']} cores, {result['machine']['cpu']}; versions: " +
          ", ".join(f"{k} {v}" for k, v in result["versions"].items()))
    print("stored/decoded: " + ", ".join(f"{v} {x:.3f}" for v, x in result["stored_over_decoded"].items()))
    print(f"MB/s of decoded bytes, best of {result['reps']} after a warm-up (files in the page cache). "
          f"'limit 1 thr': the limit on one thread,\none chunk after another (random rows). "
          f"'(n/a)': tensorstore is itself within 85% of the limit. "
          f"Load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} after.")
    print(table(rows))
    print("CPU seconds per GB decoded (user + system, all threads; lower is better; best repetition):")
    for r in rows:
        print(f"  {r['variant']:8s} {r['pattern']:7s} " +
              "  ".join(f"{k} {r['cpu_s_per_gb'][k]:.2f}" for k in READERS if k in r["cpu_s_per_gb"]))
    plot(rows, png, result["title"])


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem / 2**30, 1) if mem else None,
            "python": platform.python_version(), "system": platform.platform()}


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ["zfeed", "tensorstore", "zarr", "numcodecs", "numpy"]:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


# -------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "out",
                        help="where the data sets (cached), JSON and PNG go (default bench/out)")
    parser.add_argument("--size-mib", type=int, default=1024, help="size of each array in MiB (default 1024)")
    parser.add_argument("--k", type=int, default=64, help="random single-chunk reads per pass (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and of the random sample")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions; the best counts (default 3)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of zstd,sharded,raw")
    parser.add_argument("--readers", default=",".join(READERS), help="comma-separated subset of " + ",".join(READERS))
    parser.add_argument("--patterns", default="whole,random,list", help="comma-separated subset of whole,random,list")
    parser.add_argument("--json", type=Path, help="results JSON (default WORKDIR/read_bench.json)")
    parser.add_argument("--png", type=Path, help="bar chart (default WORKDIR/read_bench.png)")
    parser.add_argument("--limit-bin", help="the zfeed_read_limit binary (default: build it in build/release)")
    parser.add_argument("--regenerate", action="store_true", help="rewrite the data sets even if cached")
    parser.add_argument("--from-json", type=Path, help="measure nothing: print the table and plot a saved result")
    args = parser.parse_args()
    if args.from_json:
        result = json.loads(args.from_json.read_text())
        report(result, args.png or args.from_json.with_suffix(".png"))
        return 0

    variants = [v for v in args.variants.split(",") if v]
    readers = [r for r in args.readers.split(",") if r]
    patterns = [p for p in args.patterns.split(",") if p]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v}")
    for r in readers:
        if r not in READERS:
            parser.error(f"unknown reader {r}")
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    json_path = args.json or workdir / "read_bench.json"
    png_path = args.png or workdir / "read_bench.png"

    binary = limit_binary(args) if "limit" in readers else None
    paths = create_data(workdir, args.size_mib, args.seed, args.regenerate)
    shape = shape_for(args.size_mib)
    read_shape = (1, LAT, LON)
    grid = [n // c for n, c in zip(shape, read_shape)]
    rng = np.random.default_rng(args.seed + 1)
    sample = [tuple(int(rng.integers(0, g)) for g in grid) for _ in range(args.k)]
    sample_file = workdir / f"sample-{args.size_mib}mib-k{args.k}-seed{args.seed}.txt"
    sample_file.write_text("".join(" ".join(map(str, idx)) + "\n" for idx in sample))
    sample_slices = [read_chunk_slices(idx, read_shape, shape) for idx in sample]
    decoded = {"whole": int(np.prod(shape)) * 4, "random": args.k * int(np.prod(read_shape)) * 4}
    decoded["list"] = len({idx[0] for idx in sample}) * int(np.prod(read_shape)) * 4  # distinct steps

    info = machine()
    log(f"machine: {info['cores']} cores, {info['cpu']}, {info['memory_gib']} GiB; files are in the page cache "
        f"(one warm-up read before the best of {args.reps})")
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (info["cores"] or 1):
        log(f"warning: load average {load_before[0]:.1f} on {info['cores']} cores: other work competes for the CPU")
    py_readers = [r for r in readers if r != "limit"]
    rows = []
    for variant in variants:
        path = paths[variant]
        check_same(path, sample_slices)
        fns = make_readers(path, sample_slices)
        # Warm-up (page cache, thread pools, allocators), then the repetitions round-robin over
        # patterns and readers, so that a burst of other load on the machine hits all of them.
        for pattern in patterns:
            for reader in py_readers:
                if pattern in fns[reader]:
                    nbytes = fns[reader][pattern]()
                    assert nbytes == decoded[pattern], (reader, nbytes, decoded[pattern])
        times = {(p, r): [] for p in patterns for r in py_readers if p in fns[r]}
        cpu = {(p, r): [] for p in patterns for r in py_readers if p in fns[r]}
        limits = []
        for rep in range(args.reps):
            for pattern in patterns:
                for reader in py_readers:
                    fn = fns[reader].get(pattern)
                    if fn is None:
                        continue
                    cpu_start = cpu_seconds()
                    start = time.perf_counter()
                    fn()
                    times[(pattern, reader)].append(time.perf_counter() - start)
                    cpu[(pattern, reader)].append(cpu_seconds() - cpu_start)
            if binary:
                limits.append(run_limit(binary, path, sample_file, 1))
            log(f"{variant}: repetition {rep + 1}/{args.reps} done")
        for pattern in patterns:
            row = {"variant": variant, "pattern": pattern, "decoded_bytes": decoded[pattern],
                   "stored_bytes": stored_bytes(path), "mbps": {}, "seconds": {}, "cpu_s_per_gb": {},
                   "ratios": {}}
            for reader in readers:
                if reader == "limit":
                    key = "whole" if pattern == "whole" else "sample"
                    best = max(limits, key=lambda l: l[key]["mbps"])
                    row["mbps"]["limit"] = best[key]["mbps"]
                    row["seconds"]["limit"] = best[key]["seconds"]
                    row["cpu_s_per_gb"]["limit"] = best[key]["cpu_seconds"] / decoded[pattern] * 1e9
                    if pattern == "random" and key + "_serial" in best:
                        row["limit_serial_mbps"] = max(l[key + "_serial"]["mbps"] for l in limits)
                    row["limit_threads"] = best[key]["threads"]
                elif (pattern, reader) in times:
                    seconds = min(times[(pattern, reader)])
                    row["cpu_s_per_gb"][reader] = min(cpu[(pattern, reader)]) / decoded[pattern] * 1e9
                    row["seconds"][reader] = seconds
                    row["mbps"][reader] = decoded[pattern] / seconds / 1e6
            m = row["mbps"]
            log(f"{variant:8s} {pattern:7s} " + "  ".join(f"{r} {m[r]:.0f}" for r in readers if r in m) + " MB/s")
            # Against the limit: zfeed under the limit's conditions (reused buffers, all chunks at
            # once); against the peers: zfeed through the same call shape as theirs.
            best = m.get("zfeed-out", m.get("zfeed"))
            if best and m.get("limit"):
                row["ratios"]["limit"] = best / m["limit"]
            if "zfeed" in m:
                for other in ("zarr-python", "tensorstore"):
                    if other in m and m[other] > 0:
                        row["ratios"][other] = m["zfeed"] / m[other]
            if "zfeed" in m and row.get("limit_serial_mbps"):
                row["zfeed_over_limit_serial"] = m["zfeed"] / row["limit_serial_mbps"]
            if "tensorstore" in m and "limit" in m:
                row["tensorstore_near_limit"] = m["tensorstore"] / m["limit"] >= GOALS["limit"]
            rows.append(row)
    load_after = os.getloadavg()

    ratio = {v: stored_bytes(paths[v]) / (int(np.prod(shape)) * 4) for v in variants}
    title = (f"zfeed read benchmark: {shape} float32 ({np.prod(shape) * 4 / 2**30:.2f} GiB), "
             f"random = {args.k} single-chunk reads, list = the same in one read; {info['cores']} cores, "
             "page cache warm")
    result = {"title": title, "machine": info, "versions": versions(), "shape": shape, "read_chunk_shape": read_shape,
              "k": args.k, "seed": args.seed, "reps": args.reps, "page_cache": "warm (files read once before timing)",
              "stored_over_decoded": ratio, "load_average": {"before": load_before, "after": load_after},
              "goals": GOALS, "rows": rows, "sample": sample}
    json_path.write_text(json.dumps(result, indent=2))
    report(result, png_path)
    print(f"\nJSON: {json_path}\nPNG:  {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
