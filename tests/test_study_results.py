"""studies.results: the verdicts a study's stages compute from result files (versus, family and
trend, strategies, rediscovery, rate selection, store times), on small made-up files; and the study
tables that render them (report.studies.study_tables)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from evo_attention.report.studies import study_tables
from evo_attention.studies import results
from evo_attention.util.errors import UserError

GATE = "dot|softmax|output_gate|fixed|bias|0.10"


def _validation(folder: Path, mean: float, values: list, seeds=(2, 3, 4), name="validation.json", **extra) -> None:
    folder.mkdir(parents=True)
    folder.joinpath(name).write_text(json.dumps({
        "metric": "val_perplexity", "baseline": {"mean": 4.0}, **extra,
        "genes": [{"gene": "dot|softmax|output_gate|fixed", "search_value": mean - 0.1, "seeds": list(seeds),
                   "values": values, "mean": mean, "verdict": "better"}]}))


def test_strategies_pair_the_validated_winners_by_search_seed(tmp_path):
    for seed, (ga, rnd) in enumerate([(3.00, 3.30), (3.10, 3.35), (2.95, 3.31), (3.05, 3.40)], start=1):
        _validation(tmp_path / f"ga-{seed}", ga, [ga] * 3)
        _validation(tmp_path / f"random-{seed}", rnd, [rnd] * 3)
    _validation(tmp_path / "random-9", 3.0, [3.0] * 3)  # a seed the GA lacks: left out of the pairs
    result = results.compare_strategies(results.collect_strategies(tmp_path), "random", 0.01)
    assert result["search_seeds"] == [1, 2, 3, 4] and result["means"]["ga"] == [3.00, 3.10, 2.95, 3.05]
    row = result["comparisons"]["ga"]
    assert row["relative"] < -0.05 and row["family_size"] == 1 and row["p_t"] < 0.05
    # 4 search seeds: the exact test decides, and its smallest p (0.125) cannot reach 0.05
    assert row["verdict"] == "undetermined" and row["test"] == "sign-flip" and row["p_value"] == 0.125
    assert row["cannot_decide"] == "4 seeds cannot decide: the smallest possible p is 0.125"
    with pytest.raises(UserError, match="reference strategy 'tpe'"):
        results.compare_strategies(results.collect_strategies(tmp_path), "tpe", 0.01)


def test_strategies_record_the_validation_seeds_shared_across_search_seeds(tmp_path):
    for seed in (1, 2):  # seed+1 .. seed+3: search seeds 1 and 2 share validation seeds 3 and 4
        for name, mean in (("ga", 3.0), ("random", 3.3)):
            _validation(tmp_path / "shared" / f"{name}-{seed}", mean + seed / 10, [mean + seed / 10] * 3,
                        seeds=range(seed + 1, seed + 4))
            _validation(tmp_path / "blocks" / f"{name}-{seed}", mean + seed / 10, [mean + seed / 10] * 3,
                        seeds=range(1_000_000 + 2000 * seed + 1, 1_000_000 + 2000 * seed + 4))
    found = results.collect_strategies(tmp_path / "shared")
    use = results.compare_strategies(found, "random", 0.01)["validation_seeds"]
    assert use["shared"] == {"3": [1, 2], "4": [1, 2]} and not use["disjoint"]
    assert use["by_search_seed"]["1"] == [2, 3, 4]
    assert results.compare_strategies(results.collect_strategies(tmp_path / "blocks"), "random",
                                      0.01)["validation_seeds"]["disjoint"]


def test_strategies_read_suite_validations_with_higher_accuracy_better(tmp_path):
    for seed in range(1, 7):  # 6 search seeds, GA ahead on every one: the exact p 2/64 passes alone
        for name, mean in (("ga", 0.60 + seed / 1000), ("random", 0.55 + seed / 1000)):
            folder = tmp_path / f"{name}-{seed}"
            folder.mkdir()
            folder.joinpath("validation_suite.json").write_text(json.dumps({
                "metric": "suite_accuracy", "lower_is_better": False, "baseline": {"mean": 0.5},
                "genes": [{"gene": "g", "seeds": [seed], "values": [mean], "mean": mean}]}))
    result = results.compare_strategies(results.collect_strategies(tmp_path), "random", 0.02)
    row = result["comparisons"]["ga"]
    assert row["scale"] == "linear" and row["difference"] == pytest.approx(0.05)
    assert row["verdict"] == "better" and row["p_value"] == pytest.approx(2 / 64)
    # the table keeps a suite accuracy difference in units
    assert "| ga | +0.0500 [" in study_tables.strategies(result)
    (tmp_path / "ga-1" / "validation.json").write_text(  # a second file for one search is refused
        (tmp_path / "ga-1" / "validation_suite.json").read_text())
    with pytest.raises(UserError, match="keep one"):
        results.collect_strategies(tmp_path)


def _suite_validation(genes: dict, baseline=(0.50, 0.52, 0.51, 0.49, 0.50, 0.53)) -> dict:
    seeds = list(range(1_204_001, 1_204_001 + len(baseline)))
    return {"metric": "suite_accuracy", "lower_is_better": False,
            "baseline": {"gene": "vanilla", "seeds": seeds, "values": list(baseline)},
            "genes": [{"gene": g, "seeds": seeds, "values": v} for g, v in genes.items()]}


def test_versus_pairs_each_gene_with_a_gene_of_another_file():
    programs = _suite_validation({"p1": [0.70, 0.72, 0.71, 0.69, 0.70, 0.73],  # above the gate on every seed
                                  "p2": [0.600, 0.621, 0.610, 0.590, 0.600, 0.631]})  # the gate's, +0.001 at most
    gate = _suite_validation({"gate": [0.60, 0.62, 0.61, 0.59, 0.60, 0.63]})
    out = results.versus(programs, gate, "gate", 0.02)
    p1, p2 = out["genes"]["p1"], out["genes"]["p2"]
    assert out["log"] is False  # suite accuracy: raw differences
    assert p1["family_size"] == 2 and p1["difference"] == pytest.approx(0.10)
    # 6 pairs, all positive: exact p 2/64, Holm over 2 gives 0.0625: the exact test cannot decide
    assert p1["test"] == "sign-flip" and p1["verdict"] == "undetermined" and p1["p_holm"] == pytest.approx(0.0625)
    assert p2["verdict"] == "equivalent" and abs(p2["difference"]) < 0.002
    # one file holding both, the reference at its selected rate (a recipe part)
    both = _suite_validation({"p1": [0.70, 0.72, 0.71, 0.69, 0.70, 0.73],
                              "gate|lr=0.008": [0.60, 0.62, 0.61, 0.59, 0.60, 0.63]})
    alone = results.versus(both, both, "gate", 0.01)
    assert list(alone["genes"]) == ["p1"] and alone["genes"]["p1"]["family_size"] == 1
    assert alone["genes"]["p1"]["verdict"] == "better"  # exact p 2/64 alone
    with pytest.raises(UserError, match="not paired"):
        results.versus(programs, _suite_validation({"gate": [0.6] * 6}, baseline=(0.4,) * 6), "gate", 0.02)


def test_the_versus_table_shows_a_difference_of_logs_as_a_relative_change_on_the_scored_split():
    row = {"values": [110.0, 111.0], "difference": math.log(1.1), "diff_ci_low": math.log(1.05),
           "diff_ci_high": math.log(1.15), "test": "sign-flip", "p_holm": 0.5, "p_tost_holm": 1.0,
           "verdict_label": "undetermined"}
    payload = {"reference": "gate", "metric": "val_perplexity", "metric_label": "perplexity",
               "eval_split": "test", "log": True, "margin": 0.01, "seeds": [1, 2],
               "reference_values": [100.0, 101.0], "genes": {"p": row}}
    table = study_tables.versus(payload)
    assert "Mean test perplexity (2 seeds)" in table and "+10.00% [+5.00, +15.00]" in table
    # an accuracy file (raw scale, no split recorded) keeps its differences in units
    raw = {**payload, "metric": "accuracy", "log": False, "metric_label": None, "eval_split": None,
           "genes": {"p": {**row, "difference": 0.1, "diff_ci_low": 0.05, "diff_ci_high": 0.15}}}
    assert "Mean accuracy (2 seeds)" in study_tables.versus(raw)
    assert "+0.100 [+0.050, +0.150]" in study_tables.versus(raw)


def _matched_validation(gene: str, changes: list, seeds=range(1_402_001, 1_402_009)) -> dict:
    """A validate --match-params file: the gene's perplexity is the matched model's times exp(change)."""
    base = [100.0 + i for i in range(len(changes))]
    return {"genes": [{"gene": gene, "seeds": list(seeds), "values": [b * math.exp(c) for b, c in zip(base, changes)]}],
            "matched_baselines": [{"gene": "vanilla", "d_ff": 288, "matched_to": [gene], "seeds": list(seeds),
                                   "values": base}],
            "baseline": {"gene": "vanilla", "seeds": list(seeds), "values": [b * 1.01 for b in base]}}


def test_family_holds_the_cells_to_holm_and_the_trend_is_tested_by_seed():
    jitter = [0.001, -0.002, 0.0015, 0.0, -0.001, 0.002, -0.0005, 0.0005]
    # the advantage grows on every seed: -1%, -2%, -3% at 2, 6, 12 tokens per parameter
    files = {name: _matched_validation(f"{GATE}|lr=0.008", [change + j for j in jitter])
             for name, change in (("tpp2", -0.01), ("tpp6", -0.02), ("tpp12", -0.03))}
    files["seed"] = _matched_validation(f"{GATE}|lr=0.004", jitter, seeds=range(1_404_001, 1_404_009))
    cells = {n: results.matched_pair(f, GATE, n) for n, f in files.items()}
    rows = results.family(cells, 0.01)
    assert all(row["family_size"] == 4 for row in rows.values())
    # 8 negative pairs: exact p 2/256, times 4 (Holm's first step) is 0.03125: better
    assert rows["tpp12"]["verdict"] == "better" and rows["tpp12"]["p_holm"] == pytest.approx(4 * 2 / 256)
    assert rows["seed"]["verdict"] != "better"
    trend = results.trend(cells, {"tpp2": 2, "tpp6": 6, "tpp12": 12})
    assert trend["seeds"] == list(range(1_402_001, 1_402_009)) and trend["mean_slope"] < 0
    assert trend["p_exact"] == pytest.approx(2 / 256) and trend["words"].startswith("the gene's advantage grows")
    assert results.trend_verdict(trend) == "grows"
    # the table: the cells with Holm over 4, the trend as a relative change per doubling; the trend alone
    rendered = study_tables.d4_family({"family": rows, "trend": trend, "margin": 0.01})
    assert "p (Holm, 4)" in rendered and all(f"\n| {c} |" in rendered for c in ("tpp6", "tpp12", "seed"))
    assert "| tpp2 (2), tpp6 (6), tpp12 (12) | 8 |" in rendered
    assert f"{100 * math.expm1(trend['mean_slope']):+.2f}%" in rendered
    assert "Holm" not in study_tables.d4_family({"trend": trend})
    # against the file's plain baseline instead of a matched model
    assert results.matched_pair(files["tpp2"], GATE, "tpp2", against="baseline")["matched_values"][0] == 101.0
    with pytest.raises(UserError, match="no parameter-matched baseline"):
        results.matched_pair({"genes": [{"gene": GATE, "seeds": [1], "values": [1.0]}]}, GATE, "plain.json")



def test_family_and_trend_follow_a_higher_is_better_metric_in_its_units():
    """An accuracy family: a gene below its matched model on every seed is worse (not better, as a
    lower-is-better reading would say), a gap widening with the level is a shrinking advantage, the
    table keeps units; cells on different metrics are refused."""
    seeds, jitter = range(1_402_001, 1_402_009), [0.001, -0.002, 0.0015, 0.0, -0.001, 0.002, -0.0005, 0.0005]

    def cell(name: str, gap: float) -> dict:
        base = [0.90 + 0.01 * i for i in range(8)]
        values = [b - gap - 10 * gap * j for b, j in zip(base, jitter)]
        payload = {"metric": "accuracy", "lower_is_better": False,
                   "genes": [{"gene": GATE, "seeds": list(seeds), "values": values}],
                   "matched_baselines": [{"gene": "vanilla", "d_ff": 288, "matched_to": [GATE], "seeds": list(seeds),
                                          "values": base}]}
        return results.matched_pair(payload, GATE, name)

    cells = {"tpp2": cell("tpp2", 0.1), "tpp6": cell("tpp6", 0.2), "tpp12": cell("tpp12", 0.3)}
    rows = results.family(cells, 0.01)
    assert {row["verdict"] for row in rows.values()} == {"worse"} and rows["tpp2"]["scale"] == "linear"
    assert rows["tpp2"]["difference"] == pytest.approx(-0.1, abs=1e-3)
    trend = results.trend(cells, {"tpp2": 2, "tpp6": 6, "tpp12": 12})
    assert trend["mean_slope"] < 0 and results.trend_verdict(trend) == "shrinks"
    assert trend["words"].startswith("the gene's advantage shrinks")
    rendered = study_tables.d4_family({"family": rows, "trend": trend, "margin": 0.01})
    assert "| -0.100 [" in rendered and "Equivalence p (Holm, ±0.01)" in rendered
    assert f"| {trend['mean_slope']:+.4f} |" in rendered and "%]" not in rendered and "% |" not in rendered
    with pytest.raises(UserError, match="cells differ in metric or direction: .*tpp6 val_perplexity"):
        results.family({**cells, "tpp6": {**cells["tpp6"], "metric": "val_perplexity", "lower_is_better": True}}, 0.01)


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
    plain = "prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"
    gated = "prog=o(sgate(mix(w.softmax(t.fixed(s.dot(dconv3(q),k))),v)))"
    squared = "prog=o(mix(w.relu_norm(sqrelu(t.fixed(s.dot(q,k)))),v))"
    assert results.ops(gated) == {"o", "sgate", "mix", "w.softmax", "t.fixed", "s.dot", "dconv3"}
    assert results.holds("dot|softmax|output_gate|fixed|bias|0.10|" + gated, "output gate")
    assert not results.holds("dot|softmax|output_gate|fixed|bias|0.10", "output gate")  # programs only
    runs = []
    for seed in range(1, 9):  # the GA's winners are gated on every seed, random's never
        for strategy, winner in (("ga", gated), ("random", plain)):
            run = tmp_path / f"{strategy}-{seed}"
            _search_run(run, strategy, [(0, plain), (0, squared), (1, winner)], [winner, squared])
            runs.append(run)
    other = tmp_path / "d1-search"  # another budget's search without evaluations.csv: described only
    _search_run(other, "ga", [(0, gated)], [gated])
    (other / "evaluations.csv").unlink()
    with pytest.raises(UserError, match="evaluations.csv is missing"):
        results.search_features(other)
    described = results.search_features(other, need_evaluations=False)
    assert described["features"]["output gate"]["found"] and described["evaluated"] is None
    assert described["features"]["output gate"]["first_generation_best"] == 0
    searches = [results.search_features(r) for r in runs]
    out = results.rediscovery(searches, "random")
    ga, rnd = out["strategies"]["ga"], out["strategies"]["random"]
    assert ga["output gate"]["solved"] == 8 and ga["output gate"]["n"] == 8 and rnd["output gate"]["solved"] == 0
    assert ga["squared ReLU"]["solved"] == 0 and ga["squared ReLU"]["in_top_5"] == 8
    assert ga["output gate"]["base_rate"] == 0 and ga["squared ReLU"]["base_rate"] == 0.5
    assert searches[0]["features"]["output gate"]["first_evaluation"] == 3
    row = out["comparisons"]["ga"]["output gate"]
    assert row["family_size"] == 3 and row["words"] == "rediscovered more often"  # 8/8 against 0/8
    assert out["comparisons"]["ga"]["squared ReLU"]["words"] == "no difference shown"
    lines = study_tables.rediscovery(out).splitlines()
    assert "| output gate | ga | 8/8 | 1.00 [0.63, 1.00] | 8/8 | 3 (3-3) | 0.000 |" in lines
    assert any(line.startswith("| output gate | ga | +1.00 |") and "rediscovered more often" in line for line in lines)


def test_select_rate_takes_the_baselines_best_mean_ties_to_the_smaller_and_says_when_at_an_edge():
    picked = results.select_rate({"1e-3": 0.5, "2e-3": 0.9, "4e-3": 0.9, "8e-3": 0.1}, lower_is_better=False)
    assert picked["selected"] == "2e-3" and not picked["at_edge"]
    assert results.select_rate({"1e-3": 3.0, "2e-3": 4.0}, lower_is_better=True)["at_edge"]
    assert "| 2e-3 | 0.9000 | **yes** |" in study_tables.suite_rate(picked)


def test_store_times_count_each_role_and_report_gaps_without_a_stored_training():
    at = ["2026-11-26T08:00:00+00:00", "2026-11-26T08:01:00+00:00", "2026-11-26T08:30:00+00:00"]
    records = [SimpleNamespace(role="search", created_at=t, time_s=60.0) for t in at]
    records.append(SimpleNamespace(role="baseline", created_at=at[0], time_s=None))
    out = results.store_times(records, gap_s=600)
    search = out["search"]
    assert search["trainings"] == 3 and search["summed_time_s"] == 180.0 and search["span_s"] == 1800
    assert search["gaps"] == [{"from": "2026-11-26T08:01:00+00:00", "to": "2026-11-26T08:30:00+00:00",
                               "seconds": 1740}]
    assert search["span_without_gaps_s"] == 60 and out["baseline"]["summed_time_s"] == 0.0
    one = SimpleNamespace(role="search", generation=0, gene="g", created_at=at[1], time_s=12.0, train_time_s=10.0,
                          trained_steps=5000, device="cuda:0", precision="bf16", status="ok", val_loss=4.5,
                          extra={"cuda_graph": "captured at step 3"})
    first = SimpleNamespace(**{**vars(one), "created_at": at[0], "trained_steps": 0, "extra": {}})
    rows = results.training_rows([one, first])
    assert [r["stored"] for r in rows] == at[:2]  # in the order stored
    assert rows[0]["ms_per_step"] is None and rows[1]["ms_per_step"] == 2.0
    assert rows[1]["cuda_graph"] == "captured at step 3"


def _validated_run(folder: Path, winner: str, verdict: str, values: list, relative: float, seed: int,
                   metric: str = "val_perplexity", name: str = "validation.json") -> dict:
    """A climb's files and the validation of its winner beside them (``validate --from-run --top 1``)."""
    _search_run(folder, "climb", [(0, winner)], [winner])
    folder.joinpath(name).write_text(json.dumps({"metric": metric, "genes": [
        {"gene": winner, "verdict": verdict, "relative": relative, "values": values,
         "versus": {"baseline": "matched"}}]}))
    found = results.search_features(folder)
    found["seed"] = seed
    return found


