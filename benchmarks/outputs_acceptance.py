"""The outputs' acceptance figures, measured through the HTTP service on PhysioNet set C.

Sends every test stay of a converted benchmark folder (wide form, demographics) to
`POST /predict/mortality/batch` of a served model, once per named operating point, then reads
`GET /models/mortality/monitoring` and `/metrics`. Prints ECE (10 equal-width bins) of `risk`
and of `score`, AUROC, how many risks are exactly 0 or 1, and per operating point the alert
rate on set C beside its validation figure. Figures are printed, never asserted.

    .venv/bin/python -m benchmarks.outputs_acceptance --model-dir runs/models \
        --data data/physionet2012-benchmark [--stay 152873_episode1_timeseries.csv]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd

from benchmarks.common import server
from benchmarks.payloads import stay_payload
from scehr.training.calibration import expected_calibration_error
from scehr.training.metrics import auroc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--stay", default=None, help="also print this stay's full response")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    task_dir = Path(args.data) / "in-hospital-mortality"
    table = pd.read_csv(task_dir / "test_listfile.csv", dtype={"stay": str})
    if args.limit:
        table = table.head(args.limit)
    demo = pd.read_csv(task_dir / "test" / "demographics.csv", dtype={"stay": str}
                       ).set_index("stay").to_dict("index")
    stays = [stay_payload(task_dir / "test", s, demo.get(s, {})) for s in table["stay"]]
    y = table["y_true"].to_numpy()
    out: dict[str, Any] = {"n": len(stays), "deaths": int(y.sum())}
    with server(Path(args.model_dir), monitor_window=len(stays)) as srv:
        base = f"http://127.0.0.1:{srv.port}"
        with httpx.Client(base_url=base, timeout=600) as c:
            info = c.get("/models/mortality").json()
            out["model"] = {k: info[k] for k in ("name", "version", "operating_points",
                                                 "default_operating_point")}
            alert_rates = {}
            risk = score = None
            for point in info["operating_points"]:
                t0 = time.perf_counter()
                r_, s_, alerts, thr, ok = [], [], [], set(), []
                rejected: dict[str, str] = {}
                for i in range(0, len(stays), args.batch):
                    resp = c.post("/predict/mortality/batch",
                                  json={"stays": stays[i : i + args.batch]},
                                  params={"operating_point": point})
                    resp.raise_for_status()
                    for item in resp.json()["items"]:
                        if item["prediction"] is None:  # e.g. a record without any data
                            rejected[item["id"]] = item["errors"][0]["rule"]
                            continue
                        ok.append(i + item["index"])
                        res = item["prediction"]["results"][0]
                        r_.append(res["risk"])
                        s_.append(res["score"])
                        alerts.append(res["alert"])
                        thr.add((res["operating_point"]["threshold"],
                                 res["operating_point"]["applies_to"]))
                a = np.asarray(alerts)
                yy = y[ok]
                out["rejected"] = rejected
                alert_rates[point] = {"alert_rate": float(a.mean()), "threshold": sorted(thr),
                                      "sensitivity": float(a[yy == 1].mean()),
                                      "ppv": float(yy[a].mean()) if a.any() else None,
                                      "seconds": round(time.perf_counter() - t0, 1)}
                risk, score = np.asarray(r_), np.asarray(s_)
            assert risk is not None and score is not None
            y = yy
            out["scored"] = len(y)
            out["ece_risk"] = expected_calibration_error(y, risk)
            out["ece_score"] = expected_calibration_error(y, score)
            out["auroc_risk"] = auroc(y, risk)
            out["risk_exactly_0_or_1"] = int(((risk == 0) | (risk == 1)).sum())
            out["risk_min_max"] = [float(risk.min()), float(risk.max())]
            out["mean_risk"] = float(risk.mean())
            out["alert_rates"] = alert_rates
            mon = c.get("/models/mortality/monitoring").json()
            out["monitoring"] = mon
            metrics = c.get("/metrics").text
            out["monitor_series"] = sum(1 for line in metrics.splitlines()
                                        if line.startswith("scehr_monitor_"))
            if args.stay:
                k = int(np.flatnonzero(table["stay"].to_numpy() == args.stay)[0])
                one = c.post("/predict/mortality", json=stays[k])
                out["stay"] = {"name": args.stay, "label": int(table["y_true"].iloc[k]),
                               "response": one.json(),
                               "headers": {h: one.headers[h] for h in one.headers
                                           if h.lower().startswith("x-scehr")}}
                t0 = time.perf_counter()
                for _ in range(20):
                    c.post("/predict/mortality", json=stays[k], params={"explain": "basic"})
                basic = (time.perf_counter() - t0) / 20
                t0 = time.perf_counter()
                for _ in range(20):
                    c.post("/predict/mortality", json=stays[k])
                top = (time.perf_counter() - t0) / 20
                out["single_request_seconds"] = {"explain=basic": basic, "explain=top": top}
    print(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
