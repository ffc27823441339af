"""zfeed bench: loader throughput on a store, zfeed beside its peers, in one run.

The workload is the GPU-native Zarr hackathon's: inputs the variables at time t, targets the same
at t + 1, batches of 16 float32 samples [channels, lat, lon], shuffled. Readers:

  zfeed        zfeed.Loader (inputs = targets = the variables, lead 1, batch 16, shuffle,
               prefetch 2; --zfeed-option KEY=VALUE passes more; on a store with several time
               steps per chunk it asks for order="chunks", the chunk-aware order)
  baseline     the hackathon's xarray + zarr-python Dataset under a torch DataLoader with 2 worker
               processes (zfeed.baseline)
  tensorstore  the same samples as zfeed's measured batches, read with tensorstore's own
               concurrency: all reads of a batch issued as futures at once, then stacked and
               normalized with numpy
  limit        the zstd library alone (bench/read_limit.cc, zfeed_read_limit --units) decoding
               the chunks of those same samples on all cores, frames already in memory: each
               chunk decoded once per sample that uses it, as a loader without a decoded-chunk
               cache must; on a multi-step store also "limit-cached": each chunk once per epoch
               (what a chunk-aware order with a cache of decoded chunks can reach)

on two stores: the 1-step store (one time step per chunk, zstd level 3: `zfeed synth era5`) and
the same values with 10 time steps per chunk (the hackathon's original chunking, `zfeed convert
--chunks time=10`). Both are made once and cached under --workdir (made again when the variables
or the source store change).

Figures: samples/s and MB/s of decoded input + target bytes delivered (10^6 B per MB), over
--batches batches after --warmup batches (at most --seconds per reader). Each reader runs in a
fresh subprocess; every file of a store is read once before its readers run, so all readers read
from a warm page cache. Same statistics (mean, std per variable) for every reader.

    zfeed bench                                  # the full benchmark (a few minutes)
    zfeed bench --quick                          # a small smoke run (~20 s)
    zfeed bench --json out.json --plot out.png   # all numbers, and a bar chart
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_VARIABLES = ["t2m", "u500", "v500", "t500", "z500", "q500"]
READERS = ["zfeed", "baseline", "tensorstore", "limit"]
STORE_KINDS = {"1-step": 1, "10-step": 10}
STORE_DATA_VERSION = 1  # bump when the generated stores change
MULTI_STEP_ORDER = {"order": "chunks"}
LIMIT_DECODE_BYTES = 2 * 10**9  # decoded bytes per pass of the limit (a subset of the measured batches)


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------
# Finding the tools


def _beside_python(name: str) -> Path | None:
    candidate = Path(sys.executable).parent / name
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def zfeed_command() -> str:
    found = _beside_python("zfeed") or shutil.which("zfeed")
    if not found:
        raise SystemExit("zfeed bench: the zfeed command is not installed beside this Python or on PATH "
                         "(make python installs it)")
    return str(found)


def limit_binary(given: str | None) -> str | None:
    """zfeed_read_limit: --limit-bin, $ZFEED_READ_LIMIT, beside this Python (make python installs
    it there), on PATH, or in a build folder of the working directory."""
    for candidate in (given, os.environ.get("ZFEED_READ_LIMIT")):
        if candidate:
            if not Path(candidate).is_file():
                raise SystemExit(f"zfeed bench: limit helper {candidate} does not exist")
            return candidate
    found = _beside_python("zfeed_read_limit") or shutil.which("zfeed_read_limit")
    if found:
        return str(found)
    for folder in ("build/python", "build/release", "build/debug"):
        candidate = Path(folder) / "zfeed_read_limit"
        if candidate.is_file():
            return str(candidate.resolve())
    return None


# -------------------------------------------------------------------------------------------
# Stores


def _run_quiet(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"zfeed bench: failed: {' '.join(command)}")


def fail(message: str):
    """Ends the run with one line on stderr (exit status 1)."""
    raise SystemExit(f"zfeed bench: {message}")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def _marker_ok(path: Path, params: dict) -> bool:
    marker = path / "zfeed-bench-store.json"
    try:
        return json.loads(marker.read_text()) == params
    except (OSError, ValueError):
        return False


def _make_store(path: Path, params: dict, build) -> Path:
    """Builds a store into a temporary sibling and renames it into place, so a killed run never
    leaves a half-written store that a later run would reuse. A store whose marker differs from
    `params` (other variables, a changed source, an older version) is built again."""
    if _marker_ok(path, params):
        log(f"store: reusing {path}")
        return path
    if path.exists():
        log(f"store: {path.name} was made from other variables or another source: rebuilding it")
        shutil.rmtree(path)
    partial = path.with_name(path.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    start = time.perf_counter()
    build(partial)
    (partial / "zfeed-bench-store.json").write_text(json.dumps(params))
    partial.rename(path)
    log(f"store: wrote {path} in {time.perf_counter() - start:.0f} s")
    return path


def synthetic_stores(workdir: Path, grid: tuple[int, int], times: int, variables: list[str], seed: int,
                     kinds: list[str]) -> dict[str, Path]:
    zfeed = zfeed_command()
    base = f"era5-{grid[0]}x{grid[1]}-t{times}-s{seed}-{'-'.join(variables)}"
    params = {"version": STORE_DATA_VERSION, "grid": list(grid), "times": times, "variables": variables,
              "seed": seed, "codec": "zstd:3", "step": "6h"}
    stores: dict[str, Path] = {}
    one_path = workdir / f"{base}-time1.zarr"
    log(f"store: {one_path.name} ({times} x {grid[0]} x {grid[1]}, {len(variables)} variables, zstd level 3)")
    one = _make_store(one_path, {**params, "time_chunk": 1}, lambda out: _run_quiet(
        [zfeed, "synth", "era5", str(out), "--grid", f"{grid[0]}x{grid[1]}", "--times", str(times), "--step", "6h",
         "--seed", str(seed), "--variables", ",".join(variables), "--codec", "zstd:3", "--quiet"]))
    if "1-step" in kinds:
        stores["1-step"] = one
    for kind in kinds:
        if kind != "1-step":
            stores[kind] = rechunked_store(one, workdir, STORE_KINDS[kind], variables, params)
    return stores


def source_signature(path: Path, variables: list[str]) -> str:
    """What identifies a source store's contents, cheaply: the name, size and modification time of
    its root metadata and of every file of the given variables (a store rewritten since, or a
    variable written again, signs differently)."""
    files = [path / name for name in ("zarr.json", ".zmetadata", ".zgroup", ".zattrs") if (path / name).is_file()]
    for name in sorted(set(variables)):
        files.extend(sorted(f for f in (path / name).rglob("*") if f.is_file()))
    digest = hashlib.sha1()
    for f in files:
        st = f.stat()
        digest.update(f"{f.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def rechunked_store(source: Path, workdir: Path, time_chunk: int, variables: list[str], params: dict) -> Path:
    """`source` rewritten with `time_chunk` time steps per chunk, cached in `workdir`: reused while
    its marker names the same variables and the same source contents (source_signature)."""
    source = source.resolve()
    tag = hashlib.sha1(str(source).encode()).hexdigest()[:8]
    path = workdir / f"{source.name.removesuffix('.zarr').removesuffix('-time1')}-time{time_chunk}-{tag}.zarr"
    log(f"store: {path.name} (the same values, {time_chunk} time steps per chunk)")
    marker = {**params, "source": str(source), "source_signature": source_signature(source, variables),
              "variables": sorted(set(variables)), "time_chunk": time_chunk}
    return _make_store(path, marker,
                       lambda out: _run_quiet([zfeed_command(), "convert", str(source), str(out), "--chunks",
                                               f"time={time_chunk}", "--codec", "zstd:3", "--variables",
                                               ",".join(variables), "--quiet"]))


def check_store(path: Path, label: str, variables: list[str], batch_size: int, lead: int = 1) -> dict:
    """Opens the store and checks what the benchmark needs of it: the variables, each (time, lat,
    lon) of one shape, and at least one batch of samples (t, t + lead). `label` names the store in
    the one-line error ("--store PATH"). Returns {name: array}."""
    import zfeed

    if not path.exists():
        fail(f"{label} does not exist")
    try:
        group = zfeed.open(str(path))
    except (zfeed.ZarrError, OSError, ValueError) as error:
        fail(f"{label} is not a readable Zarr store: {_one_line(error)}")
    if not isinstance(group, zfeed.Group):
        fail(f"{label} is a single array; a group holding the variables is expected")
    try:
        names = group.keys()
        missing = [name for name in variables if name not in names]
        if missing:
            held = [name for name, node in group.arrays() if node.ndim == 3] or names
            fail(f"{label} lacks {', '.join(missing)} (it has {', '.join(held) or 'no arrays'}); pass --variables")
        arrays = {name: group[name] for name in variables}
    except (zfeed.ZarrError, OSError, ValueError) as error:
        fail(f"{label}: {_one_line(error)}")
    first = arrays[variables[0]]
    for name, array in arrays.items():
        if len(array.shape) != 3:
            fail(f"{label}: {name} has shape {array.shape}; (time, lat, lon) expected")
        if array.shape != first.shape:
            fail(f"{label}: {name} {array.shape} differs from {variables[0]} {first.shape}")
    steps = first.shape[0]
    if steps - lead < batch_size:
        fail(f"{label} has {steps} time steps, {max(0, steps - lead)} samples of t -> t+{lead}: fewer than one "
             f"batch of --batch-size {batch_size} (pass a smaller --batch-size, or a store of at least "
             f"{batch_size + lead} time steps)")
    return arrays


def describe_store(path: Path, variables: list[str], label: str | None = None, batch_size: int = 1) -> dict:
    arrays = check_store(path, label or str(path), variables, batch_size)
    first = arrays[variables[0]]
    stored = 0
    for name in variables:
        stored += sum(f.stat().st_size for f in (path / name).rglob("*") if f.is_file() and f.name != "zarr.json")
    chunks = [int(n) for n in first.chunks]  # the unit of reading (the inner chunk where sharded)
    return {"path": str(path), "shape": list(first.shape), "time_chunk": chunks[0],
            "chunks": chunks, "stored_bytes": stored,
            "decoded_bytes": int(np.prod(first.shape)) * 4 * len(variables),
            # chunks per dimension, and what one decodes to: the limit lists every chunk of a plane
            "read_grid": [-(-int(n) // c) for n, c in zip(first.shape, chunks)],
            "chunk_bytes": int(np.prod(chunks)) * first.dtype.itemsize,
            "variables_chunked_differently": [name for name, a in arrays.items()
                                              if [int(n) for n in a.chunks] != chunks]}


def statistics(path: Path, variables: list[str], steps: int = 24) -> dict[str, tuple[float, float]]:
    """Mean and std per variable over up to `steps` evenly spaced time steps (the same for every
    reader, and for both stores)."""
    import zfeed

    group = zfeed.open(str(path))
    out = {}
    for name in variables:
        array = group[name]
        count = array.shape[0]
        picks = sorted(set(np.linspace(0, count - 1, min(steps, count)).round().astype(int).tolist()))
        values = np.stack([array[t] for t in picks]).astype(np.float64)
        std = float(values.std())
        out[name] = (float(values.mean()), std if std > 0 else 1.0)
    return out


def warm_page_cache(path: Path) -> int:
    """Reads every file of the store once; returns the bytes read."""
    total = 0
    for file in sorted(path.rglob("*")):
        if file.is_file():
            with open(file, "rb") as f:
                while chunk := f.read(1 << 22):
                    total += len(chunk)
    return total


# -------------------------------------------------------------------------------------------
# Readers (each runs in a child process: python -m zfeed.bench --child SPEC)


def _coerce(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_options(items: list[str]) -> dict:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"zfeed bench: --zfeed-option takes KEY=VALUE, got {item!r}")
        options[key.strip()] = _coerce(value.strip())
    return options


class Clock:
    """Counts measured batches: at least `batches` and at least `min_seconds` (a fast reader on many
    cores measures more than `batches`), but no longer than `seconds` once `min_batches` are in."""

    def __init__(self, batches: int, seconds: float, min_batches: int = 2, min_seconds: float = 0.0):
        self.batches, self.seconds, self.min_batches = batches, seconds, min(min_batches, batches)
        self.min_seconds = min(min_seconds, seconds)
        self.count = 0
        self.start = None

    def begin(self) -> None:
        self.start = time.perf_counter()

    def tick(self) -> bool:
        """Records one batch; True while more should be measured."""
        self.count += 1
        elapsed = time.perf_counter() - self.start
        if self.count < self.min_batches:
            return True
        return elapsed < self.seconds and (self.count < self.batches or elapsed < self.min_seconds)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def child_zfeed(spec: dict) -> dict:
    import zfeed

    normalize = {k: tuple(v) for k, v in spec["normalize"].items()}
    options = dict(spec["options"])
    notes = []

    def make(opts):
        return zfeed.Loader(spec["store"], inputs=spec["variables"], targets=spec["variables"], lead=spec["lead"],
                            batch_size=spec["batch_size"], shuffle=True, seed=spec["seed"], prefetch=2,
                            drop_last=True, normalize=normalize, **opts)

    try:
        loader = make(options)
    except TypeError as error:
        # A zfeed.Loader without these keywords (the chunk-aware order is being added): measure it
        # without them and say so.
        given = " ".join(f"{k}={v}" for k, v in options.items())
        notes.append(f"TODO: {given} not accepted by this zfeed.Loader, measured without it")
        log(f"    zfeed.Loader rejected {given}: {error}")
        rejected, options = options, {}
        loader = make(options)
    else:
        rejected = {}
    batches = []  # [(epoch, times)] of the measured batches
    epoch = 0
    loader.set_epoch(epoch)
    iterator = iter(loader)

    def next_batch():
        nonlocal epoch, iterator
        for _ in range(2):  # the end of an epoch, then a fresh one that must yield
            try:
                return next(iterator)
            except StopIteration:
                epoch += 1
                loader.set_epoch(epoch)
                iterator = iter(loader)
        fail(f"zfeed.Loader yields no batch of {spec['batch_size']} from {spec['store']} "
             f"({loader.num_samples} samples): pass a smaller --batch-size")

    for _ in range(spec["warmup"]):
        batch = next_batch()
        del batch
    clock = Clock(spec["batches"], spec["seconds"], min_seconds=spec.get("min_seconds", 0.0))
    clock.begin()
    while True:
        batch = next_batch()
        batches.append((epoch, batch["times"].tolist()))
        del batch
        if not clock.tick():
            break
    seconds = clock.elapsed()
    return {"seconds": seconds, "batches": clock.count, "samples": clock.count * spec["batch_size"],
            "sample_batches": batches, "options": options, "rejected_options": rejected, "notes": notes,
            "epochs_crossed": batches[-1][0] - batches[0][0], "loader_stats": loader.stats()}


def child_baseline(spec: dict) -> dict:
    from zfeed.baseline import make_baseline_loader

    normalize = {k: tuple(v) for k, v in spec["normalize"].items()}
    loader = make_baseline_loader(spec["store"], spec["variables"], batch_size=spec["batch_size"],
                                  num_workers=spec["workers"], seed=spec["seed"], lead=spec["lead"],
                                  normalize=normalize)
    epochs = 0
    iterator = iter(loader)

    def next_batch():
        nonlocal iterator, epochs
        for _ in range(2):  # the end of an epoch, then a fresh one that must yield
            try:
                return next(iterator)
            except StopIteration:
                epochs += 1
                iterator = iter(loader)
        fail(f"the baseline yields no batch of {spec['batch_size']} from {spec['store']}: pass a smaller --batch-size")

    for _ in range(spec["warmup"]):
        next_batch()
    clock = Clock(spec["batches"], spec["seconds"], min_seconds=spec.get("min_seconds", 0.0))
    clock.begin()
    while True:
        x, y = next_batch()
        assert x.shape[0] == spec["batch_size"] and y.shape == x.shape
        del x, y
        if not clock.tick():
            break
    seconds = clock.elapsed()
    return {"seconds": seconds, "batches": clock.count, "samples": clock.count * spec["batch_size"],
            "workers": spec["workers"], "epochs_crossed": epochs, "notes": []}


def child_tensorstore(spec: dict) -> dict:
    import tensorstore as ts

    variables, lead = spec["variables"], spec["lead"]
    arrays = [ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(spec["store"], name)}},
                      read=True).result() for name in variables]
    mean = np.array([spec["normalize"][v][0] for v in variables], dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.array([spec["normalize"][v][1] for v in variables], dtype=np.float32).reshape(1, -1, 1, 1)

    def read_batch(times: list[int]) -> tuple[np.ndarray, np.ndarray]:
        inputs = [[array[t].read() for array in arrays] for t in times]
        targets = [[array[t + lead].read() for array in arrays] for t in times]
        x = np.stack([np.stack([f.result() for f in row]) for row in inputs])
        y = np.stack([np.stack([f.result() for f in row]) for row in targets])
        x -= mean
        x /= std
        y -= mean
        y /= std
        return x, y

    batches = spec["sample_batches"]
    for times in batches[:spec["warmup"]]:
        read_batch(times)
    clock = Clock(len(batches), spec["seconds"])
    clock.begin()
    for times in batches:
        x, y = read_batch(times)
        del x, y
        if not clock.tick():
            break
    seconds = clock.elapsed()
    return {"seconds": seconds, "batches": clock.count, "samples": clock.count * spec["batch_size"], "notes": []}


CHILDREN = {"zfeed": child_zfeed, "baseline": child_baseline, "tensorstore": child_tensorstore}


def run_child(reader: str, spec: dict, timeout: float) -> dict:
    command = [sys.executable, "-m", "zfeed.bench", "--child", reader, json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{reader}: no result within {timeout:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
        return {"error": f"{reader} failed (exit {done.returncode}): " + "\n".join(tail)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"{reader}: no result printed"}
    return json.loads(lines[-1])


# -------------------------------------------------------------------------------------------
# The limit


def chunk_uses(batches: list, variables: list[str], lead: int, time_chunk: int, once_per_epoch: bool,
               grid: tuple[int, int] = (1, 1)) -> list[str]:
    """Lines "VAR c i j" for zfeed_read_limit --units: per sample, the distinct time chunks of t and
    t + lead of every variable (once per use); or, with once_per_epoch, every distinct time chunk of
    the samples of each epoch once. A time chunk is every chunk (i, j) of the plane's chunk grid
    `grid` (lat chunks, lon chunks): (1, 1) where a chunk holds the whole plane."""
    spatial = [f"{i} {j}" for i in range(grid[0]) for j in range(grid[1])]
    lines = []
    seen: set = set()
    current_epoch = None
    for epoch, times in batches:
        if once_per_epoch and epoch != current_epoch:
            seen, current_epoch = set(), epoch
        for t in times:
            chunks = sorted({t // time_chunk, (t + lead) // time_chunk})
            for c in chunks:
                if once_per_epoch:
                    if c in seen:
                        continue
                    seen.add(c)
                lines.extend(f"{name} {c} {ij}" for name in variables for ij in spatial)
    return lines


def limit_subset(batches: list, variables: list[str], time_chunk: int, chunk_bytes: int, budget: int,
                 once_per_epoch: bool = False, grid: tuple[int, int] = (1, 1)) -> list:
    """The first of the measured batches (at least one) whose chunk decodes (once per use, or once
    per epoch) stay within `budget` bytes: the limit is a rate, and a part of the same samples
    measures it. Once per epoch, a longer part is needed: the chunks a few batches share (a
    window's, and its neighbors') are then shared over as many samples as in the measured run."""
    subset = []
    for epoch, times in batches:
        decodes = len(chunk_uses(subset + [(epoch, times)], variables, 1, time_chunk, once_per_epoch, grid))
        if subset and decodes * chunk_bytes > budget:
            break
        subset.append((epoch, times))
    return subset


def run_limit(binary: str, store: Path, lines: list[str], reps: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="zfeed-bench-units-", delete=False) as f:
        f.write("\n".join(lines) + "\n")
        units_file = f.name
    try:
        done = subprocess.run([binary, str(store), "--units", units_file, "--reps", str(reps)], capture_output=True,
                              text=True, timeout=600)
    finally:
        os.unlink(units_file)
    if done.returncode != 0:
        return {"error": f"limit failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"}
    result = json.loads(done.stdout)
    units = result["units"]
    return {"seconds": units["seconds"], "decoded_chunk_bytes": units["decoded_bytes"], "chunks": units["chunks"],
            "threads": units["threads"], "reps": reps, "cpu_seconds": units["cpu_seconds"], "notes": []}


# -------------------------------------------------------------------------------------------
# Report


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        memory = None
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": memory, "python": platform.python_version(),
            "system": platform.platform()}


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ["zfeed", "numpy", "torch", "xarray", "zarr", "numcodecs", "tensorstore"]:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _ratio(a, b):
    return a / b if a and b else None


def add_ratios(rows: list[dict]) -> None:
    by = {(r["reader"], r["store"]): r for r in rows if "samples_per_s" in r}
    for r in rows:
        if "samples_per_s" not in r:
            continue
        store = r["store"]
        base = by.get(("baseline", store))
        limit = by.get(("limit", store))
        cached = by.get(("limit-cached", store))
        tstore = by.get(("tensorstore", store))
        value = r["samples_per_s"]
        r["vs_baseline"] = _ratio(value, base and base["samples_per_s"])
        r["of_limit"] = _ratio(value, limit and limit["samples_per_s"])
        r["of_limit_cached"] = _ratio(value, cached and cached["samples_per_s"])
        r["vs_tensorstore"] = _ratio(value, tstore and tstore["samples_per_s"])


def summary(rows: list[dict], kinds: list[str]) -> dict:
    by = {(r["reader"], r["store"]): r for r in rows if "samples_per_s" in r}
    out = {}
    if "1-step" in kinds:
        for kind in kinds:
            if kind == "1-step":
                continue
            for reader in ("zfeed", "baseline", "tensorstore"):
                one, multi = by.get((reader, "1-step")), by.get((reader, kind))
                if one and multi:
                    # loss: the share of the 1-step throughput lost; slowdown: 1-step over multi-step
                    out[f"{reader} {kind} vs 1-step"] = {
                        "loss": 1 - multi["samples_per_s"] / one["samples_per_s"],
                        "slowdown": one["samples_per_s"] / multi["samples_per_s"],
                        "one_samples_per_s": one["samples_per_s"], "multi_samples_per_s": multi["samples_per_s"]}
    return out


def _fmt(value, digits=2, suffix="x"):
    if value is None:
        return "-"
    return f"{value:.{digits}f}{suffix}"


def table(rows: list[dict]) -> str:
    head = ["reader", "store", "samples/s", "MB/s", "vs baseline", "of limit", "vs tensorstore", "note"]
    lines = []
    for r in rows:
        if "samples_per_s" not in r:
            lines.append([r["reader"], r["store"], "-", "-", "-", "-", "-", r.get("error", "").splitlines()[0][:90]])
            continue
        note = "; ".join(r.get("notes", []))
        if r.get("of_limit_cached") is not None and r["reader"] not in ("limit", "limit-cached"):
            note = f"{r['of_limit_cached']:.2f} of limit-cached" + (f"; {note}" if note else "")
        lines.append([r["reader"], r["store"], f"{r['samples_per_s']:.1f}", f"{r['mb_per_s']:.0f}",
                      _fmt(r.get("vs_baseline")), _fmt(r.get("of_limit"), suffix=""),
                      _fmt(r.get("vs_tensorstore")), note])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip(), "  ".join("-" * w for w in widths[:-1])]
    for line in lines:
        cells = [x.ljust(w) if i in (0, 1, 7) else x.rjust(w) for i, (x, w) in enumerate(zip(line, widths))]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "samples_per_s" in r]
    stores = [k for k in result["stores"] if any(r["store"] == k for r in rows)]
    readers = [r for r in READERS + ["limit-cached"] if any(row["reader"] == r for row in rows)]
    colors = {"zfeed": "#d62728", "baseline": "#2ca02c", "tensorstore": "#1f77b4", "limit": "#7f7f7f",
              "limit-cached": "#c7c7c7"}
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(1, len(readers))
    x = np.arange(len(stores))
    for i, reader in enumerate(readers):
        values = []
        labels = []
        for store in stores:
            row = next((r for r in rows if r["reader"] == reader and r["store"] == store), None)
            values.append(row["mb_per_s"] if row else 0)
            labels.append(f"{row['mb_per_s']:.0f} MB/s\n{row['samples_per_s']:.1f} samples/s" if row else "")
        bars = ax.bar(x + (i - (len(readers) - 1) / 2) * width, values, width, label=reader,
                      color=colors.get(reader, "#999999"))
        ax.bar_label(bars, labels=labels, fontsize=7, padding=2)
    ax.set_xticks(x, [f"{s} chunks\n{result['stores'][s]['chunks']}" for s in stores])
    ax.set_ylabel("MB/s of decoded inputs + targets delivered (higher is better)")
    ax.margins(y=0.2)
    ax.legend(fontsize=8)
    ax.set_title(result["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def report(result: dict) -> None:
    m = result["machine"]
    print()
    print(result["title"])
    print(f"machine: {m['cores']} cores, {m['cpu']}; versions: " +
          ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v))
    print(f"page cache: {result['page_cache']}")
    load = result["load_average"]
    print(f"load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} after "
          f"(other work on the machine competes for the {m['cores']} cores)")
    for kind, store in result["stores"].items():
        print(f"store {kind}: {store['path']}  shape {tuple(store['shape'])}, chunks {tuple(store['chunks'])}, "
              f"stored/decoded {store['stored_bytes'] / store['decoded_bytes']:.2f}")
    print(f"sample: {result['config']['channels']} channels x 2 (input t, target t+1) of "
          f"{result['config']['grid'][0]} x {result['config']['grid'][1]} float32 = "
          f"{result['config']['sample_bytes'] / 1e6:.2f} MB; batch {result['config']['batch_size']}")
    print(table(result["rows"]))
    for name, value in result["summary"].items():
        reader, kind = name.split(" ")[:2]
        if value["loss"] > 0:
            change = f"a loss of {value['loss'] * 100:.0f}% ({value['slowdown']:.2f}x the time per sample)"
        else:
            change = f"no loss: {1 / value['slowdown']:.2f}x faster"
        print(f"{reader} on the {kind} store: {value['multi_samples_per_s']:.1f} samples/s against "
              f"{value['one_samples_per_s']:.1f} on the 1-step store, {change}")
    for note in result.get("notes", []):
        print(f"note: {note}")
    print("limit: libzstd alone on all cores, frames in memory, each chunk decoded once per sample that "
          "uses it; limit-cached: each chunk once per epoch (a decoded-chunk cache).")


# -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zfeed bench", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, help="a 1-step store to measure (default: a synthetic one in --workdir)")
    parser.add_argument("--chunked-store", type=Path,
                        help="the 10-step store (default: --store rewritten with 10 time steps per chunk)")
    parser.add_argument("--workdir", type=Path, default=Path("bench/out/loader"),
                        help="where synthetic stores are cached (default bench/out/loader)")
    parser.add_argument("--stores", default="1-step,10-step", help="which stores: 1-step,10-step (default both)")
    parser.add_argument("--readers", default=",".join(READERS), help="comma-separated subset of " + ",".join(READERS))
    parser.add_argument("--variables", default=",".join(DEFAULT_VARIABLES), help="the variables (inputs = targets)")
    parser.add_argument("--grid", help="grid of the synthetic store, NLATxNLON (default 320x640; --quick 64x128)")
    parser.add_argument("--times", type=int, help="time steps of the synthetic store (default 360; --quick 80)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int,
                        help="measured batches per reader, at least (default 20, more until --min-seconds pass; "
                             "--quick 3)")
    parser.add_argument("--min-seconds", type=float,
                        help="measure zfeed and the baseline at least this long (default 2: on many cores 20 "
                             "batches take a fraction of a second, and the pipeline's start would weigh; --quick 0)")
    parser.add_argument("--warmup", type=int, help="batches read before measuring (default 2; --quick 1)")
    parser.add_argument("--seconds", type=float,
                        help="stop measuring a reader after this long, once 2 batches are in (default 20; --quick 10)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the baseline (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zfeed-option", action="append", default=[], metavar="KEY=VALUE",
                        help="pass KEY=VALUE to zfeed.Loader (repeatable), e.g. order=chunks")
    parser.add_argument("--limit-bin", help="the zfeed_read_limit helper (default: beside python, PATH, build/)")
    parser.add_argument("--limit-reps", type=int, help="repetitions of the limit, best counts (default 3; --quick 1)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 64x128 grid, 80 time steps, 3 measured batches (options given "
                             "explicitly keep their values)")
    parser.add_argument("--json", type=Path, help="write every number, machine facts and versions here")
    parser.add_argument("--plot", type=Path, help="write a bar chart here (a PNG; .png is added to a name without it)")
    parser.add_argument("--from-json", type=Path, help="measure nothing: print (and --plot) a saved result")
    parser.add_argument("--child", nargs=2, metavar=("READER", "SPEC"), help=argparse.SUPPRESS)
    return parser


# What --quick changes, unless given explicitly; and the defaults of a full run.
FULL_DEFAULTS = {"grid": "320x640", "times": 360, "batches": 20, "warmup": 2, "seconds": 20.0, "min_seconds": 2.0,
                 "limit_reps": 3}
QUICK_DEFAULTS = {"grid": "64x128", "times": 80, "batches": 3, "warmup": 1, "seconds": 10.0, "min_seconds": 0.0,
                  "limit_reps": 1}


def store_labels(args, kinds: list[str]) -> dict[str, str]:
    """How the one-line errors name each store: by its option where one was given."""
    labels = {}
    for kind in kinds:
        if kind == "1-step" and args.store:
            labels[kind] = f"--store {args.store}"
        elif kind != "1-step" and args.chunked_store:
            labels[kind] = f"--chunked-store {args.chunked_store}"
        elif args.store:
            labels[kind] = f"the {kind} store made from --store {args.store}"
        else:
            labels[kind] = f"the synthetic {kind} store"
    return labels


def prepare_stores(args, kinds: list[str], variables: list[str], grid: tuple[int, int]) -> dict[str, Path]:
    if args.chunked_store and not args.store:
        # Its figures are compared with the 1-step store's: the same values, chunked otherwise.
        fail(f"--chunked-store {args.chunked_store} needs --store, the 1-step store of the same values "
             "it is compared with")
    if not args.store:
        if args.times - 1 < args.batch_size:
            fail(f"--times {args.times} makes {args.times - 1} samples of t -> t+1: fewer than one batch of "
                 f"--batch-size {args.batch_size} (pass --times {args.batch_size + 1} or more)")
    else:
        # Checked before anything is made from them.
        check_store(args.store, f"--store {args.store}", variables, args.batch_size)
        if args.chunked_store and any(kind != "1-step" for kind in kinds):
            check_store(args.chunked_store, f"--chunked-store {args.chunked_store}", variables, args.batch_size)
    workdir = args.workdir.resolve()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"--workdir {args.workdir}: {error.strerror or _one_line(error)}")
    if not args.store:
        return synthetic_stores(workdir, grid, args.times, variables, args.seed, kinds)
    stores = {}
    for kind in kinds:
        if kind == "1-step":
            stores[kind] = args.store.resolve()
        elif args.chunked_store:
            stores[kind] = args.chunked_store.resolve()
        else:
            stores[kind] = rechunked_store(args.store.resolve(), workdir, STORE_KINDS[kind], variables,
                                           {"version": STORE_DATA_VERSION})
    return stores


def plot_path(given: Path) -> Path:
    """The PNG --plot writes: .png added to a name without a suffix (as matplotlib does)."""
    if given.suffix == "":
        return given.with_name(given.name + ".png")
    if given.suffix.lower() != ".png":
        fail(f"--plot writes a PNG: give FILE.png, not {given}")
    return given


def write_plot(result: dict, png: Path) -> None:
    try:
        png.parent.mkdir(parents=True, exist_ok=True)
        plot(result, png)
    except OSError as error:
        fail(f"--plot {png}: {error.strerror or _one_line(error)}")


RESULT_KEYS = ("title", "machine", "versions", "load_average", "page_cache", "stores", "config", "rows", "summary")


def load_result(path: Path) -> dict:
    try:
        result = json.loads(path.read_text())
    except OSError as error:
        fail(f"--from-json {path}: {error.strerror or _one_line(error)}")
    except ValueError as error:
        fail(f"--from-json {path} is not JSON: {_one_line(error)}")
    missing = [key for key in RESULT_KEYS if key not in result] if isinstance(result, dict) else list(RESULT_KEYS)
    if missing:
        fail(f"--from-json {path} is not a result of zfeed bench --json (no {', '.join(missing)})")
    return result


class Measurement:
    """Runs the readers on one store after another and collects the rows of the table."""

    def __init__(self, args, readers: list[str], variables: list[str], options: dict, normalize: dict,
                 binary: str | None, grid: tuple[int, int], steps: int):
        self.args, self.readers, self.variables, self.options = args, readers, variables, options
        self.normalize, self.binary, self.grid = normalize, binary, grid
        self.sample_bytes = 2 * len(variables) * grid[0] * grid[1] * 4
        self.child_timeout = max(120.0, 6 * args.seconds + 60)
        self.steps, self.step = steps, 0
        self.rows: list[dict] = []

    def store(self, kind: str, path: Path, described: dict) -> None:
        time_chunk = described["time_chunk"]
        warmed = warm_page_cache(path)
        log(f"{kind}: page cache warmed ({warmed / 1e6:.0f} MB read)")
        args = self.args
        spec = {"store": str(path), "variables": self.variables, "lead": 1, "batch_size": args.batch_size,
                "seed": args.seed, "warmup": args.warmup, "batches": args.batches, "seconds": args.seconds,
                "min_seconds": args.min_seconds,
                "normalize": self.normalize}
        sample_batches = None  # [(epoch, times)] of zfeed's measured batches
        for reader in self.readers:
            self.step += 1
            log(f"[{self.step}/{self.steps}] {reader} on the {kind} store ...")
            row: dict = {"reader": reader, "store": kind, "notes": []}
            extra_rows: list[dict] = []
            if reader == "zfeed":
                options = dict(self.options)
                if time_chunk > 1:
                    for key, value in MULTI_STEP_ORDER.items():
                        options.setdefault(key, value)
                result = run_child("zfeed", {**spec, "options": options}, self.child_timeout)
                if "error" not in result:
                    sample_batches = result.pop("sample_batches")
                    if result["options"]:
                        row["notes"].append(" ".join(f"{k}={v}" for k, v in result["options"].items()))
            elif reader == "baseline":
                result = run_child("baseline", {**spec, "workers": args.workers}, self.child_timeout)
                row["notes"].append(f"{args.workers} workers")
            elif sample_batches is None:
                result = {"error": "needs the samples of zfeed's measured batches (zfeed failed)"}
            elif reader == "tensorstore":
                result = run_child("tensorstore", {**spec, "sample_batches": [t for _, t in sample_batches]},
                                   self.child_timeout)
            else:  # limit
                result, cached = self.limit(path, described, sample_batches)
                if cached is not None:
                    extra_rows.append(_finish({"reader": "limit-cached", "store": kind, "notes": []}, cached,
                                              self.sample_bytes))
            row = _finish(row, result, self.sample_bytes)
            if "error" in row:
                log(f"    {row['error']}")
            else:
                log(f"    {row['samples_per_s']:.1f} samples/s, {row['mb_per_s']:.0f} MB/s "
                    f"({row['batches']} batches in {row['seconds']:.2f} s)")
            self.rows.append(row)
            self.rows.extend(extra_rows)

    def limit(self, path: Path, described: dict, sample_batches: list) -> tuple[dict, dict | None]:
        """The limit per use and, on a multi-step store, once per epoch: every chunk of each plane
        (a store chunked in space has several)."""
        if described["variables_chunked_differently"]:
            return {"error": "limit: left out, the variables are not chunked alike ("
                             + ", ".join(described["variables_chunked_differently"]) + " differ from "
                             + self.variables[0] + ")"}, None
        time_chunk, chunk_bytes = described["time_chunk"], described["chunk_bytes"]
        grid = tuple(described["read_grid"][1:])
        subset = limit_subset(sample_batches, self.variables, time_chunk, chunk_bytes, LIMIT_DECODE_BYTES, grid=grid)
        counts = {"samples": sum(len(t) for _, t in subset), "batches": len(subset)}
        per_use = run_limit(self.binary, path, chunk_uses(subset, self.variables, 1, time_chunk, False, grid),
                            self.args.limit_reps)
        per_use.update(counts)
        if time_chunk == 1 or "error" in per_use:
            return per_use, None
        subset = limit_subset(sample_batches, self.variables, time_chunk, chunk_bytes, LIMIT_DECODE_BYTES,
                              once_per_epoch=True, grid=grid)
        cached = run_limit(self.binary, path, chunk_uses(subset, self.variables, 1, time_chunk, True, grid),
                           self.args.limit_reps)
        cached.update({"samples": sum(len(t) for _, t in subset), "batches": len(subset)})
        return per_use, cached


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        reader, spec = args.child
        print(json.dumps(CHILDREN[reader](json.loads(spec))), flush=True)
        return 0
    png = plot_path(args.plot) if args.plot else None
    if args.from_json:
        result = load_result(args.from_json)
        try:
            report(result)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            fail(f"--from-json {args.from_json} is not a result of zfeed bench --json ({type(error).__name__}: "
                 f"{_one_line(error)})")
        if png:
            write_plot(result, png)
            print(f"PNG:  {png}")
        return 0

    for key, value in (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    kinds = [k for k in args.stores.split(",") if k]
    readers = [r for r in args.readers.split(",") if r]
    variables = [v for v in args.variables.split(",") if v]
    for kind in kinds:
        if kind not in STORE_KINDS:
            parser.error(f"unknown store {kind} (1-step, 10-step)")
    for reader in readers:
        if reader not in READERS:
            parser.error(f"unknown reader {reader} ({', '.join(READERS)})")
    if ("tensorstore" in readers or "limit" in readers) and "zfeed" not in readers:
        parser.error("tensorstore and limit read the samples of zfeed's measured batches: keep zfeed in --readers")
    try:
        grid = tuple(int(n) for n in args.grid.lower().split("x"))
        assert len(grid) == 2 and min(grid) > 0
    except (ValueError, AssertionError):
        parser.error(f"--grid takes NLATxNLON, got {args.grid}")
    options = parse_options(args.zfeed_option)
    notes = []
    binary = limit_binary(args.limit_bin) if "limit" in readers else None
    if "limit" in readers and not binary:
        if set(readers) <= {"zfeed", "limit"}:
            fail("--readers asks for the limit, but zfeed_read_limit is not found (make python builds and "
                 "installs it; or pass --limit-bin)")
        notes.append("zfeed_read_limit not found (make python builds and installs it): the limit is left out")
        log(f"limit: {notes[-1]}")
        readers = [r for r in readers if r != "limit"]

    stores = prepare_stores(args, kinds, variables, grid)
    labels = store_labels(args, kinds)
    described = {kind: describe_store(path, variables, labels[kind], args.batch_size) for kind, path in stores.items()}
    shape = next(iter(described.values()))["shape"]
    for kind, store in described.items():
        if store["shape"] != shape:
            fail(f"{labels[kind]} has shape {tuple(store['shape'])}, the {next(iter(described))} store "
                 f"{tuple(shape)}: the stores must hold the same values")
    lat, lon = shape[1], shape[2]
    normalize = statistics(stores.get("1-step", next(iter(stores.values()))), variables)
    info = machine()
    measurement = Measurement(args, readers, variables, options, normalize, binary, (lat, lon),
                              len(stores) * len(readers))
    log(f"machine: {info['cores']} cores, {info['cpu']}; sample {measurement.sample_bytes / 1e6:.2f} MB, "
        f"batch {args.batch_size}")
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (info["cores"] or 1):
        log(f"warning: load average {load_before[0]:.1f} on {info['cores']} cores: other work competes for the CPU")
    for kind, path in stores.items():
        measurement.store(kind, path, described[kind])
    load_after = os.getloadavg()
    rows = measurement.rows
    add_ratios(rows)
    title = (f"zfeed loader benchmark: {len(variables)} variables, {lat} x {lon}, t -> t+1, batch {args.batch_size}; "
             f"{info['cores']} cores, page cache warm")
    result = {
        "title": title, "machine": info, "versions": versions(),
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "page_cache": "warm: every file of a store read once before its readers run; each reader in a fresh process",
        "notes": notes,
        "config": {"variables": variables, "readers": readers, "channels": len(variables), "grid": [lat, lon], "lead": 1,
                   "batch_size": args.batch_size, "batches": args.batches, "warmup": args.warmup,
                   "seconds_cap": args.seconds, "min_seconds": args.min_seconds, "baseline_workers": args.workers, "seed": args.seed,
                   "zfeed_options": options, "multi_step_zfeed_options": MULTI_STEP_ORDER,
                   "sample_bytes": measurement.sample_bytes, "limit_reps": args.limit_reps, "quick": args.quick,
                   "normalize": normalize},
        "stores": described, "rows": rows, "summary": summary(rows, list(stores)),
        "definitions": {
            "samples_per_s": "samples (input t + target t+1) delivered per second over the measured batches",
            "mb_per_s": "decoded input + target bytes delivered per second, 10^6 bytes per MB",
            "limit": "libzstd alone (zfeed_read_limit --units) on all cores decoding the chunks of the samples of "
                     "zfeed's measured batches (the first of them, up to 2 GB of decoding), frames in memory, each "
                     "chunk once per sample that uses it; best of limit_reps after a warm-up pass",
            "limit-cached": "the same, each distinct chunk once per epoch (multi-step stores)",
            "loss": "1 - (samples/s on the multi-step store) / (samples/s on the 1-step store)"},
    }
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2))
        except OSError as error:
            fail(f"--json {args.json}: {error.strerror or _one_line(error)}")
    report(result)
    if png:
        write_plot(result, png)
    if args.json:
        print(f"JSON: {args.json}")
    if png:
        print(f"PNG:  {png}")
    return 1 if any("error" in r for r in rows) else 0


def _finish(row: dict, result: dict, sample_bytes: int) -> dict:
    """Merges a reader's result into its row and derives samples/s and MB/s."""
    notes = row.pop("notes", []) + result.pop("notes", [])
    row.update(result)
    row["notes"] = notes
    if "error" not in row:
        row["samples_per_s"] = row["samples"] / row["seconds"]
        row["mb_per_s"] = row["samples_per_s"] * sample_bytes / 1e6
    return row


if __name__ == "__main__":
    sys.exit(main())
