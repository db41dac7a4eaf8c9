"""The training recipe as gene axes (lr=, wu=, wd=): the grammar, the one rule both trainers follow,
search spaces and strategies over it, the recipe-or-mechanism 2x2 of an ablation, the schedule in
the outputs, and transfer --dry-run."""

import json
import math
import pickle
import random

import pytest

from evo_attention import AttentionGene, Config
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.genes import (RECIPE_FIELDS, VANILLA_KEY, LayerGenes, SearchSpace, mechanism_of, recipe_of,
                                 with_recipe)
from evo_attention.report.studies.ablation import (OLDER_RECIPE_SIGN, ablation_markdown, current_ablation,
                                                   recipe_changes, recipe_mechanism_lines)
from evo_attention.search import make_strategy
from evo_attention.studies.ablation import ablate, ablation_variants, recipe_cells, write_ablation
from evo_attention.studies.transfer import dry_run, plan, with_budgets
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import Trainer, run_batched, run_training, train_and_evaluate
from evo_attention.util import stats
from evo_attention.util.errors import UserError

SPARSE = "dot|sparsemax|none|fixed|bias|0.10"
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=32, eval_steps=None,
            learning_rate=1e-3, train_steps=6, log_every=3, seed=7)
TINY_FLAGS = ["--data", "recall", "--vocab-size", "32", "--seq-len", "32", "--d-model", "16", "--heads", "2",
              "--layers", "1", "--batch-size", "8", "--eval-steps", "2", "--quiet"]


@pytest.fixture(scope="module")
def tiny():
    config = Config(**TINY)
    return config, data_from_config(config)


# -- the grammar ----------------------------------------------------------------------------------
def test_recipe_parts_are_named_parts_of_a_key_and_default_to_the_run():
    gene = AttentionGene.parse("dot|softmax|none|fixed|wd=0|lr=1e-3|wu=0.05")
    assert gene.key == f"{VANILLA_KEY}|lr=0.001|wu=0.05|wd=0"
    assert (gene.learning_rate, gene.warmup, gene.weight_decay) == (0.001, 0.05, 0.0)
    assert recipe_of(gene) == {"learning_rate": 0.001, "warmup": 0.05, "weight_decay": 0.0}
    assert mechanism_of(gene).key == VANILLA_KEY and mechanism_of(VANILLA_KEY).key == VANILLA_KEY
    assert with_recipe(VANILLA_KEY, {"learning_rate": 2e-3}).key == f"{VANILLA_KEY}|lr=0.002"
    assert AttentionGene.parse(gene.key) == gene == pickle.loads(pickle.dumps(gene))
    steps = AttentionGene.parse("dot|softmax|none|fixed|wu=100").warmup
    assert steps == 100 and isinstance(steps, int)  # whole steps; a fraction stays a float
    vanilla = AttentionGene.vanilla()
    assert vanilla.key == VANILLA_KEY and all(getattr(vanilla, n) is None for n in RECIPE_FIELDS)
    assert AttentionGene(learning_rate="default").key == VANILLA_KEY
    for part, words in (("lr=0", "positive"), ("lr=fast", "not a number"), ("wu=1.5", "whole steps"),
                        ("wd=-0.1", "negative"), ("lr=nan", "not a number")):
        with pytest.raises(UserError, match=words):
            AttentionGene.parse(f"dot|softmax|none|fixed|{part}")


def test_a_per_layer_genome_trains_with_one_recipe():
    with pytest.raises(UserError, match="layers-share-recipe"):
        LayerGenes.parse(f"{VANILLA_KEY}|lr=0.001 / {VANILLA_KEY}")
    space = SearchSpace(learning_rate=(5e-4, 1e-3, 2e-3), weight_decay=(None, 0.1), layers=3)
    rng = random.Random(0)
    genomes = [space.random(rng) for _ in range(40)]
    genomes += [g.mutate(1.0, rng, space) for g in genomes] + [a.crossover(b, rng) for a, b in zip(genomes, genomes[1:])]
    for genome in genomes:
        assert len({tuple(recipe_of(g).items()) for g in genome.layers}) == 1, genome.key
    assert {recipe_of(g).get("learning_rate") for g in genomes} == {5e-4, 1e-3, 2e-3}


