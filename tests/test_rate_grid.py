"""A learning rate per candidate (rate_grid, search.tuning): every gene, the baseline too, is
trained at each rate of the grid on the tuning seed and measured at its best one on the run's seed."""

import json

import pytest

from tests.conftest import assert_resume_is_uninterrupted

from evo_attention import Evolution
from evo_attention.cli import main
from evo_attention.genes import recipe_of
from evo_attention.report import load_run
from evo_attention.search.racing import RACE_ROLE
from evo_attention.search.store import RunStore
from evo_attention.search.tuning import RATE_META, TUNE_ROLE, TUNING_FROM, select_rate
from evo_attention.studies.common import TUNING_OFFSET
from evo_attention.studies.evolution import CHECK_ENV
from evo_attention.train.config import Config
from evo_attention.util.errors import UserError

RECALL = {"data": "recall", "vocab_size": 16, "max_seq_len": 16, "d_model": 16, "n_heads": 2, "n_layers": 1,
          "recall": {"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
          "train_steps": 4, "batch_size": 4, "eval_batch_size": 16, "eval_steps": 2}
GRID = (1e-3, 8e-3)


def test_the_tuning_seed_is_the_run_seeds_first_tuning_seed_and_the_rule_is_the_studies_rule():
    assert TUNING_FROM == TUNING_OFFSET + 1
    curve = [{"lr": 1e-3, "mean": 5.0, "n_failed": 0}, {"lr": 2e-3, "mean": 4.0, "n_failed": 1},
             {"lr": 4e-3, "mean": 5.0, "n_failed": 0}]
    assert select_rate(curve) == 1e-3  # 2e-3 failed; 1e-3 and 4e-3 tie: the smaller rate


def test_rate_grid_settings_are_checked():
    assert Config(rate_grid="2e-3, 1e-3").rate_grid == (1e-3, 2e-3)
    for bad, match in [({"rate_grid": "1e-3"}, "at least 2"), ({"rate_grid": "1e-3,-2"}, "not a learning rate"),
                       ({"rate_grid": GRID, "objectives": ["perplexity", "params"]}, "one objective"),
                       ({"rate_grid": GRID, "fidelity": "halving"}, "full budget"),
                       ({"rate_grid": GRID, "search_space": {"lr": [1e-3, 2e-3]}}, "lr in the search space"),
                       ({"rate_grid": GRID, "max_params": 10**6}, "caps"),
                       ({"rate_grid": GRID, "seed": 2**63 - 10}, "tuning seed")]:
        with pytest.raises(UserError, match=match):
            Config(**bad)


def test_a_tuned_racing_climb_measures_every_gene_at_its_best_rate_and_resumes_to_the_uninterrupted_result(
        tmp_path):
    config = Config(**RECALL, population_size=3, n_generations=2, elite_size=1, strategy="climb", elite_seeds=2,
                    start_from="vanilla", search_space={"program": {"max_nodes": 8}}, rate_grid=GRID, seed=7)
    with Evolution(config, out_dir=tmp_path / "full") as evo:
        best = evo.run()
    with RunStore.open(tmp_path / "full", readonly=True) as store:
        tuning = store.get_meta(RATE_META)
        rows = store.evaluations()
    tuned = {(r["gene"], r["seed"]): r for r in rows if r["role"] == TUNE_ROLE}
    assert tuning["grid"] == list(GRID) and tuning["seed"] == 7 + TUNING_FROM
    assert {seed for _, seed in tuned} == {7 + TUNING_FROM}
    for gene in tuning["genes"]:  # each gene's rate is the best of its tuning trainings
        values = {rate: tuned[gene["tuned"].replace(f"lr={gene['rate']:g}", f"lr={rate:g}"), 7 + TUNING_FROM][
            "val_perplexity"] for rate in GRID}
        assert gene["rate"] == min(GRID, key=lambda r: (values[r], r))
        assert recipe_of(gene["tuned"])["learning_rate"] == gene["rate"]
    searched = [r for r in rows if r["role"] in ("search", "baseline", RACE_ROLE)]
    assert searched and all(recipe_of(r["gene"]).get("learning_rate") in GRID for r in searched)
    assert recipe_of(best.gene.key)["learning_rate"] in GRID  # the winner carries its rate
    summary = load_run(tmp_path / "full")
    assert summary.best["key"] == best.gene.key and recipe_of(summary.baseline["gene"])["learning_rate"] in GRID
    assert {r["gene"] for r in summary.racing["genes"]} <= {r["gene"] for r in rows if r["role"] == "search"}
    assert "each gene's own best of 0.001, 0.008 on the tuning seed" in (tmp_path / "full" / "report.md").read_text()

    total = len(rows)
    assert_resume_is_uninterrupted(config, tmp_path, 9, total)


def test_every_generation_shows_its_best_gene_at_its_rate(tmp_path):
    config = Config(**RECALL, population_size=2, n_generations=1, strategy="climb", rate_grid=GRID, baseline=False)
    with Evolution(config, out_dir=tmp_path / "run") as evo:
        evo.run()
    history = [*evo.history, *load_run(tmp_path / "run").history]
    history += json.loads((tmp_path / "run" / "final_results.json").read_text())["history"]
    assert len(history) == 3 and all(recipe_of(h["best_gene"]).get("learning_rate") in GRID for h in history)


def test_the_fresh_check_compares_with_the_baseline_at_its_tuned_rate(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)  # the suite turns the check off
    out = tmp_path / "run"
    assert main(["search", "--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "4",
                 "--quiet", "--population", "2", "--generations", "1", "--elite", "1", "--keep-models", "0",
                 "--rate-grid", "1e-3,8e-3", "--out", str(out)]) == 0
    check = json.loads((out / "fresh_check.json").read_text())
    assert check["vanilla"]["gene"] == load_run(out).baseline["gene"]
    assert recipe_of(check["vanilla"]["gene"])["learning_rate"] in GRID
    # the grid given again, in another spelling, resumes the run (it was compared as typed: 'contradicts')
    assert main(["search", "--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "4",
                 "--quiet", "--population", "2", "--generations", "1", "--elite", "1", "--keep-models", "0",
                 "--rate-grid", "0.008,1e-3", "--resume", "--out", str(out)]) == 0
