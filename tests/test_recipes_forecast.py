"""The forecast recipe (zfeed.recipes.forecast) and the shared training machinery, on a tiny
synthetic ERA5-like store: CPU, a few steps per run, no timing assertions."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("segmentation_models_pytorch")

from zfeed.recipes import common, forecast  # noqa: E402

PYTHON = sys.executable
ZFEED = str(Path(PYTHON).parent / "zfeed") if (Path(PYTHON).parent / "zfeed").exists() else shutil.which("zfeed")

# A grid that does not divide by the U-Net's downsampling (padding is exercised, as on the real
# ERA5 UK file's 33 x 49) and a small U-Net, so a step takes a few tens of milliseconds.
SMALL = ["--encoder", "resnet18", "--encoder-depth", "3", "--decoder-channels", "32,16,16", "--threads", "1",
         "--batch-size", "4", "--log-every", "0", "--seed", "0"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    if ZFEED is None:
        pytest.skip("the zfeed command is not installed")
    path = tmp_path_factory.mktemp("forecast") / "era5.zarr"
    subprocess.run([ZFEED, "synth", "era5", str(path), "--lat", "20", "--lon", "36", "--times", "24",
                    "--variables", "t2m,u500,z500", "--quiet"], check=True)
    return str(path)


def run(args: list[str]) -> int:
    torch.set_num_threads(1)
    return forecast.main(args)


def test_hackathon_loss_equals_hand_computed():
    pred = torch.tensor([1.0, 2.0, 3.0, 6.0]).view(1, 1, 2, 2)
    target = torch.tensor([1.0, 1.0, 3.0, 3.0]).view(1, 1, 2, 2)
    rmse = math.sqrt((0 + 1 + 0 + 9) / 4)
    std_pred = math.sqrt((4 + 1 + 0 + 9) / 3)   # mean 3, unbiased
    std_target = math.sqrt((1 + 1 + 1 + 1) / 3)  # mean 2
    expected = rmse + 0.1 * abs(std_pred - std_target)
    assert float(forecast.hackathon_loss(pred, target)) == pytest.approx(expected, rel=1e-6)
    assert float(forecast.mse_loss(pred, target)) == pytest.approx(2.5)


def test_padded_unet_any_grid():
    torch.manual_seed(0)
    model = forecast.PaddedUnet(1, 1, encoder_depth=3, decoder_channels=(32, 16, 16))
    assert model(torch.randn(2, 1, 33, 49)).shape == (2, 1, 33, 49)


@pytest.fixture(scope="module")
def uninterrupted(store, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("full")
    args = ["--store", store, "--inputs", "t2m,u500,z500", "--steps", "6", "--epochs", "3",
            "--checkpoint", str(out / "ckpt.pt"), "--json", str(out / "run.json"), *SMALL]
    assert run(args) == 0
    return {"dir": out, "doc": json.loads((out / "run.json").read_text()), "args": args}


def test_loss_decreases_and_validation_against_persistence(uninterrupted):
    doc = uninterrupted["doc"]
    (real,) = doc["runs"]
    assert real["mode"] == "real" and real["source"] == "zfeed" and real["steps"] == 6
    losses = real["losses"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2
    # The split: 24 times, the last ceil(0.1 * 24) = 3 held out.
    assert doc["split"] == 21 and doc["statistics_source"].startswith("computed over the training times")
    val = doc["validation"]
    assert val["samples"] == 2 and set(val["variables"]) == {"t2m", "u500", "z500"}
    for v in val["variables"].values():
        assert v["rmse"] > 0 and v["persistence_rmse"] > 0
        assert v["ratio"] == pytest.approx(v["rmse"] / v["persistence_rmse"])
    assert real["flops_per_sample"] > 0 and real["flop_per_s"]["median"] > 0


def test_resume_is_bit_identical(store, uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    base = [a for a in uninterrupted["args"]]
    i = base.index("--checkpoint")
    base[i + 1] = str(ckpt)
    j = base.index("--json")
    base[j + 1] = str(tmp_path / "resumed.json")
    first = list(base)
    first[first.index("--steps") + 1] = "3"
    assert run(first) == 0  # "killed" after 3 steps: the checkpoint is all that survives
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == 3 and state["loader"][0]["batch"] >= 1
    assert run(base + ["--resume"]) == 0
    resumed = json.loads((tmp_path / "resumed.json").read_text())["runs"][0]
    full = uninterrupted["doc"]["runs"][0]
    assert resumed["weights_sha256_by_rank"] == full["weights_sha256_by_rank"]
    assert resumed["losses"] == full["losses"]
    a = torch.load(uninterrupted["dir"] / "ckpt.pt", weights_only=False)
    b = torch.load(ckpt, weights_only=False)
    assert a["step"] == b["step"] == 6
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_resume_with_another_split_is_refused_naming_the_checkpoint(uninterrupted, tmp_path):
    """The loader reads the training times only: a checkpoint taken with another --val-fraction
    holds a sample order of other samples, and resuming it would train on a different epoch.
    Refused naming the option; a checkpoint that does not record its options (older ones) is
    refused by the loader's state, whose sample count differs."""
    ckpt = tmp_path / "ckpt.pt"
    shutil.copy(uninterrupted["dir"] / "ckpt.pt", ckpt)
    args = list(uninterrupted["args"])
    args[args.index("--checkpoint") + 1] = str(ckpt)
    args[args.index("--json") + 1] = str(tmp_path / "other.json")
    with pytest.raises(SystemExit, match=rf"{re.escape(str(ckpt))} was written with --val-fraction 0\.1 \(this run: "
                                         r"0\.25\)"):
        run(args + ["--val-fraction", "0.25", "--resume"])
    state = torch.load(ckpt, weights_only=False)
    del state["settings"]  # as checkpoints written before they held their options
    torch.save(state, ckpt)
    with pytest.raises(SystemExit) as info:
        run(args + ["--val-fraction", "0.25", "--resume"])
    message = str(info.value)
    assert str(ckpt) in message and "loader state does not fit" in message and "num_samples" in message


