#!/usr/bin/env python3
"""Reading one time step of a chunk of many: zfeed decodes a zstd chunk's stream only as far as the
step needs, and reads only the step's bytes of an uncompressed chunk. Prints each step's read time
as a fraction of reading the whole chunk.

  ZFEED_NUM_THREADS=1 .venv/bin/python bench/step_read_bench.py [--steps 10] [--grid 320x640]
                                                                [--codecs zstd,none]
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import zfeed


def best(fn, repeats):
    fastest = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--grid", default="320x640")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--codecs", default="zstd,none", help="compressors to measure: zstd, none")
    args = parser.parse_args()
    steps = args.steps
    height, width = (int(v) for v in args.grid.split("x"))
    # Smooth, weather-like values at 0.01 K (zstd stores them at about half their size).
    t = np.arange(steps)[:, None, None]
    y = np.linspace(0, 3, height)[None, :, None]
    x = np.linspace(0, 6, width)[None, None, :]
    values = (280 + 10 * np.sin(x + 0.1 * t) * np.cos(y) + 0.01 * np.round(np.sin(7 * x * y + t) * 100))
    values = values.astype(np.float32)
    for codec in args.codecs.split(","):
        with tempfile.TemporaryDirectory() as folder:
            path = str(Path(folder) / "steps.zarr")
            array = zfeed.create(path, shape=values.shape, chunks=values.shape, dtype="float32", compressor=codec)
            array[...] = values
            array = zfeed.open(path)
            whole = best(lambda: array[...], args.repeats)
            label = "uncompressed" if codec == "none" else codec
            print(f"chunk {values.shape} float32, {label}; whole chunk {whole * 1e3:.2f} ms (best of {args.repeats})")
            for k in range(steps):
                assert np.array_equal(array[k], values[k])
                seconds = best(lambda: array[k], args.repeats)
                print(f"step {k}: {seconds * 1e3:6.2f} ms  {seconds / whole:.2f} of the whole chunk")

if __name__ == "__main__":
    main()
