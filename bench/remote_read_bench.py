#!/usr/bin/env python3
"""The remote read benchmark: zfeed against tensorstore and zarr-python reading a Zarr array over
HTTP, from a static file server with range requests on loopback that holds each response for a
set time (--latency-ms, default 0 and 20: a local server, and one with a cloud object store's
time to first byte).

The array is read_bench.py's smooth weather-like float32 field, (time, 1024, 1024), one time step
per chunk, zstd level 3 (about 1.9 MB a chunk), written by zfeed and served from the page cache
by zfeed._range_server (Python's ThreadingHTTPServer, a thread per connection) in its own
process. Readers, side by side in one run, each with its own concurrency:

  zfeed        zfeed.open(url)[...]                  (ZFEED_IO_THREADS reads in flight, 32)
  tensorstore  ts.open(zarr3 driver, http kvstore)   (its default context)
  zarr-python  zarr.open_array(url)                  (fsspec's HTTP filesystem, aiohttp)

in three patterns: "whole" (the array in one read), "random" (K seeded single chunks, one read
after another, as a loader without prefetch asks) and "batch" (the same K chunks asked at once:
zfeed `arr.read_many`, tensorstore K futures then waited for, zarr-python an index array over
the K steps). MB/s counts decoded bytes; each figure is the median of --reps (5) after a warm-up,
the readers taking turns rep by rep (the Python server's speed varies; each rep is in the JSON).

    .venv/bin/python bench/remote_read_bench.py                 # 256 MiB, latencies 0 and 20 ms
    .venv/bin/python bench/remote_read_bench.py --size-mib 64   # a quick check
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import read_bench  # noqa: E402  (the data and the machine facts)


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def start_server(directory: Path, latency_ms: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "zfeed._range_server", str(directory), "--port", str(port),
                               "--latency-ms", str(latency_ms)])
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("the range server did not start")


def make_readers(url: str, steps: list[int]):
    import zfeed

    readers = {}
    arr = zfeed.open(url)
    chunk = (1,) + tuple(arr.shape[1:])
    keys = [np.s_[t:t + 1] for t in steps]
    readers["zfeed"] = {
        "whole": lambda: arr[...],
        "random": lambda: [arr[k] for k in keys],
        "batch": lambda: arr.read_many(keys),
    }
    try:
        import tensorstore as ts

        store = ts.open({"driver": "zarr3", "kvstore": url + "/"}, read=True).result()

        def ts_batch():
            futures = [store[t:t + 1].read() for t in steps]
            return [f.result() for f in futures]

        readers["tensorstore"] = {
            "whole": lambda: store.read().result(),
            "random": lambda: [store[t:t + 1].read().result() for t in steps],
            "batch": ts_batch,
        }
    except Exception as error:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        log(f"tensorstore: not measured ({error})")
    try:
        import zarr

        za = zarr.open_array(url, mode="r")
        readers["zarr-python"] = {
            "whole": lambda: za[...],
            "random": lambda: [za[t:t + 1] for t in steps],
            "batch": lambda: za.oindex[np.asarray(steps)],
        }
    except Exception as error:  # noqa: BLE001
        log(f"zarr-python: not measured ({error})")
    return readers, chunk


def check_same(readers, expected: np.ndarray, steps: list[int]) -> None:
    for name, patterns in readers.items():
        whole = np.asarray(patterns["whole"]())
        if not np.array_equal(whole, expected):
            raise SystemExit(f"{name}: the whole read differs from the array")
        batch = patterns["batch"]()
        got = np.concatenate([np.asarray(b) for b in batch]) if isinstance(batch, list) else np.asarray(batch)
        if not np.array_equal(got, expected[steps]):
            raise SystemExit(f"{name}: the batch read differs from the array")


def plot(rows, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["latency_ms"], r["pattern"]) for r in rows}, key=lambda g: (g[0], ["whole", "random", "batch"].index(g[1])))
    readers = [r for r in ["zfeed", "tensorstore", "zarr-python"] if any(x["reader"] == r for x in rows)]
    colors = {"zfeed": "#1f77b4", "tensorstore": "#ff7f0e", "zarr-python": "#2ca02c"}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(readers)
    for i, reader in enumerate(readers):
        values = [next((r["mb_s"] for r in rows if r["reader"] == reader and (r["latency_ms"], r["pattern"]) == g), 0)
                  for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=reader, color=colors[reader])
    ax.set_xticks([x + width * (len(readers) - 1) / 2 for x in range(len(groups))])
    ax.set_xticklabels([f"{p}\n{lat:g} ms" for lat, p in groups])
    ax.set_ylabel("MB/s decoded")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--latency-ms", default="0,20", help="comma-separated server latencies")
    parser.add_argument("--chunks", type=int, default=16, help="K: chunks of the random and batch patterns")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()

    paths = read_bench.create_data(args.workdir, args.size_mib, args.seed, regenerate=False)
    import zfeed

    local = zfeed.open(paths["zstd"])
    expected = local[...]
    rng = np.random.default_rng(args.seed + 1)
    steps = sorted(rng.choice(local.shape[0], size=min(args.chunks, local.shape[0]), replace=False).tolist())
    directory, name = paths["zstd"].parent, paths["zstd"].name
    # The ceiling: zfeed reading the same files from local disk (page cache), whole.
    local_seconds = []
    local[...]
    for _ in range(args.reps):
        start = time.perf_counter()
        local[...]
        local_seconds.append(time.perf_counter() - start)
    local_mb_s = expected.nbytes / float(np.median(local_seconds)) / 1e6
    log(f"local whole zfeed {local_mb_s:.0f} MB/s")
    rows = []
    for latency in [float(x) for x in args.latency_ms.split(",")]:
        server, base = start_server(directory, latency)
        try:
            url = f"{base}/{name}"
            readers, chunk = make_readers(url, steps)
            check_same(readers, expected, steps)
            for pattern in ["whole", "random", "batch"]:
                nbytes = expected.nbytes if pattern == "whole" else len(steps) * int(np.prod(chunk)) * 4
                # Readers take turns, rep by rep, so that the server's ups and downs fall on all.
                times = {reader: [] for reader in readers}
                for reader, patterns in readers.items():
                    patterns[pattern]()  # warm-up
                for _ in range(args.reps):
                    for reader, patterns in readers.items():
                        start = time.perf_counter()
                        patterns[pattern]()
                        times[reader].append(time.perf_counter() - start)
                for reader, spent in times.items():
                    seconds = float(np.median(spent))
                    rows.append({"latency_ms": latency, "pattern": pattern, "reader": reader, "seconds": seconds,
                                 "mb_s": nbytes / seconds / 1e6,
                                 "mb_s_each": [round(nbytes / t / 1e6, 1) for t in spent]})
                    log(f"{latency:g} ms {pattern:6s} {reader:12s} {nbytes / seconds / 1e6:8.0f} MB/s "
                        f"(each: {', '.join(f'{nbytes / t / 1e6:.0f}' for t in spent)})")
        finally:
            server.terminate()
            server.wait()

    print(f"\nRemote reads over HTTP on loopback: {expected.shape} float32 zstd, chunks (1, 1024, 1024), "
          f"K = {len(steps)} chunks; MB/s decoded, median of {args.reps} (readers taking turns)")
    print("| latency | pattern | zfeed | tensorstore | zarr-python | zfeed / tensorstore | zfeed / zarr-python |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for latency in sorted({r["latency_ms"] for r in rows}):
        for pattern in ["whole", "random", "batch"]:
            got = {r["reader"]: r["mb_s"] for r in rows if r["latency_ms"] == latency and r["pattern"] == pattern}
            cell = lambda k: f"{got[k]:.0f}" if k in got else "-"  # noqa: E731
            ratio = lambda k: f"{got['zfeed'] / got[k]:.2f}x" if k in got else "-"  # noqa: E731
            print(f"| {latency:g} ms | {pattern} | {cell('zfeed')} | {cell('tensorstore')} | {cell('zarr-python')} | "
                  f"{ratio('tensorstore')} | {ratio('zarr-python')} |")
    print(f"\nThe same array read whole by zfeed from local disk (page cache): {local_mb_s:.0f} MB/s")
    result = {"rows": rows, "local_whole_mb_s": local_mb_s, "shape": list(expected.shape), "chunks": len(steps), "reps": args.reps,
              "machine": read_bench.machine(), "versions": read_bench.versions(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.plot:
        plot(rows, args.plot, f"Remote reads over HTTP (loopback, {expected.shape} float32 zstd)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
