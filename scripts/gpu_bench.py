#!/usr/bin/env python3
"""GPU benchmarks of scripts/gpu-check (issue 6), on an ERA5-like store written by zfeed (6
variables, 1 time step per chunk, zstd level 3, float32, 640 x 1280 by default):

1. Host-to-device batch copies: the device loader's copies (CUDA-event time of its
   cudaMemcpyAsync calls, measured while it runs) against a plain pinned cudaMemcpyAsync of the
   same bytes in the same run (best of 10). Goal: 90% or more.
2. Loader throughput, decoded GB/s delivered: Loader(device="cuda") (float32 and bfloat16) against
   the CPU loader, and the CPU loader followed by torch's .to("cuda") from pageable memory. Goal:
   5 GB/s or more with device="cuda". The same store written with blosc (--blosc-codec, LZ4 and
   byte shuffle by default) too, with decode="cpu" and decode="gpu" (blosc's streams on nvCOMP).
3. The forecast recipe on the GPU (`zfeed train forecast --mode real,load-only,synthetic --source
   zfeed,baseline`): real-data throughput as a fraction of synthetic, with zfeed and with the
   xarray + DataLoader baseline as the source. Goal: 95% or more with zfeed.

Prints a Markdown section (gpu-check appends it to its report) and writes gpu_bench.json and
gpu_bench.png into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VARIABLES = ["t2m", "u500", "v500", "t500", "z500", "q500"]


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def emit(lines: list[str]) -> None:
    """Prints the finished part of the Markdown section at once (a stage killed at its time limit
    still leaves what it measured)."""
    print("\n".join(lines), flush=True)
    lines.clear()


def find_zfeed() -> str:
    found = shutil.which("zfeed")
    if found:
        return found
    for folder in ("build/gpu", "build/release", "build/python", "build/debug"):
        candidate = Path(folder) / "zfeed"
        if candidate.is_file():
            return str(candidate.resolve())
    raise SystemExit("gpu_bench: the zfeed command was not found (PATH, build/gpu)")


def make_store(zfeed: str, path: Path, grid: str, times: int, codec: str = "zstd:3") -> None:
    if (path / "zarr.json").exists():
        log(f"store: reusing {path}")
        return
    start = time.perf_counter()
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([zfeed, "synth", "era5", str(partial), "--grid", grid, "--times", str(times), "--step", "6h",
                    "--variables", ",".join(VARIABLES), "--codec", codec, "--quiet"], check=True)
    subprocess.run([zfeed, "stats", str(partial)], check=True, capture_output=True)
    partial.rename(path)
    log(f"store: wrote {path} in {time.perf_counter() - start:.1f} s")


def plain_pinned_copy_gbps(nbytes: int, repeats: int = 10) -> float:
    """Best of `repeats` cudaMemcpyAsync of `nbytes` from a pinned buffer (torch's
    non_blocking copy of a pinned tensor is exactly that call)."""
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    best = float("inf")
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
        for _ in range(repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            dst.copy_(src, non_blocking=True)
            stop.record(stream)
            stop.synchronize()
            best = min(best, start.elapsed_time(stop) / 1e3)
    return nbytes / best / 1e9


def measure_loader(store: Path, device: str, dtype: str, batch_size: int, seconds: float, to_cuda: bool = False,
                   warmup: int = 2, decode: str = "cpu", gds: str | None = None) -> dict:
    """Delivered GB/s of one loader configuration: batches until `seconds` have passed (whole
    epochs repeat), the consumer touching each batch on its stream (as training would)."""
    import torch
    import zfeed
    loader = zfeed.Loader(store, inputs=VARIABLES, targets=VARIABLES, batch_size=batch_size, seed=0,
                          dtype=dtype, device=device, decode=decode, gds=gds)
    stream = torch.cuda.current_stream() if torch.cuda.is_available() else None
    batches = 0
    nbytes = 0
    epoch = 0
    start = None
    while True:
        loader.set_epoch(epoch)
        for batch in loader:
            x, y = batch["inputs"], batch["targets"]
            if to_cuda:
                from zfeed.torch import to_torch
                t = to_torch(batch)
                x, y = t["inputs"].to("cuda", non_blocking=True), t["targets"].to("cuda", non_blocking=True)
            if device != "cpu" or to_cuda:
                x.view(-1)[:1].add_(0)  # a kernel on the consumer's stream that reads the batch
            batches += 1
            if batches == warmup:
                if stream is not None:
                    stream.synchronize()
                start = time.perf_counter()
                stats_start = loader.stats()
                batches_measured = 0
                nbytes = 0
                continue
            if start is not None:
                batches_measured += 1
                nbytes += x.nbytes + y.nbytes
                if time.perf_counter() - start >= seconds:
                    if stream is not None:
                        stream.synchronize()
                    elapsed = time.perf_counter() - start
                    stats = loader.stats()
                    row = {"device": device + (" + .to(cuda)" if to_cuda else ""), "dtype": dtype,
                           "decode": decode + (f", gds {gds}" if gds else ""),
                           "batch_size": batch_size, "batches": batches_measured, "seconds": elapsed,
                           "gb_per_s": nbytes / elapsed / 1e9,
                           "samples_per_s": batches_measured * batch_size / elapsed,
                           "stats": stats}
                    if "device" in stats:
                        d, d0 = stats["device"], stats_start["device"]
                        # The bytes of the copies whose time was taken, over that time.
                        copied = d["copy_bytes_timed"] - d0["copy_bytes_timed"]
                        copy_s = d["copy_s"] - d0["copy_s"]
                        row["copy_gb_per_s"] = copied / copy_s / 1e9 if copy_s > 0 else None
                        row["raw_batch_bytes"] = copied / max(d["copies_timed"] - d0["copies_timed"], 1)
                    return row
        epoch += 1


def run_recipe(store: Path, out: Path, steps: int, batch_size: int, extra: list[str],
               device: str = "cuda", sources: str = "zfeed,baseline") -> dict | None:
    json_path = out / "gpu_forecast.json"
    command = [sys.executable, "-m", "zfeed.recipes", "forecast", "--store", str(store), "--mode",
               "real,load-only,synthetic", "--source", sources, "--steps", str(steps), "--batch-size",
               str(batch_size), "--no-val",
               "--device", device, "--log-every", "0", "--json", str(json_path), "--plot",
               str(out / "gpu_forecast.png"), *extra]
    log("recipe: " + " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode != 0:
        log(f"recipe failed with exit {done.returncode}")
        return None
    return json.loads(json_path.read_text())


def plot(result: dict, path: Path) -> None:
    """Bars of the loader rows' decoded GB/s, against the 5 GB/s goal."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = result["loader"]
        fig, ax = plt.subplots(figsize=(10, 4.5))
        labels = [(f"{r['codec']}\n" if r.get("codec", "zstd:3") != "zstd:3" else "")
                  + f"{r['device']}\n{r['dtype']}\ndecode {r['decode']}".replace(", gds", "\ngds") for r in rows]
        bars = ax.bar(range(len(rows)), [r["gb_per_s"] for r in rows], color="#1f77b4")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.axhline(5.0, color="gray", linestyle="--", label="goal 5 GB/s")
        ax.set_ylabel("decoded GB/s delivered")
        machine, store = result["machine"], result["store"]
        ax.set_title(f"zfeed loader, ERA5-like {store['grid']} batches, {machine['gpu']}, {machine['date']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    except Exception as error:  # the numbers matter more than the picture
        log(f"plot failed: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/gpu"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/zfeed-gpu-bench"))
    parser.add_argument("--grid", default="640x1280")
    parser.add_argument("--times", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per loader row")
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--train-batch-size", type=int, default=8)
    parser.add_argument("--recipe-args", default="", help="extra arguments of the forecast recipe")
    parser.add_argument("--recipe-sources", default="zfeed,baseline", help="the recipe's --source")
    parser.add_argument("--blosc-codec", default="blosc:lz4:5",
                        help="codec of the second store (loader rows with decode cpu and gpu); '' for none")
    parser.add_argument("--skip", default="", help="comma-separated: copy,loader,recipe")
    parser.add_argument("--plot-from", type=Path, help="measure nothing: plot a saved gpu_bench.json into --out")
    args = parser.parse_args()
    if args.plot_from:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(json.loads(args.plot_from.read_text()), args.out / "gpu_bench.png")
        return 0
    import torch
    import zfeed

    status = zfeed._core.cuda_status()
    if not status["available"] or not torch.cuda.is_available():
        print(f"gpu_bench: no usable GPU: {status['reason'] or 'torch.cuda.is_available() is False'}")
        return 3
    args.out.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    store = args.workdir / f"era5-{args.grid}-t{args.times}.zarr"
    make_store(find_zfeed(), store, args.grid, args.times)
    result: dict = {"machine": {"gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count(),
                                "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                    "store": {"path": str(store), "grid": args.grid, "times": args.times, "variables": VARIABLES},
                    "loader": [], "copy": None, "recipe": None}
    lines = ["## GPU benchmarks (scripts/gpu_bench.py)", "",
             f"{result['machine']['gpu']}, {os.cpu_count()} CPUs, torch {torch.__version__}; store {args.grid}, "
             f"{args.times} steps, 6 variables, 1 step per chunk, zstd level 3; batch {args.batch_size}", ""]

    if "loader" not in skip:
        rows = []
        import zfeed
        # Chunks read by cuFile into GPU memory (compat mode where nvidia-fs is not loaded).
        cufile = zfeed.gds_status("on")
        log(f"cuFile: {cufile['mode']} ({cufile['reason']})")
        configurations = [("cuda", "float32", False, "cpu", None), ("cuda", "float32", False, "gpu", "off"),
                          ("cuda", "bfloat16", False, "gpu", "off"), ("cuda", "float32", False, "auto", None),
                          ("cpu", "float32", True, "cpu", None), ("cpu", "float32", False, "cpu", None)]
        if cufile["available"]:
            configurations.insert(2, ("cuda", "float32", False, "gpu", "on"))
        configurations = [(store, "zstd:3", *c) for c in configurations]
        if args.blosc_codec:
            blosc_store = args.workdir / f"era5-{args.grid}-t{args.times}-{args.blosc_codec.replace(':', '-')}.zarr"
            make_store(find_zfeed(), blosc_store, args.grid, args.times, args.blosc_codec)
            configurations += [(blosc_store, args.blosc_codec, "cuda", "float32", False, "cpu", None),
                               (blosc_store, args.blosc_codec, "cuda", "float32", False, "gpu", "off")]
        for path, codec, device, dtype, to_cuda, decode, gds in configurations:
            log(f"loader: {codec} device={device} dtype={dtype} decode={decode} gds={gds}"
                f"{' + .to(cuda)' if to_cuda else ''}")
            try:
                rows.append(measure_loader(path, device, dtype, args.batch_size, args.seconds, to_cuda,
                                           decode=decode, gds=gds))
            except Exception as error:  # one failed row must not cost the others
                log(f"  failed: {error}")
                continue
            rows[-1]["codec"] = codec
            log(f"  {rows[-1]['gb_per_s']:.2f} GB/s")
        result["loader"] = rows
        lines += ["| store | loader | dtype | decode | samples/s | GB/s delivered | decode in use | goal |",
                  "|---|---|---|---|---:|---:|---|---|"]
        for r in rows:
            goal = "5 GB/s" if r["device"] == "cuda" else ""
            used = (r["stats"].get("device") or {}).get("decode", {})
            in_use = f"{used.get('mode', 'cpu')}: {used.get('reason', '')}" if used else "cpu"
            read = (r["stats"].get("device") or {}).get("read", {})
            if read.get("mode") in ("gds", "compat"):
                in_use += f"; chunks read by cuFile ({read['mode']})"
            lines.append(f"| {r['codec']} | {r['device']} | {r['dtype']} | {r['decode']} | {r['samples_per_s']:.1f} | "
                         f"{r['gb_per_s']:.2f} | {in_use} | {goal} |")
        lines.append("")
        first = rows[0]
        if "copy" not in skip and first.get("copy_gb_per_s"):
            plain = plain_pinned_copy_gbps(int(first["raw_batch_bytes"]))
            result["copy"] = {"loader_copy_gb_per_s": first["copy_gb_per_s"], "plain_pinned_gb_per_s": plain,
                              "ratio": first["copy_gb_per_s"] / plain, "bytes": first["raw_batch_bytes"]}
            lines += [f"Host-to-device batch copies: the loader's {first['copy_gb_per_s']:.1f} GB/s against a plain "
                      f"pinned cudaMemcpyAsync of the same {first['raw_batch_bytes'] / 1e6:.0f} MB: {plain:.1f} GB/s "
                      f"= {result['copy']['ratio']:.0%} (goal 90%)", ""]
        for r in rows:
            r["stats"] = {k: r["stats"].get(k) for k in ("read_s", "decode_s", "assemble_s", "wait_s", "device")}
        emit(lines)
        (args.out / "gpu_bench.json").write_text(json.dumps(result, indent=1, default=str))

    if "recipe" not in skip:
        extra = args.recipe_args.split() if args.recipe_args else []
        recipe = run_recipe(store, args.out, args.train_steps, args.train_batch_size, extra,
                            sources=args.recipe_sources)
        result["recipe"] = recipe
        if recipe:
            summaries = recipe.get("summaries") or recipe.get("runs") or []
            lines += ["| forecast recipe | samples/s (median) | p10 | p90 |", "|---|---:|---:|---:|"]
            for s in summaries:
                sps = s.get("samples_per_s", {})
                lines.append(f"| {s.get('source')} / {s.get('mode')} | {sps.get('median', 0):.1f} | "
                             f"{sps.get('p10', 0):.1f} | {sps.get('p90', 0):.1f} |")
            heads = recipe.get("headline") or {}
            lines += ["", f"Real-data throughput as a fraction of synthetic: {json.dumps(heads)} (goal 95%)", ""]
        else:
            lines += ["The forecast recipe failed: see the log above.", ""]

    (args.out / "gpu_bench.json").write_text(json.dumps(result, indent=1, default=str))
    if result["loader"]:
        plot(result, args.out / "gpu_bench.png")
    emit(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
