"""The recipes' shared helpers (zfeed.recipes.common): counting FLOPs draws no random numbers of
the training's, and checkpoints and JSON results are written atomically, with the usual
permissions, synced, and leave nothing behind when the write fails."""

from __future__ import annotations

import json
import os
import stat

import pytest

torch = pytest.importorskip("torch")

from zfeed.recipes import common  # noqa: E402


class _Task(common.Task):
    def loss(self, model, batch):
        return model(batch["inputs"]).square().mean()


def test_counting_flops_leaves_the_random_number_generators_alone():
    """The counting pass runs dropout; the training after it draws what it would have drawn
    without the count (so a resumed run, which counts again, stays bit-identical)."""
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)).train()
    batch = {"inputs": torch.ones(3, 4), "samples": 3}
    before = torch.get_rng_state()
    flops = common.count_flops(_Task(), model, batch)
    assert flops and flops > 0
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())
    counted = torch.rand(5)
    torch.set_rng_state(before)
    assert torch.equal(torch.rand(5), counted)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_checkpoints_and_json_get_the_usual_permissions_and_a_synced_directory(tmp_path, monkeypatch, mask):
    old = os.umask(mask)
    try:
        synced = []
        fsync = os.fsync

        def recording_fsync(fd):
            synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
            return fsync(fd)

        monkeypatch.setattr(os, "fsync", recording_fsync)
        common.save_checkpoint(str(tmp_path / "run" / "checkpoint.pt"), {"step": 3})
        assert synced == [False, True]  # the file, then the directory that holds the rename
        common.write_json(str(tmp_path / "run" / "result.json"), {"loss": 0.5})
        assert synced == [False, True, False, True]
        for name in ("checkpoint.pt", "result.json"):
            assert stat.S_IMODE(os.stat(tmp_path / "run" / name).st_mode) == 0o666 & ~mask, name
        assert common.load_checkpoint(str(tmp_path / "run" / "checkpoint.pt")) == {"step": 3}
        assert json.loads((tmp_path / "run" / "result.json").read_text()) == {"loss": 0.5}
    finally:
        os.umask(old)
    assert _umask() == old


class _Interrupting:
    """Ctrl-C in the middle of a write: pickling it (torch.save) or turning it into a number
    (write_json's default=float) raises KeyboardInterrupt."""

    def __reduce__(self):
        raise KeyboardInterrupt

    def __float__(self):
        raise KeyboardInterrupt


