"""benchmarks/bench_gpu.py: its CPU smoke run writes the JSON a GPU run writes (a row per config, K and
precision, the dropout comparison, the device), without entmax, optuna or ray; a K that runs out of
memory skips the larger ones; the time limit marks what it did not start."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_gpu.py"

# The smoke run as a GPU machine without these packages would run it: importing one fails.
WITHOUT = """
import runpy, sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("entmax", "optuna", "ray"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Absent())
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def load_script():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_every_row(tmp_path):
    out = tmp_path / "tmp" / "x.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.update(EVO_ATTENTION_CACHE_DIR=str(tmp_path / "cache"), EVO_ATTENTION_BATCH_MODELS="auto")  # --auto: measured
    done = subprocess.run([sys.executable, "-c", WITHOUT, str(SCRIPT), "--smoke", "--auto", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| config | K | precision |" in done.stdout
    result = json.loads(out.read_text())
    assert result["complete"] is True
    device = result["device"]
    assert device["type"] == "cpu" and device["name"] and device["torch"] == torch.__version__
    assert "cuda" in device and device["threads"] >= 1
    assert "--smoke" in result["command"]
    assert "evaluation excluded" in result["notes"]["trainings_per_hour"]
    quick = result["configs"]["quick"]
    assert quick["status"] == "ok" and quick["budget_steps"] == 400
    auto = quick["batch_models_auto"]  # what batch_models auto chose here, with the probe's times
    assert auto["k"] in (1, 2, 4, 8) and auto["why"].startswith("auto: ") and "K=1 " in auto["why"]
    for name in ("wikitext_small", "seed"):  # quick only in a smoke run
        assert name not in result["configs"]

    rows = {(r["config"], r["k"], r["precision"]): r for r in result["rows"]}
    assert set(rows) == {("quick", k, p) for k in (1, 2) for p in ("fp32", "bf16")}
    for (_, k, precision), row in rows.items():
        assert row["status"] == "ok" and row["rounds"] == 1 and row["precision_run"] == precision
        assert row["seconds_per_step"] > 0 and row["peak_memory_mb"] > 0
        assert row["trainings_per_hour"] == pytest.approx(k * 3600 / (row["seconds_per_step"] * 400))

    arms = {(r["k"], r["arm"]): r for r in result["dropout_rows"]}
    assert set(arms) == {(k, a) for k in (1, 2) for a in ("dropout 0", "dropout 0.1", "no dropout",
                                                         "dropout 0 counter", "dropout 0.1 counter")}
    assert arms[(1, "dropout 0.1")]["dropout"] == 0.1 and arms[(1, "dropout 0")]["dropout"] == 0.0
    assert {a: r["dropout_stream"] for (k, a), r in arms.items() if k == 1} == {
        "dropout 0": "cpu", "dropout 0.1": "cpu", "no dropout": "cpu", "dropout 0 counter": "counter",
        "dropout 0.1 counter": "counter"}
    assert arms[(1, "dropout 0.1 counter")]["dropout"] == 0.1 and arms[(1, "dropout 0 counter")]["dropout"] == 0.0
    assert arms[(1, "no dropout")]["attention_dropout"] == 0.0
    assert all(r["status"] == "ok" and r["seconds_per_step"] > 0 for r in arms.values())
    compared = {c["k"]: c for c in result["dropout"]}
    assert set(compared) == {1, 2}  # K = 1 and the largest that fit
    for c in compared.values():
        assert c["precision"] == "bf16" and c["ratio_dropout_vs_0"] > 0 and c["ratio_attention_dropout_vs_none"] > 0
        assert all(s > 0 for s in c["seconds_per_step"].values())
        assert set(c["ratio_counter_vs_cpu"]) == {"dropout 0", "dropout 0.1"}
        assert all(r > 0 for r in c["ratio_counter_vs_cpu"].values())
    assert "counter / cpu stream" in done.stdout and result["settings"]["dropout_stream"] == "cpu"


def fake_step_seconds(oom_from: int):
    """step_seconds without training: 10 ms per model and step, out of memory from ``oom_from`` models."""
    def step_seconds(trials, data, *, device, warmup, steps):
        if len(trials) >= oom_from:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return SimpleNamespace(precision=trials[0].train.precision, compiled=False, graph_state=lambda: None), 0.01 * len(trials)
    return step_seconds


def test_out_of_memory_skips_larger_k(tmp_path, monkeypatch, capsys):
    bench = load_script()
    monkeypatch.setattr(bench, "step_seconds", fake_step_seconds(oom_from=2))
    result = bench.main(["--smoke", "--ks", "1,2,4", "--precisions", "fp32", "--out", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text()) == result
    status = {r["k"]: r["status"] for r in result["rows"]}
    assert status == {1: "ok", 2: "oom", 4: "skipped: K=2 ran out of memory"}
    assert "out of memory" in result["rows"][1]["error"]
    # the dropout comparison at K = 1 only (the largest that fit), at fp32 (bf16 was not measured)
    assert {(c["k"], c["precision"]) for c in result["dropout"]} == {(1, "fp32")}
    assert result["dropout"][0]["ratio_dropout_vs_0"] == pytest.approx(1.0)


def test_time_limit_marks_the_rest(tmp_path, monkeypatch, capsys):
    bench = load_script()
    monkeypatch.setattr(bench, "step_seconds", fake_step_seconds(oom_from=99))
    result = bench.main(["--smoke", "--configs", "quick,seed", "--time-limit", "0", "--out", str(tmp_path / "r.json")])
    assert result["complete"] is False
    assert result["configs"] == {"quick": {"status": "skipped: time limit"},
                                 "seed": {"status": "skipped: no --data-dir given (WikiText-2)"}}
    assert json.loads((tmp_path / "r.json").read_text())["complete"] is False


def test_the_processes_summary_sums_steps_per_second_and_states_the_seed_study(tmp_path):
    """benchmarks/gpu_procs_summary.py (gpu_checks.sh's procs part): N processes' bench files -> their
    summed steps per second and the seed study's training minutes at that rate; a failed one is left out."""
    spec = importlib.util.spec_from_file_location("gpu_procs_summary", REPO / "benchmarks" / "gpu_procs_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    for i, (seconds, status) in enumerate([(0.02, "ok"), (0.04, "ok"), (None, "oom")]):
        row = {"status": status, "seconds_per_step": seconds, "ms_per_step": seconds and 1e3 * seconds}
        (tmp_path / f"p{i}.json").write_text(json.dumps({"device": {"name": "X"}, "settings": {"configs": ["seed"]},
                                                         "started": "t0", "updated": "t1", "rows": [row]}))
    out = tmp_path / "procs.json"
    result = summary.main([str(tmp_path), "--processes", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == result and result["ok"] == 2 and result["processes"] == 3
    assert result["steps_per_s_total"] == pytest.approx(1 / 0.02 + 1 / 0.04)
    assert result["seed_study_training_minutes"] == pytest.approx(94 * 5000 / 75 / 60)


def test_the_graph_benchmark_runs_on_the_cpu(tmp_path):
    """benchmarks/bench_graph.py: both arms eager on a CPU (it says so), the result file written."""
    spec = importlib.util.spec_from_file_location("bench_graph", REPO / "benchmarks" / "bench_graph.py")
    bench_graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_graph)
    from evo_attention.nn import losses

    chunk = losses.DEFAULT_CHUNK
    try:
        assert bench_graph.main(["--smoke", "--configs", "quick,seed", "--device", "cpu", "--loss-chunk", "64",
                                 "--out", str(tmp_path / "g.json")]) == 0
    finally:
        losses.DEFAULT_CHUNK = chunk
    result = json.loads((tmp_path / "g.json").read_text())
    quick, seed = result["rows"]
    assert seed == {"config": "seed", "status": "skipped: needs --data-dir"}
    assert quick["graph"]["graph_state"] == quick["eager"]["graph_state"] == "eager: not on CUDA"
    assert quick["graph"]["ms_per_step"] > 0 and result["settings"]["loss_chunk"] == 64
