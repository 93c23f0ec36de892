"""Training throughput (stays/s): training.fit's loop against a plain PyTorch DataLoader loop.

Model: the paper's mortality LSTM (bi-LSTM 8+8 -> LSTM 16, dropout 0.3) with CBCE + SCR
(λ = 0.007), batch 256, T = 48, F = 76, on synthetic tensors of realistic size. Both loops train
the same model from the same initial weights on the same (already normalised) data:

- ours: training.fit's loop (contiguous tensors, batches are index slices of them), timed step
  by step with the same calls as `scehr.training.fit.fit`, and then `fit` itself for a few epochs
  (its `stays_per_second` counts training steps only, not the per-epoch validation pass);
- plain: a `torch.utils.data.DataLoader` over a numpy-backed Dataset (per-item numpy arrays,
  default collate converts each batch to tensors), the loop most tutorials write.

The two loops are timed interleaved, one step each in turn, so both see the same background
load on a shared machine; medians of per-step times are the headline.
Then a torch.profiler pass over a few steps of each says where the time goes.

    .venv/bin/python benchmarks/train_throughput.py [--stays 4000] [--steps 120] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scehr.training.config import TrainConfig
from scehr.training.fit import Prepared, TensorSplit, build_model, fit, seed_everything
from scehr.training.losses import build_loss

T, F, S = 48, 76, 4
PHASES = ("data", "forward", "loss", "backward", "optimizer")


def synthetic(n: int, seed: int) -> dict[str, np.ndarray]:
    """Normalised-looking values, 0/1 masks, full 48-bin stays, ~13% positives."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, T, F), dtype=np.float32)
    x[:, :, 59:] = rng.random((n, T, F - 59), dtype=np.float32) < 0.3
    return {"x": x, "lengths": np.full(n, T, dtype=np.int64),
            "static": rng.standard_normal((n, S), dtype=np.float32),
            "y": (rng.random((n, 1)) < 0.13).astype(np.float32)}


def tensor_split(a: dict[str, np.ndarray]) -> TensorSplit:
    return TensorSplit(torch.from_numpy(a["x"]), torch.from_numpy(a["lengths"]),
                       torch.from_numpy(a["static"]), torch.from_numpy(a["y"]),
                       [str(i) for i in range(len(a["y"]))])


class NumpyStays(Dataset):
    """What a plain loop reads from: numpy arrays, one stay per __getitem__."""

    def __init__(self, a: dict[str, np.ndarray]) -> None:
        self.a = a

    def __len__(self) -> int:
        return len(self.a["y"])

    def __getitem__(self, i: int) -> tuple[np.ndarray, ...]:
        return self.a["x"][i], self.a["lengths"][i], self.a["static"][i], self.a["y"][i]


def run_ours(cfg: TrainConfig, train: TensorSplit, val: TensorSplit) -> tuple[float, float]:
    """(training stays/s, mean seconds per epoch including the validation pass)."""
    data = Prepared(train=train, val=val, test=val, calib=None, normalizer=None,  # type: ignore[arg-type]
                    static_imputer=None, label_names=["in_hospital_mortality"],  # type: ignore[arg-type]
                    coverage={}, raw={})
    res = fit(cfg, data, echo=False)
    return res.stays_per_second, float(np.mean([r["seconds"] for r in res.history]))


def plain_steps(cfg: TrainConfig, a: dict[str, np.ndarray], epochs: int,
                annotate: bool = False) -> Iterator[int]:
    """The plain loop as a generator: yields the batch size after each training step."""
    gen = seed_everything(cfg.seed)
    model = build_model(cfg, F, S, 1)
    crit = build_loss(cfg.loss, cfg.lam, temperature=cfg.temperature)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = DataLoader(NumpyStays(a), batch_size=cfg.batch_size, shuffle=True, generator=gen)
    model.train()
    for _ in range(epochs):
        it = iter(loader)
        while True:
            with _rf("data", annotate):
                try:
                    x, lengths, static, y = next(it)
                except StopIteration:
                    break
            _step(model, crit, opt, cfg, x, lengths, static, y, annotate)
            yield len(y)


def _rf(name: str, on: bool) -> Any:
    return record_function(name) if on else nullcontext()


def _step(model: nn.Module, crit: nn.Module, opt: torch.optim.Optimizer, cfg: TrainConfig,
          x: torch.Tensor, lengths: torch.Tensor, static: torch.Tensor, y: torch.Tensor,
          prof: bool) -> float:
    with _rf("forward", prof):
        z, logits = model(x, lengths, static)
    with _rf("loss", prof):
        loss, _ = crit(z, logits, y)
    with _rf("backward", prof):
        opt.zero_grad(set_to_none=True)
        loss.backward()
    with _rf("optimizer", prof):
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
    return loss.item()


