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
    # the background-only predictor: IoU 0 for cyclones and rivers present in the labels (a class
    # absent from them has none, as the model's), background frequency for background
    matrix = val["confusion_matrix"]
    for k, name in enumerate(CLASSES[1:], start=1):
        assert val["background_only_iou"][name] == (0.0 if sum(matrix[k]) else None), name
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


# ---------------------------------------------------------------- in this process (no start-up cost)

def _main(args: list[str]) -> int:
    import torch

    from zfeed.recipes import segment

    threads = torch.get_num_threads()
    try:
        return segment.main(args)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture()
def store_copy(store, tmp_path) -> str:
    path = tmp_path / "cam5.zarr"
    shutil.copytree(store, path)
    return str(path)


def test_absent_classes_leave_both_mean_ious_alike(store_copy, tmp_path):
    """A class in neither the labels nor the predictions has no IoU and stays out of the mean, for
    the background-only predictor as for the model (it used to count 0 in the predictor's mean)."""
    import numpy as np
    import zfeed

    from zfeed.recipes import common as recipes_common
    from zfeed.recipes import segment, segment_smoke

    labels = zfeed.open(store_copy, mode="r+")["labels"]
    held_out = np.asarray(labels[9:12])
    held_out[held_out == 1] = 0  # no cyclone in the held-out times
    held_out[:, 0, :3] = 2       # and some river
    labels[9:12] = held_out
    args = segment.build_parser().parse_args(["--store", store_copy, *TINY])
    task = segment.SegmentTask(args, recipes_common.Dist())
    val = task.validate(task.build_model(), recipes_common.Dist())
    background = val["background_only_iou"]
    assert background["cyclone"] is None and background["river"] == 0.0 and 0 < background["background"] < 1
    assert val["background_only_mean_iou"] == pytest.approx((background["background"] + 0.0) / 2)
    present = [v for v in val["iou"].values() if v is not None]
    assert val["mean_iou"] == pytest.approx(sum(present) / len(present))
    assert "-" in segment.validation_table(val)
    # The smoke run scores the same way (NaN: no IoU).
    subprocess.run([ZFEED, "stats", store_copy, "--variables", ",".join(segment.CHANNELS)], check=True,
                   stdout=subprocess.DEVNULL)
    smoke = segment_smoke.run(store_copy, store_copy, "tiramisu", steps=1, batch_size=2, channels_last=False,
                              model_options={"growth_rate": 4, "layers": (2,), "bottleneck_layers": 1,
                                             "first_channels": 8}, log=lambda *a: None)
    whole = zfeed.open(store_copy)["labels"]
    if not (np.asarray(whole[...]) == 1).any():
        assert math.isnan(smoke["background_only_iou"]["cyclone"])
    iou = [v for v in smoke["background_only_iou"].values() if not math.isnan(v)]
    assert smoke["background_only_mean_iou"] == pytest.approx(sum(iou) / len(iou))


def test_segment_refuses_what_would_fail_later(store_copy, tmp_path):
    base = ["--store", store_copy, *TINY, "--steps", "1", "--no-flops", "--no-val"]
    # 3 classes in the labels, 2 asked for: the loss would index past the logits.
    with pytest.raises(SystemExit, match=r"segment: labels holds the label 2 .*not a class of --classes 2 \(0\.\.1\): "
                                         r"give --classes 3"):
        _main([*base, "--classes", "2"])
    for layers in (",", "2,,2", "2,0", "x"):
        args = list(base)
        args[args.index("--tiramisu-layers") + 1] = layers
        with pytest.raises(SystemExit, match=r"segment: --tiramisu-layers must be comma-separated integers of at "
                                             r"least 1"):
            _main(args)
    # Statistics errors name the recipe that asked for them.
    import zfeed
    root = zfeed.open(store_copy, mode="r+")
    root["TMQ"].attrs["zfeed_stats"] = {"mean": 1.0, "std": 0.0}
    root.consolidate()  # the group's consolidated metadata holds the attributes too
    with pytest.raises(SystemExit, match=r"^segment: TMQ has standard deviation 0\.0"):
        _main([*base, "--inputs", "TMQ"])


def test_resume_refuses_other_optimizer_and_precision(store, tmp_path):
    """A checkpoint resumed with --gradient-lag toggled (another optimizer state) or --amp
    changed (the grad scaler's state) is refused naming the checkpoint and the option."""
    import torch

    ckpt = tmp_path / "ckpt.pt"
    base = ["--store", store, *TINY, "--steps", "1", "--no-flops", "--no-val", "--checkpoint", str(ckpt)]
    assert _main(base) == 0
    for extra, message in ((["--gradient-lag"], r"--gradient-lag off \(this run: on\)"),
                           (["--amp", "fp16"], r"--amp none \(this run: fp16\)"),
                           (["--lr", "0.01"], r"--lr 0\.001 \(this run: 0\.01\)"),
                           (["--growth-rate", "8"], r"--growth-rate 4 \(this run: 8\)"),
                           (["--batch-size", "3"], r"--batch-size 2 \(this run: 3\)")):
        with pytest.raises(SystemExit, match=rf"{ckpt} was written with {message}"):
            _main([*base, *extra, "--resume"])
    # A checkpoint written before the settings were saved: the optimizer state that does not fit
    # is refused with a message too, not a KeyError.
    state = torch.load(ckpt, weights_only=False)
    del state["settings"]
    torch.save(state, ckpt)
    with pytest.raises(SystemExit, match=rf"{ckpt}: its optimizer state does not fit this run"):
        _main([*base, "--gradient-lag", "--resume"])