def test_a_search_space_lists_the_recipe_by_field_or_key_part():
    space = SearchSpace.from_dict({"lr": [5e-4, "1e-3", "default"], "weight_decay": 0.1})
    assert space.options("learning_rate") == [5e-4, 1e-3, None] and space.options("weight_decay") == [0.1]
    assert SearchSpace().options("learning_rate") == [None] and SearchSpace().size() == space.size() // 3
    with pytest.raises(UserError, match="twice"):
        SearchSpace.from_dict({"lr": [1e-3], "learning_rate": [2e-3]})
    with pytest.raises(UserError, match="unknown search-space field 'rate'"):
        SearchSpace.from_dict({"rate": [1e-3]})
    # a warm-up axis must apply (a schedule with a warm-up) and fit the steps, said before any training
    with pytest.raises(UserError, match="does nothing under lr_schedule constant") as info:
        Config(search_space={"wu": [0.1]}).space()
    assert info.value.settings == ("lr_schedule", "search_space")
    with pytest.raises(UserError, match="does not fit in the 100 steps"):
        Config(search_space={"wu": [100]}, lr_schedule="cosine", warmup_steps=10, train_steps=100).space()
    Config(search_space={"wu": [0.1, 20]}, lr_schedule="wsd", warmup_steps=10, train_steps=100).space()


# -- the one rule: Trial.recipe -------------------------------------------------------------------
def test_the_trainer_runs_the_genes_recipe_and_the_record_says_so(tiny):
    config, data = tiny
    own = f"{VANILLA_KEY}|lr=0.003|wd=0.2"
    record = train_and_evaluate(own, config, data)
    same = train_and_evaluate(VANILLA_KEY, config.replace(learning_rate=3e-3, weight_decay=0.2), data)
    assert record.ok and record.val_loss == same.val_loss and record.curve == same.curve
    assert record.settings["learning_rate"] == 0.003 and record.settings["weight_decay"] == 0.2
    trial = Trial.from_config(own, config, data=data)
    assert trial.train.learning_rate == 1e-3 and trial.recipe.learning_rate == 3e-3  # the key keeps both
    assert trial.key() != Trial.from_config(VANILLA_KEY, config.replace(learning_rate=3e-3), data=data).key()
    assert Trial.from_config(VANILLA_KEY, config).recipe == config.train  # no parts: the run's recipe
    trainer = Trainer(trial, data)
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [0.2, 0.0]
    cosine = config.replace(lr_schedule="cosine", warmup_steps=1, train_steps=8)
    warm = Trainer(Trial.from_config(f"{VANILLA_KEY}|wu=0.5", cosine, data=data), data)
    assert warm.recipe.warmup_steps == 4 and warm.lr_at(1) == pytest.approx(1e-3 * 2 / 4)
    assert Trainer(Trial.from_config(f"{VANILLA_KEY}|wu=3", cosine, data=data), data).recipe.warmup_steps == 3
    with pytest.raises(UserError, match="does nothing under lr_schedule constant"):
        Trial.from_config(f"{VANILLA_KEY}|wu=0.5", config)
    with pytest.raises(UserError, match="does not fit"):
        Trial.from_config(f"{VANILLA_KEY}|wu=8", cosine)


def test_trials_of_one_mechanism_batch_with_their_own_recipes(tiny):
    config, data = tiny
    trials = [Trial.from_config(key, config, seed=seed, data=data)
              for key, seed in ((VANILLA_KEY, 1), (f"{VANILLA_KEY}|lr=0.004", 1), (f"{VANILLA_KEY}|wd=0.5", 2))]
    batch = run_batched(trials, data)
    alone = [run_training(t, data) for t in trials]
    for b, a in zip(batch, alone):
        assert b.record.extra.get("batched") == 3 and b.record.key == a.record.key
        assert b.record.val_loss == a.record.val_loss and b.record.curve == a.record.curve  # vanilla: bitwise
    assert batch[0].record.val_loss != batch[1].record.val_loss


# -- searches -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ga", "random", "nsga2", "tpe"])
def test_every_strategy_searches_the_recipe_axes(name):
    rates = (5e-4, 2e-3, 8e-3)
    strategy = make_strategy(name, population_size=6, n_generations=3, elite_size=2, seed=3,
                             space={"lr": list(rates), "wd": [0.0, 0.1]})
    if name == "tpe":
        assert {"learning_rate", "weight_decay"} <= set(strategy.distributions)
    asked = []
    while not strategy.done:
        genes = strategy.ask()
        asked += genes
        strategy.tell([(g, 5 + abs(math.log(g.learning_rate / 2e-3)) + random.Random(g.key).random()) for g in genes])
    assert {g.learning_rate for g in asked} <= set(rates) and {g.weight_decay for g in asked} == {0.0, 0.1}
    assert len({g.learning_rate for g in asked}) >= 2
    assert strategy.best.gene.learning_rate in rates


