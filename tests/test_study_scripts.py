"""The study's summary scripts (benchmarks/cost_rounds.py, benchmarks/strategies.py,
benchmarks/curve_verdicts.py): the rules they apply to result files, on small made-up files."""

import importlib.util
import json
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
