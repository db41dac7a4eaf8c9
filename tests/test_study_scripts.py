"""The study's summary scripts (benchmarks/cost_rounds.py, benchmarks/strategies.py,
benchmarks/curve_verdicts.py): the rules they apply to result files, on small made-up files; and
benchmarks/detached.sh, how a job that outlives its starter is started and collected. (Study 3's
computations are the package's: tests/test_study_results.py.)"""

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _round(ms: dict) -> dict:
    return {"rows": [{"name": name, "gene": f"g-{name}", "seq_len": t, "batch_size": 4096 // t, "ms_per_step": v,
                      "step_memory_mb": 10.0, "precision": "fp32"} for (name, t), v in ms.items()]}


def test_cost_rounds_calls_a_gene_faster_or_slower_only_where_every_round_agrees():
    cost_rounds = _script("cost_rounds")
    rounds = [_round({("softmax", 64): 100, ("a", 64): 90, ("b", 64): 120, ("c", 64): 95}),
              _round({("softmax", 64): 110, ("a", 64): 100, ("b", 64): 115, ("c", 64): 115})]
    rows = {r["name"]: r for r in cost_rounds.summarise(rounds)["rows"]}
    assert rows["softmax"]["call"] == "reference"
    assert rows["a"]["call"] == "faster" and rows["a"]["ratio_max"] == pytest.approx(100 / 110)
    assert rows["b"]["call"] == "slower" and rows["b"]["ms_median"] == pytest.approx(117.5)
    assert rows["c"]["call"] == "not distinguishable"  # 0.95 in one round, 1.05 in the other
    with pytest.raises(SystemExit, match="missing from some rounds"):
        cost_rounds.summarise(rounds + [_round({("softmax", 64): 100})])
    with pytest.raises(SystemExit, match="no 'softmax' gene"):
        cost_rounds.summarise([_round({("a", 64): 1.0})])


def _validation(folder: Path, mean: float, values: list, seeds=(2, 3, 4)) -> None:
    folder.mkdir(parents=True)
    folder.joinpath("validation.json").write_text(json.dumps({
        "metric": "val_perplexity", "baseline": {"mean": 4.0},
        "genes": [{"gene": "dot|softmax|output_gate|fixed", "search_value": mean - 0.1, "seeds": list(seeds),
                   "values": values, "mean": mean, "verdict": "better"}]}))


def test_strategies_pairs_the_validated_winners_by_search_seed(tmp_path):
    strategies = _script("strategies")
    for seed, (ga, rnd) in enumerate([(3.00, 3.30), (3.10, 3.35), (2.95, 3.31), (3.05, 3.40)], start=1):
        _validation(tmp_path / f"ga-{seed}", ga, [ga] * 3)
        _validation(tmp_path / f"random-{seed}", rnd, [rnd] * 3)
    _validation(tmp_path / "random-9", 3.0, [3.0] * 3)  # a seed the GA lacks: left out of the pairs
    assert strategies.main([str(tmp_path), "--out", str(tmp_path / "s.json")]) == 0
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["search_seeds"] == [1, 2, 3, 4] and result["means"]["ga"] == [3.00, 3.10, 2.95, 3.05]
    row = result["comparisons"]["ga"]
    assert row["relative"] < -0.05 and row["family_size"] == 1 and row["p_t"] < 0.05
    # 4 search seeds: the exact test decides, and its smallest p (0.125) cannot reach 0.05
    assert row["verdict"] == "undetermined" and row["test"] == "sign-flip" and row["p_value"] == 0.125
    assert row["cannot_decide"] == "4 seeds cannot decide: the smallest possible p is 0.125"
    assert strategies.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "x.json")]) == 1


def _curve(genes: dict) -> dict:
    return {"task": "mqar", "knob": "pairs", "metric": "accuracy", "steps": 100,
            "genes": [{"gene": name, "points": [{"value": v, "seeds": list(range(43, 50)), "accuracy": acc}
                                                for v, acc in points.items()]} for name, points in genes.items()]}