def test_a_registered_rediscovery_rule_counts_searches_and_sets_the_rate_against_its_bar(tmp_path):
    gated = "prog=o(sgate(mix(w.softmax(t.fixed(s.dot(q,k))),v)))"
    mixed = "prog=o(mix(w.softmax(t.fixed(s.dot(shift(q),k))),v))"
    plain = "prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"
    # 9 of 10 searches rediscover: 5 hold the gate (whatever their verdict), 4 others are validated better
    searches = [_validated_run(tmp_path / f"g{i}", gated, "undetermined", [2.0], 0.0, i) for i in range(5)]
    searches += [_validated_run(tmp_path / f"m{i}", mixed, "better", [1.9], -0.03 - i / 100, 5 + i) for i in range(4)]
    searches += [_validated_run(tmp_path / "p", plain, "worse", [2.1], 0.02, 9)]
    assert searches[5]["validated"] == {"verdict": "better", "relative": -0.03, "difference": None, "values": [1.9],
                                        "against": "matched",
                                        "metric": "val_perplexity", "file": "validation.json"}
    rule = [["holds output gate"], ["validated better"]]
    out = results.rediscovered(searches, rule, bar=0.5)
    rate = out["rates"]["climb"]
    assert (rate["solved"], rate["n"], rate["verdict"]) == (9, 10, "above")  # [0.555, 0.997]: above one half
    assert [s["rediscovered"] for s in searches] == [True] * 9 + [False]
    assert results.rediscovered(searches[4:], rule, 0.5)["rates"]["climb"]["verdict"] == "undetermined"  # 5/6
    assert results.rediscovered(searches[9:] * 10, rule, 0.5)["rates"]["climb"]["verdict"] == "below"  # 0/10
    # both facts of an alternative must hold: token mixing and solving (every fresh value >= 0.9)
    recall = [_validated_run(tmp_path / "r1", mixed, "better", [0.95, 0.91], 0.4, 1, "suite_accuracy",
                             "validation_suite.json"),
              _validated_run(tmp_path / "r2", mixed, "better", [0.95, 0.85], 0.4, 2, "suite_accuracy",
                             "validation_suite.json")]
    out = results.rediscovered(recall, [["holds token mixing", "solves"]], bar=0.5, solve_at=0.9)
    assert [s["rediscovered"] for s in recall] == [True, False] and out["rates"]["climb"]["solved"] == 1
    payload = {**results.rediscovery(recall, "climb", ["token mixing"]), "searches": recall, "outcome": out}
    text = study_tables.rediscovery(payload)
    assert "Rediscovered: (holds token mixing and solves) (solves: every fresh value >= 0.9)." in text
    assert "| climb | 1/2 | 0.50 [0.01, 0.99] | 0.5 | undetermined |" in text
    for bad, bar, match in (([["holds a wish"]], 0.5, "'holds a wish' is not a fact"), ([], 0.5, "list of alternatives"),
                            (rule, 1.5, "not a rate between 0 and 1")):
        with pytest.raises(UserError, match=match):
            results.check_rule(bad, bar)
    with pytest.raises(UserError, match="rediscovery features"):
        results.rediscovery(recall, "climb", ["a wish"])


