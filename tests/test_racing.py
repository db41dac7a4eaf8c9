"""Racing (elite_seeds): a gene that would enter the elite is measured on more seeds first and
ranked by a lower bound over them; the climb moves only on gains that hold on paired seeds."""

import math
import statistics

import pytest
import yaml

from tests.conftest import assert_resume_is_uninterrupted

from evo_attention import Evolution
from evo_attention.cli import main
from evo_attention.report import load_run, write_report
from evo_attention.search.racing import RACE_ROLE, RACE_SEEDS_FROM, Racing, lower_bound, race_seeds
from evo_attention.search.store import RunStore
from evo_attention.studies.common import SEED_BLOCK_SIZE, TUNING_OFFSET, validation_seeds
from evo_attention.train.config import Config
from evo_attention.util.errors import UserError

RECALL = {"data": "recall", "vocab_size": 16, "max_seq_len": 16, "d_model": 16, "n_heads": 2, "n_layers": 1,
          "recall": {"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
          "train_steps": 3, "batch_size": 4, "eval_batch_size": 16, "eval_steps": 2}


def test_the_racing_seeds_lie_in_the_run_seeds_block_beyond_every_verdict_and_tuning_seed():
    assert RACE_SEEDS_FROM == SEED_BLOCK_SIZE
    seeds = race_seeds(7, 4)
    assert seeds == [7, 7 + SEED_BLOCK_SIZE, 7 + SEED_BLOCK_SIZE - 1, 7 + SEED_BLOCK_SIZE - 2]
    assert not set(seeds) & set(validation_seeds(7, TUNING_OFFSET))  # no validation or fresh check reaches them
    assert lower_bound([1.0, 2.0, 3.0]) == pytest.approx(2.0 + 1.0 / math.sqrt(3))
    assert lower_bound([1.0, None]) is None and lower_bound([1.0, math.inf]) is None


class Inner:
    """An evaluation whose told value is given per (gene, seed): what Racing stands in front of."""

    def __init__(self, values):
        self.values, self.asked = values, []
        self.config = Config(seed=1)
        self.store = type("Store", (), {"set_meta": lambda *a: None})()
        self.runner = type("Runner", (), {"view": None})()

    def fitness(self, keys, generation):
        return {k: self.values[k][0] for k in keys}

    def shown(self, key):
        return key

    def scores(self, pairs, generation, role):
        assert role == RACE_ROLE
        self.asked += [k for k, _ in pairs]
        seeds = race_seeds(1, 3)
        return {(k, s): self.values[k][seeds.index(s)] for k, s in pairs}


def test_only_genes_that_would_enter_the_elite_race_and_the_elite_are_all_raced():
    values = {"a": [1.0, 5.0, 5.0],  # lucky on the run's seed: raced, its bound is poor
              "b": [2.0, 2.1, 1.9],  # then the best un-raced one beats that bound: raced
              "c": [3.0, 3.0, 3.0],  # beats nothing raced once b's bound is known: told its one seed
              "d": [None, 1.0, 1.0]}  # failed on the run's seed: never raced
    racing = Racing(Inner(values), elite_seeds=3, places=1)
    told = racing.fitness(["a", "b", "c", "d"], 0)
    assert racing.inner.asked == ["a", "a", "b", "b"]
    assert told["a"] == pytest.approx(statistics.fmean([1, 5, 5]) + statistics.stdev([1, 5, 5]) / math.sqrt(3))
    assert told["b"] == pytest.approx(lower_bound([2.0, 2.1, 1.9])) and told["c"] == 3.0 and told["d"] is None
    best = min((v, k) for k, v in told.items() if v is not None)[1]
    assert best == "b"  # the best told value is a raced one
    values["e"] = [2.05, 9.0, 9.0]  # a later child beating the incumbent's bound on one seed races too
    assert racing.fitness(["e"], 1)["e"] > told["b"] and racing.inner.asked[-2:] == ["e", "e"]


def test_elite_seeds_settings_are_checked():
    assert Config(elite_seeds=3).elite_seeds == 3
    for bad, match in [({"elite_seeds": 0}, "elite_seeds"),
                       ({"elite_seeds": 3, "objectives": ["perplexity", "params"]}, "one objective"),
                       ({"elite_seeds": 3, "fidelity": "halving"}, "full budget"),
                       ({"elite_seeds": 3, "seed": 2**63 - 10}, "racing seeds")]:
        with pytest.raises(UserError, match=match):
            Config(**bad)


@pytest.mark.parametrize("strategy", ["climb", "ga"])
def test_a_racing_search_ranks_by_the_bound_reports_every_seed_and_resumes_to_the_uninterrupted_result(tmp_path,
                                                                                                         strategy):
    config = Config(**RECALL, population_size=3, n_generations=3, elite_size=1, strategy=strategy, elite_seeds=3,
                    start_from="vanilla", search_space={"program": {"max_nodes": 8}}, seed=7)
    with Evolution(config, out_dir=tmp_path / "full") as evo:
        best = evo.run()
    with RunStore.open(tmp_path / "full", readonly=True) as store:
        racing = store.get_meta("racing")
        raced = store.evaluations(role=RACE_ROLE)
    assert racing["seeds"] == race_seeds(7, 3) and racing["places"] == 1 and racing["baseline"] is not None
    by_gene = {r["gene"]: r for r in racing["genes"]}
    assert best.gene.key in by_gene and best.perplexity == pytest.approx(by_gene[best.gene.key]["told"])
    assert {r["seed"] for r in raced} == set(race_seeds(7, 3)[1:])
    assert len(raced) == 2 * len(set(by_gene) | {racing["baseline"]["gene"]})  # a gene's seeds trained once
    summary = load_run(tmp_path / "full")
    assert summary.best["key"] == best.gene.key and summary.best["seeds"] == 3
    paths = write_report(tmp_path / "full")
    text = paths["report"].read_text()
    assert "## Re-measured elites" in text and f"Seed {7 + RACE_SEEDS_FROM}" in text
    assert "mean + standard error over 3 seeds" in text and "Re-measured elites" in paths["report_html"].read_text()

    total = sum(1 for _ in RunStore.open(tmp_path / "full", readonly=True).evaluations())
    assert_resume_is_uninterrupted(config, tmp_path, 7, total)


def test_a_racing_suite_search_from_the_cli(tmp_path):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump({"suite": "tiny", "steps": 2, "defaults": {"vocab": 12, "train_examples": 64,
                                                                               "eval_examples": 16},
                                     "points": [{"label": "recall", "task": "mad:in_context_recall",
                                                 "knobs": {"seq_len": 12, "pairs": 2}}]}))
    assert main(["search", "--suite", str(suite), "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32",
                 "--batch-size", "4", "--eval-batch-size", "16", "--seq-len", "12", "--population", "3",
                 "--generations", "2", "--elite", "1", "--elite-seeds", "2", "--quiet", "--out",
                 str(tmp_path / "run")]) == 0
    summary = load_run(tmp_path / "run")
    raced = {r["gene"]: r for r in summary.racing["genes"]}
    top = summary.suite["genes"][0]
    assert top["gene"] in raced and top["seeds"] == 2
    assert top["suite_accuracy"] == pytest.approx(-raced[top["gene"]]["told"])
    assert "## Re-measured elites" in (tmp_path / "run" / "report.md").read_text()



