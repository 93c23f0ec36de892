"""How much data does a mortality stay need? The shipped model on validation stays, data removed.

    .venv/bin/python -m benchmarks.sufficiency_study [--model models/mortality/1.2.0]
        [--data ../shared/data/physionet2012] [--out docs/sufficiency-mortality]

Reads PhysioNet 2012 with the model's feature set (the converter's own reader and cleaning),
takes the validation stays exactly as the converter splits them (15% of sets a+b by RecordID,
seed 0, stratified), and runs the exported ONNX graph through the shared tensorize path
(`scehr.schemas.tensorize.discretize`, the manifest's normalizer and static imputer, channels never
seen in training treated as not observed, as the service does). Four ways of removing data,
each at several levels, seeded:

- observations: keep n random observations of each stay's window;
- channels: keep k random variables of those the stay observed;
- hours covered: keep only the last h hours of the window (recent data, short span);
- hours since last: keep only the window's first 48 − g hours (long span, stale data).

Descriptors (ICU type, height) are always kept: they are not measurements over time
(`scehr.schemas.sufficiency.DESCRIPTORS`). For each level it prints AUROC, ECE and the median
|risk change| against the full stay, then chooses the model's minimum on validation (the
least data at which AUROC stays within `AUROC_DROP` of the full stays' and ECE at most
`MAX_ECE`) and reports it on the test set (set c): stays kept, AUROC and ECE on them. Writes
`<out>.json` (the figures and the chosen `DataMinimum`) and `<out>.png`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scehr.schemas.contract import (  # noqa: E402
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    OUTPUT_ANCHOR_LOGITS,
    OUTPUT_PROBABILITY,
)
from scehr.schemas.featureset import FeatureSet  # noqa: E402
from scehr.schemas.manifest import Manifest, load_manifest  # noqa: E402
from scehr.schemas.sufficiency import (  # noqa: E402
    DataMinimum,
    SplitFigures,
    shortfalls,
    summarize,
)
from scehr.schemas.tensorize import Normalizer, Observations, StaticImputer, discretize  # noqa: E402
from scehr.training.sufficiency import (  # noqa: E402
    AUROC_DROP,
    LEVELS,
    MAX_ECE,
    choose,
    data_minimum,
    degrade,
    figures,
    rule_text,
)

SEED = 0


class Model:
    """The exported graph run with ONNX Runtime on Observations, as the service builds them."""

    def __init__(self, folder: Path) -> None:
        import onnxruntime as ort

        self.m: Manifest = load_manifest(folder / "manifest.json")
        self.fs = FeatureSet.from_dict(self.m.feature_set)
        self.normalizer = Normalizer.from_dict(self.m.normalizer)
        self.static = (StaticImputer.from_dict(self.m.static)
                       if self.m.encoder.uses_static and self.m.static else None)
        self.neutral = np.array([self.m.coverage.get(v, 1.0) <= 0.0
                                 for v in self.fs.variable_ids])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / "model.onnx"), opts,
                                            providers=["CPUExecutionProvider"])

    def risk(self, obs: Observations, static_raw: np.ndarray) -> np.ndarray:
        """Class-0 risk per stay, each stay's window ending where the feature set's does."""
        end = np.full(obs.n_stays, float(self.fs.window_hours or self.fs.max_hours))
        return self.risks(obs, static_raw, end)[:, 0]

    def risks(self, obs: Observations, static_raw: np.ndarray, end: np.ndarray) -> np.ndarray:
        """[stays, classes] calibrated risks, stay i's window ending at `end[i]` hours."""
        obs = obs.take(~self.neutral[obs.channel])
        x, lengths = discretize(obs, self.fs, end)
        x = self.normalizer.transform(x, lengths)
        probs, margins = [], []
        for a in range(0, len(x), 256):
            feed = {INPUT_X: x[a:a + 256], INPUT_LENGTHS: lengths[a:a + 256].astype(np.int64)}
            if self.static is not None:
                feed[INPUT_STATIC] = self.static.transform(static_raw[a:a + 256])
            logits, p = self.session.run([OUTPUT_ANCHOR_LOGITS, OUTPUT_PROBABILITY], feed)
            probs.append(p)
            margins.append(logits[:, :, 0] - logits[:, :, 1])
        p = np.concatenate(probs).astype(np.float64)
        mg = np.concatenate(margins).astype(np.float64)
        return np.stack([c.calibration.apply(p[:, k], mg[:, k])
                         for k, c in enumerate(self.m.classes)], axis=1)


def load(src: Path, fs: FeatureSet) -> dict[str, tuple[Observations, np.ndarray, np.ndarray]]:
    """{"val": ..., "test": ...}: (observations, static_raw [n, 2], labels) per split."""
    from scehr.training.data.layout import split_groups
    from scehr.training.data.physionet2012 import read_set

    sets = {n: read_set(src, n, fs=fs, progress=False) for n in ("a", "b", "c")}

    def pack(parts: list) -> tuple[Observations, np.ndarray, np.ndarray, np.ndarray]:
        off, cols = 0, []
        for s in parts:
            o = s.obs
            cols.append((o.stay + off, o.channel, o.time, o.value))
            off += o.n_stays
        obs = Observations(*(np.concatenate(c) for c in zip(*cols, strict=True)), off)
        demo = np.concatenate([s.demographics[["age", "sex_male"]].to_numpy(np.float64)
                               for s in parts])
        ids = np.concatenate([s.record_ids for s in parts]).astype(str)
        return obs, demo, np.concatenate([s.labels for s in parts]), ids

    obs, demo, y, ids = pack([sets["a"], sets["b"]])
    val = split_groups(ids, 0.15, SEED, y)
    test = pack([sets["c"]])
    return {"val": (subset(obs, np.flatnonzero(val)), demo[val], y[val]),
            "test": test[:3]}