def test_a_validation_beside_a_search_must_hold_its_winner(tmp_path):
    run = tmp_path / "climb-1"
    _search_run(run, "climb", [(0, "prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),v))")],
                ["prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"])
    assert results.search_features(run)["validated"] is None  # not validated: no facts of a validation
    run.joinpath("validation.json").write_text(json.dumps({"genes": [{"gene": "another", "verdict": "better"}]}))
    with pytest.raises(UserError, match="does not validate the search's winner"):
        results.search_features(run)
    # a search whose winner is its baseline: validate leaves it out, and it is no validated improvement
    run.joinpath("validation.json").write_text(json.dumps({"baseline": {"gene": "prog=o(mix(w.softmax(t.fixed("
                                                                        "s.dot(q,k))),v))"}, "genes": []}))
    assert results.search_features(run)["validated"]["verdict"] == "the baseline itself"


def test_reliability_pools_each_searchs_rank_correlation_with_its_interval():
    def validation(seed, pairs):
        return {"search_seed": seed, "genes": [{"search_value": a, "mean": b} for a, b in pairs]}

    agree = validation(1, [(1.0, 2.0), (2.0, 3.0), (3.0, 5.0), (4.0, 4.5)])  # rho 0.8
    exact = validation(2, [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)])  # rho 1
    short = validation(3, [(1.0, 1.0), (2.0, 2.0)])  # two genes: no correlation
    out = results.reliability([agree, exact, short])
    assert [r["rho"] for r in out["searches"]] == [pytest.approx(0.8), pytest.approx(1.0), None]
    assert out["pooled"]["n"] == 2 and out["pooled"]["mean"] == pytest.approx(0.9)
    assert out["pooled"]["ci_low"] < 0.9 < out["pooled"]["ci_high"]
    text = study_tables.reliability(out)
    assert "| **pooled (2 searches)** |  | 0.90 [" in text and "| 3 | 2 | - |" in text
