#!/usr/bin/env python3
"""Runs the loader benchmark (zfeed bench) several times one after another and writes the figures
the README quotes: per run and their medians (docs/loader_bench_runs.json), with the median run's
whole table and plot as docs/loader_bench.{json,png}. The VM's speed varies by 10-20% from run to
run, so one run is not enough.

  .venv/bin/python scripts/loader_bench_runs.py [--runs 3] [--out docs] [-- extra zfeed bench args]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def rate(rows: list[dict], reader: str, store: str) -> float | None:
    for row in rows:
        if row["reader"] == reader and row["store"] == store and "samples_per_s" in row:
            return row["samples_per_s"]
    return None


def figures(rows: list[dict]) -> dict:
    """The README's figures from one run's rows (None where a reader failed)."""
    def get(reader, store="1-step"):
        return rate(rows, reader, store)

    def ratio(a, b):
        return a / b if a and b else None

    def loss(reader):
        one, ten = get(reader), get(reader, "10-step")
        return 1 - ten / one if one and ten else None

    zfeed_ten = rows_stats(rows, "zfeed", "10-step")
    return {
        "zfeed": get("zfeed"), "baseline": get("baseline"), "tensorstore": get("tensorstore"),
        "limit": get("limit"),
        "zfeed_of_limit": ratio(get("zfeed"), get("limit")),
        "zfeed_vs_tensorstore": ratio(get("zfeed"), get("tensorstore")),
        "zfeed_vs_baseline": ratio(get("zfeed"), get("baseline")),
        "limit_vs_baseline": ratio(get("limit"), get("baseline")),
        "zfeed_10step": get("zfeed", "10-step"),
        "limit_cached_10step": get("limit-cached", "10-step"),
        "zfeed_10step_of_limit_cached": ratio(get("zfeed", "10-step"), get("limit-cached", "10-step")),
        "zfeed_10step_loss": loss("zfeed"),
        "baseline_10step_loss": loss("baseline"),
        "tensorstore_10step_loss": loss("tensorstore"),
        "zfeed_10step_chunks_decoded": zfeed_ten.get("chunks_decoded"),
        "zfeed_10step_planes_read_alone": zfeed_ten.get("planes_read_alone"),
        "zfeed_10step_samples": zfeed_ten.get("samples"),
    }


def rows_stats(rows: list[dict], reader: str, store: str) -> dict:
    for row in rows:
        if row["reader"] == reader and row["store"] == store:
            return row.get("loader_stats") or {}
    return {}


def median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="docs", help="where the JSON and the plot go")
    parser.add_argument("bench_args", nargs="*", help="passed on to zfeed bench (after --)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="zfeed-loader-runs-"))
    runs = []
    try:
        for run in range(1, args.runs + 1):
            print(f"run {run} of {args.runs} ...", file=sys.stderr, flush=True)
            before = os.getloadavg()
            result_json, plot = work / f"run{run}.json", work / f"run{run}.png"
            subprocess.run([sys.executable, "-m", "zfeed.bench", "--json", str(result_json), "--plot", str(plot),
                            *args.bench_args], check=True)
            result = json.loads(result_json.read_text())
            runs.append({"run": run, "load_average": {"before": list(before), "after": list(os.getloadavg())},
                         **figures(result["rows"])})
        keys = [k for k in runs[0] if k not in ("run", "load_average")]
        medians = {k: median([r[k] for r in runs]) for k in keys}
        # The run whose zfeed figure is the median one stands for the whole table.
        by_zfeed = sorted(runs, key=lambda r: r["zfeed"] or 0)
        middle = by_zfeed[len(by_zfeed) // 2]["run"]
        shutil.copy(work / f"run{middle}.json", out / "loader_bench.json")
        shutil.copy(work / f"run{middle}.png", out / "loader_bench.png")
        summary = {
            "date": datetime.date.today().isoformat(),
            "machine": json.loads((out / "loader_bench.json").read_text()).get("machine"),
            "command": "python scripts/loader_bench_runs.py --runs %d (zfeed bench, runs one after another)"
                       % args.runs,
            "table_run": middle,
            "runs": runs,
            "median": medians,
        }
        (out / "loader_bench_runs.json").write_text(json.dumps(summary, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key, value in medians.items():
        spread = ", ".join("-" if r[key] is None else f"{r[key]:.3g}" for r in runs)
        shown = "-" if value is None else f"{value:.3g}"
        print(f"{key:32s} {shown:>8s}  ({spread})")
    print(f"wrote {out / 'loader_bench_runs.json'}, {out / 'loader_bench.json'} and .png (run {middle})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