def subset(obs: Observations, stays: np.ndarray) -> Observations:
    """The observations of `stays`, renumbered 0..len(stays)-1."""
    new = np.full(obs.n_stays, -1)
    new[stays] = np.arange(len(stays))
    keep = new[obs.stay] >= 0
    o = obs.take(keep)
    return Observations(new[o.stay], o.channel, o.time, o.value, len(stays))


def study(model: Model, obs: Observations, static_raw: np.ndarray, y: np.ndarray
          ) -> dict[str, list[dict[str, float]]]:
    window = float(model.fs.window_hours or model.fs.max_hours)
    full = model.risk(obs, static_raw)
    out: dict[str, list[dict[str, float]]] = {"full": [figures(y, full)]}
    for how, levels in LEVELS.items():
        rows = []
        for level in levels:
            d = degrade(obs, model.fs, how, level, window, np.random.default_rng(SEED))
            r = model.risk(d, static_raw)
            rows.append({"level": level, **figures(y, r),
                         "median_abs_risk_change": float(np.median(np.abs(r - full)))})
            print(f"  {how:>17} {level:>5g}: AUROC {rows[-1]['auroc']:.3f}  ECE "
                  f"{rows[-1]['ece']:.3f}  median |Δrisk| "
                  f"{rows[-1]['median_abs_risk_change']:.3f}", flush=True)
        out[how] = rows
    return out


def on_split(model: Model, minimum: DataMinimum, obs: Observations, static_raw: np.ndarray,
             y: np.ndarray) -> SplitFigures:
    window = float(model.fs.window_hours or model.fs.max_hours)
    risk = model.risk(obs, static_raw)
    summ = summarize(obs, np.full(obs.n_stays, window), model.fs)
    kept = np.array([not shortfalls(s, minimum) for s in summ])
    f = figures(y[kept], risk[kept])
    return SplitFigures(n=len(y), kept=int(kept.sum()), auroc=round(f["auroc"], 4),
                        ece=round(f["ece"], 4), auroc_all=round(figures(y, risk)["auroc"], 4),
                        outcome_rate_kept=round(float(y[kept].mean()), 4),
                        outcome_rate_abstained=round(float(y[~kept].mean()), 4)
                        if (~kept).any() else None)


def write_report(model: Model, res: dict[str, list[dict[str, float]]],
                 pick: dict[str, float | None], minimum: DataMinimum, out: Path) -> None:
    """Print the chosen minimum's validation and test figures and write `OUT.json` (the study,
    the choice and the DataMinimum a reissued manifest takes)."""
    print("validation:", minimum.validation.model_dump(), flush=True)
    print("test:", minimum.test.model_dump(), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(
        {"model": f"{model.m.name} {model.m.version}", "validation_study": res,
         "chosen": pick, "data_minimum": minimum.model_dump()}, indent=1) + "\n")


def plot(res: dict[str, list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(LEVELS)
    fig, axes = plt.subplots(2, 4, figsize=(14, 6), sharey="row")
    for j, how in enumerate(names):
        lv = [r["level"] for r in res[how]]
        for i, key in enumerate(("auroc", "ece")):
            ax = axes[i, j]
            ax.plot(lv, [r[key] for r in res[how]], "o-")
            ax.axhline(res["full"][0][key], color="grey", ls="--", lw=1, label="full stays")
            if key == "auroc":
                ax.axhline(res["full"][0][key] - AUROC_DROP, color="red", ls=":", lw=1,
                           label=f"full − {AUROC_DROP}")
            else:
                ax.axhline(MAX_ECE, color="red", ls=":", lw=1, label=f"ECE {MAX_ECE}")
            ax.set_xscale("log" if how in ("observations", "channels") else "linear")
            ax.set_xlabel(how.replace("_", " "))
            if j == 0:
                ax.set_ylabel(key.upper())
                ax.legend(fontsize=7)
    fig.suptitle("Validation AUROC and ECE as data is removed (mortality)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "mortality" / "1.2.0")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" /
                    "physionet2012")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "sufficiency-mortality")
    args = ap.parse_args(argv)
    model = Model(args.model)
    print(f"sufficiency study: {model.m.name} {model.m.version}; reading {args.data}",
          flush=True)
    splits = load(args.data, model.fs)
    obs, static_raw, y = splits["val"]
    print(f"validation: {len(y)} stays, {int(y.sum())} with the outcome", flush=True)
    res = study(model, obs, static_raw, y)
    pick = choose(res)
    print("chosen on validation:", pick, flush=True)
    minimum = data_minimum(
        pick, rule_text(f"validation, {len(y)} stays; benchmarks/sufficiency_study.py"),
        "docs/sufficiency.md")
    minimum.validation = on_split(model, minimum, obs, static_raw, y)
    minimum.test = on_split(model, minimum, *splits["test"])
    write_report(model, res, pick, minimum, args.out)
    plot(res, Path(f"{args.out}.png"))
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