def test_a_failed_write_leaves_no_temporary_file_and_the_old_file(tmp_path):
    checkpoint, result = tmp_path / "checkpoint.pt", tmp_path / "result.json"
    common.save_checkpoint(str(checkpoint), {"step": 1})
    common.write_json(str(result), {"step": 1})
    with pytest.raises(KeyboardInterrupt):
        common.save_checkpoint(str(checkpoint), {"step": 2, "model": _Interrupting()})
    with pytest.raises(KeyboardInterrupt):
        common.write_json(str(result), {"step": 2, "loss": _Interrupting()})
    with pytest.raises(TypeError):
        common.write_json(str(result), {"step": 2, "loss": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "result.json"]
    assert common.load_checkpoint(str(checkpoint)) == {"step": 1}
    assert json.loads(result.read_text()) == {"step": 1}


# ---------------------------------------------------------------- values as the Loader decodes them

def _cf_store(path, zarr_format: int):
    """Arrays (time 4, lat 3, lon 5) stored with the CF encodings the Loader decodes, and the
    stored values."""
    import base64
    import struct

    import numpy as np
    import zfeed

    rng = np.random.default_rng(3)
    dims = ["time", "latitude", "longitude"]
    root = zfeed.create_group(str(path), zarr_format=zarr_format)
    stored = {}

    def add(name, values, attributes, fill_value=None):
        root.create_array(name, shape=values.shape, chunks=(1, 3, 5), dtype=values.dtype, data=values,
                          attributes=attributes, fill_value=fill_value, dimension_names=dims)
        stored[name] = values

    packed = rng.integers(-32768, 32767, (4, 3, 5)).astype("int16")
    packed[0, 0, :2] = [-32767, -32768]
    add("packed", packed, {"scale_factor": 0.01, "add_offset": 280.0, "_FillValue": -32767,
                           "missing_value": [-32768]})
    small = rng.integers(-128, 127, (4, 3, 5)).astype("int8")
    small[1, 1, 1] = -1
    add("unsigned", small, {"_Unsigned": "true", "scale_factor": [0.5], "_FillValue": -1})
    floats = rng.standard_normal((4, 3, 5)).astype("float32")
    floats[2, 2, 2] = -9999.0
    if zarr_format == 3:  # xarray's Zarr v3 form of a float _FillValue: the base64 of a double
        add("floats", floats, {"_FillValue": base64.b64encode(struct.pack("<d", -9999.0)).decode()})
    else:  # v2: a float fill_value other than 0 masks by itself
        add("floats", floats, {}, fill_value=-9999.0)
        zeros = floats.copy()
        zeros[0, 0, 0] = 0.0
        add("zeros", zeros, {}, fill_value=0.0)  # zarr-python's default fill value: not a mask
        v2packed = packed.copy()
        add("v2packed", v2packed, {"scale_factor": 0.5}, fill_value=-32767)  # fill_value is the _FillValue
    labels = rng.integers(0, 3, (4, 3, 5)).astype("uint8")
    labels[3, 0, 0] = 255
    add("labels", labels, {"_FillValue": 255} if zarr_format == 3 else {"missing_value": 255})
    return stored


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_validation_reads_decode_as_the_loader_does(tmp_path, zarr_format):
    """read_decoded / read_labels (validation reads the arrays itself) give the Loader's values:
    CF scale and offset, _FillValue and missing_value (NaN; -100 for labels), _Unsigned, the v2
    fill_value rules, float32 at the end."""
    import numpy as np
    import zfeed

    path = tmp_path / "cf.zarr"
    stored = _cf_store(path, zarr_format)
    group = zfeed.open(str(path))
    for name in stored:
        if name == "labels":
            continue
        loader = zfeed.Loader(str(path), inputs=[name], targets=[], lead=0, batch_size=4, shuffle=False,
                              normalize=False, drop_last=False)
        want = next(iter(loader))["inputs"][:, 0]
        got = common.read_decoded(group[name], 0, 4)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want, err_msg=name)
    decoded = common.read_decoded(group["packed"], 0, 1)
    assert np.isnan(decoded[0, 0, :2]).all() and np.isfinite(decoded[0, 0, 2:]).all()
    assert np.isnan(common.read_decoded(group["unsigned"], 1, 2)[0, 1, 1])
    labels = zfeed.Loader(str(path), inputs=["floats"], targets=["labels"], lead=0, batch_size=4, shuffle=False,
                          drop_last=False)
    want = next(iter(labels))["targets"]
    got = common.read_labels(group["labels"], 0, 4)
    np.testing.assert_array_equal(got, want)
    assert got[3, 0, 0] == -100 and got.dtype == np.int64


# ---------------------------------------------------------------- resume: rank 0 decides

class _FakeRanks(common.Dist):
    """A two-process Dist whose all_gather_object answers with what each rank would have seen."""

    def __init__(self, rank: int, seen: list):
        super().__init__(rank=rank, world_size=2)
        self.seen = seen

    def all_gather_object(self, obj):
        out = list(self.seen)
        out[self.rank] = obj
        return out


def test_rank_zero_decides_whether_to_resume(tmp_path):
    present, absent = tmp_path / "ckpt.pt", tmp_path / "elsewhere.pt"
    present.write_bytes(b"x")
    assert common.resume_decision(str(present), common.Dist()) is True
    assert common.resume_decision(str(absent), common.Dist()) is False
    # Rank 1 has a file of that name, rank 0 none: neither resumes.
    assert common.resume_decision(str(present), _FakeRanks(1, [False, True])) is False
    # Rank 0 resumes and rank 1 cannot find the file (a node-local path): every rank stops,
    # naming the rank.
    for rank, seen in ((0, [True, False]), (1, [True, False])):
        path = present if rank == 0 else absent
        with pytest.raises(SystemExit, match=r"exists on rank 0 but not on rank 1: give --checkpoint a path"):
            common.resume_decision(str(path), _FakeRanks(rank, seen))


