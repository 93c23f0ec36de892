"""`scehr score`: the service's results offline, resumable after SIGKILL, sharded."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.model_index import read_index
from scehr.schemas.payloads import Prediction
from scehr.service.offline_scoring import CLASS_FIELDS, Output, count_jsonl, read_benchmark, score
from scehr.service.settings import Settings
from scehr.service.shards import parse_shard
from scehr.training.data.synthetic import write_synthetic
from tests.conftest import REPO, SHARED_DATA, needs_shared_data
from tests.service.conftest import serve, stay

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
    keys, stays, _ = zip(*read_benchmark(synth), strict=True)  # the very payloads it scored
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


def write_long_csv(path: Path, items: list[dict[str, Any]]) -> Path:
    lines = ["stay_id,variable,time,value,unit,age,sex"]
    for p in items:
        for o in p["observations"]:
            d = p["demographics"]
            lines.append(f"{p['id']},{o['variable']},{o['time']},{o['value']},"
                         f"{o.get('unit') or ''},{d['age']},{d['sex']}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_long_form_csv_and_parquet_equal_jsonl(model_dir: Path, tmp_path: Path) -> None:
    items = payloads(12, bad=False)
    write_long_csv(tmp_path / "long.csv", items)
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
    # the risk's uncertainty rides in every output (the fixture's mortality v1 has a map)
    low = header.index("in_hospital_mortality.risk_low")
    got = {r.split(",")[0]: float(r.split(",")[low]) for r in csv_rows[1:]}
    assert got == {k: r["results"]["in_hospital_mortality"]["risk_low"] for k, r in want.items()}
    for r in want.values():
        res = r["results"]["in_hospital_mortality"]
        assert res["risk_low"] <= res["risk_high"] and res["outcomes"]


def test_parquet_without_pyarrow_names_the_extra(model_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"pip install 'scehr\[parquet\]'"):
        score("mortality", tmp_path / "x.parquet", tmp_path / "o.jsonl", model_dir=model_dir,
              device="cpu", progress=False)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "folder"])
def test_shards_read_only_their_part_and_cover_every_stay_once(
        model_dir: Path, tmp_path: Path, synth: Path, fmt: str) -> None:
    """N contiguous parts (byte ranges on line starts, listfile rows, row groups): each stay
    in exactly one part, with the whole run's row; a stay whose rows cross a part's end belongs
    to the part of its first row."""
    items = payloads(40, bad=False)
    if fmt == "jsonl":
        src = write_jsonl(tmp_path / "in.jsonl", items)
    elif fmt == "folder":
        src = synth
    else:
        src = write_long_csv(tmp_path / "in.csv", items)
        if fmt == "parquet":
            import pyarrow.csv as pacsv
            import pyarrow.parquet as pq

            src = tmp_path / "in.parquet"  # small row groups: stays cross them
            pq.write_table(pacsv.read_csv(tmp_path / "in.csv"), src, row_group_size=7)
    run: Callable[..., Any] = lambda out, shard: score(  # noqa: E731
        "mortality", src, tmp_path / out, model_dir=model_dir, device="cpu",
        shard=shard, progress=False)
    run("all.jsonl", (0, 1))
    whole = read_rows(tmp_path / "all.jsonl")
    for n in (3, 7):
        parts = []
        for i in range(n):
            s = run(f"part{i}-of-{n}.jsonl", (i, n))
            parts.append(read_rows(tmp_path / f"part{i}-of-{n}.jsonl"))
            assert s.read == len(parts[-1])  # it read its own stays only
        assert sum(map(len, parts)) == len(whole) == 40
        assert {k: v for p in parts for k, v in p.items()} == whole
    run("part0-again.jsonl", (0, 3))
    assert read_rows(tmp_path / "part0-again.jsonl") == read_rows(tmp_path / "part0-of-3.jsonl")
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
    return [sys.executable, "-m", "scehr.cli", "score", "mortality", str(src), "--out",
            str(out), "--model-dir", str(model_dir), "--device", "cpu", "--threads", "1",
            "--chunk-size", "5", "--quiet"]


def test_resume_from_any_prefix_a_kill_can_leave(model_dir: Path, tmp_path: Path) -> None:
    """A kill leaves a prefix of the uninterrupted output (rows are only appended): nothing,
    whole chunks, or a torn line. From each, a rerun writes exactly the uninterrupted file."""
    write_jsonl(tmp_path / "in.jsonl", payloads(30))
    args = dict(model_dir=model_dir, device="cpu", chunk_size=4, progress=False)
    score("mortality", tmp_path / "in.jsonl", tmp_path / "full.jsonl", **args)
    full = (tmp_path / "full.jsonl").read_bytes()
    ends = [k + 1 for k, b in enumerate(full) if b == ord("\n")]
    for cut in (0, 1, ends[3], ends[4] + 17, ends[11], len(full) - 2):
        out = tmp_path / f"cut{cut}.jsonl"
        out.write_bytes(full[:cut])
        score("mortality", tmp_path / "in.jsonl", out, **args)
        assert out.read_bytes() == full, cut


def _cli(model_dir: Path, src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "scehr.cli", "score", "mortality", str(src), "--out",
            str(out), "--model-dir", str(model_dir), "--device", "cpu", "--threads", "1",
            "--chunk-size", "5", "--quiet"]


@pytest.mark.slow
def test_sigkill_then_resume(model_dir: Path, tmp_path: Path) -> None:
    """A real SIGKILL once the first rows are on disk (or after the run, on a fast machine:
    nothing here depends on where it lands), then a rerun: the uninterrupted file, byte for
    byte."""
    n = 400
    write_jsonl(tmp_path / "in.jsonl", payloads(n))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(_cli(model_dir, tmp_path / "in.jsonl", tmp_path / "ref.jsonl"), env=env,
                   check=True, cwd=REPO, capture_output=True)
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(_cli(model_dir, tmp_path / "in.jsonl", out), env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not (out.exists() and out.stat().st_size):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run(_cli(model_dir, tmp_path / "in.jsonl", out), env=env, check=True, cwd=REPO,
                   capture_output=True)
    assert len(read_rows(out)) == n
    assert out.read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def test_ctrl_c_prints_the_command_that_resumes_and_exits_130(model_dir: Path,
                                                              tmp_path: Path) -> None:
    """SIGINT once the model is loaded: no traceback, one line naming the output and the
    command to run again (status 130, the shell's for SIGINT); that command finishes the
    file."""
    n = 1000
    write_jsonl(tmp_path / "in.jsonl", payloads(n, bad=False))
    out = tmp_path / "out.jsonl"
    argv = _cli(model_dir, tmp_path / "in.jsonl", out)
    proc = subprocess.Popen(
        argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE,
        text=True,
        # a job started in the background of a script inherits SIGINT ignored: Python would
        # then never raise KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    first = proc.stderr.readline()  # printed once the model is loaded, before any stay
    assert first.startswith("scehr score: "), first
    proc.send_signal(signal.SIGINT)
    err = first + proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    said = [line for line in err.splitlines() if "interrupted" in line]
    again = shlex.join(["scehr", *argv[3:]])
    assert said == [f"scehr score: interrupted; the rows written so far stay in {out}: to go "
                    f"on, run the same command: {again}"], err
    assert len(read_rows(out)) < n
    subprocess.run([sys.executable, "-m", "scehr.cli", *shlex.split(again)[1:]], check=True,
                   cwd=REPO, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert len(read_rows(out)) == n


def test_jsonl_progress_has_a_total_and_an_eta(model_dir: Path, tmp_path: Path) -> None:
    """The stays of a JSON Lines input (its non-blank lines, any shard) are counted before the
    run, so the bar shows k/N and the time left."""
    text = "".join(json.dumps(p) + "\n" for p in payloads(9, bad=False))
    (tmp_path / "in.jsonl").write_text(text.replace("\n", "\n\n", 2) + "  \n")
    log = io.StringIO()
    score("mortality", tmp_path / "in.jsonl", tmp_path / "out.jsonl", model_dir=model_dir,
          device="cpu", chunk_size=4, log=log)
    bar = log.getvalue().splitlines()[-2]  # its last state; the summary line follows
    assert "9/9 [" in bar and "<00:00" in bar, bar
    assert sum(count_jsonl(tmp_path / "in.jsonl", (i, 4)) for i in range(4)) == 9


def test_bad_lines_and_repeated_ids_get_their_own_rows(model_dir: Path, tmp_path: Path) -> None:
    """An invalid-UTF-8 line is that line's error row (the run goes on, a rerun adds nothing);
    a stay repeating an id gets its own duplicate_id row: one row per input stay."""
    items = payloads(6, bad=False)
    items[4]["id"] = "s0001"
    lines = [json.dumps(p).encode() + b"\n" for p in items]
    lines.insert(2, b'{"id": "s\xff\xfe"}\n')
    (tmp_path / "in.jsonl").write_bytes(b"".join(lines))
    out = tmp_path / "out.jsonl"
    s = score("mortality", tmp_path / "in.jsonl", out, model_dir=model_dir, device="cpu",
              progress=False)
    rows = read_rows(out)
    assert len(rows) == len(lines) == 7 and s.written == 7 and s.duplicates == 1
    assert rows["line-3"]["errors"][0]["rule"] == "invalid_utf8"
    assert rows["line-6"]["errors"][0]["rule"] == "duplicate_id"  # the second s0001
    assert rows["s0001"]["status"] == "ok"
    again = score("mortality", tmp_path / "in.jsonl", out, model_dir=model_dir, device="cpu",
                  progress=False)
    assert again.written == 0 and again.already_done == 7


@pytest.mark.parametrize(("out", "message"), [
    ("scores.txt", "unknown output format '.txt'; use .jsonl or .csv"),
    ("a-file/scores.jsonl", "a-file is a file, not a folder)"),
    ("a-folder.jsonl", "cannot write it (Is a directory)"),
])
def test_unusable_output_is_one_line_before_the_model_loads(
        model_dir: Path, tmp_path: Path, out: str, message: str) -> None:
    write_jsonl(tmp_path / "in.jsonl", payloads(2, bad=False))
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder.jsonl").mkdir()
    r = subprocess.run(_cli(model_dir, tmp_path / "in.jsonl", tmp_path / out), cwd=REPO,
                       capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr, r.stderr
    assert "model loaded" not in r.stderr


def test_score_runs_without_torch_or_pandas(model_dir: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", payloads(4, bad=False))
    argv = _cli(model_dir, tmp_path / "in.jsonl", tmp_path / "o.jsonl")[3:]
    code = (
        "import sys\nfrom scehr import cli as scehr_cli\n"
        "for m in ('torch', 'pandas', 'scehr.training'):\n"
        "    sys.modules[m] = None  # importing them would fail, as in a serve-only install\n"
        f"rc = scehr_cli.main({argv!r})\n"
        "assert rc == 0, rc\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    assert len(read_rows(tmp_path / "o.jsonl")) == 4


@needs_shared_data
async def test_real_physionet_set_c_stays_equal_the_service(tmp_path: Path) -> None:
    """Converted PhysioNet 2012 set-c stays, shipped default model: scorer == HTTP to 1e-6."""
    from scehr.training.data.physionet2012 import convert_physionet2012

    models = REPO / "models"
    index = read_index(models)
    default = index.entry("mortality", index.defaults["mortality"])
    assert default is not None
    convert_physionet2012(SHARED_DATA / "physionet2012", tmp_path / "bench", limit=60,
                          progress=False, fs=FEATURE_SETS[default.feature_set])
    split = tmp_path / "bench" / "in-hospital-mortality" / "test"
    score("mortality", split, tmp_path / "out.jsonl", model_dir=models, device="cpu",
          progress=False)
    keys, stays, _ = zip(*read_benchmark(split), strict=True)
    served = await http_rows(Settings(model_dir=models, device="cpu", tasks=["mortality"]),
                             list(stays), list(keys))
    # every stay is scored or, below the model's data minimum, abstains the same way on both
    assert assert_same(read_rows(tmp_path / "out.jsonl"), served) >= 50


def test_results_do_not_depend_on_the_chunking(model_dir: Path, synth: Path,
                                               tmp_path: Path) -> None:
    """A stay's ONNX Runtime run does not depend on which stays share it: every chunk size
    gives the same bytes (small runs take another GEMM path unless padded)."""
    outs = []
    for size in (1, 2, 3, 5, 6, 7, 40):
        out = tmp_path / f"c{size}.jsonl"
        score("mortality", synth, out, model_dir=model_dir, device="cpu", threads=1,
              chunk_size=size, progress=False)
        outs.append(out.read_bytes())
    assert all(o == outs[-1] for o in outs)