def test_curve_verdicts_pair_each_gene_with_the_reference_by_seed_at_one_point(tmp_path):
    curve_verdicts = _script("curve_verdicts")
    # 7 seeds: the exact test's smallest p (2^-6) passes Holm over 3 comparisons
    curve = _curve({"softmax": {2: [0.9] * 7, 16: [0.30, 0.32, 0.31, 0.29, 0.33, 0.28, 0.30]},
                    "window": {2: [0.9] * 7, 16: [0.10, 0.12, 0.11, 0.09, 0.13, 0.08, 0.10]},
                    "gqa": {2: [0.9] * 7, 16: [0.301, 0.321, 0.309, 0.291, 0.331, 0.279, 0.301]},
                    "linear": {2: [0.9] * 7, 16: [0.1, None, 0.5, 0.3, 0.2, 0.4, 0.6]}})
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(curve))
    assert curve_verdicts.main([str(path), "--at", "16", "--out", str(tmp_path / "v.json")]) == 0
    result = json.loads((tmp_path / "v.json").read_text())
    rows = result["comparisons"]
    assert result["reference"] == "softmax" and set(rows) == {"window", "gqa", "linear"}
    assert rows["window"]["verdict"] == "worse" and rows["window"]["difference"] == pytest.approx(-0.2)
    assert rows["gqa"]["verdict"] == "equivalent" and rows["gqa"]["family_size"] == 3
    assert rows["linear"]["n_pairs"] == 6 and rows["linear"]["verdict"] == "undetermined"  # a failed seed drops out
    assert result["devices"] == {"softmax": None, "window": None, "gqa": None, "linear": None}  # not recorded
    with pytest.raises(SystemExit, match="no point at"):
        curve_verdicts.verdicts(curve, 8, None, 0.02)
    with pytest.raises(SystemExit, match="not a gene of the curve"):
        curve_verdicts.verdicts(curve, 16, "favor", 0.02)


def test_curve_verdicts_say_where_each_seed_trained(tmp_path):
    # a curve can read trainings made on another machine from its store: the verdicts and their
    # table say which device each gene's seeds trained on
    curve_verdicts, doc_tables = _script("curve_verdicts"), _script("doc_tables")
    curve = _curve({"softmax": {8: [0.9] * 4, 16: [0.30, 0.32, 0.31, 0.29]},
                    "sparsemax": {8: [0.9] * 4, 16: [0.10, 0.12, 0.11, 0.09]}})
    for gene, device in zip(curve["genes"], ["cuda:0", "cpu"]):
        for point in gene["points"]:
            point["devices"] = [device] * 4
    curve["genes"][1]["points"][1]["devices"][3] = None  # a seed whose record has no device
    result = curve_verdicts.verdicts(curve, 16, None, 0.02)
    assert result["devices"] == {"softmax": ["cuda:0"] * 4, "sparsemax": ["cpu", "cpu", "cpu", None]}
    table = doc_tables.curve_verdicts(result)
    header, _, reference, sparsemax = table.strip().splitlines()
    assert header.rstrip(" |").endswith("Trained on")
    assert reference.rstrip(" |").endswith("cuda:0") and sparsemax.rstrip(" |").endswith("cpu, -")
    del result["devices"]  # a result written before devices were recorded: no column
    assert "Trained on" not in doc_tables.curve_verdicts(result)


def test_curve_verdicts_table_of_an_earlier_rules_file_gives_todays_verdicts():
    # a file written by the paired-2 rule (no analysis mark) called 3 seeds "worse" by the t-test; its
    # table states today's verdict, recomputed from the per-seed values: the exact test cannot decide
    curve_verdicts, doc_tables = _script("curve_verdicts"), _script("doc_tables")
    curve = _curve({"softmax": {16: [0.262, 0.262, 0.264]}, "window": {16: [0.096, 0.104, 0.099]}})
    for gene in curve["genes"]:
        gene["points"][0]["seeds"] = [43, 44, 45]
    result = curve_verdicts.verdicts(curve, 16, None, 0.02)
    assert result["comparisons"]["window"]["verdict"] == "undetermined"
    old = {**result, "comparisons": {"window": {**result["comparisons"]["window"], "verdict": "worse",
                                                "verdict_label": "worse", "p_holm": 0.0002}}}
    old.pop("analysis", None)
    window = doc_tables.curve_verdicts(old).strip().splitlines()[-1].split(" | ")
    assert window[4] == "0.250" and window[5].startswith("undetermined (3 seeds cannot decide")
    old["analysis"] = result["analysis"]  # a file by today's rule: its own verdicts, as written
    assert "| worse |" in doc_tables.curve_verdicts(old)