# -- recipe or mechanism --------------------------------------------------------------------------
def test_two_factor_shares_add_up_to_the_advantage():
    base = [100.0, 110.0, 95.0, 105.0]
    exact = stats.two_factor_shares(base, [b * 0.9 for b in base], [b * 0.8 for b in base],
                                    [b * 0.72 for b in base])  # multiplicative: no interaction on the log scale
    assert exact["first"]["mean"] == pytest.approx(-math.log(0.9)) and exact["second"]["relative"] == pytest.approx(0.2)
    assert exact["first"]["fraction"] + exact["second"]["fraction"] == pytest.approx(1.0)
    assert exact["interaction"]["change"] == pytest.approx(0.0, abs=1e-12)
    joint = stats.two_factor_shares(base + [None], [b * 0.9 for b in base] + [1.0], [b * 0.8 for b in base] + [1.0],
                                    [b * 0.6 for b in base] + [1.0])  # a failed seed is dropped
    assert joint["n"] == 4 and joint["n_dropped"] == 1
    assert joint["first"]["mean"] + joint["second"]["mean"] == pytest.approx(joint["total"]["mean"])
    assert joint["interaction"]["change"] == pytest.approx(math.log(0.8) - math.log(0.6) + math.log(0.9))
    higher = stats.two_factor_shares([0.5, 0.6], [0.6, 0.7], [0.5, 0.6], [0.6, 0.7], log=False, lower_is_better=False)
    assert higher["first"]["mean"] == pytest.approx(0.1) and higher["second"]["mean"] == pytest.approx(0.0)


def test_two_factor_shares_p_is_the_verdict_rules_and_the_docs_say_so():
    """Below 12 seeds a share's p is the exact sign-flip test's (the verdict rule), not a one-sample t-test's."""
    r = stats.two_factor_shares([10, 11, 12, 13, 12.5], [9, 10.2, 11.1, 12, 11.9], [9.5, 10.5, 11.5, 12.5, 12],
                                [8.8, 9.7, 10.9, 11.9, 11.2])
    assert r["total"]["p_value"] == 0.0625 and r["interaction"]["p_value"] == 0.25
    assert "sign-flip" in stats.two_factor_shares.__doc__ and "one-sample t-test of the" not in \
        stats.two_factor_shares.__doc__


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_two_factor_shares_refuse_a_value_the_log_scale_cannot_take(bad):
    """A 0 on the log scale was dropped as a failed seed (n_dropped 1) where paired refuses it."""
    with pytest.raises(UserError, match="the log scale needs positive values"):
        stats.two_factor_shares([10, 11, 12, 13], [9, 10, 11, 12], [bad, 10.5, 11.5, 12.5], [8.8, 9.7, 10.9, 11.9])


def test_ablating_a_gene_with_a_recipe_separates_recipe_and_mechanism(tiny, tmp_path, monkeypatch):
    config, data = tiny
    # the seed plans of the verdicts (a numerical integral per comparison) are not what this test is about
    monkeypatch.setattr(stats, "seeds_for_equivalence", lambda *a, **k: None)
    # the crossed cells join the variants where no field's variant is already one of them
    gated = "dot|sparsemax|output_gate|fixed|bias|0.10"
    variants = ablation_variants(f"{gated}|lr=0.006|wd=0")
    assert [(v.name, v.gene.key) for v in variants[2:4]] == [("mechanism alone", gated),
                                                             ("recipe alone", f"{VANILLA_KEY}|lr=0.006|wd=0")]
    assert "mechanism alone" not in [v.name for v in ablation_variants(f"{SPARSE}|lr=0.006|wd=0")]
    gene = f"{SPARSE}|lr=0.006"
    result = ablate(gene, config, data, n_seeds=2)
    assert [v["name"] for v in result.variants] == ["full gene", "baseline", "without normalization",
                                                    "baseline + normalization", "without learning rate",
                                                    "baseline + learning rate"]
    block = result["recipe_vs_mechanism"]
    assert {k: c["gene"] for k, c in block["cells"].items()} == {
        "neither": VANILLA_KEY, "mechanism": SPARSE, "recipe": f"{VANILLA_KEY}|lr=0.006", "both": gene}
    shares = block["shares"]
    # stored in the one sign convention: changes of the metric (the gene's minus the baseline's), never gains
    assert all("mean" not in share for share in shares.values())
    assert shares["mechanism"]["change"] + shares["recipe"]["change"] == pytest.approx(shares["total"]["change"])
    both, neither = block["cells"]["both"]["values"], block["cells"]["neither"]["values"]
    geometric = math.exp(sum(math.log(b / a) for a, b in zip(neither, both)) / len(both)) - 1
    assert shares["total"]["relative"] and shares["total"]["metric_change"] == pytest.approx(geometric)
    assert block["parts_text"] == "lr=0.006" and block["larger"] in ("mechanism", "recipe")
    assert block["interaction"]["test"] == "paired" and block["n"] == 2
    text = ablation_markdown(result)
    assert "## Recipe or mechanism" in text and "Share of the recipe (lr=0.006)" in text
    assert "Learning-rate schedule: lr 0.001, constant; a gene's own recipe parts" in text
    paths = write_ablation(result, tmp_path)
    assert json.loads(paths["json"].read_text())["recipe_vs_mechanism"]["cells"]["both"]["gene"] == gene
    assert recipe_cells(AttentionGene.parse(SPARSE), AttentionGene.vanilla()) is None  # no recipe parts: no 2x2
    with pytest.raises(UserError, match="sets its own learning rate") as info:
        ablate(gene, config, data, n_seeds=2, lr_grid="1e-3,2e-3")
    assert info.value.settings == ("lr_grid",)


