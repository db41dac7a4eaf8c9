"""The study's summary scripts (benchmarks/cost_rounds.py, benchmarks/strategies.py,
benchmarks/curve_verdicts.py, benchmarks/findings3_versus.py, benchmarks/findings3_family.py,
benchmarks/rediscovery.py): the rules they apply to result files, on small made-up files; and
benchmarks/detached.sh, how a job that outlives its starter is started and collected."""

import importlib.util
import json
import math
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
    with pytest.raises(SystemExit, match="reference strategy 'tpe'"):
        strategies.compare(strategies.collect(tmp_path), "tpe", 0.01)
    assert strategies.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "x.json")]) == 1


def test_strategies_records_the_validation_seeds_and_warns_of_seeds_shared_across_search_seeds(tmp_path, capsys):
    strategies = _script("strategies")
    for seed in (1, 2):  # seed+1 .. seed+3: search seeds 1 and 2 share validation seeds 3 and 4
        for name, mean in (("ga", 3.0), ("random", 3.3)):
            _validation(tmp_path / "shared" / f"{name}-{seed}", mean + seed / 10, [mean + seed / 10] * 3,
                        seeds=range(seed + 1, seed + 4))
            _validation(tmp_path / "blocks" / f"{name}-{seed}", mean + seed / 10, [mean + seed / 10] * 3,
                        seeds=range(1_000_000 + 2000 * seed + 1, 1_000_000 + 2000 * seed + 4))
    assert strategies.main([str(tmp_path / "shared"), "--out", str(tmp_path / "a.json")]) == 0
    use = json.loads((tmp_path / "a.json").read_text())["validation_seeds"]
    assert use["shared"] == {"3": [1, 2], "4": [1, 2]} and not use["disjoint"]
    assert use["by_search_seed"]["1"] == [2, 3, 4]
    assert "served several search seeds" in capsys.readouterr().err
    assert strategies.main([str(tmp_path / "blocks"), "--out", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["validation_seeds"]["disjoint"]
    assert "served several" not in capsys.readouterr().err


def test_strategies_reads_suite_validations_with_higher_accuracy_better(tmp_path):
    strategies = _script("strategies")
    for seed in range(1, 7):  # 6 search seeds, GA ahead on every one: the exact p 2/64 passes alone
        for name, mean in (("ga", 0.60 + seed / 1000), ("random", 0.55 + seed / 1000)):
            folder = tmp_path / f"{name}-{seed}"
            folder.mkdir()
            folder.joinpath("validation_suite.json").write_text(json.dumps({
                "metric": "suite_accuracy", "lower_is_better": False, "baseline": {"mean": 0.5},
                "genes": [{"gene": "g", "seeds": [seed], "values": [mean], "mean": mean}]}))
    assert strategies.main([str(tmp_path), "--reference", "random", "--margin", "0.02",
                            "--out", str(tmp_path / "s.json")]) == 0
    row = json.loads((tmp_path / "s.json").read_text())["comparisons"]["ga"]
    assert row["scale"] == "linear" and row["difference"] == pytest.approx(0.05)
    assert row["verdict"] == "better" and row["p_value"] == pytest.approx(2 / 64)
    (tmp_path / "ga-1" / "validation.json").write_text(  # a second file for one search is refused
        (tmp_path / "ga-1" / "validation_suite.json").read_text())
    with pytest.raises(SystemExit, match="keep one"):
        strategies.collect(tmp_path)


def _suite_validation(path: Path, genes: dict, baseline=(0.50, 0.52, 0.51, 0.49, 0.50, 0.53)) -> None:
    seeds = list(range(1_204_001, 1_204_001 + len(baseline)))
    path.write_text(json.dumps({
        "metric": "suite_accuracy", "lower_is_better": False,
        "baseline": {"gene": "vanilla", "seeds": seeds, "values": list(baseline)},
        "genes": [{"gene": g, "seeds": seeds, "values": v} for g, v in genes.items()]}))


def test_findings3_versus_pairs_each_gene_with_a_gene_of_another_file(tmp_path):
    versus = _script("findings3_versus")
    _suite_validation(tmp_path / "programs.json", {
        "p1": [0.70, 0.72, 0.71, 0.69, 0.70, 0.73],    # above the gate on every seed
        "p2": [0.600, 0.621, 0.610, 0.590, 0.600, 0.631]})  # the gate's values, +0.001 at most
    _suite_validation(tmp_path / "gate.json", {"gate": [0.60, 0.62, 0.61, 0.59, 0.60, 0.63]})
    assert versus.main([str(tmp_path / "programs.json"), "--reference-file", str(tmp_path / "gate.json"),
                        "--reference", "gate", "--margin", "0.02", "--out", str(tmp_path / "v.json")]) == 0
    out = json.loads((tmp_path / "v.json").read_text())
    p1, p2 = out["genes"]["p1"], out["genes"]["p2"]
    assert out["log"] is False  # suite accuracy: raw differences
    assert p1["family_size"] == 2 and p1["difference"] == pytest.approx(0.10)
    # 6 pairs, all positive: exact p 2/64, Holm over 2 gives 0.0625: the exact test cannot decide
    assert p1["test"] == "sign-flip" and p1["verdict"] == "undetermined" and p1["p_holm"] == pytest.approx(0.0625)
    assert p2["verdict"] == "equivalent" and abs(p2["difference"]) < 0.002
    # one file holding both, the reference at its selected rate (a recipe part)
    _suite_validation(tmp_path / "both.json", {"p1": [0.70, 0.72, 0.71, 0.69, 0.70, 0.73],
                                               "gate|lr=0.008": [0.60, 0.62, 0.61, 0.59, 0.60, 0.63]})
    assert versus.main([str(tmp_path / "both.json"), "--reference-file", str(tmp_path / "both.json"),
                        "--reference", "gate", "--out", str(tmp_path / "b.json")]) == 0
    both = json.loads((tmp_path / "b.json").read_text())
    assert list(both["genes"]) == ["p1"] and both["genes"]["p1"]["family_size"] == 1
    assert both["genes"]["p1"]["verdict"] == "better"  # exact p 2/64 alone
    _suite_validation(tmp_path / "other.json", {"gate": [0.6] * 6}, baseline=(0.4,) * 6)
    with pytest.raises(SystemExit, match="not paired"):
        versus.main([str(tmp_path / "programs.json"), "--reference-file", str(tmp_path / "other.json"),
                     "--reference", "gate", "--out", str(tmp_path / "x.json")])


def _matched_validation(path: Path, gene: str, changes: list, seeds=range(1_402_001, 1_402_009)) -> None:
    """A validate --match-params file: the gene's perplexity is the matched model's times exp(change)."""
    base = [100.0 + i for i in range(len(changes))]
    path.write_text(json.dumps({
        "genes": [{"gene": gene, "seeds": list(seeds), "values": [b * math.exp(c) for b, c in zip(base, changes)]}],
        "matched_baselines": [{"gene": "vanilla", "d_ff": 288, "matched_to": [gene], "seeds": list(seeds),
                               "values": base}]}))


def test_findings3_family_holds_the_cells_to_holm_and_tests_the_trend_by_seed(tmp_path):
    family = _script("findings3_family")
    gate = "dot|softmax|output_gate|fixed|bias|0.10"
    jitter = [0.001, -0.002, 0.0015, 0.0, -0.001, 0.002, -0.0005, 0.0005]
    # the advantage grows on every seed: -1%, -2%, -3% at 2, 6, 12 tokens per parameter
    for name, change in (("tpp2", -0.01), ("tpp6", -0.02), ("tpp12", -0.03)):
        _matched_validation(tmp_path / f"{name}.json", f"{gate}|lr=0.008", [change + j for j in jitter])
    _matched_validation(tmp_path / "seed.json", f"{gate}|lr=0.004", [0.0 + j for j in jitter],
                        seeds=range(1_404_001, 1_404_009))
    cells = [f"--cell={n}={tmp_path / n}.json" for n in ("tpp2", "tpp6", "tpp12", "seed")]
    assert family.main(["--gene", gate, *cells, "--trend", "tpp2=2,tpp6=6,tpp12=12",
                        "--out", str(tmp_path / "f.json")]) == 0
    out = json.loads((tmp_path / "f.json").read_text())
    rows = out["family"]
    assert all(row["family_size"] == 4 for row in rows.values())
    # 8 negative pairs: exact p 2/256, times 4 (Holm's first step) is 0.03125: better
    assert rows["tpp12"]["verdict"] == "better" and rows["tpp12"]["p_holm"] == pytest.approx(4 * 2 / 256)
    assert rows["seed"]["verdict"] != "better"
    trend = out["trend"]
    assert trend["seeds"] == list(range(1_402_001, 1_402_009)) and trend["mean_slope"] < 0
    assert trend["p_exact"] == pytest.approx(2 / 256) and trend["words"].startswith("the gene's advantage grows")
    # the trend alone, before the seed config's cell exists: the same trend, no Holm family
    assert family.main(["--gene", gate, *cells[:3], "--trend", "tpp2=2,tpp6=6,tpp12=12", "--trend-only",
                        "--out", str(tmp_path / "t.json")]) == 0
    alone = json.loads((tmp_path / "t.json").read_text())
    assert "family" not in alone and alone["trend"] == trend
    # the docs' table of each: the cells with Holm over 4, the trend as a relative change per doubling
    tables = _script("doc_tables")
    rendered = tables.d4_family(out)
    assert "p (Holm, 4)" in rendered and all(f"\n| {c} |" in rendered for c in ("tpp6", "tpp12", "seed"))
    assert "| tpp2 (2), tpp6 (6), tpp12 (12) | 8 |" in rendered
    assert f"{100 * math.expm1(trend['mean_slope']):+.2f}%" in rendered
    assert "Holm" not in tables.d4_family(alone) and "no trend shown" not in tables.d4_family(alone)
    with pytest.raises(SystemExit, match="--trend-only needs --trend"):
        family.main(["--gene", gate, *cells[:3], "--trend-only", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="no parameter-matched baseline"):
        (tmp_path / "plain.json").write_text(json.dumps({"genes": [{"gene": gate, "seeds": [1], "values": [1.0]}]}))
        family.main(["--gene", gate, f"--cell=a={tmp_path / 'plain.json'}", "--out", str(tmp_path / "x.json")])


def _search_run(folder: Path, strategy: str, genes: list, top: list) -> None:
    """A suite search's files: evaluations in order (generation 0 first), its top table, its history."""
    folder.mkdir(parents=True)
    with open(folder / "evaluations.csv", "w") as f:
        f.write("id,role,generation,gene\n1,baseline,,vanilla\n")
        for i, (generation, gene) in enumerate(genes, start=2):
            f.write(f'{i},search,{generation},"{gene}"\n')
    folder.joinpath("final_results.json").write_text(json.dumps({
        "strategy": {"name": strategy, "options": {}}, "config": {"seed": 1}, "suite": {"name": "s"},
        "top_5": [{"gene": g, "suite_accuracy": 0.5} for g in top],
        "history": [{"generation": 0, "best_gene": genes[0][1], "best_suite_accuracy": 0.4},
                    {"generation": 1, "best_gene": top[0], "best_suite_accuracy": 0.5}]}))


def test_rediscovery_counts_winners_holding_each_feature_and_compares_strategies(tmp_path):
    rediscovery = _script("rediscovery")
    plain = "prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"
    gated = "prog=o(sgate(mix(w.softmax(t.fixed(s.dot(dconv3(q),k))),v)))"
    squared = "prog=o(mix(w.relu_norm(sqrelu(t.fixed(s.dot(q,k)))),v))"
    assert rediscovery.ops(gated) == {"o", "sgate", "mix", "w.softmax", "t.fixed", "s.dot", "dconv3"}
    assert rediscovery.holds("dot|softmax|output_gate|fixed|bias|0.10|" + gated, "output gate")
    assert not rediscovery.holds("dot|softmax|output_gate|fixed|bias|0.10", "output gate")  # programs only
    runs = []
    for seed in range(1, 9):  # the GA's winners are gated on every seed, random's never
        for strategy, winner in (("ga", gated), ("random", plain)):
            run = tmp_path / f"{strategy}-{seed}"
            _search_run(run, strategy, [(0, plain), (0, squared), (1, winner)], [winner, squared])
            runs.append(str(run))
    # a search of another budget (D1's), its evaluations.csv not kept: described, in no count
    other = tmp_path / "d1-search"
    _search_run(other, "ga", [(0, gated)], [gated])
    (other / "evaluations.csv").unlink()
    with pytest.raises(SystemExit, match="evaluations.csv is missing"):
        rediscovery.main([*runs, str(other), "--out", str(tmp_path / "r.json")])
    assert rediscovery.main([*runs, "--describe", str(other), "--out", str(tmp_path / "r.json")]) == 0
    out = json.loads((tmp_path / "r.json").read_text())
    (described,) = out["described"]
    assert described["features"]["output gate"]["found"] and described["evaluated"] is None
    assert described["features"]["output gate"]["first_evaluation"] is None
    assert described["features"]["output gate"]["first_generation_best"] == 0
    ga, rnd = out["strategies"]["ga"], out["strategies"]["random"]
    assert ga["output gate"]["solved"] == 8 and ga["output gate"]["n"] == 8 and rnd["output gate"]["solved"] == 0
    assert ga["squared ReLU"]["solved"] == 0 and ga["squared ReLU"]["in_top_5"] == 8
    assert ga["output gate"]["base_rate"] == 0 and ga["squared ReLU"]["base_rate"] == 0.5
    first = out["searches"][0]["features"]
    assert first["output gate"]["first_evaluation"] == 3 and first["output gate"]["first_generation_best"] == 1
    row = out["comparisons"]["ga"]["output gate"]
    assert row["family_size"] == 3 and row["words"] == "rediscovered more often"  # 8/8 against 0/8
    assert out["comparisons"]["ga"]["squared ReLU"]["words"] == "no difference shown"


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


def test_store_times_counts_each_role_and_reports_gaps_without_a_stored_training():
    """benchmarks/store_times.py: per role the trainings, first and last stored, the summed time, and
    the stretches longer than the gap in which no training was stored (a stop and resume)."""
    from types import SimpleNamespace

    times = _script("store_times")
    at = ["2026-11-26T08:00:00+00:00", "2026-11-26T08:01:00+00:00", "2026-11-26T08:30:00+00:00"]
    records = [SimpleNamespace(role="search", created_at=t, time_s=60.0) for t in at]
    records.append(SimpleNamespace(role="baseline", created_at=at[0], time_s=None))
    out = times.store_times(records, gap_s=600)
    search = out["search"]
    assert search["trainings"] == 3 and search["summed_time_s"] == 180.0 and search["span_s"] == 1800
    assert search["gaps"] == [{"from": "2026-11-26T08:01:00+00:00", "to": "2026-11-26T08:30:00+00:00",
                               "seconds": 1740}]
    assert search["span_without_gaps_s"] == 60
    assert out["baseline"] == {"trainings": 1, "first_stored": "2026-11-26T08:00:00+00:00",
                               "last_stored": "2026-11-26T08:00:00+00:00", "span_s": 0, "gaps": [],
                               "span_without_gaps_s": 0, "summed_time_s": 0.0}
    one = SimpleNamespace(role="search", generation=0, gene="g", created_at=at[1], time_s=12.0, train_time_s=10.0,
                          trained_steps=5000, device="cuda:0", precision="bf16", status="ok", val_loss=4.5,
                          extra={"cuda_graph": "captured at step 3"})
    first = SimpleNamespace(**{**vars(one), "created_at": at[0], "trained_steps": 0, "extra": {}})
    rows = times.training_rows([one, first])
    assert [r["stored"] for r in rows] == at[:2]  # in the order stored
    assert rows[0]["ms_per_step"] is None and rows[0]["cuda_graph"] is None
    assert rows[1]["ms_per_step"] == 2.0 and rows[1]["cuda_graph"] == "captured at step 3"


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
