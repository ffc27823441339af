"""The segmentation recipe's building blocks (zfeed.recipes.segment_models, segment_losses,
segment_optim): hand-computed loss, IoU, LARC and gradient-lag values, model shapes (channels-last
too), mixed precision, and a short training run on zfeed-read CAM5-like data whose loss must fall.
The full claim (cyclone and river IoU above a background-only predictor) is
``python -m zfeed.recipes.segment_smoke`` (minutes on CPU)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("segmentation_models_pytorch")

from zfeed.recipes.segment_losses import (ConfusionMatrix, class_frequencies, class_weights,  # noqa: E402
                                          label_counts, per_sample_iou, weighted_cross_entropy)
from zfeed.recipes.segment_models import build_model  # noqa: E402
from zfeed.recipes.segment_optim import LARC, GradientLag, MixedPrecision  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- losses and metrics

def test_class_weights_by_hand():
    freq = class_frequencies(torch.tensor([81, 1, 16]))
    assert torch.allclose(freq, torch.tensor([81, 1, 16], dtype=torch.float64) / 98)
    f = torch.tensor([0.81, 0.01, 0.16])
    w = class_weights(f, exponent=0.5)
    assert torch.allclose(w, torch.tensor([1 / 0.9, 10.0, 2.5]), rtol=1e-6)
    assert torch.allclose(class_weights(f, 0.5, normalize="min"), torch.tensor([1.0, 9.0, 2.25]), rtol=1e-6)
    assert torch.allclose(class_weights(f, 0.5, normalize="mean"),
                          torch.tensor([1 / 0.9, 10.0, 2.5]) / ((1 / 0.9 + 10 + 2.5) / 3), rtol=1e-6)
    # "pixels": sum_c f_c w_c = 1 with f renormalized to sum 1: (0.81/0.9 + 0.1 + 0.4) / 0.98 = 1.4 / 0.98
    assert torch.allclose(class_weights(f, 0.5, normalize="pixels"), torch.tensor([1 / 0.9, 10.0, 2.5]) * 0.98 / 1.4,
                          rtol=1e-6)
    # DeepCAM's published weights
    deepcam = class_weights([0.9863, 0.000458, 0.0133], exponent=0.125)
    assert [round(float(x), 2) for x in deepcam] == [1.00, 2.61, 1.72]
    assert label_counts(torch.tensor([[0, 2, 2], [1, 0, 0]])).tolist() == [3, 1, 2]


def test_weighted_cross_entropy_by_hand():
    # pixel 0: logits (0, 0, 0), label 1 -> CE log 3; pixel 1: logits (2, 0, 0), label 0 -> log(1 + 2 e^-2)
    logits = torch.tensor([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]]).reshape(1, 3, 1, 2)
    labels = torch.tensor([[[1, 0]]])
    weights = torch.tensor([1.0, 4.0, 2.0])
    expected = (4 * math.log(3) + 1 * math.log(1 + 2 * math.exp(-2))) / 2      # mean over pixels
    assert weighted_cross_entropy(logits, labels, weights).item() == pytest.approx(expected, rel=1e-6)
    assert weighted_cross_entropy(logits, labels).item() == pytest.approx(
        (math.log(3) + math.log(1 + 2 * math.exp(-2))) / 2, rel=1e-6)
    # bf16 logits are computed in float32
    assert weighted_cross_entropy(logits.bfloat16(), labels, weights).dtype == torch.float32


def test_confusion_matrix_iou_by_hand():
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 0, 0]).reshape(2, 2, 2)
    preds = torch.tensor([0, 1, 1, 1, 2, 0, 0, 0]).reshape(2, 2, 2)
    cm = ConfusionMatrix(3)
    cm.update(preds, labels)
    assert cm.matrix.tolist() == [[3, 1, 0], [0, 2, 0], [1, 0, 1]]
    # IoU: class 0 3 / (3 + 1 + 1); class 1 2 / (2 + 1 + 0); class 2 1 / (1 + 0 + 1)
    assert cm.iou().tolist() == pytest.approx([3 / 5, 2 / 3, 1 / 2])
    assert cm.mean_iou() == pytest.approx((3 / 5 + 2 / 3 + 1 / 2) / 3)
    # logits work too (argmax over classes), and matrices add up like an all-reduce would
    logits = torch.nn.functional.one_hot(preds, 3).permute(0, 3, 1, 2).float()
    other = ConfusionMatrix(3)
    other.update(logits, labels)
    total = ConfusionMatrix(3)
    total.matrix = cm.matrix + other.matrix
    assert total.iou().tolist() == pytest.approx([3 / 5, 2 / 3, 1 / 2])
    assert cm.all_reduce() is cm                                       # no process group: no-op
    # background everywhere: IoU 0 for the other classes
    bg = ConfusionMatrix(3)
    bg.update(torch.zeros_like(labels), labels)
    assert bg.iou().tolist() == pytest.approx([4 / 8, 0.0, 0.0])
    # a class in neither labels nor predictions has no IoU, and the mean skips it
    one = ConfusionMatrix(3)
    one.update(torch.tensor([0, 1]), torch.tensor([0, 0]))
    iou = one.iou()
    assert iou[0] == pytest.approx(0.5) and iou[1] == 0 and math.isnan(iou[2])
    assert one.mean_iou() == pytest.approx(0.25)


def test_per_sample_iou_deepcam():
    labels = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    preds = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0]])
    # sample 0: class 0 1/2, class 1 2/3, class 2 absent -> 1; sample 1: 1, 1, 1
    assert per_sample_iou(preds, labels).tolist() == pytest.approx([(0.5 + 2 / 3 + 1) / 3, 1.0])


# ---------------------------------------------------------------- LARC

def _sgd_larc(eta, mode, wd=0.1, lr=0.5):
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))                   # ||w|| = 5
    z = torch.nn.Parameter(torch.zeros(2))                             # zero norm: skipped
    w.grad = torch.tensor([0.6, 0.8])                                  # ||g|| = 1
    z.grad = torch.tensor([1.0, 1.0])
    opt = LARC(torch.optim.SGD([w, z], lr=lr, weight_decay=wd), eta=eta, mode=mode)
    opt.step()
    assert opt.param_groups[0]["weight_decay"] == wd                   # restored after the step
    return w.detach(), z.detach()


def test_larc_update_equals_formula():
    trust = 0.002 * 5 / (1 + 0.1 * 5)                                  # eta ||w|| / (||g|| + wd ||w||)
    g = torch.tensor([0.6, 0.8]) + 0.1 * torch.tensor([3.0, 4.0])      # g + wd w = (0.9, 1.2)
    w, z = _sgd_larc(0.002, "clip")
    assert torch.allclose(w, torch.tensor([3.0, 4.0]) - 0.5 * trust * g, atol=1e-7)
    assert torch.allclose(w, torch.tensor([2.997, 3.996]), atol=1e-6)
    assert torch.allclose(z, torch.tensor([-0.5, -0.5]))               # plain SGD, no decay
    # clip at 1: eta = 1 gives trust 3.33 -> factor 1
    w, _ = _sgd_larc(1.0, "clip")
    assert torch.allclose(w, torch.tensor([3.0, 4.0]) - 0.5 * g, atol=1e-6)
    # apex's clip: min(trust / lr, 1)
    w, _ = _sgd_larc(0.002, "clip_lr")
    assert torch.allclose(w, torch.tensor([3.0, 4.0]) - 0.5 * (trust / 0.5) * g, atol=1e-7)
    # unclipped
    w, _ = _sgd_larc(1.0, "scale")
    assert torch.allclose(w, torch.tensor([3.0, 4.0]) - 0.5 * (5 / 1.5) * g, atol=1e-5)


def test_larc_with_grad_scaler_and_adam():
    model = torch.nn.Linear(4, 2)
    opt = LARC(torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.01))
    amp = MixedPrecision("fp16", device_type="cpu")
    assert amp.scaler.is_enabled()
    before = [p.detach().clone() for p in model.parameters()]
    amp.backward(model(torch.ones(3, 4)).pow(2).sum())
    amp.step(opt)
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert "scaler" in amp.state_dict()


# ---------------------------------------------------------------- gradient lag

def test_gradient_lag_sequence_by_hand():
    # y = w x, loss (w x - t)^2, g = 2 x (w x - t); SGD lr 0.1; w0 = 1
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    lag = GradientLag([w], opt, lag=1)
    data = [(1.0, 3.0), (2.0, 1.0), (1.0, 0.0)]
    seen, applied = [], []
    for x, t in data:
        opt.zero_grad()
        seen.append(w.item())
        ((w * x - t) ** 2).sum().backward()
        applied.append(lag.step())
    # step 0: g0 = 2(1 - 3) = -4 at w = 1, no update; step 1: g1 = 4(2 - 1) = 4 at w = 1,
    # apply g0 -> 1.4; step 2: g2 = 2(1.4) = 2.8 at w = 1.4, apply g1 -> 1.0; flush: apply g2 -> 0.72
    assert seen == pytest.approx([1.0, 1.0, 1.4])
    assert applied == [False, True, True]
    assert w.item() == pytest.approx(1.0)
    state = lag.state_dict()
    assert state["pending"][0].tolist() == pytest.approx([2.8])
    assert lag.flush() and w.item() == pytest.approx(0.72)
    # lag 0 is the plain sequence: 1 -> 1.4 -> 1.4 - 0.1 * 4 (2.8 - 1) = 0.68 -> 0.68 - 0.1 * 2 * 0.68
    w0 = torch.nn.Parameter(torch.tensor([1.0]))
    opt0 = torch.optim.SGD([w0], lr=0.1)
    lag0 = GradientLag([w0], opt0, lag=0)
    for x, t in data:
        opt0.zero_grad()
        ((w0 * x - t) ** 2).sum().backward()
        assert lag0.step()
    assert w0.item() == pytest.approx(0.68 - 0.1 * 2 * 0.68)


def test_gradient_lag_resume():
    def make():
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 1)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        return m, o, GradientLag(m.parameters(), o)
    xs = [torch.full((2, 3), float(i)) for i in range(5)]

    def steps(m, o, lag, batch):
        for x in batch:
            o.zero_grad()
            m(x).sum().backward()
            lag.step()
    m, o, lag = make()
    steps(m, o, lag, xs)
    m2, o2, lag2 = make()
    steps(m2, o2, lag2, xs[:2])
    state = (m2.state_dict(), o2.state_dict(), lag2.state_dict())
    m3, o3, lag3 = make()
    m3.load_state_dict(state[0]), o3.load_state_dict(state[1]), lag3.load_state_dict(state[2])
    steps(m3, o3, lag3, xs[2:])
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m3.parameters()))


# ---------------------------------------------------------------- models and precision

@pytest.mark.parametrize("name,options", [
    ("deeplabv3plus", {"encoder": "resnet18", "decoder_channels": 32}),
    ("tiramisu", {"growth_rate": 4, "layers": (2, 2, 2), "bottleneck_layers": 2, "first_channels": 8}),
])
@pytest.mark.parametrize("channels_last", [False, True])
def test_models_shape(name, options, channels_last):
    torch.manual_seed(0)
    model = build_model(name, in_channels=16, classes=3, channels_last=channels_last, **options)
    for h, w in ((64, 96), (40, 60)):                                  # the second needs padding
        x = torch.randn(2, 16, h, w)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = model(x)
        assert y.shape == (2, 3, h, w)
        assert torch.isfinite(y).all()
    y.float().mean().backward()


def test_model_options():
    with pytest.raises(ValueError):
        build_model("unet")
    t = build_model("tiramisu", growth_rate=4, layers=(1, 2), bottleneck_layers=1, first_channels=8, in_channels=5,
                    classes=2)
    assert t(torch.randn(1, 5, 16, 24)).shape == (1, 2, 16, 24)


def test_mixed_precision_cpu():
    model = torch.nn.Conv2d(16, 3, 1)
    x = torch.randn(1, 16, 4, 4)
    bf16 = MixedPrecision("bf16", device_type="cpu")
    assert not bf16.scaler.is_enabled()
    with bf16.autocast():
        assert model(x).dtype == torch.bfloat16
    with MixedPrecision("fp32", device_type="cpu").autocast():
        assert model(x).dtype == torch.float32
    with pytest.raises(ValueError):
        MixedPrecision("fp8")


# ---------------------------------------------------------------- a short run on zfeed batches

CHANNELS = ["TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT", "TS",
            "TREFHT", "Z1000", "Z200", "ZBOT"]


def _zfeed_exe() -> str:
    exe = Path(sys.executable).parent / "zfeed"
    return str(exe) if exe.exists() else "zfeed"


def test_short_training_on_zfeed_batches(tmp_path):
    """Loader labels (int64 [batch, lat, lon]) into the weighted loss; with LARC(Adam) and gradient
    lag the loss of a small Tiramisu falls well below its start within 30 steps, and the metric path
    runs. (The IoU claim: python -m zfeed.recipes.segment_smoke.)"""
    import zfeed
    from zfeed.torch import to_torch
    store = str(tmp_path / "cam5.zarr")
    subprocess.run([_zfeed_exe(), "synth", "cam5", store, "--lat", "32", "--lon", "48", "--times", "16", "-q"],
                   check=True)
    subprocess.run([_zfeed_exe(), "stats", store, "--variables", ",".join(CHANNELS)], check=True,
                   stdout=subprocess.DEVNULL)
    loader = zfeed.Loader(store, inputs=CHANNELS, targets=["labels"], lead=0, batch_size=4, seed=0)
    batches = [to_torch(b) for b in loader]
    batches = [(b["inputs"].clone(), b["targets"].clone()) for b in batches]
    x0, y0 = batches[0]
    assert x0.shape == (4, 16, 32, 48) and y0.shape == (4, 32, 48) and y0.dtype == torch.int64
    counts = sum(label_counts(y) for _, y in batches)
    assert counts[1] > 0 and counts[2] > 0
    weights = class_weights(class_frequencies(counts), exponent=0.5, normalize="pixels")
    torch.manual_seed(0)
    model = build_model("tiramisu", channels_last=True, growth_rate=8, layers=(2, 2), bottleneck_layers=2,
                        first_channels=16, dropout=0.0)
    opt = LARC(torch.optim.Adam(model.parameters(), lr=3e-3), eta=0.002)
    lag = GradientLag(model.parameters(), opt)
    losses = []
    for step in range(30):
        x, y = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = weighted_cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y, weights)
        loss.backward()
        lag.step()
        losses.append(loss.item())
    assert lag.updates == 29
    assert sum(losses[-4:]) / 4 < 0.5 * losses[0], losses
    cm = ConfusionMatrix(3)
    model.eval()
    with torch.no_grad():
        for x, y in batches:
            cm.update(model(x), y)
    assert int(cm.matrix.sum()) == len(batches) * 4 * 32 * 48
    assert cm.iou()[0] > 0.5
