"""`scehr score`: the service's results offline, resumable after SIGKILL, sharded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from schemas.featureset import FEATURE_SETS
from schemas.model_index import read_index
from schemas.payloads import Prediction
from service.scoring import CLASS_FIELDS, Output, parse_shard, read_benchmark, score
from service.settings import Settings
from tests.conftest import REPO, SHARED_DATA, needs_shared_data
from tests.service.conftest import serve, stay
from training.data.synthetic import write_synthetic

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic benchmark test split (mortality): listfile, timeseries CSVs, demographics."""
    root = write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=4, n_test=40,
                           seed=3)
    return root / "in-hospital-mortality" / "test"


def payloads(n: int, bad: bool = True) -> list[dict[str, Any]]:
    out = [stay(hr=60.0 + k, id=f"s{k:04d}",
                demographics={"age": 30 + k % 50, "sex": "male" if k % 2 else "female"})
           for k in range(n)]
    if bad:  # one invalid payload, one invalid value, one with no id (keyed by its line)
        out[3] = {"id": "s0003", "observations": "not a list"}
        out[5]["observations"][0]["value"] = "fast"
        del out[7]["id"]
    return out


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in items))
    return path


def read_rows(path: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "an id appears twice in the output"
    return {r["id"]: r for r in rows}


async def http_rows(settings: Settings, stays: list[dict[str, Any]], keys: list[str]
                    ) -> dict[str, dict[str, Any]]:
    """The batch route's answers, read out with the scorer's own column mapping."""
    out: dict[str, dict[str, Any]] = {}
    async with serve(settings) as client:
        for a in range(0, len(stays), 100):
            r = await client.post("/predict/mortality/batch", json={"stays": stays[a:a + 100]})
            assert r.status_code == 200, r.text
            for key, item in zip(keys[a:a + 100], r.json()["items"], strict=True):
                if item.get("prediction") is None:
                    out[key] = {"status": "error", "rules": {e["rule"] for e in item["errors"]}}
                    continue
                pred = Prediction.model_validate(item["prediction"])
                out[key] = {"status": "ok" if pred.status == "scored" else pred.status,
                            "results": {
                    c.label: {k: f(c) for k, f in CLASS_FIELDS.items()} for c in pred.results}}
    return out


def assert_same(scored: dict[str, dict[str, Any]], served: dict[str, dict[str, Any]]) -> int:
    assert scored.keys() == served.keys()
    worst = 0.0
    for key, want in served.items():
        got = scored[key]
        assert got["status"] == want["status"], key
        if want["status"] == "error":
            assert {e["rule"] for e in got["errors"]} == want["rules"], key
            continue
        for label, fields in want["results"].items():
            for name in ("risk", "score"):
                worst = max(worst, abs(got["results"][label][name] - fields[name]))
            assert got["results"][label]["alert"] == fields["alert"], key
    assert worst <= 1e-6, worst
    return sum(w["status"] == "ok" for w in served.values())


async def test_scorer_equals_the_http_service(model_dir: Path, synth: Path,
                                              tmp_path: Path) -> None:
    settings = Settings(model_dir=model_dir, device="cpu")
    # a benchmark folder
    score("mortality", synth, tmp_path / "bench.jsonl", model_dir=model_dir, device="cpu",
          chunk_size=7, progress=False)
    keys, stays = zip(*read_benchmark(synth), strict=True)  # the very payloads it scored
    n_ok = assert_same(read_rows(tmp_path / "bench.jsonl"),
                       await http_rows(settings, list(stays), list(keys)))
    assert n_ok == 40
    # a JSONL of payloads, with bad stays among them
    items = payloads(30)
    write_jsonl(tmp_path / "in.jsonl", items)
    score("mortality", tmp_path / "in.jsonl", tmp_path / "out.jsonl", model_dir=model_dir,
          device="cpu", chunk_size=8, progress=False)
    keys = [p.get("id") or f"line-{i + 1}" for i, p in enumerate(items)]
    rows = read_rows(tmp_path / "out.jsonl")
    assert_same(rows, await http_rows(settings, items, keys))
    assert rows["s0003"]["status"] == rows["s0005"]["status"] == "error"
    assert "line-8" in rows and rows["s0010"]["model_version"] == "v1"


def test_long_form_csv_and_parquet_equal_jsonl(model_dir: Path, tmp_path: Path) -> None:
    items = payloads(12, bad=False)
    lines = ["stay_id,variable,time,value,unit,age,sex"]
    for p in items:
        for o in p["observations"]:
            d = p["demographics"]
            lines.append(f"{p['id']},{o['variable']},{o['time']},{o['value']},"
                         f"{o.get('unit') or ''},{d['age']},{d['sex']}")
    (tmp_path / "long.csv").write_text("\n".join(lines) + "\n")
    write_jsonl(tmp_path / "in.jsonl", items)
    for name in ("in.jsonl", "long.csv"):
        score("mortality", tmp_path / name, tmp_path / f"{name}.out.jsonl",
              model_dir=model_dir, device="cpu", progress=False)
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    pq.write_table(pacsv.read_csv(tmp_path / "long.csv"), tmp_path / "long.parquet")
    score("mortality", tmp_path / "long.parquet", tmp_path / "pq.out.csv",
          model_dir=model_dir, device="cpu", progress=False)
    want = read_rows(tmp_path / "in.jsonl.out.jsonl")
    assert read_rows(tmp_path / "long.csv.out.jsonl") == want
    csv_rows = (tmp_path / "pq.out.csv").read_text().splitlines()
    header = csv_rows[0].split(",")
    risk = header.index("in_hospital_mortality.risk")
    got = {r.split(",")[0]: float(r.split(",")[risk]) for r in csv_rows[1:]}
    assert got == {k: r["results"]["in_hospital_mortality"]["risk"] for k, r in want.items()}


def test_parquet_without_pyarrow_names_the_extra(model_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"pip install 'scehr\[parquet\]'"):
        score("mortality", tmp_path / "x.parquet", tmp_path / "o.jsonl", model_dir=model_dir,
              device="cpu", progress=False)


def test_shards_split_deterministically(model_dir: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", payloads(40, bad=False))
    run: Callable[..., Any] = lambda out, shard: score(  # noqa: E731
        "mortality", tmp_path / "in.jsonl", tmp_path / out, model_dir=model_dir, device="cpu",
        shard=shard, progress=False)
    run("all.jsonl", (0, 1))
    parts = []
    for i in range(3):
        s = run(f"part{i}.jsonl", (i, 3))
        assert s.other_shard == 40 - s.written
        parts.append(read_rows(tmp_path / f"part{i}.jsonl"))
    assert all(parts) and sum(len(p) for p in parts) == 40
    assert {k: v for p in parts for k, v in p.items()} == read_rows(tmp_path / "all.jsonl")
    run("part0-again.jsonl", (0, 3))
    assert read_rows(tmp_path / "part0-again.jsonl").keys() == parts[0].keys()
    with pytest.raises(ValueError, match="I/N"):
        parse_shard("3")
    with pytest.raises(ValueError, match="0 <= I < N"):
        parse_shard("3/3")


def test_torn_last_line_is_dropped_and_rescored(model_dir: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", payloads(20, bad=False))
    args = dict(model_dir=model_dir, device="cpu", chunk_size=4, progress=False)
    score("mortality", tmp_path / "in.jsonl", tmp_path / "full.jsonl", **args)
    full = (tmp_path / "full.jsonl").read_text()
    lines = full.splitlines(keepends=True)
    (tmp_path / "torn.jsonl").write_text("".join(lines[:6]) + lines[6][:25])
    s = score("mortality", tmp_path / "in.jsonl", tmp_path / "torn.jsonl", **args)
    assert s.already_done == 6 and s.written == 14
    assert (tmp_path / "torn.jsonl").read_text() == full  # byte for byte


def test_output_never_mixes_two_models(model_dir: Path, tmp_path: Path) -> None:
    Output(tmp_path / "o.csv", ["a"]).close()
    with pytest.raises(ValueError, match="other columns"):
        Output(tmp_path / "o.csv", ["b"])
    write_jsonl(tmp_path / "in.jsonl", payloads(3, bad=False))
    for suffix in ("jsonl", "csv"):
        out = tmp_path / f"o2.{suffix}"
        score("mortality", tmp_path / "in.jsonl", out, model_dir=model_dir, device="cpu",
              version="v1", progress=False)
        with pytest.raises(ValueError, match=r"holds rows of fixture-mortality-cbce v1.*--version"):
            score("mortality", tmp_path / "in.jsonl", out, model_dir=model_dir, device="cpu",
                  version="v2", progress=False)


def _cli(model_dir: Path, src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "scehr_cli", "score", "mortality", str(src), "--out",
            str(out), "--model-dir", str(model_dir), "--device", "cpu", "--threads", "1",
            "--chunk-size", "5", "--quiet"]


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume(model_dir: Path, tmp_path: Path) -> None:
    """Killed at start-up, mid-run (three times), then rerun: every id exactly once, and the
    file equals an uninterrupted run's byte for byte."""
    n = 800
    write_jsonl(tmp_path / "in.jsonl", payloads(n))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(_cli(model_dir, tmp_path / "in.jsonl", tmp_path / "ref.jsonl"), env=env,
                   check=True, cwd=REPO, capture_output=True)
    out = tmp_path / "out.jsonl"
    mid_run = 0
    for target in (0, 150, 400, 650):
        proc = subprocess.Popen(_cli(model_dir, tmp_path / "in.jsonl", out), env=env, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            size = out.stat().st_size if out.exists() else 0
            if (target == 0 and time.monotonic() > deadline - 59.5) or (
                    size and out.read_bytes().count(b"\n") >= target > 0):
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        written = out.read_bytes().count(b"\n") if out.exists() else 0
        mid_run += 0 < written < n
    assert mid_run >= 2, "the scorer finished before it could be killed mid-run"
    subprocess.run(_cli(model_dir, tmp_path / "in.jsonl", out), env=env, check=True, cwd=REPO,
                   capture_output=True)
    assert len(read_rows(out)) == n
    assert out.read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def test_score_runs_without_torch_or_pandas(model_dir: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", payloads(4, bad=False))
    argv = _cli(model_dir, tmp_path / "in.jsonl", tmp_path / "o.jsonl")[3:]
    code = (
        "import sys, scehr_cli\n"
        "for m in ('torch', 'pandas', 'training'):\n"
        "    sys.modules[m] = None  # importing them would fail, as in a serve-only install\n"
        f"rc = scehr_cli.main({argv!r})\n"
        "assert rc == 0, rc\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    assert len(read_rows(tmp_path / "o.jsonl")) == 4


@needs_shared_data
async def test_real_physionet_set_c_stays_equal_the_service(tmp_path: Path) -> None:
    """Converted PhysioNet 2012 set-c stays, shipped default model: scorer == HTTP to 1e-6."""
    from training.data.physionet2012 import convert_physionet2012

    models = REPO / "models"
    index = read_index(models)
    default = index.entry("mortality", index.defaults["mortality"])
    assert default is not None
    convert_physionet2012(SHARED_DATA / "physionet2012", tmp_path / "bench", limit=60,
                          progress=False, fs=FEATURE_SETS[default.feature_set])
    split = tmp_path / "bench" / "in-hospital-mortality" / "test"
    score("mortality", split, tmp_path / "out.jsonl", model_dir=models, device="cpu",
          progress=False)
    keys, stays = zip(*read_benchmark(split), strict=True)
    served = await http_rows(Settings(model_dir=models, device="cpu", tasks=["mortality"]),
                             list(stays), list(keys))
    # every stay is scored or, below the model's data minimum, abstains the same way on both
    assert assert_same(read_rows(tmp_path / "out.jsonl"), served) >= 50