def test_transfer_and_strategies_tables_of_an_earlier_rules_file_give_todays_p_values():
    # study 2's committed ladder and strategy comparison were written by the paired-2 rule (no analysis
    # mark): their tables give today's Holm p from the per-seed values (8 seeds: the exact test decides),
    # and the ladder's interaction test by today's rule too; a file by today's rule shows its own numbers
    from evo_attention.util.stats import ANALYSIS

    doc_tables = _script("doc_tables")
    ladder = json.loads((REPO / "docs/findings/q1/transfer_test.json").read_text())
    assert "analysis" not in ladder
    rows = [row.split(" | ") for row in doc_tables.transfer(ladder).strip().splitlines()[2:]]
    assert [(r[0], r[6], r[7]) for r in rows if r[7] != "-"] == [("| 64x2", "0.0391", "better"),
                                                                   ("| 96x2", "0.0312", "better")]
    assert rows[-1][8].endswith("(p 0.7891)")  # the paired t-test gave 0.7683
    stored = doc_tables.transfer({**ladder, "analysis": ANALYSIS})
    assert "| 0.0297 | better |" in stored and "(p 0.7683)" in stored
    strategies = json.loads((REPO / "docs/findings/q4/strategies.json").read_text())
    assert "analysis" not in strategies
    table = doc_tables.TABLES["strategies"](strategies)
    assert table.count("| 0.375 | undetermined (5 seeds cannot decide") == 2 and "| 0.360 |" not in table
    stored = doc_tables.TABLES["strategies"]({**strategies, "analysis": ANALYSIS})
    assert stored.count("| 0.360 |") == 2


def test_detached_job_outlives_its_starter_and_a_later_wait_collects_it(tmp_path):
    """benchmarks/detached.sh: `start` returns at once; a `wait` shorter than the job says it still
    runs (exit 3, its log copied); a later one collects the exit status and a tar of the named paths;
    a second job in the same JOB is refused."""
    import subprocess
    import tarfile

    job, out, made = tmp_path / "job", tmp_path / "out", tmp_path / "made"
    out.mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "JOB": str(job), "OUT": str(out)}  # python3: ours
    script = str(REPO / "benchmarks" / "detached.sh")
    command = f"echo begun; sleep 3; mkdir -p {made}; echo x > {made}/a; exit 4"
    run = lambda *args: subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True,  # noqa: E731
                                       cwd=tmp_path, timeout=60)
    started = run("start", "bash", "-c", command)
    assert started.returncode == 0 and "started" in started.stdout
    early = run("wait", "0", "made")
    assert early.returncode == 3 and "still running" in early.stdout
    assert not (out / "results.tar.gz").exists()
    late = run("wait", "30", "made")
    assert late.returncode == 4 and "ended with status 4" in late.stdout
    assert (out / "job.log").read_text() == "begun\n"
    with tarfile.open(out / "results.tar.gz") as tar:
        assert tar.getnames() == ["made", "made/a"]
    again = run("start", "true")
    assert again.returncode == 2 and "already holds a job" in again.stderr


def test_detached_wait_brings_a_live_store_back_whole(tmp_path):
    """benchmarks/detached.sh: a `wait` that ends before its job copies the run store the job is
    writing through SQLite's backup (its WAL held open, uncheckpointed), so the tar holds every
    training finished so far, and progress.txt names them and the workers' steps."""
    import sqlite3
    import subprocess
    import tarfile

    from evo_attention.search.store import RunStore

    job, out, run_dir = tmp_path / "job", tmp_path / "out", tmp_path / "runs" / "cell"
    out.mkdir()
    RunStore.create(run_dir, {}).close()
    writer = ("import sys, time\n"
              "from evo_attention.search.store import RunStore\n"
              "store = RunStore.open(sys.argv[1])\n"  # held open: its write stays in the WAL until it closes
              "store.set_activity('w0', 'g', 7, 10, 1.5)\n"
              "print('written', flush=True)\n"
              "time.sleep(30)\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "JOB": str(job), "OUT": str(out)}
    script = str(REPO / "benchmarks" / "detached.sh")
    run = lambda *args: subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True,  # noqa: E731
                                       cwd=tmp_path, timeout=60)
    assert run("start", sys.executable, "-c", writer, str(run_dir)).returncode == 0
    for _ in range(100):
        if "written" in (job / "log").read_text():
            break
        time.sleep(0.1)
    try:
        early = run("wait", "0", "runs")
        assert early.returncode == 3, early.stderr
        with tarfile.open(out / "results.tar.gz") as tar:
            assert "runs/cell/run.db" in tar.getnames()
            assert not any(n.endswith("-wal") for n in tar.getnames())
            tar.extractall(tmp_path / "back", filter="data")
        back = sqlite3.connect(tmp_path / "back" / "runs" / "cell" / "run.db")
        assert back.execute("select worker, step from activity").fetchall() == [("w0", 7)]
        text = (out / "progress.txt").read_text()
        assert "runs/cell/run.db: 0 trainings finished" in text and "w0 step 7/10" in text
    finally:
        os.killpg(int((job / "pid").read_text()), signal.SIGTERM)  # `start` made the job a session of its own