def test_resume_refuses_other_memory_format_and_statistics(store_copy, tmp_path):
    """--channels-last (NHWC kernels sum in another order: a run resumed in the other format is not
    bit-identical) and the normalization statistics (here the store's zfeed_stats, rewritten
    since the checkpoint) change what a resumed run computes: refused naming the option."""
    import re

    import torch
    import zfeed

    ckpt = tmp_path / "ckpt.pt"
    base = ["--store", store_copy, *TINY, "--steps", "1", "--no-flops", "--no-val", "--checkpoint", str(ckpt)]
    assert _main(base) == 0
    with pytest.raises(SystemExit, match=rf"{re.escape(str(ckpt))} was written with --channels-last off "
                                         r"\(this run: on\)"):
        _main([*base, "--channels-last", "--resume"])
    saved = torch.load(ckpt, weights_only=False)["settings"]["--stats"]["TMQ"]
    root = zfeed.open(store_copy, mode="r+")
    root["TMQ"].attrs["zfeed_stats"] = {"mean": 40.0, "std": 12.5}
    root.consolidate()  # the group's consolidated metadata holds the attributes too
    with pytest.raises(SystemExit, match=rf"{re.escape(str(ckpt))} was written with --stats TMQ: {re.escape(saved)} "
                                         r"\(this run: mean 40\.0, std 12\.5\)"):
        _main([*base, "--resume"])


def test_throughput_counts_labels_at_their_stored_size(store):
    """MB/s counts the decoded bytes a batch delivers from the store: the 16 float32 channels and
    the labels at their stored size (uint8), not the int64 the Loader widens them to."""
    import torch
    import zfeed

    from zfeed.recipes import common as recipes_common
    from zfeed.recipes import segment

    task = segment.SegmentTask(segment.build_parser().parse_args(["--store", store, *TINY]), recipes_common.Dist())
    loader = zfeed.Loader(store, inputs=task.inputs, targets=[task.labels], lead=0, batch_size=2, seed=0,
                          normalize=task.stats)
    batch = task.prepare(next(iter(loader)), torch.device("cpu"))
    assert batch["targets"].dtype == torch.int64 and zfeed.open(store)["labels"].dtype == "uint8"
    assert batch["bytes"] == 2 * (16 * 4 + 1) * 22 * 36


def test_smoke_run_validates_with_the_training_statistics(store_copy, tmp_path, monkeypatch):
    """segment_smoke normalizes the held-out store with the training store's statistics (the
    model learned on those), not with statistics the held-out store carries."""
    import numpy as np
    import zfeed

    from zfeed.recipes import common as recipes_common
    from zfeed.recipes import segment, segment_smoke

    subprocess.run([ZFEED, "stats", store_copy, "--variables", ",".join(segment.CHANNELS)], check=True,
                   stdout=subprocess.DEVNULL)
    held_out = str(tmp_path / "held_out.zarr")
    subprocess.run([ZFEED, "synth", "cam5", held_out, "--lat", "22", "--lon", "36", "--times", "4", "--seed", "7",
                    "-q"], check=True)
    root = zfeed.open(held_out, mode="r+")
    for name in segment.CHANNELS:  # statistics of its own, far from the training store's
        root[name].attrs["zfeed_stats"] = {"mean": 1000.0, "std": 3.0}
    root.consolidate()

    delivered: dict = {}

    class RecordingLoader(zfeed.Loader):
        """zfeed.Loader keeping a copy of every batch's inputs and times, by store."""

        def __init__(self, store, **options):
            super().__init__(store, **options)
            self.path = str(store)

        def __iter__(self):
            for batch in super().__iter__():
                delivered.setdefault(self.path, []).append(
                    (np.array(batch["inputs"], copy=True), np.array(batch["times"], copy=True)))
                yield batch

    monkeypatch.setattr(zfeed, "Loader", RecordingLoader)
    segment_smoke.run(store_copy, held_out, "tiramisu", steps=1, batch_size=2, channels_last=False,
                      model_options={"growth_rate": 4, "layers": (2,), "bottleneck_layers": 1, "first_channels": 8},
                      log=lambda *a: None)
    training = zfeed.open(store_copy)
    held = zfeed.open(held_out)
    assert delivered[held_out]
    for inputs, times in delivered[held_out]:
        for c, name in enumerate(segment.CHANNELS):
            stats = training[name].attrs["zfeed_stats"]
            for i, t in enumerate(times):
                raw = recipes_common.read_decoded(held[name], int(t), int(t) + 1)[0]
                np.testing.assert_allclose(inputs[i, c], (raw - stats["mean"]) / stats["std"], rtol=1e-4, atol=1e-4,
                                           err_msg=name)