def test_the_recipe_or_mechanism_block_stores_changes_and_an_older_one_of_gains_reads_the_same():
    base = [100.0, 110.0, 95.0, 105.0, 98.0, 102.0, 107.0, 99.0]
    jitter = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.995]
    mechanism, recipe = [b * 0.9 for b in base], [b * 0.8 for b in base]
    both = [b * 0.6 * j for b, j in zip(base, jitter)]  # better than 0.9 x 0.8: the two reinforce each other
    gains = stats.two_factor_shares(base, mechanism, recipe, both)
    older = {"total": gains["total"], "mechanism": gains["first"], "recipe": gains["second"]}
    shares, interaction = recipe_changes(older, gains["interaction"], gains["scale"], lower=True)
    geometric = math.exp(sum(math.log(b / a) for a, b in zip(base, both)) / len(base)) - 1
    assert shares["total"]["metric_change"] == pytest.approx(geometric) and geometric < -0.39
    assert shares["mechanism"]["alone"] == pytest.approx(math.log(0.9))  # a change: negative = lower perplexity
    assert shares["mechanism"]["change"] + shares["recipe"]["change"] == pytest.approx(shares["total"]["change"])
    low, high = shares["recipe"]["metric_change_low"], shares["recipe"]["metric_change_high"]
    assert low < shares["recipe"]["metric_change"] < high < 0
    assert interaction["change"] == pytest.approx(-gains["interaction"]["change"]) and interaction["change"] < 0
    block = {"parts_text": "lr=0.006", "cells": {}, "scale": "log", "n": 8, "n_dropped": 0, "larger": "recipe"}
    result = {"metric": "val_perplexity", "metric_label": "perplexity", "lower_is_better": True, "confidence": 0.95,
              "recipe_vs_mechanism": {**block, "shares": shares, "interaction": interaction}}
    lines = recipe_mechanism_lines(result)
    assert f"perplexity change {100 * geometric:+.2f}%" in lines[0] and "reinforce each other" in lines[3], lines
    # a block an earlier version wrote (the gains, positive = better) is converted when read
    written = {**result, "recipe_vs_mechanism": {**block, "shares": older, "interaction": gains["interaction"]}}
    read = current_ablation(written)["recipe_vs_mechanism"]
    assert read["shares"] == shares and read["interaction"] == interaction
    assert read["recomputed_from"] == OLDER_RECIPE_SIGN
    assert recipe_mechanism_lines(written)[:-1] == lines and "older sign" in recipe_mechanism_lines(written)[-1]


