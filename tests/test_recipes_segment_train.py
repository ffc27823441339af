"""The segmentation recipe (``zfeed train segment``, zfeed.recipes.segment) end to end on a tiny
``zfeed synth cam5`` store: CPU, one torch thread, a few steps per run, no timing assertions."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

PYTHON = sys.executable
ZFEED = str(Path(PYTHON).parent / "zfeed") if (Path(PYTHON).parent / "zfeed").exists() else shutil.which("zfeed")

# A grid that does not divide by the Tiramisu's downsampling (padding is exercised) and a tiny
# Tiramisu, so a step takes milliseconds.
TINY = ["--model", "tiramisu", "--growth-rate", "4", "--tiramisu-layers", "2,2", "--bottleneck-layers", "2",
        "--first-channels", "8", "--dropout", "0", "--batch-size", "2", "--threads", "1", "--log-every", "0",
        "--seed", "0", "--val-fraction", "0.25", "--weights-exponent", "0.5"]
CLASSES = ("background", "cyclone", "river")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    if ZFEED is None:
        pytest.skip("the zfeed command is not installed")
    path = tmp_path_factory.mktemp("segment") / "cam5.zarr"
    subprocess.run([ZFEED, "synth", "cam5", str(path), "--lat", "22", "--lon", "36", "--times", "12", "-q"],
                   check=True)
    return str(path)


def train(args: list[str]) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([PYTHON, "-m", "zfeed.recipes", "segment", *args], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_train_segment_end_to_end(store, tmp_path):
    out = tmp_path / "run.json"
    run = train(["--store", store, *TINY, "--steps", "4", "--json", str(out), "--plot", str(tmp_path / "run.png")])
    assert "background only" in run.stdout
    doc = json.loads(out.read_text())
    assert doc["recipe"] == "segment" and doc["model"] == "tiramisu" and doc["grid"] == [22, 36]
    assert doc["times"] == 12 and doc["split"] == 9 and doc["classes"] == list(CLASSES)
    # class weights freq ** -0.5 from the training labels (normalized so sum freq * w = 1)
    freq, weights = doc["class_frequencies"], doc["class_weights"]
    assert sum(freq) == pytest.approx(1.0) and sum(doc["label_counts"]) == 9 * 22 * 36
    raw = [f ** -0.5 for f in freq]
    scale = sum(f * w for f, w in zip(freq, raw))
    assert weights == pytest.approx([w / scale for w in raw], rel=1e-5)
    assert weights[1] > weights[2] > weights[0]  # cyclones rarest, background commonest
    (real,) = doc["runs"]
    assert real["mode"] == "real" and real["source"] == "zfeed" and real["steps"] == 4
    assert len(real["losses"]) == 4 and all(math.isfinite(x) for x in real["losses"])
    assert real["flops_per_sample"] and real["flops_per_sample"] > 0
    val = doc["validation"]
    assert val["samples"] == 3 and val["times"] == [9, 12]
    for name in CLASSES:
        assert f"iou_{name}" in val and name in val["iou"] and name in val["background_only_iou"]
        assert val["iou"][name] is None or 0.0 <= val["iou"][name] <= 1.0
    # the background-only predictor: IoU 0 for cyclones and rivers, background frequency for background
    assert val["background_only_iou"]["cyclone"] == 0.0 and val["background_only_iou"]["river"] == 0.0
    matrix = val["confusion_matrix"]
    assert sum(map(sum, matrix)) == 3 * 22 * 36
    assert val["background_only_iou"]["background"] == pytest.approx(sum(matrix[0]) / sum(map(sum, matrix)))
    assert (tmp_path / "run.png").stat().st_size > 0


def test_train_segment_larc_lag_bf16_channels_last(store, tmp_path):
    out = tmp_path / "run.json"
    train(["--store", store, *TINY, "--steps", "4", "--larc", "--larc-eta", "0.002", "--gradient-lag",
           "--amp", "bf16", "--channels-last", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["larc"] and doc["gradient_lag"] and doc["amp"] == "bf16" and doc["channels_last"]
    (real,) = doc["runs"]
    assert real["steps"] == 4 and all(math.isfinite(x) for x in real["losses"])
    assert real["gradient_lag_updates"] == 3  # step 0 makes no update with lag 1
    assert doc["validation"]["mean_iou"] is not None


def test_resume_with_gradient_lag_is_bit_identical(store, tmp_path):
    common = ["--store", store, *TINY, "--larc", "--gradient-lag", "--no-val", "--no-flops", "--epochs", "3"]
    train([*common, "--steps", "5", "--checkpoint", str(tmp_path / "full.pt"), "--json", str(tmp_path / "full.json")])
    train([*common, "--steps", "2", "--checkpoint", str(tmp_path / "part.pt")])
    train([*common, "--steps", "5", "--checkpoint", str(tmp_path / "part.pt"), "--resume",
           "--json", str(tmp_path / "resumed.json")])
    full = json.loads((tmp_path / "full.json").read_text())["runs"][0]
    resumed = json.loads((tmp_path / "resumed.json").read_text())["runs"][0]
    assert resumed["losses"] == full["losses"]
    assert resumed["weights_sha256_by_rank"] == full["weights_sha256_by_rank"]


# The common options of TINY without the model's.
LOOP = TINY[TINY.index("--batch-size"):]
DEEPLAB = ["--model", "deeplabv3plus", "--encoder", "resnet18", "--decoder-channels", "32"]


@pytest.mark.parametrize("model", ["tiramisu", "deeplabv3plus"])
def test_two_processes_gradient_lag_larc_disjoint_samples_identical_weights(store, tmp_path, model):
    """torchrun, 2 processes on gloo: --gradient-lag (its own asynchronous all-reduce, DDP's off by
    no_sync) with LARC. Each rank trains on its own shard of the samples, and the ranks end with the
    same parameters (the lagged all-reduce averages the gradients; without it the ranks diverge) and
    buffers (made rank 0's at the end). Batches are full (the Loader's time range ends at the split),
    as DeepLabv3+'s ASPP BatchNorm needs at batch 2."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    prefix = tmp_path / "times"
    out = tmp_path / "ddp.json"
    options = TINY if model == "tiramisu" else [*DEEPLAB, *LOOP]
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "zfeed.recipes",
               "segment", "--store", store, *options, "--steps", "4", "--epochs", "2", "--gradient-lag", "--larc",
               "--no-flops", "--times-log", str(prefix), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 2 and doc["model"] == model and doc["gradient_lag"] and doc["larc"]
    (real,) = doc["runs"]
    assert real["steps"] == 4 and len(real["losses"]) == 4 and all(math.isfinite(x) for x in real["losses"])
    assert real["gradient_lag_updates"] == 3  # step 0 makes no update with lag 1
    for key in ("parameters_sha256_by_rank", "weights_sha256_by_rank"):
        digests = real[key]
        assert len(digests) == 2 and digests[0] == digests[1], key
    seen: dict = {}
    steps = {0: 0, 1: 0}
    for rank in (0, 1):
        for line in filter(None, Path(f"{prefix}.rank{rank}").read_text().split("\n")):
            epoch, _step, *times = (int(x) for x in line.split())
            assert len(times) == 2, line  # a full batch every step
            steps[rank] += 1
            seen.setdefault((rank, epoch), []).extend(times)
    assert steps == {0: 4, 1: 4}  # both ranks took every step
    # Every rank trained, never on the other rank's samples.
    assert all(any(seen.get((rank, e)) for e in (0, 1)) for rank in (0, 1)), seen
    for epoch in {e for (_, e) in seen}:
        a, b = seen.get((0, epoch), []), seen.get((1, epoch), [])
        assert len(set(a)) == len(a) and len(set(b)) == len(b)
        assert (a or b) and not set(a) & set(b), (epoch, a, b)
        assert all(t < doc["split"] for t in a + b)
    assert doc["validation"]["samples"] == 3 and doc["validation"]["mean_iou"] is not None
