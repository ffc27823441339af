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