# -- the schedule in the outputs, the search over the recipe, status ------------------------------
def test_a_search_over_the_recipe_says_its_schedule_everywhere(tmp_path, capsys, monkeypatch):
    config = tmp_path / "recipe.yaml"
    config.write_text("search_space:\n  lr: [0.001, 0.004]\n  wu: [0.25, default]\nlr_schedule: cosine\n"
                      "warmup: 0.5\ndata: recall\n"
                      "recall: {num_pairs: 2, num_queries: 2, train_examples: 128, eval_examples: 32}\n")
    run = tmp_path / "run"
    assert main(["search", *TINY_FLAGS[2:], "--config", str(config), "--steps", "4", "--population", "3",
                 "--generations", "1", "--elite", "1", "--out", str(run)]) == 0
    from evo_attention.search.store import RunStore

    with RunStore.open(run, readonly=True) as store:
        records = store.evaluations()
    for r in records:
        gene = AttentionGene.parse(r["gene"])
        assert r["settings"]["learning_rate"] == (gene.learning_rate or 3e-4)  # the rate that ran
        assert r["settings"]["warmup_steps"] == (1 if gene.warmup == 0.25 else 2)
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert ("learning-rate schedule: lr 0.0003, cosine: linear warm-up over 2 steps (0.5 of 4), cosine decay to 0 at "
            "step 4; the search varies per gene learning_rate over 0.001/0.004, warmup over 0.25/default") in out
    report = (run / "report.md").read_text()
    assert "| Learning-rate schedule | lr 0.0003, cosine" in report
    rates = {AttentionGene.parse(r["gene"]).learning_rate for r in records if r["role"] == "search"}
    assert ("| learning_rate | `" in report) == (len(rates) > 1)  # the component analysis, where it varied
    # the ablation of a gene with a recipe part joins the run's report with its 2x2
    monkeypatch.setattr(stats, "seeds_for_equivalence", lambda *a, **k: None)  # seed plans: not tested here
    assert main(["ablate", "--from-run", str(run), "--gene", f"{SPARSE}|lr=0.004", "--seeds", "2", "--quiet"]) == 0
    assert "Learning-rate schedule: lr 0.0003, cosine" in (run / "ablation.md").read_text()
    assert main(["report", str(run)]) == 0
    assert "Recipe or mechanism" in (run / "report.md").read_text()
    assert "Recipe or mechanism" in (run / "report.html").read_text()


def test_transfer_dry_run_prints_the_ladder_and_trains_and_writes_nothing(tiny, tmp_path, capsys):
    config, data = tiny
    rungs = with_budgets(plan(config, [SPARSE], sizes="16x1,32x1", tokens_per_param=2), data, 2)
    planned = dry_run(config, data, [SPARSE], sizes="16x1,32x1", tokens_per_param=2, n_seeds=2,
                      lr_grid=(1e-3, 2e-3), n_tuning_seeds=1, measure=False)
    assert [(r["size"], r["steps"]) for r in planned["sizes"]] == [(r.label, r.config.train_steps) for r in rungs]
    assert planned["sizes"][0]["tokens"] == rungs[0].config.train_steps * 8 * 16
    assert planned["trainings"] == 2 * 2 * (2 + 2 * 1) and planned["estimated_s"] is None
    out = tmp_path / "out"
    argv = ["transfer", "--genes", SPARSE, *TINY_FLAGS, "--sizes", "16x1,32x1", "--tokens-per-param", "2",
            "--seeds", "2", "--out", str(out), "--dry-run"]
    capsys.readouterr()
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| 16x1 (reference) | 2 |" in text and "| 32x1 |" in text and "s / step (measured)" in text
    assert "total: 8 trainings, estimated" in text and "measured on this machine" in text
    assert not out.exists()
    assert main(["transfer", "--genes", f"{SPARSE}|lr=0.002", *TINY_FLAGS, "--sizes", "32x1", "--lr-grid",
                 "1e-3,2e-3", "--dry-run"]) == 2
    assert "--lr-grid" in capsys.readouterr().err


def test_an_ablation_counts_a_gene_two_variants_share_once_in_each_holm_family():
    from evo_attention.studies.ablation import ablation_statistics
    from evo_attention.studies.common import StudySetup

    gene = "dot|sparsemax|output_gate|fixed|bias|0.10"  # two fields: 'baseline + F' is 'without G'
    variants = ablation_variants(gene)
    keys = {v.gene.key for v in variants}
    assert len(variants) > len(keys)  # the variants share genes
    seeds = [8, 9, 10, 11, 12, 13]
    records = {(k, s): {"status": "ok", "val_perplexity": 7.0 + i + 0.1 * j}
               for i, k in enumerate(sorted(keys)) for j, s in enumerate(seeds)}
    setup = StudySetup(config=Config(), data=None, seeds=tuple(seeds), steps=50, role="ablation")
    rows = ablation_statistics(setup, variants, records)["variants"]
    full = variants[0].gene.key
    for column, left_out in (("vs_full", full), ("vs_baseline", variants[1].gene.key)):
        sizes = {r[column]["family_size"] for r in rows if r[column]}
        assert sizes == {len(keys - {left_out})}, column  # distinct genes, not variants