@pytest.fixture(scope="module")
def raced_summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("raced") / "run"
    config = Config(**RECALL, population_size=3, n_generations=2, elite_size=1, elite_seeds=2,
                    start_from="vanilla", seed=7)
    with Evolution(config, out_dir=out) as evo:
        evo.run()
    return load_run(out)


def test_a_raced_runs_summary_line_names_the_seeds_its_values_rest_on(raced_summary):
    from evo_attention.cli.search import best_line

    line = best_line(raced_summary)
    assert "mean + standard error over 2 seeds each" in line and "one seed" not in line


def test_a_raced_runs_component_analysis_reads_the_ranked_values(raced_summary):
    from evo_attention.report.summary import field_labels

    options = field_labels(raced_summary.best["key"], 1)  # the winner's options: their best value is the winner's
    rows = [r for r in raced_summary.components if options.get(r["field"]) == r["option"]]
    assert rows and all(r["best_perplexity"] == pytest.approx(raced_summary.best["perplexity"]) for r in rows)


def test_a_raced_runs_summary_analyses_its_components_once(raced_summary, monkeypatch):
    """The summary analysed a raced run's components from the one-seed values, then again from the raced ones."""
    from evo_attention.report import summary

    calls, analysis = [], summary.component_analysis
    monkeypatch.setattr(summary, "component_analysis", lambda *args: calls.append(args) or analysis(*args))
    assert load_run(raced_summary.run_dir).components == raced_summary.components and len(calls) == 1
