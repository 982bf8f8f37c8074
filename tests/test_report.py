"""The tuning report (autocnn report): tables, figures, sources, bad input, and the page in a browser.

Everything runs on the CPU: a small tuning database and an Optuna SQLite storage are made here, with
studies named and annotated as the tuner does. The browser test runs where Chromium is installed.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

pytest.importorskip("plotly", reason="the report needs plotly (pip install 'autocnn[report]')")

from autocnn import __version__  # noqa: E402
from autocnn.store import RecordKey, TuningDatabase, TuningRecord, now_utc  # noqa: E402
from autocnn.device import DeviceInfo, DeviceLimits  # noqa: E402
from autocnn.kernels import get_operation  # noqa: E402
from autocnn.cli.report import main  # noqa: E402
from autocnn.reports import TITLE  # noqa: E402
from autocnn.kernels.suite import seed_problems  # noqa: E402
from autocnn.search.tuner import study_name  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEVICE = DeviceInfo("NVIDIA H200", "9.0", 132, 13020, 13000)
LIMITS = DeviceLimits.for_arch("sm_90")

# (op, seed shape, tuned us, default us, cuDNN us in the record, study kind)
RECORDS = [
    ("conv_fwd", "kriz09", 87.36, 104.51, 143.87, "good"),
    ("conv_fwd", "convnet18_c1", 23.6, 27.6, None, "few"),      # cuDNN time from the benchmark
    ("conv_wgrad", "kriz09", 176.4, 214.5, 185.9, "good"),
    ("avgpool_fwd", "kriz09_pool", 15.7, None, 20.0, None),     # no default time, no study
]
BENCH_CUDNN = {("conv_fwd", "convnet18_c1"): 41.6}
FAILED_ONLY = ("avgpool_bwd", "kriz09_pool", {"infeasible": 3, "compile_error": 2, "wrong_result": 1})
GOOD_FAILURES = {"infeasible": 2, "compile_error": 1}
CEILINGS = (4000.0, 50.0)


def _problem(op: str, seed: str):
    return dict(seed_problems(op))[seed]


def _name(op: str, seed: str) -> str:
    return study_name(DEVICE, op, _problem(op, seed), get_operation(op).fingerprint(), {})


def _add_study(url: str, op: str, seed: str, complete: int, failures: dict[str, int], reused: int = 0) -> None:
    problem = _problem(op, seed)
    operation = get_operation(op)
    study = optuna.create_study(study_name=_name(op, seed), storage=url, direction="minimize")
    study.set_user_attr("op", op)
    study.set_user_attr("problem", problem.to_dict())
    study.set_user_attr("device", DEVICE.to_dict())
    study.set_user_attr("fingerprint", operation.fingerprint())
    config = operation.default_config(problem, LIMITS).as_dict()
    dists = {"A": optuna.distributions.IntDistribution(0, 3), "B": optuna.distributions.IntDistribution(0, 2)}
    for i in range(complete):
        a, b = i % 4, i % 3
        value = 50.0 + 25.0 * a + 0.5 * b       # A decides the time: it is the important parameter
        timing = {"median_us": value, "p25_us": value * 0.99, "p75_us": value * 1.01, "min_us": value * 0.98,
                  "reps": 100, "spread": 0.02}
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=value, params={"A": a, "B": b}, distributions=dists,
            user_attrs={"config": config, "result": {"timing": timing, "registers": {op: 32}}}))
    for i in range(reused):
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=50.0, params={"A": 0, "B": 0}, distributions=dists,
            user_attrs={"config": config, "result": {"reused": True}}))
    for failure, n in failures.items():
        for _ in range(n):
            result = {"failure": failure, "message": f"a {failure}"}
            if failure == "infeasible":
                result["stage"] = "static"
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.FAIL, params={"A": 1, "B": 1}, distributions=dists,
                user_attrs={"config": config, "result": result}))


def _make_inputs(root: Path) -> dict[str, Path | str]:
    db_dir, empty = root / "db", root / "shipped-empty"
    empty.mkdir(parents=True)
    url = f"sqlite:///{root / 'optuna.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = TuningDatabase(user_dir=db_dir, shipped_dir=empty)
    for op, seed, t, d, c, kind in RECORDS:
        problem = _problem(op, seed)
        config = get_operation(op).default_config(problem, LIMITS).as_dict()
        fingerprint = get_operation(op).config_fingerprint(config)
        db.put(TuningRecord(key=RecordKey.for_(DEVICE, problem, fingerprint), config=config, time_us=t, spread=0.01,
                            default_time_us=d, cudnn_time_us=c, trials=12, tuned_at=now_utc(),
                            autocnn_version=__version__, sampler="tpe",
                            study=_name(op, seed) if kind else None, storage=url))
        if kind == "good":
            _add_study(url, op, seed, complete=12, failures=GOOD_FAILURES, reused=1)
        elif kind == "few":
            _add_study(url, op, seed, complete=3, failures={"launch_error": 1})
    op, seed, failures = FAILED_ONLY
    _add_study(url, op, seed, complete=0, failures=failures)
    bench = root / "bench.json"
    bench.write_text(json.dumps({
        "device": DEVICE.to_dict(), "ceilings": {"copy_gbps": CEILINGS[0], "sgemm_tflops": CEILINGS[1]},
        "rows": [{"op": o, "shape": s, "default_us": None, "best_us": None, "cudnn_us": us}
                 for (o, s), us in BENCH_CUDNN.items()],
        "records": []}))
    return {"db": db_dir, "url": url, "bench": bench, "root": root}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    return _make_inputs(tmp_path_factory.mktemp("report-inputs"))


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("report") / "report.html"
    rc = main(["--db", str(inputs["db"]), "--storage", inputs["url"], "--bench", str(inputs["bench"]),
               "--out", str(out)])
    return {"rc": rc, "html": out.read_text(encoding="utf-8"), "md": out.with_suffix(".md").read_text(encoding="utf-8"),
            "out": out}


def _md_row(md: str, *first_cells: str) -> list[str]:
    prefix = "| " + " | ".join(first_cells) + " |"
    lines = [line for line in md.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one Markdown row starting {prefix!r}, found {len(lines)}"
    return [c.strip() for c in lines[0].strip().strip("|").split("|")]


def _html_row(html_text: str, op: str, shape: str) -> str:
    start = html_text.index(f"<tr><td>{op}</td><td class='shape'>{shape}<")
    return html_text[start:html_text.index("</tr>", start)]


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


# -- contents ------------------------------------------------------------------------------------------

def test_report_succeeds_and_states_its_sources(report, inputs):
    assert report["rc"] == 0
    html_text, md = report["html"], report["md"]
    for text in (html_text, md):
        assert TITLE in text
        assert str(inputs["db"]) in text                       # the database directory
        assert str(inputs["db"] / "nvidia-h200_sm90.json") in text   # and the file read
        assert inputs["url"] in text                            # the storage URL
        assert str(inputs["bench"]) in text
        assert "copy 4000 GB/s, SGEMM 50.0 TFLOP/s" in text
        assert re.search(r"made: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ by autocnn", text.replace("</td><td>", ": "))
        assert f"optuna-dashboard {inputs['url']}" in text


def test_every_record_in_the_tables_with_its_numbers(report):
    md, html_text = report["md"], report["html"]
    for op, seed, t, d, c, _ in RECORDS:
        shape = _problem(op, seed).shape_string()
        cells = _md_row(md, op, shape)
        cudnn = c if c is not None else BENCH_CUDNN.get((op, seed))
        assert cells[3] == f"{t:.1f}"
        assert cells[4] == (f"{d:.1f}" if d is not None else "—")
        assert cells[5] == (f"{cudnn:.1f}" if c is not None else f"{cudnn:.1f} (bench)")
        assert cells[6] == (f"{d / t:.2f}×" if d is not None else "—")
        assert cells[7] == f"{cudnn / t:.2f}×"
        # the roofline share: achieved GFLOP/s over min(SGEMM peak, bandwidth x intensity)
        operation, problem = get_operation(op), _problem(op, seed)
        flops, nbytes = operation.flops(problem), operation.min_bytes(problem)
        roof = min(CEILINGS[1] * 1000, CEILINGS[0] * flops / nbytes)
        assert cells[8] == f"{100 * flops / (t * 1e-6) / 1e9 / roof:.0f}%"
        row = _html_row(html_text, op, shape)
        assert f">{t:.1f}<" in row and f">{cudnn / t:.2f}×<" in row
        assert (f">{d / t:.2f}×<" if d is not None else ">—<") in row


def test_summary_has_geometric_means_per_operation(report):
    conv = [r for r in RECORDS if r[0] == "conv_fwd"]
    vs_default = _geomean([d / t for _, _, t, d, _, _ in conv])
    vs_cudnn = _geomean([(c or BENCH_CUDNN[(op, seed)]) / t for op, seed, t, _, c, _ in conv])
    cells = _md_row(report["md"], "NVIDIA H200 (sm_90, 132 SMs, CUDA 13020, driver 13000)", "conv_fwd")
    assert cells[2:] == ["2", f"{vs_default:.2f}×", f"{vs_cudnn:.2f}×", "2 of 2"]
    pool = _md_row(report["md"], "NVIDIA H200 (sm_90, 132 SMs, CUDA 13020, driver 13000)", "avgpool_fwd")
    assert pool[2:] == ["1", "—", f"{20.0 / 15.7:.2f}×", "1 of 1"]


def test_figures_of_every_kind_are_present(report):
    html_text = report["html"]
    for div_id, title in [("fig-speedup-g1", "Speed-up per kernel"),
                          ("fig-roofline-g1", "Kernels against the measured ceilings"),
                          ("fig-failures", "Failed trials by class per study")]:
        assert f'id="{div_id}"' in html_text
        assert title in html_text
    # three studies with complete trials get a history and a trial-time plot; two have enough
    # complete trials for importances, the third says why it has none
    assert len(re.findall(r'id="fig-history-s\d+"', html_text)) == 3
    assert len(re.findall(r'id="fig-times-s\d+"', html_text)) == 3
    assert len(re.findall(r'id="fig-importance-s\d+"', html_text)) == 2
    assert "Optimisation history" in html_text and "Parameter importances (PED-ANOVA)" in html_text
    assert "parameter importances skipped: 3 measured complete trial(s)" in html_text
    # the important parameter is the one that decides the time
    imp = re.search(r'id="fig-importance-s1".*?"y":\["(\w+)"', html_text, re.S)
    assert imp and imp.group(1) == "A"
    # plotly.js inline, once, and nothing fetched from a network
    import plotly.offline

    head = plotly.offline.get_plotlyjs()[:300]
    assert html_text.count(head) == 1
    assert not re.search(r"<script[^>]+src=", html_text)


def test_studies_with_failure_counts_per_class(report):
    md, html_text = report["md"], report["html"]
    op, seed, failures = FAILED_ONLY
    shape = _problem(op, seed).shape_string()
    rows = [line for line in md.splitlines() if f"{op} · {seed}: {shape}" in line]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2:] == ["6", "0", "6", "infeasible 3, compile_error 2, wrong_result 1", "no completed trial"]
    assert "This study has no completed trial" in html_text
    assert f"study {op} · {seed} has no completed trial" in md
    good = [line for line in md.splitlines() if "conv_wgrad · kriz09:" in line and line.startswith("| s")]
    cells = [c.strip() for c in good[0].strip("|").split("|")]
    assert cells[2:5] == ["16", "13", "3"]      # 12 + 1 reused complete, 3 failed
    assert cells[5] == "infeasible 2, compile_error 1"
    assert cells[6] == "50.0"


def test_cli_runs_the_same_report(inputs, tmp_path, capsys):
    from autocnn.cli import main as cli_main

    out = tmp_path / "cli.html"
    rc = cli_main(["report", "--", "--db", str(inputs["db"]), "--storage", inputs["url"], "--out", str(out)])
    assert rc == 0 and out.exists() and out.with_suffix(".md").exists()
    assert "ceilings unknown" in out.read_text(encoding="utf-8")
    assert f"browse the studies: optuna-dashboard {inputs['url']}" in capsys.readouterr().out


def test_cli_takes_options_without_a_separator(inputs, tmp_path):
    from autocnn.cli import main as cli_main

    out = tmp_path / "cli.html"
    rc = cli_main(["report", "--db", str(inputs["db"]), "--storage", inputs["url"], "--out", str(out)])
    assert rc == 0 and out.exists()
    out2 = tmp_path / "cli2.html"
    assert cli_main(["report", "--", "--db", str(inputs["db"]), "--storage", inputs["url"], "--out", str(out2)]) == 0
    assert out2.exists()


def test_script_is_a_thin_wrapper():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "tuning_report.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert "usage: autocnn report" in done.stdout and "--ceilings" in done.stdout


def test_network_lists_fallbacks(inputs, tmp_path, capsys):
    out = tmp_path / "net.html"
    rc = main(["--db", str(inputs["db"]), "--storage", inputs["url"], "--network", "kriz09", "--batch", "128",
               "--op", "conv_fwd,conv_wgrad,avgpool_fwd,avgpool_bwd", "--out", str(out)])
    assert rc == 0
    md = out.with_suffix(".md").read_text(encoding="utf-8")
    # conv_wgrad and avgpool_fwd of kriz09 at batch 128 are tuned exactly
    wgrad = _md_row(md, "conv_wgrad", _problem("conv_wgrad", "kriz09").shape_string())
    assert wgrad[2] == "Conv2d 'conv2d_1'" and wgrad[4] == "176.4"
    _md_row(md, "avgpool_fwd", _problem("avgpool_fwd", "kriz09_pool").shape_string())
    # the network's conv_fwd has a bias and a logistic epilogue: borrowed from the tuned shape;
    # avgpool_bwd has no record at all: the heuristic default
    assert "### Kernels of kriz09 still on a fallback" in md
    fwd = [line for line in md.splitlines() if line.startswith("| conv_fwd |") and "act=logistic" in line]
    assert len(fwd) == 1 and "| nearest_shape |" in fwd[0]
    bwd = [line for line in md.splitlines() if line.startswith("| avgpool_bwd |")]
    assert len(bwd) == 1 and "| default |" in bwd[0]
    assert "kriz09 (batch 128) on NVIDIA H200" in capsys.readouterr().out


def test_network_at_tf32_looks_up_tf32_records(inputs, tmp_path, capsys):
    out = tmp_path / "net32.html"
    assert main(["--db", str(inputs["db"]), "--storage", inputs["url"], "--network", "kriz09", "--batch", "128",
                 "--precision", "tf32", "--out", str(out)]) == 0
    md = out.with_suffix(".md").read_text(encoding="utf-8")
    # pooling has no precision: still exact; the fp32 wgrad record does not serve the tf32 problem
    _md_row(md, "avgpool_fwd", _problem("avgpool_fwd", "kriz09_pool").shape_string())
    wgrad = [line for line in md.splitlines() if line.startswith("| conv_wgrad |")]
    assert len(wgrad) == 1 and ",precision=tf32 |" in wgrad[0] and "| exact |" not in wgrad[0]
    assert "kriz09 (batch 128, tf32) on NVIDIA H200" in capsys.readouterr().out
    assert main(["--network", "kriz09", "--precision", "fp16"]) == 2
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_filters_by_gpu_and_operation(inputs, tmp_path):
    out = tmp_path / "f.html"
    assert main(["--db", str(inputs["db"]), "--storage", inputs["url"], "--op", "conv_wgrad", "--gpu", "h200",
                 "--ceilings", "4000,50", "--out", str(out)]) == 0
    md = out.with_suffix(".md").read_text(encoding="utf-8")
    assert "| conv_wgrad |" in md and "| conv_fwd |" not in md and "avgpool" not in md
    assert "copy 4000 GB/s, SGEMM 50.0 TFLOP/s (given with --ceilings" in md
    out2 = tmp_path / "none.html"
    assert main(["--db", str(inputs["db"]), "--storage", inputs["url"], "--gpu", "a100", "--out", str(out2)]) == 1
    assert not out2.exists()


# -- bad input ---------------------------------------------------------------------------------------

def _no_traceback(captured) -> None:
    assert "Traceback" not in captured.out + captured.err


def test_missing_database_directory(tmp_path, capsys):
    out = tmp_path / "r.html"
    rc = main(["--db", str(tmp_path / "nope"), "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--out", str(out)])
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert rc == 1 and not out.exists()
    assert f"tuning database {tmp_path / 'nope'} does not exist" in captured.err
    assert "nothing to report" in captured.err
    assert not (tmp_path / "none.db").exists()      # reading a report never creates a storage


def test_empty_database_with_studies(inputs, tmp_path, capsys):
    empty = tmp_path / "empty-db"
    empty.mkdir()
    out = tmp_path / "r.html"
    rc = main(["--db", str(empty), "--storage", inputs["url"], "--out", str(out)])
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert rc == 0
    assert "the tuning database has no files" in captured.err
    html_text = out.read_text(encoding="utf-8")
    assert "There are no tuning records to show" in html_text
    assert 'id="fig-history-s1"' in html_text       # the studies are still reported


def test_empty_database_and_no_storage(tmp_path, capsys):
    empty = tmp_path / "empty-db"
    empty.mkdir()
    (empty / "gpu.json").write_text('{"format": 1, "records": []}\n')
    rc = main(["--db", str(empty), "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--out", str(tmp_path / "r.html")])
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert rc == 1
    assert "the tuning database has no valid records" in captured.err
    assert "nothing to report" in captured.err


@pytest.mark.parametrize("url, why", [
    ("sqlite:////nonexistent/dir/x.db", "does not open: /nonexistent/dir/x.db does not exist"),
    # no PostgreSQL driver here (ImportError), or no such host where there is one: a reason either way
    ("postgresql://nohost:1/x", re.compile(r"does not open: \w+Error: \S")),
    ("postgresql://user:secret@nohost:1/x", re.compile(r"does not open: \w+Error: \S")),
])
def test_storage_that_does_not_open(inputs, tmp_path, capsys, url, why):
    out = tmp_path / "r.html"
    rc = main(["--db", str(inputs["db"]), "--storage", url, "--out", str(out)])
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert rc == 1                                  # an input named on the command line failed
    shown = url.replace("secret", "***")
    assert f"storage {shown} does not open" in captured.err
    assert (why.search(captured.err) if isinstance(why, re.Pattern) else why in captured.err), captured.err
    assert "secret" not in captured.err + captured.out
    html_text = out.read_text(encoding="utf-8")     # the records are still reported, with the problem
    assert f"storage {shown} does not open" in html_text and "secret" not in html_text
    assert _problem("conv_fwd", "kriz09").shape_string() in html_text
    assert "optuna-dashboard" not in captured.out


def test_storage_file_that_is_not_a_storage(tmp_path, capsys):
    junk = tmp_path / "junk.db"
    junk.write_text("not a database\n" * 100)
    rc = main(["--db", str(tmp_path), "--storage", f"sqlite:///{junk}", "--out", str(tmp_path / "r.html")])
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert rc == 1 and "is not a SQLite database" in captured.err
    assert junk.read_text() == "not a database\n" * 100


def test_bad_arguments(inputs, tmp_path, capsys):
    assert main(["--ceilings", "1,x"]) == 2
    assert "COPY_GBPS,SGEMM_TFLOPS" in capsys.readouterr().err
    assert main(["--db", str(inputs["db"]), "--network", "nonet", "--storage", inputs["url"]]) == 1
    assert "unknown network 'nonet'" in capsys.readouterr().err
    assert main(["--db", str(inputs["db"]), "--op", "conv_fwdx", "--storage", inputs["url"]]) == 1
    assert "unknown operation(s) conv_fwdx" in capsys.readouterr().err
    out = tmp_path / "r.html"
    assert main(["--db", str(inputs["db"]), "--storage", inputs["url"], "--bench", str(tmp_path / "b.json"),
                 "--out", str(out)]) == 1
    captured = capsys.readouterr()
    _no_traceback(captured)
    # The ceilings and cuDNN times asked for are not there: nothing is written.
    assert f"benchmark {tmp_path / 'b.json'} does not exist" in captured.err and not out.exists()


# -- precision ----------------------------------------------------------------------------------------

def test_tf32_records_are_labelled_and_compared_with_cudnn_tf32(tmp_path, capsys):
    """One seed shape tuned in both precisions; the benchmark (as autocnn bench writes it) timed
    cuDNN in FP32 and in TF32 and measured both GEMM rates: each record meets its own."""
    import dataclasses

    from autocnn.benchmark.table import BenchRow, GpuRates
    from autocnn.benchmark.kernels import _write

    empty = tmp_path / "empty"
    empty.mkdir()
    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=empty)
    fp32 = _problem("conv_fwd", "kriz09")
    tf32 = dataclasses.replace(fp32, precision="tf32")
    times = {"fp32": (100.0, 150.0), "tf32": (50.0, 40.0)}     # (tuned us, cuDNN us in the benchmark)
    operation = get_operation("conv_fwd")
    for problem in (fp32, tf32):
        config = operation.default_config(problem, LIMITS).as_dict()
        db.put(TuningRecord(key=RecordKey.for_(DEVICE, problem, operation.config_fingerprint(config)), config=config,
                            time_us=times[problem.precision][0], spread=0.01, default_time_us=200.0,
                            cudnn_time_us=None, trials=5, tuned_at=now_utc(), autocnn_version=__version__,
                            sampler="tpe", study=None, storage=None))
    rates = GpuRates(4000.0, 50.0, 400.0)
    rows = [BenchRow("conv_fwd", "kriz09", p.precision, operation.flops(p), operation.min_bytes(p),
                     best_us=times[p.precision][0], cudnn_us=times[p.precision][1]) for p in (fp32, tf32)]
    records = [{"op": "conv_fwd", "shape": "kriz09", "precision": p.precision.name, "problem": p.to_dict(),
                "results": []} for p in (fp32, tf32)]
    bench = tmp_path / "bench.json"
    _write(bench, DEVICE.to_dict(), 1, 4, ("fp32", "tf32"), rates, rows, records)
    out = tmp_path / "r.html"
    url = f"sqlite:///{tmp_path / 'o.db'}"
    optuna.storages.RDBStorage(url)   # an empty storage: no studies
    assert main(["--db", str(tmp_path / "db"), "--storage", url, "--bench", str(bench), "--out", str(out)]) == 0
    md, html_text = out.with_suffix(".md").read_text(), out.read_text()
    assert "copy 4000 GB/s, SGEMM 50.0 TFLOP/s, TF32 GEMM 400.0 TFLOP/s" in md
    flops, nbytes = operation.flops(fp32), operation.min_bytes(fp32)
    for problem, peak in ((fp32, 50.0), (tf32, 400.0)):
        tuned, cudnn = times[problem.precision]
        cells = _md_row(md, "conv_fwd", problem.shape_string())
        assert cells[3] == f"{tuned:.1f}" and cells[5] == f"{cudnn:.1f} (bench)" and cells[7] == f"{cudnn / tuned:.2f}×"
        roof = min(peak * 1000, 4000.0 * flops / nbytes)
        assert cells[8] == f"{100 * flops / (tuned * 1e-6) / 1e9 / roof:.0f}%"
    assert tf32.shape_string().endswith(",precision=tf32")
    assert "<span class='seed'>kriz09 · tf32</span>" in html_text and "TF32 GEMM peak 400.0 TFLOP" in html_text
    title = "NVIDIA H200 (sm_90, 132 SMs, CUDA 13020, driver 13000)"
    assert _md_row(md, title, "conv_fwd")[2:] == ["1", "2.00×", "1.50×", "1 of 1"]
    assert _md_row(md, title, "conv_fwd · tf32")[2:] == ["1", "4.00×", "0.80×", "0 of 1"]
    out_text = capsys.readouterr().out
    assert "conv_fwd · tf32: 1 kernels" in out_text


def test_ceilings_take_an_optional_tf32_rate():
    from autocnn.cli.report import parse_ceilings

    c = parse_ceilings("4227,51.1,378")
    assert (c.copy_gbps, c.sgemm_tflops, c.tf32_tflops) == (4227.0, 51.1, 378.0)
    assert c.roof(1e6, "tf32") == 378_000.0 and c.roof(1e6, "fp32") == 51_100.0 and c.roof(1.0, "tf32") == 4227.0
    assert parse_ceilings("4227,51.1").roof(1e6, "tf32") is None    # unknown: no share is shown
    import argparse

    for bad in ("1,2,3,4", "1", "1,2,-3"):
        with pytest.raises(argparse.ArgumentTypeError, match="COPY_GBPS,SGEMM_TFLOPS|positive"):
            parse_ceilings(bad)


# -- in a browser ------------------------------------------------------------------------------------

def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0"]
    url = report["out"].resolve().as_uri()
    shot = tmp_path / "report.png"
    done = subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1400,2400", url],
                          capture_output=True, text=True, timeout=180)
    assert shot.exists(), done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000   # a page with tables and plots, not blank
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert TITLE in dom.stdout and _problem("conv_fwd", "kriz09").shape_string() in dom.stdout
    # every figure was drawn by plotly.js (it marks a drawn div js-plotly-plot)
    figures = report["html"].count('class="plotly-graph-div"')
    assert figures >= 8 and dom.stdout.count("js-plotly-plot") >= figures
    console = [line for line in (done.stderr + dom.stderr).splitlines() if "CONSOLE" in line]
    errors = [line for line in console if "Uncaught" in line or "rror" in line]
    assert not errors, "JavaScript console errors:\n" + "\n".join(errors)
    keep = report["out"].parent / "report.png"       # for a person to look at (pytest --basetemp)
    shutil.copy(shot, keep)
