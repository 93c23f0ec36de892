"""Screened occlusion against exact occlusion on PhysioNet 2012 set C, through the service's code
in-process: fidelity of the top 3 and the CPU per request of each explanation.

    .venv/bin/python benchmarks/explanation_fidelity.py [--model models/mortality/1.3.3] \
        [--screen runs/screen-mortality-1.3.2.json] [--stays 4000] [--timed 300] [--passes 5]

The model is a folder (default: the task's default version in models/index.json); `--screen`
gives it a screen fitted by `python -m scehr.service.screen_fit` (else the model's own). Per
stay of the test split (set C; `data/physionet2012-full`, docs/data.md): the exact top 3
(`explain=full`'s order, occlusion of every observed channel) against the screened top 3
(`explain=top`): the share of stays whose top 3 is the same set, and the same in the same
order, with the observed channels and the exact rows per stay. Then the CPU per request of
one stay alone (prepare + the model's run + the answers, one ONNX Runtime thread, the
service's session) at `explain=basic`, `top` (screened) and `full`'s exact rows read as `top`
(the exact method): each the best of `--passes` passes over the same `--timed` stays, the
kinds interleaved pass by pass, side by side with their ratios to `basic`. Load average
printed before and after. Indicative on a busy machine; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from common import REPO, loadavg
from payloads import real_stays

from scehr.schemas.explanation_screen import ExplanationScreen
from scehr.schemas.payloads import StayPayload
from scehr.service.model import ModelSpec
from scehr.service.pipeline import prepare
from scehr.service.registry import LoadedModel, load_model, read_index, resolve
from scehr.service.responses import predictions
from scehr.service.settings import Settings

TOP = 3


def answer(model: LoadedModel, spec: ModelSpec, stay: StayPayload, explain: str,
           screened: bool) -> Any:
    """One request's work: prepare, run, answers (`explain=top`, screened or exact); a stay
    below the data minimum is scored too (`allow_insufficient`), so every stay compares."""
    p = prepare(spec, [stay], occlusion=explain != "basic", screened=screened)
    assert p.inputs is not None
    choice = replace(spec.points.default_choice(), allow_insufficient=True)
    return predictions(spec, p, model.run(p.inputs), choice=choice, explain=explain), p


def top3(res: Any) -> list[str]:
    [pred] = res.values()
    return [c.variable for c in pred.results[0].contributions[:TOP]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None, help="a model folder")
    ap.add_argument("--screen", type=Path, default=None, help="a fitted screen's JSON")
    ap.add_argument("--stays", type=int, default=4000, help="set-C stays compared")
    ap.add_argument("--timed", type=int, default=300, help="stays timed per pass")
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    before = loadavg()
    models = REPO / "models"
    folder = args.model or resolve(models, read_index(models), "mortality")
    model = load_model(folder, "mortality", Settings(model_dir=folder.parent.parent,
                                                     device="cpu", intra_op_threads=1))
    spec = model.spec
    if args.screen is not None:
        screen = ExplanationScreen.model_validate_json(args.screen.read_text())
        spec = ModelSpec.from_manifest(
            spec.manifest.model_copy(update={"explanation_screen": screen}), spec.ref.sha256,
            spec.fixed_t)
    if spec.manifest.explanation_screen is None:
        raise SystemExit(f"{folder} has no explanation screen: give --screen")
    found = real_stays("mortality", args.stays, models)
    if found is None:
        raise SystemExit("no converted data under data/ (docs/data.md)")
    stays = [StayPayload.model_validate(b) for b in found[0]]
    sc = spec.manifest.explanation_screen
    print(f"model {spec.ref.name} {spec.ref.version} ({folder}); screen: "
          f"m = {sc.candidates}, chosen on {sc.chosen_on.split(':')[0]}; {found[1]}; "
          f"load average before: {before}\n")

    same_set = same_order = compared = 0
    observed, rows = [], []
    for s in stays:
        exact, pe = answer(model, spec, s, "full", screened=False)
        screened, ps = answer(model, spec, s, "top", screened=True)
        if not pe.ok:
            continue
        a, b = top3(exact), top3(screened)
        compared += 1
        same_set += set(a) == set(b)
        same_order += a == b
        observed.append(len(pe.occluded[0]))
        rows.append(len(ps.occluded[0]))
    print("| stays | top 3 same set | same order | observed channels per stay (median) | "
          "exact rows per stay, screened (median, mean) |\n|---|---|---|---|---|")
    print(f"| {compared} | {same_set / compared:.4f} | {same_order / compared:.4f} | "
          f"{np.median(observed):.0f} | {np.median(rows):.0f}, {np.mean(rows):.1f} |\n")

    kinds = {"basic": ("basic", False), "top, screened": ("top", True),
             "top, exact (every channel)": ("top", False)}
    timed = stays[: args.timed]
    best = dict.fromkeys(kinds, float("inf"))
    for _ in range(args.passes):
        for name, (explain, screened) in kinds.items():
            t = time.thread_time()
            for s in timed:
                answer(model, spec, s, explain, screened)
            best[name] = min(best[name], (time.thread_time() - t) / len(timed) * 1e3)
    print(f"CPU per request, one stay alone, best of {args.passes} passes over {len(timed)} "
          "stays:\n\n| explain | CPU ms per request | × basic |\n|---|---|---|")
    for name, ms in best.items():
        print(f"| {name} | {ms:.3f} | {ms / best['basic']:.2f} |")
    print(f"\nload average after: {loadavg()}")


if __name__ == "__main__":
    main()
