"""`zfeed rechunk` (and `zfeed convert` from Zarr): values kept, peak memory within --max-memory,
a killed run resumed ends byte for byte like an uninterrupted one, a full disk is a clear error and
a rerun after freeing space completes.

Runs the installed command (.venv/bin/zfeed, put there by `make python`) as a user would.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import zfeed_cli

zfeed = pytest.importorskip("zfeed")

PROGRESS = ".zfeed-convert-progress.json"
# 200 steps of a 361 x 720 float32 field: 198 MiB decoded, 10 steps per chunk.
SHAPE = (200, 361, 720)
BUDGET_MIB = 48
# Allowance above the process's own baseline (the peak RSS of a tiny rechunk: the binary, its
# libraries, thread stacks, malloc arenas) for what the budget does not count: allocator slack and
# pages freed but not yet returned.
SLACK_MIB = 8


def run(*args, ok=True, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([zfeed_cli.zfeed_command(), *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **(env or {})))
    if ok:
        assert proc.returncode == 0, f"zfeed {' '.join(map(str, args))} failed ({proc.returncode}): {proc.stderr}"
    return proc


def peak_rss_mib(*args) -> tuple[subprocess.CompletedProcess, float]:
    """Runs zfeed from a fresh Python process and returns its peak RSS (RUSAGE_CHILDREN ru_maxrss)."""
    code = ("import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:])\n"
            "print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(p.returncode)\n")
    env = {k: v for k, v in os.environ.items() if k != "ZFEED_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", code, zfeed_cli.zfeed_command(), *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("MAXRSS_KIB")][-1]
    return proc, int(line.split()[1]) / 1024


def write_field(path: Path, shape=SHAPE, chunks=(10, 361, 720), seed=0) -> np.ndarray:
    arr = zfeed.create(str(path), path="field", shape=shape, chunks=chunks, dtype="float32", compressor="zstd:1",
                       fill_value="nan", dimension_names=["time", "latitude", "longitude"],
                       attributes={"units": "K"})
    rng = np.random.default_rng(seed)
    ny, nx = shape[1], shape[2]
    base = (np.sin(np.linspace(0, 6, ny))[:, None] * np.cos(np.linspace(0, 9, nx))[None, :] * 30 + 270)
    for t in range(0, shape[0], chunks[0]):
        n = min(chunks[0], shape[0] - t)
        arr[t:t + n] = (base[None] + rng.standard_normal((n, ny, nx))).astype(np.float32)
    zfeed.open(str(path)).consolidate()
    return arr


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def same_values(a: Path, b: Path, name="field") -> bool:
    x, y = zfeed.open(str(a))[name], zfeed.open(str(b))[name]
    if x.shape != y.shape:
        return False
    return all(np.array_equal(x[t:t + 20], y[t:t + 20], equal_nan=True) for t in range(0, x.shape[0], 20))


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rechunk") / "in.zarr"
    write_field(path)
    return path


def test_rechunk_stays_within_the_memory_budget(big_store, tmp_path):
    tiny = tmp_path / "tiny.zarr"
    write_field(tiny, shape=(4, 8, 8), chunks=(2, 8, 8))
    # Two threads, whatever the machine: each thread's working buffers come out of the budget.
    proc, baseline = peak_rss_mib("rechunk", tiny, tmp_path / "tiny-out.zarr", "--chunks", "time=1",
                                  "--max-memory", f"{BUDGET_MIB}MiB", "--threads", "2")
    assert proc.returncode == 0, proc.stderr

    out = tmp_path / "out.zarr"
    proc, peak = peak_rss_mib("rechunk", big_store, out, "--chunks", "time=1,latitude=181,longitude=360",
                              "--max-memory", f"{BUDGET_MIB}MiB", "--threads", "2")
    assert proc.returncode == 0, proc.stderr
    decoded_mib = np.prod(SHAPE) * 4 / 2**20
    print(f"rechunk of {decoded_mib:.0f} MiB with --max-memory {BUDGET_MIB}MiB: peak RSS {peak:.1f} MiB; "
          f"process baseline (tiny rechunk) {baseline:.1f} MiB; bound {BUDGET_MIB + baseline + SLACK_MIB:.1f} MiB")
    assert decoded_mib > 4 * BUDGET_MIB
    assert peak <= BUDGET_MIB + baseline + SLACK_MIB
    field = zfeed.open(str(out))["field"]
    assert field.chunks == (1, 181, 360)
    assert field.attrs["units"] == "K"
    assert same_values(big_store, out)

    # A budget that cannot hold one chunk is refused up front, naming the budget that would do.
    proc = run("rechunk", big_store, tmp_path / "small.zarr", "--max-memory", "8MiB", "--threads", "2", ok=False)
    assert proc.returncode == 1
    assert "--max-memory 8MiB is too small" in proc.stderr and "give --max-memory" in proc.stderr
    assert not (tmp_path / "small.zarr").exists()


def test_rechunk_killed_and_resumed_ends_identical(big_store, tmp_path):
    args = ["--chunks", "time=1,latitude=181", "--shards", "time=5", "--max-memory", "256MiB", "--quiet"]
    whole = tmp_path / "whole.zarr"
    run("rechunk", big_store, whole, *args)

    out = tmp_path / "resumed.zarr"
    child = subprocess.Popen([zfeed_cli.zfeed_command(), "rechunk", str(big_store), str(out), *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = 0
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        try:
            record = json.loads((out / PROGRESS).read_text())
            done = sum(b - a for ranges in record["done"].values() for a, b in ranges)
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= 3:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    child.wait()
    if child.returncode != -signal.SIGKILL:
        pytest.fail(f"the run ended ({child.returncode}) before it could be killed mid-way")
    assert (out / PROGRESS).exists()
    assert not (out / "zarr.json").exists()  # an unfinished output does not open as a store

    proc = run("rechunk", big_store, out, *args)
    assert "already done by an earlier run" in proc.stdout
    assert not (out / PROGRESS).exists()
    assert digests(out) == digests(whole)


def test_rechunk_refuses_an_existing_output(big_store, tmp_path):
    out = tmp_path / "out.zarr"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    proc = run("rechunk", big_store, out, ok=False)
    assert proc.returncode == 1 and "already exists" in proc.stderr and "--overwrite" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    proc = run("rechunk", big_store, out, "--overwrite", ok=False)
    assert proc.returncode == 1 and "not a Zarr store" in proc.stderr
    assert (out / "notes.txt").read_text() == "keep me"
    proc = run("rechunk", big_store, big_store, "--overwrite", ok=False)
    assert proc.returncode == 1 and "is (or holds) the input" in proc.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (we are root in CI); yields (directory, grow) where grow() gives it 64 MiB."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root and mount permission): "
                    f"{proc.stderr.strip() or proc.returncode}")

    def grow():
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount_point)], check=True)

    try:
        yield mount_point, grow
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@pytest.mark.parametrize("verb", ["convert", "rechunk"])
def test_full_disk_is_a_clear_error_and_a_rerun_completes(verb, small_disk, tmp_path):
    disk, grow = small_disk
    source = tmp_path / "in.zarr"
    write_field(source, shape=(20, 100, 200), chunks=(5, 100, 200))  # 1.5 MiB decoded
    out = disk / "out.zarr"
    args = [verb, source, out, "--chunks", "time=1", "--codec", "none", "--quiet"]
    # 2 MiB hold 1.5 MiB of chunks only just; the group and filler take the rest.
    (disk / "filler").write_bytes(b"\0" * (1 << 20))
    proc = run(*args, ok=False)
    assert proc.returncode == 1
    assert "No space left on device" in proc.stderr, proc.stderr
    assert str(out) in proc.stderr  # names the key that could not be written
    assert (out / PROGRESS).exists()
    assert not (out / "zarr.json").exists()

    (disk / "filler").unlink()
    grow()
    run(*args)
    assert not (out / PROGRESS).exists()
    assert same_values(source, out)