def test_modes_and_baseline_write_json_and_png(store, tmp_path):
    out_json, out_png = tmp_path / "bars.json", tmp_path / "bars.png"
    assert run(["--store", store, "--inputs", "t2m,u500,z500", "--steps", "3", "--warmup", "1", "--no-val",
                "--mode", "real,load-only,synthetic", "--source", "zfeed,baseline", "--baseline-workers", "0",
                "--json", str(out_json), "--plot", str(out_png), *SMALL]) == 0
    doc = json.loads(out_json.read_text())
    runs = {(r["source"], r["mode"]): r for r in doc["runs"]}
    assert set(runs) == {(s, m) for s in ("zfeed", "baseline") for m in ("real", "load-only", "synthetic")}
    for (source, mode), r in runs.items():
        assert r["steps"] == 3 and r["timed_steps"] == 2
        for key in ("samples_per_s", "mb_per_s"):
            p = r[key]
            assert p["median"] > 0 and p["p10"] <= p["median"] <= p["p90"], (source, mode, key)
        if mode == "load-only":
            assert r["flop_per_s"]["median"] is None and r["losses"] == []
        else:
            assert r["flop_per_s"]["median"] > 0 and len(r["losses"]) == 3
    assert set(doc["headline"]) == {"zfeed", "baseline"}
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_zfeed_train_command(store):
    if ZFEED is None:
        pytest.skip("the zfeed command is not installed")
    usage = subprocess.run([ZFEED, "train"], capture_output=True, text=True)
    assert usage.returncode == 2 and "forecast" in usage.stdout
    help_text = subprocess.run([ZFEED, "train", "forecast", "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0 and "--val-fraction" in help_text.stdout


def test_two_processes_disjoint_samples_identical_weights(store, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    prefix = tmp_path / "times"
    out_json = tmp_path / "ddp.json"
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "zfeed.recipes", "forecast", "--store", store, "--inputs", "t2m", "--steps", "4",
               "--epochs", "2", "--times-log", str(prefix), "--json", str(out_json), *SMALL]
    command[command.index("--batch-size") + 1] = "3"
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out_json.read_text())
    assert doc["world_size"] == 2
    # Throughput is the job's: both processes' samples, each step's rates summed over them, and
    # the table says so; rank 0's own rate is kept beside it.
    real = doc["runs"][0]
    assert real["processes"] == 2 and real["samples"] == 4 * 3 and real["samples_all_processes"] == 2 * 4 * 3
    assert real["samples_per_s"]["median"] > real["rank0_samples_per_s"]["median"] > 0
    assert "the job's: each step's rates summed over its 2 processes" in done.stdout
    # Parameters identical as trained; buffers (BatchNorm statistics) made rank 0's at the end.
    for key in ("parameters_sha256_by_rank", "weights_sha256_by_rank"):
        digests = doc["runs"][0][key]
        assert len(digests) == 2 and digests[0] == digests[1], key
    seen = {}
    for rank in (0, 1):
        lines = Path(f"{prefix}.rank{rank}").read_text().split("\n")
        for line in filter(None, lines):
            epoch, _step, *times = (int(x) for x in line.split())
            seen.setdefault((rank, epoch), []).extend(times)
    epochs = {e for (_, e) in seen}
    for e in epochs:
        a, b = set(seen.get((0, e), [])), set(seen.get((1, e), []))
        assert a and b and not (a & b), (e, a, b)
        assert all(t + 1 < doc["split"] for t in a | b)


def test_history_and_time_features_channels(store, tmp_path):
    """--history 2 stacks t-1 and t (the Loader's order: oldest step first, the variables within
    each), the residual base is x_t, and --time-features adds four channels; validation reads the
    held-out inputs in the same order."""
    import numpy as np
    import zfeed

    out = tmp_path / "h2.json"
    assert run(["--store", store, "--inputs", "t2m,u500", "--targets", "t2m", "--residual", "--history", "2",
                "--steps", "2", "--json", str(out), "--checkpoint", str(tmp_path / "h2.pt"), *SMALL]) == 0
    doc = json.loads(out.read_text())
    assert doc["history"] == 2 and doc["input_channels"] == 4 and not doc["time_features"]
    weights = torch.load(tmp_path / "h2.pt", weights_only=False)["model"]
    assert weights["net.encoder.conv1.weight"].shape[1] == 4
    val = doc["validation"]["variables"]["t2m"]
    assert val["rmse"] > 0 and val["persistence_rmse"] > 0

    args = forecast.build_parser().parse_args(["--store", store, "--inputs", "t2m,u500", "--targets", "t2m",
                                               "--residual", "--history", "2", "--time-features"])
    task = forecast.ForecastTask(args, common.Dist())
    assert task.in_channels == 2 * 2 + 4 and task.residual_index == [2]  # t2m at t
    loader = zfeed.Loader(store, inputs=task.inputs, targets=task.targets, history=2, batch_size=3, seed=0,
                          normalize=task.stats, shuffle=False)
    batch = task.prepare(next(iter(loader)), torch.device("cpu"))
    x, times = batch["inputs"], batch["times"]
    assert x.shape[1] == 8
    # The synthetic store's times are hourly from 2000-01-01 00:00 (standard calendar).
    assert zfeed.open(store)["time"].attrs["units"] == "hours since 2000-01-01"
    for i, t in enumerate(times):
        expected = [task._read(n, t - 1 + k, t + k)[0] for k in range(2) for n in task.inputs]
        for c, plane in enumerate(expected):
            np.testing.assert_allclose(x[i, c].numpy(), plane, rtol=1e-5, atol=1e-5)
        day, year = (t % 24) / 24, (t / 24) / 366  # 2000 is a leap year
        feats = [math.sin(2 * math.pi * day), math.cos(2 * math.pi * day),
                 math.sin(2 * math.pi * year), math.cos(2 * math.pi * year)]
        np.testing.assert_allclose(x[i, 4:, 0, 0].numpy(), feats, atol=1e-6)
        assert float(x[i, 4:].std(dim=(1, 2)).max()) == 0.0
    # Hour 6 UTC on 1 January: a quarter turn of the day, the first day of the year.
    sin_h, cos_h, sin_y, cos_y = forecast.time_features(*forecast.calendar_phases(np.array([6]), "hours since "
                                                                                  "1970-01-01", "standard"))[0]
    assert sin_h == pytest.approx(1.0) and cos_h == pytest.approx(0.0, abs=1e-6) and cos_y == pytest.approx(1.0, abs=1e-3)


def test_two_nodes_each_stage_and_train_on_their_own_block(store, tmp_path):
    """Two one-process nodes (torchrun's static rendezvous on loopback) with --partition node and
    --stage-dir: each node copies only its block's time steps, trains on its block's samples
    only (disjoint, as many steps), and the weights end identical."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    prefix = tmp_path / "times"
    out_json = tmp_path / "nodes.json"
    stage_dir = tmp_path / "scratch-{node}" / "era5.zarr"
    processes = []
    for node in (0, 1):
        command = [PYTHON, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
                   "--master_addr=127.0.0.1", f"--master_port={port}",
                   "-m", "zfeed.recipes", "forecast", "--store", store, "--inputs", "t2m", "--steps", "3",
                   "--times-log", str(prefix), "--json", str(out_json), "--stage-dir", str(stage_dir),
                   "--partition", "node", "--no-val", *SMALL]
        command[command.index("--batch-size") + 1] = "2"
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], [o[0][-2000:] + o[1][-2000:] for o in outputs]
    doc = json.loads(out_json.read_text())
    digests = doc["runs"][0]["parameters_sha256_by_rank"]
    assert len(digests) == 2 and digests[0] == digests[1]
    # The training range's samples (t + 1 < split) in two equal blocks, one per node.
    samples = doc["split"] - 1
    per_node = samples // 2
    steps_by_rank = {}
    for rank in (0, 1):
        times = set()
        lines = [line for line in Path(f"{prefix}.rank{rank}").read_text().split("\n") if line]
        steps_by_rank[rank] = len(lines)
        for line in lines:
            times.update(int(x) for x in line.split()[2:])
        block = set(range(rank * per_node, (rank + 1) * per_node))
        assert times and times <= block, (rank, times, block)
        held = sorted(p.name for p in (tmp_path / f"scratch-{rank}" / "era5.zarr" / "t2m" / "c").iterdir())
        assert sorted(int(t) for t in held) == list(range(rank * per_node, (rank + 1) * per_node + 1))
    assert steps_by_rank[0] == steps_by_rank[1]


def _copy_t2m(store: str, path, packed: bool) -> str:
    """The store's t2m as an int16 store packed with scale_factor 0.01 (``packed``) or as float32
    holding the very values that packing decodes to, with its time and grid coordinates."""
    import numpy as np
    import zfeed

    source = zfeed.open(store)
    values = np.asarray(source["t2m"][...], dtype=np.float64)
    scale, offset = 0.01, float(np.round(values.mean()))
    raw = np.round((values - offset) / scale).astype("int16")
    root = zfeed.create_group(str(path))
    dims = ["time", "latitude", "longitude"]
    if packed:
        root.create_array("t2m", shape=raw.shape, chunks=(1, *raw.shape[1:]), dtype="int16", data=raw,
                          dimension_names=dims, attributes={"scale_factor": scale, "add_offset": offset,
                                                            "_FillValue": -32767})
    else:
        decoded = (raw.astype(np.float64) * scale + offset).astype("float32")  # as the Loader decodes
        root.create_array("t2m", shape=raw.shape, chunks=(1, *raw.shape[1:]), dtype="float32", data=decoded,
                          dimension_names=dims)
    for name in ("time", "latitude", "longitude"):
        array = source[name]
        root.create_array(name, shape=array.shape, dtype=array.dtype, data=np.asarray(array[...]),
                          dimension_names=[name], attributes=dict(array.attrs))
    return str(path)


def test_a_packed_store_validates_as_the_float_store_it_decodes_to(store, tmp_path, capsys):
    """Validation reads the held-out times itself: decoded as the Loader decodes the training
    batches (scale_factor, add_offset), so an int16-packed store scores as its float twin (the
    raw int16 values would make both RMSEs 1/scale_factor = 100 times too large)."""
    docs = {}
    for packed in (False, True):
        path = _copy_t2m(store, tmp_path / f"{'packed' if packed else 'float'}.zarr", packed)
        out = tmp_path / f"{packed}.json"
        assert run(["--store", path, "--inputs", "t2m", "--steps", "2", "--no-flops", "--json", str(out),
                    *SMALL]) == 0
        docs[packed] = json.loads(out.read_text())
    assert docs[True]["statistics"]["t2m"] == pytest.approx(docs[False]["statistics"]["t2m"], rel=1e-6)
    assert docs[True]["runs"][0]["losses"] == pytest.approx(docs[False]["runs"][0]["losses"], rel=1e-5)
    want, got = docs[False]["validation"]["variables"]["t2m"], docs[True]["validation"]["variables"]["t2m"]
    assert 0.1 < want["persistence_rmse"] < 10  # kelvin, as the float store holds them
    for key in ("rmse", "persistence_rmse", "ratio"):
        assert got[key] == pytest.approx(want[key], rel=1e-5), key
    # --steps 2 with --warmup 2: the timing keeps the last step, and says so.
    assert "--warmup 2 is not below the 2 steps of the zfeed/real run" in capsys.readouterr().err


def test_checkpoint_and_resume_belong_to_the_zfeed_real_run(store, tmp_path):
    """--resume with several modes and sources: the zfeed real run resumes from and writes the
    checkpoint; the synthetic and baseline runs neither load nor write it (they used to reload the
    checkpoint the real run had just written and run no step, or stop the invocation)."""
    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "runs.json"
    assert run(["--store", store, "--inputs", "t2m,u500,z500", "--steps", "3", "--warmup", "1", "--no-val",
                "--no-flops", "--mode", "real,synthetic", "--source", "zfeed,baseline", "--baseline-workers", "0",
                "--checkpoint", str(ckpt), "--resume", "--json", str(out), *SMALL]) == 0
    doc = json.loads(out.read_text())
    runs = {(r["source"], r["mode"]): r for r in doc["runs"]}
    assert set(runs) == {(s, m) for s in ("zfeed", "baseline") for m in ("real", "synthetic")}
    assert all(r["steps"] == 3 and r["samples_per_s"]["median"] for r in runs.values())
    assert set(doc["headline"]) == {"zfeed", "baseline"}
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == 3 and state["losses"] == runs[("zfeed", "real")]["losses"]
    # Where no zfeed real run is asked for, the checkpoint options cannot work: refused up front.
    base = ["--store", store, "--inputs", "t2m", *SMALL]
    with pytest.raises(SystemExit, match=r"--checkpoint and --resume apply to the zfeed real-mode run only .*"
                                         r"--source baseline --mode real"):
        run([*base, "--source", "baseline", "--checkpoint", str(ckpt), "--resume"])
    with pytest.raises(SystemExit, match=r"--checkpoint applies to the zfeed real-mode run only"):
        run([*base, "--mode", "synthetic", "--checkpoint", str(ckpt)])
    with pytest.raises(SystemExit, match=r"--resume needs --checkpoint"):
        run([*base, "--resume"])


def test_resume_refuses_a_checkpoint_of_other_options(uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    shutil.copy(uninterrupted["dir"] / "ckpt.pt", ckpt)
    args = list(uninterrupted["args"])
    args[args.index("--checkpoint") + 1] = str(ckpt)
    args[args.index("--json") + 1] = str(tmp_path / "other.json")
    for extra, message in ((["--lr", "0.002"], r"--lr 0\.001 \(this run: 0\.002\)"),
                           (["--amp", "fp16"], r"--amp none \(this run: fp16\)"),
                           (["--loss", "hackathon"], r"--loss mse \(this run: hackathon\)"),
                           (["--batch-size", "2"], r"--batch-size 4 \(this run: 2\)")):
        with pytest.raises(SystemExit, match=rf"{ckpt} was written with {message}"):
            run(args + extra + ["--resume"])
    state = torch.load(ckpt, weights_only=False)
    torch.save({**state, "task": "segment"}, ckpt)
    with pytest.raises(SystemExit, match=rf"{ckpt} was written by the segment recipe; this is forecast"):
        run(args + ["--resume"])
    # A checkpoint from before the settings were saved still resumes (here: nothing left to do).
    del state["settings"]
    torch.save(state, ckpt)
    assert run(args + ["--resume"]) == 0


def test_resume_refuses_other_normalization_statistics(store, tmp_path):
    """The statistics the data are normalized with change what a resumed run computes: zfeed_stats
    written into the store since the checkpoint (here where there were none, so the first run
    computed them over the training times) are refused naming --stats and the variable; --stats
    train, which computes them over the training times as the first run did, resumes."""
    import zfeed

    copy = tmp_path / "era5.zarr"
    shutil.copytree(store, copy)
    ckpt = tmp_path / "ckpt.pt"
    args = ["--store", str(copy), "--inputs", "t2m", "--no-val", "--no-flops", "--checkpoint", str(ckpt), *SMALL]
    assert run([*args, "--steps", "1"]) == 0
    root = zfeed.open(str(copy), mode="r+")
    root["t2m"].attrs["zfeed_stats"] = {"mean": 250.0, "std": 10.0}
    root.consolidate()  # the group's consolidated metadata holds the attributes too
    with pytest.raises(SystemExit, match=rf"{re.escape(str(ckpt))} was written with --stats t2m: mean (\S+), std (\S+) "
                                         r"\(this run: mean 250\.0, std 10\.0\)") as info:
        run([*args, "--steps", "2", "--resume"])
    # The checkpoint's values, written exactly: those the first run computed over the training times.
    mean, std = re.search(r"--stats t2m: mean (\S+), std (\S+) ", str(info.value)).groups()
    training_times = forecast.resolve_statistics(str(copy), zfeed.open(str(copy)), ["t2m"], 21, "train")[0]
    assert (float(mean), float(std)) == training_times["t2m"]
    assert run([*args, "--steps", "2", "--resume", "--stats", "train"]) == 0
    assert torch.load(ckpt, weights_only=False)["step"] == 2


def test_throughput_counts_the_bytes_read_from_the_store(store):
    """MB/s counts, as zfeed bench does, the decoded bytes a batch delivers from the store: the
    inputs' history steps and the targets as float32, not the time-feature channels the recipe
    computes itself."""
    import zfeed

    args = forecast.build_parser().parse_args(["--store", store, "--inputs", "t2m,u500", "--targets", "t2m",
                                               "--history", "2", "--time-features"])
    task = forecast.ForecastTask(args, common.Dist())
    loader = zfeed.Loader(store, inputs=task.inputs, targets=task.targets, history=2, batch_size=3, seed=0,
                          normalize=task.stats)
    batch = task.prepare(next(iter(loader)), torch.device("cpu"))
    assert batch["inputs"].shape[1] == 2 * 2 + 4
    grid = task.height * task.width
    assert batch["bytes"] == 3 * (2 * 2 + 1) * grid * 4
    # The hackathon's task (the inputs at t and at t + 1): zfeed bench's sample, 2 * variables * grid * 4.
    plain = forecast.ForecastTask(forecast.build_parser().parse_args(["--store", store, "--inputs", "t2m,u500"]),
                                  common.Dist())
    loader = zfeed.Loader(store, inputs=plain.inputs, targets=plain.targets, batch_size=3, seed=0,
                          normalize=plain.stats)
    assert plain.prepare(next(iter(loader)), torch.device("cpu"))["bytes"] == 3 * 2 * 2 * grid * 4


def _store_with_time(store: str, path, values, units: str, calendar: str | None) -> str:
    """The store's t2m and grid with a time coordinate of ``values`` in ``units`` and ``calendar``."""
    import numpy as np
    import zfeed

    source = zfeed.open(store)
    root = zfeed.create_group(str(path))
    t2m = np.asarray(source["t2m"][...])
    root.create_array("t2m", shape=t2m.shape, chunks=(1, *t2m.shape[1:]), dtype="float32", data=t2m,
                      dimension_names=["time", "latitude", "longitude"])
    for name in ("latitude", "longitude"):
        array = source[name]
        root.create_array(name, shape=array.shape, dtype=array.dtype, data=np.asarray(array[...]),
                          dimension_names=[name], attributes=dict(array.attrs))
    attributes = {"units": units, **({"calendar": calendar} if calendar is not None else {})}
    times = np.asarray(values, dtype="float64")
    root.create_array("time", shape=times.shape, dtype="float64", data=times, dimension_names=["time"],
                      attributes=attributes)
    return str(path)


def test_time_features_follow_the_cf_calendar(store, tmp_path):
    """Day of year and year length are the time coordinate's CF calendar's: CAM5's noleap has 365
    days every year (day 59 is 1 March, never 29 February), 360_day twelve months of 30 days,
    all_leap 366 days, julian a leap year every 4 years (1900 among them), the Gregorian ones not
    in 1900, standard the Julian rule before 1582-10-15."""
    import numpy as np
    import zfeed

    # A CAM5-like store: 6-hourly from 28 February of year 2000 in the noleap calendar.
    values = 365 * 1999 + 58 + np.arange(24) / 4
    path = _store_with_time(store, tmp_path / "noleap.zarr", values, "days since 0001-01-01 00:00:00", "noleap")
    task = forecast.ForecastTask(forecast.build_parser().parse_args(["--store", path, "--inputs", "t2m",
                                                                     "--time-features"]), common.Dist())
    loader = zfeed.Loader(path, inputs=task.inputs, targets=task.targets, batch_size=8, seed=0,
                          normalize=task.stats, shuffle=False)
    batch = task.prepare(next(iter(loader)), torch.device("cpu"))
    for i, t in enumerate(batch["times"]):
        day, year = (t % 4) / 4, (58 + t / 4) / 365
        want = [math.sin(2 * math.pi * day), math.cos(2 * math.pi * day),
                math.sin(2 * math.pi * year), math.cos(2 * math.pi * year)]
        np.testing.assert_allclose(batch["inputs"][i, 1:, 0, 0].numpy(), want, atol=1e-6)

    phases = forecast.calendar_phases
    day, year = phases(np.array([0, 59, 364, 365, 4 * 365 + 59.5]), "days since 2000-01-01 00:00:00", "noleap")
    np.testing.assert_allclose(year, [0, 59 / 365, 364 / 365, 0, 59.5 / 365], atol=1e-12)
    np.testing.assert_allclose(day, [0, 0, 0, 0, 0.5], atol=1e-12)
    for calendar in ("365_day", "NoLeap"):
        np.testing.assert_allclose(phases(np.array([59]), "days since 2000-01-01", calendar)[1], [59 / 365])
    _, year = phases(np.array([0, 30, 45, 359, 360]), "days since 2000-01-01", "360_day")
    np.testing.assert_allclose(year, [0, 30 / 360, 45 / 360, 359 / 360, 0], atol=1e-12)
    for calendar in ("all_leap", "366_day"):
        _, year = phases(np.array([365, 366]), "days since 2001-01-01", calendar)
        np.testing.assert_allclose(year, [365 / 366, 0], atol=1e-12)
    for calendar, want in (("julian", 365 / 366), ("proleptic_gregorian", 0.0), ("standard", 0.0),
                           ("gregorian", 0.0)):
        np.testing.assert_allclose(phases(np.array([365]), "days since 1900-01-01", calendar)[1], [want], atol=1e-12)
    np.testing.assert_allclose(phases(np.array([365]), "days since 1500-01-01", "standard")[1], [365 / 366])
    np.testing.assert_allclose(phases(np.array([365]), "days since 1500-01-01", "proleptic_gregorian")[1], [0.0])
    # Hours, a leap year (2000) then a common one, and a reference time in another zone (00:00 at
    # +01:00 is 23:00 UTC the day before).
    day, year = phases(np.array([6, 24 * 366 + 12]), "hours since 2000-01-01 00:00:00", "standard")
    np.testing.assert_allclose(day, [0.25, 0.5], atol=1e-12)
    np.testing.assert_allclose(year, [0.25 / 366, 0.5 / 365], atol=1e-12)
    day, year = phases(np.array([0]), "hours since 2001-01-01 00:00 +01:00", "standard")
    np.testing.assert_allclose([day[0], year[0]], [23 / 24, (365 + 23 / 24) / 366], atol=1e-12)


def test_an_unknown_calendar_is_refused_naming_the_variable(store, tmp_path):
    import numpy as np

    path = _store_with_time(store, tmp_path / "mars.zarr", np.arange(24), "hours since 2000-01-01", "mars")
    args = forecast.build_parser().parse_args(["--store", path, "--inputs", "t2m", "--time-features"])
    with pytest.raises(SystemExit, match=r"^forecast: --time-features: time has calendar 'mars', not a CF calendar "
                                         r"this recipe knows \(standard, gregorian, proleptic_gregorian, julian, "
                                         r"noleap, 365_day, all_leap, 366_day, 360_day\)$"):
        forecast.ForecastTask(args, common.Dist())
    # Without --time-features the calendar is not read.
    args = forecast.build_parser().parse_args(["--store", path, "--inputs", "t2m"])
    assert forecast.ForecastTask(args, common.Dist()).time_table is None
    # A date the calendar does not have, and units that are no CF time.
    for units, calendar, message in (("days since 2001-02-29", "noleap", r"time's units 'days since 2001-02-29' name "
                                      r"a date the noleap calendar does not have"),
                                     ("months since 2000-01-01", None, r"time has units 'months since 2000-01-01'; "
                                      r"need '<unit> since <date>'")):
        path = _store_with_time(store, tmp_path / f"bad{calendar}.zarr", np.arange(24), units, calendar)
        args = forecast.build_parser().parse_args(["--store", path, "--inputs", "t2m", "--time-features"])
        with pytest.raises(SystemExit, match=message):
            forecast.ForecastTask(args, common.Dist())


@pytest.mark.parametrize("extra,message", [
    (["--lead", "-1"], r"--lead must be at least 1"),
    (["--lead", "0"], r"--lead must be at least 1"),
    (["--decoder-channels", "32,16,8"], r"--decoder-channels must be comma-separated integers of at least 16, "
                                        r"got '32,16,8'"),
    (["--decoder-channels", "32,,16"], r"--decoder-channels must be comma-separated integers"),
    (["--decoder-channels", "32,16"], r"--decoder-channels needs 3 numbers"),
    (["--batch-size", "32"], r"the training split holds 20 samples, fewer than one batch of 32"),
])
def test_bad_arguments_are_refused_with_a_message(store, extra, message):
    args = ["--store", store, "--inputs", "t2m", "--steps", "2", "--no-flops", *SMALL]
    for i in range(0, len(extra), 2):  # replace SMALL's value where it has the option
        if extra[i] in args:
            args[args.index(extra[i]) + 1] = extra[i + 1]
        else:
            args += extra[i:i + 2]
    with pytest.raises(SystemExit, match=message):
        run(args)