def ours_steps(cfg: TrainConfig, train: TensorSplit, epochs: int,
               annotate: bool = False) -> Iterator[int]:
    """fit()'s inner loop (same calls as training.fit.fit) as an annotated generator."""
    gen = seed_everything(cfg.seed)
    model = build_model(cfg, F, S, 1)
    crit = build_loss(cfg.loss, cfg.lam, temperature=cfg.temperature)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(train), generator=gen)
        for i in range(0, len(perm), cfg.batch_size):
            with _rf("data", annotate):
                x, lengths, static, y = train.batch(perm[i : i + cfg.batch_size])
            _step(model, crit, opt, cfg, x, lengths, static, y, annotate)
            yield len(y)


def breakdown(name: str, steps: Iterator[int], warmup: int, active: int) -> None:
    """Profile `active` steps after `warmup` unprofiled ones (one-off allocations excluded)."""
    for _ in range(warmup):
        next(steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(active):
            next(steps)
    events = prof.key_averages()
    phase = {e.key: e.cpu_time_total for e in events if e.key in PHASES}
    total = sum(phase.values()) or 1.0
    print(f"\n[{name}] where the time goes over {active} steps (torch.profiler; the profiler "
          "itself adds overhead)")
    for k in PHASES:
        print(f"  {k:<10} {phase.get(k, 0) / 1e3:8.1f} ms  {100 * phase.get(k, 0) / total:5.1f}%")
    print(f"[{name}] top operators by self CPU time")
    ops = sorted((e for e in events if e.key not in PHASES), key=lambda e: -e.self_cpu_time_total)
    for e in ops[:8]:
        print(f"  {e.key:<42} {e.self_cpu_time_total / 1e3:8.1f} ms  x{e.count}")


def interleaved(cfg: TrainConfig, train: TensorSplit, a: dict[str, np.ndarray],
                steps: int) -> dict[str, np.ndarray]:
    """Alternate one step of each loop and time each step (data fetch included).

    On a shared machine background load comes and goes within seconds; alternating step by step
    exposes both loops to the same load, and the median step time ignores the spikes.
    """
    gens = {"ours": ours_steps(cfg, train, 10**6), "plain": plain_steps(cfg, a, 10**6)}
    for g in gens.values():  # warm-up: allocator, oneDNN primitives, thread pool
        for _ in range(3):
            next(g)
    times: dict[str, list[float]] = {k: [] for k in gens}
    for _ in range(steps):
        for k, g in gens.items():
            t0 = time.perf_counter()
            next(g)
            times[k].append(time.perf_counter() - t0)
    return {k: np.array(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stays", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=120, help="interleaved steps per loop")
    ap.add_argument("--fit-epochs", type=int, default=2, help="epochs of the fit() run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--val-stays", type=int, default=1200,
                    help="validation stays scored after every epoch (PhysioNet 2012: 1,200)")
    ap.add_argument("--profile-steps", type=int, default=6)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, torch.set_num_threads({args.threads}) -> "
          f"{torch.get_num_threads()} threads; {args.stays} synthetic stays, T={T}, F={F}, "
          "batch 256, mortality LSTM (bi 8+8 -> 16, dropout 0.3), CBCE + SCR λ=0.007")
    cfg = TrainConfig(task="mortality", loss="cbce", lam=0.007, batch_size=256,
                      epochs=args.fit_epochs, patience=10**6, threads=args.threads,
                      progress=False, tsne=False)
    a = synthetic(args.stays, 0)
    train, val = tensor_split(a), tensor_split(synthetic(args.val_stays, 1))

    t = interleaved(cfg, train, a, args.steps)
    bs = cfg.batch_size
    print(f"\ninterleaved, {args.steps} steps each (stays/s = 256 / step time):")
    print(f"  {'loop':<22} {'median':>9} {'mean':>9} {'best':>9}")
    for k, label in (("ours", "training.fit loop"), ("plain", "plain DataLoader loop")):
        v = t[k]
        print(f"  {label:<22} {bs / np.median(v):9.1f} {bs * len(v) / v.sum():9.1f} "
              f"{bs / v.min():9.1f}")
    print(f"  ratio ours / plain (median step time) "
          f"{np.median(t['plain']) / np.median(t['ours']):.3f}")
    stays_s, epoch_s = run_ours(cfg, train, val)
    print(f"\ntraining.fit.fit itself, {args.fit_epochs} epochs x {args.stays} stays: "
          f"{stays_s:.1f} stays/s (FitResult.stays_per_second; whole-epoch wall clock, so it "
          "includes any background load)")
    print(f"speed target: 100 epochs (training + validation on {args.val_stays} stays) "
          f"extrapolated from {epoch_s:.2f} s/epoch = {100 * epoch_s / 60:.1f} min "
          f"(target <= 6 min on 2 cores; load average {os.getloadavg()[0]:.1f})")
    breakdown("training.fit loop", ours_steps(cfg, train, 100, annotate=True), 3,
              args.profile_steps)
    breakdown("plain DataLoader loop", plain_steps(cfg, a, 100, annotate=True), 3,
              args.profile_steps)


if __name__ == "__main__":
    main()
