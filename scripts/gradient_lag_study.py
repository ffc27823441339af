#!/usr/bin/env python3
"""Gradient lag's effect on convergence in the segmentation recipe (issue 5), over several seeds.

On the synthetic CAM5 store of the README's segmentation figure (``zfeed synth cam5 --lat 48 --lon
72 --times 120``), the README's short Tiramisu run (growth rate 12, layers 3,3,3, batch 4, 4
epochs, lr 1e-3, one torch thread) is trained with and without ``--gradient-lag`` for each seed
(``--seed``: the model's initialization, dropout and the sample order), and optionally once each
under ``torchrun --nproc_per_node 2`` (gloo; batch 4 per process, so a global batch of 8 and half
the steps: compare those two with each other only). Each run's JSON (``zfeed train segment
--json``) is kept under ``--work``, and a run whose JSON is there is not run again (``--rerun``
runs everything), so an interrupted study continues where it stopped.

Writes ``--json`` (default docs/gradient_lag.json): per run the training loss at every step, the
final step's loss, the mean over the last 10 steps, the losses at steps 30/60/90/120, the held-out
IoU per class and the mean IoU, the wall time; per configuration the mean, standard deviation,
minimum and maximum over the seeds; and ``--plot`` (default docs/gradient_lag.png): the training
loss (running mean over 10 steps) per run, and the held-out IoU per configuration (bars: mean over
seeds, whiskers: min-max, dots: seeds).

    .venv/bin/python scripts/gradient_lag_study.py                  # 5 seeds + 2-process runs
    .venv/bin/python scripts/gradient_lag_study.py --seeds 0 --no-ddp --epochs 1   # quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("background", "cyclone", "river")
MODEL = ["--model", "tiramisu", "--growth-rate", "12", "--tiramisu-layers", "3,3,3"]


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def f3(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def find_zfeed() -> str:
    beside = Path(sys.executable).parent / "zfeed"
    if beside.exists():
        return str(beside)
    found = shutil.which("zfeed")
    if not found:
        raise SystemExit("gradient_lag_study: the zfeed command is not installed (make python)")
    return found


def make_store(args) -> tuple[str, list[str]]:
    store = Path(args.work) / f"cam5_{args.lat}x{args.lon}x{args.times}.zarr"
    command = ["zfeed", "synth", "cam5", str(store), "--lat", str(args.lat), "--lon", str(args.lon),
               "--times", str(args.times)]
    if not store.exists():
        log(f"writing {store}")
        subprocess.run([find_zfeed(), *command[1:], "-q"], check=True)
    return str(store), command


def train_command(args, store: str, seed: int, lag: bool, out: Path, ddp: bool) -> list[str]:
    recipe = ["-m", "zfeed.recipes", "segment", "--store", store, *MODEL, "--batch-size", str(args.batch_size),
              "--epochs", str(args.epochs), "--lr", str(args.lr), "--threads", "1", "--seed", str(seed),
              "--log-every", "30", "--json", str(out)]
    if args.steps:
        recipe += ["--steps", str(args.steps)]
    if lag:
        recipe.append("--gradient-lag")
    if ddp:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *recipe]
    return [sys.executable, *recipe]


def record(doc: dict, config: str, seed: int, lag: bool, ddp: bool, wall: float | None) -> dict:
    (run,) = [r for r in doc["runs"] if r["mode"] == "real"]
    losses = run["losses"]
    val = doc["validation"]
    return {
        "config": config, "seed": seed, "gradient_lag": lag, "world_size": doc["world_size"],
        "steps": run["steps"], "samples_rank0": run["samples"],
        "gradient_lag_updates": run.get("gradient_lag_updates"),
        "final_loss": losses[-1], "last10_loss_mean": statistics.fmean(losses[-10:]),
        "loss_at": {str(s): losses[s - 1] for s in (30, 60, 90, 120) if s <= len(losses)},
        "val_iou": {c: val["iou"][c] for c in CLASSES}, "val_mean_iou": val["mean_iou"], "val_loss": val["loss"],
        "val_samples": val["samples"], "background_only_mean_iou": val["background_only_mean_iou"],
        "weights_identical_across_ranks": len(set(run["weights_sha256_by_rank"])) == 1,
        "wall_s": wall, "losses": losses,
    }


def spread(values: list) -> dict:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0,
            "min": min(v), "max": max(v), "n": len(v)}


METRICS = {
    "final_loss": lambda r: r["final_loss"],
    "last10_loss_mean": lambda r: r["last10_loss_mean"],
    "iou_cyclone": lambda r: r["val_iou"]["cyclone"],
    "iou_river": lambda r: r["val_iou"]["river"],
    "iou_background": lambda r: r["val_iou"]["background"],
    "mean_iou": lambda r: r["val_mean_iou"],
}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for config in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == config]
        out[config] = {name: spread([f(r) for r in mine]) for name, f in METRICS.items()}
        out[config]["seeds"] = [r["seed"] for r in mine]
    return out


def running_mean(values: list[float], n: int = 10) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= n:
            total -= values[i - n]
        out.append(total / min(i + 1, n))
    return out


COLORS = {"no_lag": "#1f77b4", "lag": "#d62728", "ddp2_no_lag": "#17becf", "ddp2_lag": "#ff7f0e"}
LABELS = {"no_lag": "1 process, no lag", "lag": "1 process, --gradient-lag",
          "ddp2_no_lag": "2 processes, no lag", "ddp2_lag": "2 processes, --gradient-lag"}


def plot(path: str, runs: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in runs))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1.25, 1]})
    labelled = set()
    for r in runs:
        c = r["config"]
        ax.plot(range(1, len(r["losses"]) + 1), running_mean(r["losses"]), color=COLORS.get(c), lw=1.2,
                ls="--" if r["world_size"] > 1 else "-", label=None if c in labelled else LABELS.get(c, c))
        labelled.add(c)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (running mean of 10 steps)")
    ax.set_title("training loss, one line per seed", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")

    groups = ["cyclone", "river", "mean"]
    width = 0.8 / max(len(configs), 1)
    in_legend = set()
    for j, c in enumerate(configs):
        mine = [r for r in runs if r["config"] == c]
        for i, g in enumerate(groups):
            vals = [(r["val_mean_iou"] if g == "mean" else r["val_iou"][g]) for r in mine]
            vals = [v for v in vals if v is not None]
            if not vals:
                continue
            x = i + (j - (len(configs) - 1) / 2) * width
            m = statistics.fmean(vals)
            bx.bar(x, m, width * 0.9, color=COLORS.get(c), alpha=0.55,
                   yerr=[[m - min(vals)], [max(vals) - m]], capsize=3,
                   label=None if c in in_legend else LABELS.get(c, c))
            in_legend.add(c)
            bx.scatter([x] * len(vals), vals, color=COLORS.get(c), s=14, zorder=3, edgecolor="black", lw=0.4)
            bx.annotate(f"{m:.3f}", (x, max(vals)), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 3), textcoords="offset points")
    bx.set_xticks(range(len(groups)))
    bx.set_xticklabels(["IoU cyclone", "IoU river", "mean IoU (3 classes)"])
    bx.set_ylim(0, 1)
    bx.set_title("held-out IoU: bars mean over seeds, whiskers min-max, dots seeds", fontsize=9)
    bx.legend(fontsize=7, loc="upper left")
    bx.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4", help="seeds, comma-separated (default 0,1,2,3,4)")
    p.add_argument("--ddp", action=argparse.BooleanOptionalAction, default=True,
                   help="also run with and without the lag under torchrun, 2 processes, the first seed (default on)")
    p.add_argument("--lat", type=int, default=48)
    p.add_argument("--lon", type=int, default=72)
    p.add_argument("--times", type=int, default=120)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps", type=int, default=0, help="stop each run after this many steps (0: the epochs)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--work", default=str(ROOT / "build" / "gradient_lag"), help="store and per-run JSON/logs")
    p.add_argument("--json", default=str(ROOT / "docs" / "gradient_lag.json"))
    p.add_argument("--plot", default=str(ROOT / "docs" / "gradient_lag.png"))
    p.add_argument("--rerun", action="store_true", help="run again even where a run's JSON exists")
    p.add_argument("--date", default=datetime.date.today().isoformat(), help="the date recorded (default today)")
    p.add_argument("--machine", default="", help="a description of the machine, recorded as given")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    Path(args.work).mkdir(parents=True, exist_ok=True)
    store, store_command = make_store(args)

    plan = [(("lag" if lag else "no_lag"), seed, lag, False) for seed in seeds for lag in (False, True)]
    if args.ddp:
        plan += [(("ddp2_lag" if lag else "ddp2_no_lag"), seeds[0], lag, True) for lag in (False, True)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs, started = [], time.perf_counter()
    for i, (config, seed, lag, ddp) in enumerate(plan):
        out = Path(args.work) / f"{config}_seed{seed}.json"
        wall = None
        if out.exists() and not args.rerun:
            log(f"[{i + 1}/{len(plan)}] {config} seed {seed}: kept {out}")
            previous = json.loads(out.read_text())
            wall = previous.get("_study_wall_s")
        else:
            command = train_command(args, store, seed, lag, out, ddp)
            log(f"[{i + 1}/{len(plan)}] {config} seed {seed}: {' '.join(command[1:])}")
            t0 = time.perf_counter()
            with open(out.with_suffix(".log"), "w") as log_file:
                proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.PIPE, text=True, env=env)
                for line in proc.stderr:
                    log_file.write(line)
                    if " step " in line and " loss " in line:
                        log("    " + line.rstrip())
                proc.wait()
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"gradient_lag_study: {config} seed {seed} failed (rc {proc.returncode}); "
                                 f"see {out.with_suffix('.log')}")
            doc = json.loads(out.read_text())
            doc["_study_wall_s"] = wall
            out.write_text(json.dumps(doc, indent=1, default=float))
        r = record(json.loads(out.read_text()), config, seed, lag, ddp, wall)
        runs.append(r)
        done = time.perf_counter() - started
        log(f"    {config} seed {seed}: {r['steps']} steps, final loss {r['final_loss']:.4f} (last 10: "
            f"{r['last10_loss_mean']:.4f}), IoU cyclone {f3(r['val_iou']['cyclone'])} river "
            f"{f3(r['val_iou']['river'])} mean {f3(r['val_mean_iou'])}"
            + (f", {wall:.0f} s" if wall else "") + f"; study at {done:.0f} s")

    summary = summarize(runs)
    import torch

    base = ["zfeed", "train", "segment", "--store", "cam5.zarr", *MODEL, "--batch-size", str(args.batch_size),
            "--epochs", str(args.epochs), "--lr", str(args.lr), "--threads", "1", "--seed", "S"]
    if args.steps:
        base += ["--steps", str(args.steps)]
    document = {
        "what": "gradient lag 1 (--gradient-lag) against none, zfeed train segment, Tiramisu, synthetic CAM5",
        "date": args.date, "machine": args.machine or f"{os.cpu_count()} CPUs, no GPU",
        "torch": torch.__version__, "python": platform.python_version(),
        "store": {"command": " ".join(store_command[:3] + ["cam5.zarr"] + store_command[4:]),
                  "grid": [args.lat, args.lon], "times": args.times},
        "command": " ".join(base) + " [--gradient-lag]",
        "ddp_command": "torchrun --standalone --nproc_per_node=2 -m zfeed.recipes segment ... (same options; "
                       "batch 4 per process, global batch 8, half the steps)" if args.ddp else None,
        "seeds": seeds, "runs_wall_s_total": sum(r["wall_s"] or 0.0 for r in runs),
        "summary": summary, "runs": runs,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(document, indent=1, default=float) + "\n")
    title = (f"zfeed train segment, Tiramisu (growth 12, layers 3,3,3), synthetic CAM5 {args.lat}x{args.lon}x"
             f"{args.times}, batch {args.batch_size}, epochs {args.epochs}, lr {args.lr:g}; seeds {args.seeds}")
    plot(args.plot, runs, title)
    print(f"{'configuration':<14} {'n':>2} {'final loss':>18} {'last-10 loss':>18} {'IoU cyclone':>18} "
          f"{'IoU river':>18} {'mean IoU':>18}")
    for config, s in summary.items():
        cells = [f"{f3(s[m]['mean'])} ± {f3(s[m]['std'])}" for m in
                 ("final_loss", "last10_loss_mean", "iou_cyclone", "iou_river", "mean_iou")]
        print(f"{config:<14} {s['final_loss']['n']:>2} " + " ".join(f"{c:>18}" for c in cells))
    print(f"wrote {args.json} and {args.plot} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