def test_checkpoints_of_another_recipe_or_other_options_are_refused(tmp_path):
    settings = {"--lr": 0.001, "--gradient-lag": False, "--amp": "none"}
    state = {"task": "forecast", "settings": dict(settings)}
    common.check_checkpoint_settings("c.pt", state, "forecast", settings)
    with pytest.raises(SystemExit, match=r"c\.pt was written by the forecast recipe; this is segment"):
        common.check_checkpoint_settings("c.pt", state, "segment", settings)
    changed = {**settings, "--lr": 0.002, "--gradient-lag": True}
    with pytest.raises(SystemExit, match=r"c\.pt was written with --lr 0\.001 \(this run: 0\.002\); --gradient-lag off "
                                         r"\(this run: on\)"):
        common.check_checkpoint_settings("c.pt", state, "forecast", changed)
    # Older checkpoints hold no settings: they load unchecked; a new option absent from the
    # checkpoint is not a mismatch.
    common.check_checkpoint_settings("c.pt", {"task": "forecast"}, "forecast", changed, log_note=False)
    common.check_checkpoint_settings("c.pt", state, "forecast", {**settings, "--new": 1})


def test_statistics_are_compared_variable_by_variable():
    """A dict setting (the normalization statistics) is refused naming the option and only the
    variables whose values differ, written exactly."""
    saved = {"--stats": common.statistics_setting({"t2m": (280.5, 5.25), "u500": (0.0, 12.0)}), "--lr": 0.001}
    state = {"task": "forecast", "settings": saved}
    common.check_checkpoint_settings("c.pt", state, "forecast", dict(saved))
    now = {**saved, "--stats": common.statistics_setting({"t2m": (280.5, 5.250000001), "u500": (0.0, 12.0)})}
    with pytest.raises(SystemExit, match=r"^c\.pt was written with --stats t2m: mean 280\.5, std 5\.25 \(this run: "
                                         r"mean 280\.5, std 5\.250000001\): resume with the options"):
        common.check_checkpoint_settings("c.pt", state, "forecast", now)


def _steps(seconds, samples, item_bytes=100):
    return {"seconds": list(seconds), "samples": list(samples), "bytes": [n * item_bytes for n in samples],
            "wait": [s / 10 for s in seconds]}


def test_throughput_is_the_jobs_summed_over_the_ranks():
    """Under torchrun samples/s, MB/s and FLOP/s are the job's: per step, each rank's rate summed
    (here rank 1 runs at half rank 0's speed in two steps); rank 0's own rate is kept beside them,
    and the table says which it is."""
    result = common.RunResult(source="zfeed", mode="real", steps=4, samples=16, flops_per_sample=10.0)
    result.steps_by_rank = [_steps([9.0, 1.0, 1.0, 0.5], [4, 4, 4, 4]), _steps([9.0, 2.0, 2.0, 0.5], [4, 4, 4, 4])]
    s = result.summary(warmup=1)
    # steps 1..3: 4/1 + 4/2 = 6, 6, then 4/0.5 + 4/0.5 = 16
    assert s["samples_per_s"]["median"] == pytest.approx(6.0) and s["samples_per_s"]["n"] == 3
    assert s["rank0_samples_per_s"]["median"] == pytest.approx(4.0)
    assert s["mb_per_s"]["median"] == pytest.approx(6.0 * 100 / 1e6)
    assert s["flop_per_s"]["median"] == pytest.approx(60.0)
    assert s["processes"] == 2 and s["samples"] == 16 and s["samples_all_processes"] == 32
    assert s["timed_steps"] == 3 and s["wait_fraction"] == pytest.approx(0.1)
    assert "the job's: each step's rates summed over its 2 processes" in common.summary_table([s])
    # One process: the figures are its own.
    alone = common.RunResult(source="zfeed", mode="real", steps=3, samples=12)
    alone.step_seconds, alone.step_samples = [1.0, 2.0, 1.0], [4, 4, 4]
    alone.step_bytes, alone.wait_seconds = [8, 8, 8], [0.0, 0.0, 0.0]
    s = alone.summary(warmup=0)
    assert s["processes"] == 1 and s["samples_per_s"]["median"] == pytest.approx(4.0)
    assert s["samples_per_s"] == s["rank0_samples_per_s"]
    assert "of the job's one process" in common.summary_table([s])


def test_integer_lists_are_checked():
    assert common.parse_int_list("32, 16,16", "--decoder-channels", minimum=16) == [32, 16, 16]
    for text in (",", "", "32,,16", "a", "32,8"):
        with pytest.raises(SystemExit, match="--decoder-channels must be comma-separated integers of at least 16"):
            common.parse_int_list(text, "--decoder-channels", minimum=16)
