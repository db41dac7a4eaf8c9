"""Verdicts a researcher can cite: paired comparisons, Holm over a run's family, seeds from a target,
and results of earlier versions recomputed by the current rule."""

import json
import math

import pytest

from evo_attention import Config
from evo_attention.data import data_from_config
from evo_attention.report.studies.validation import read_studies
from evo_attention.search.store import RunStore
from evo_attention.studies.transfer import transfer_genes
from evo_attention.studies.validate import validate_genes
from evo_attention.util import stats

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, seed=7)
VANILLA = "dot|softmax|none|fixed|bias|0.10"
GENES = ["dot|sparsemax|none|fixed|bias|0.10", "cosine|softmax|none|fixed|bias|0.10", "dot|relu_norm|none|fixed|bias|0.10"]


def test_holm_covers_every_comparison_that_shares_the_baseline_trainings(tmp_path):
    config = Config(**TINY)
    data = data_from_config(config)
    store = RunStore.create(tmp_path / "run", config.to_dict())
    first = validate_genes([GENES[0]], config, data, n_seeds=3, store=store)
    second = validate_genes([GENES[1]], config, data, n_seeds=3, store=store)
    assert first["family_size"] == 1 and second["family_size"] == 2
    base = second["baseline"]["values"]
    values = {GENES[0]: first["genes"][0]["values"], GENES[1]: second["genes"][0]["values"]}
    assert first["baseline"]["values"] == base  # the same baseline trainings, served from the store
    p = {g: stats.paired(v, base, log=True)["p_value"] for g, v in values.items()}
    expected = stats.holm([p[GENES[0]], p[GENES[1]]])
    assert second["genes"][0]["p_holm"] == pytest.approx(expected[1])
    assert second["genes"][0]["p_value"] == pytest.approx(p[GENES[1]])
    # a transfer whose reference size is the same setting shares those baseline trainings: its family there
    # holds both validated genes, its own gene, and its own comparison at the other size
    result = transfer_genes([GENES[2]], config, data, sizes="32x1", n_seeds=3, store=store)
    ref, big = result["sizes"]
    row = ref["genes"][0]
    assert ref["baseline"]["values"] == base and row["family_size"] == 4
    assert big["genes"][0]["family_size"] == 2  # at the other size: its own two comparisons only
    family = [p[GENES[0]], p[GENES[1]], row["p_value"], big["genes"][0]["p_value"]]
    assert row["p_value"] == pytest.approx(stats.paired(row["values"], base, log=True)["p_value"])
    assert row["p_holm"] == pytest.approx(stats.holm(family)[2])
    assert "interaction" in big["genes"][0] and "interaction" not in row
    store.close()


def test_seeds_auto_plans_fresh_seeds_from_a_pilot():
    config = Config(**TINY)
    data = data_from_config(config)
    result = validate_genes([GENES[0]], config, data, n_seeds="auto", mde=0.05, max_seeds=6)
    plan = result["seed_plan"]
    assert plan["pilot_seeds"] == [8, 9, 10]
    assert result["seeds"][0] == 11 and not set(result["seeds"]) & set(plan["pilot_seeds"])  # fresh seeds
    expected = stats.seed_plan(plan["sd_used"], 3, math.log(1.05), power=0.8, alpha=0.05, family_size=1, max_seeds=6)
    needed = expected["seeds"]
    assert plan["family_size"] == 1 and plan["range"] == [expected["n_point"], expected["n_upper"]]
    assert plan["sd_upper"] == pytest.approx(expected["sd_upper"]) and plan["sd_level"] == 0.8
    assert needed is None or needed >= 6  # the exact test reaches 0.05 from 6 seeds (2^-5)
    assert plan["needed"] == needed and len(result["seeds"]) == (6 if needed is None else max(2, needed))
    assert plan["alpha_planned"] == pytest.approx(0.05) and plan["power"] == 0.8


def test_a_validation_written_by_an_earlier_version_is_recomputed_and_marked(tmp_path):
    old = {"kind": "validation", "metric": "val_perplexity", "metric_label": "perplexity", "lower_is_better": True,
           "eval_split": "valid", "confidence": 0.95, "seeds": [1, 2, 3, 4],
           "baseline": {"gene": VANILLA, "str": "Attn(dot|softmax|none|fixed)", "values": [10.0, 12.0, 9.0, 11.0],
                        "mean": 10.5},
           "genes": [{"gene": GENES[0], "str": "Attn(dot|sparsemax|none|fixed)", "values": [9.8, 11.7, 8.9, 10.8],
                      "mean": 10.3, "difference": -0.2, "verdict": "not distinguishable", "p_holm": 0.7}],
           "headline": "old"}
    (tmp_path / "validation.json").write_text(json.dumps(old))
    v = read_studies(tmp_path).validation
    row = v["genes"][0]
    assert v["recomputed"] and "recomputed" in v["headline"] and row["verdict"] in ("better", "undetermined")
    paired = stats.paired(old["genes"][0]["values"], old["baseline"]["values"], log=True)
    assert row["p_value"] == pytest.approx(paired["p_value"]) and row["welch"]["p_value"] > row["p_value"]


def test_study_2_paired_results_are_recomputed_by_the_exact_rule_and_marked(tmp_path):
    """A result written by the paired-2 rule (t-test at any n) is re-read by the current one: Q4's
    3-seed validation said 'better' at t p 0.002; 3 seeds cannot reach 0.05 exactly."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "docs" / "findings"
    shutil.copy(root / "q4" / "ga-1" / "validation.json", tmp_path / "validation.json")
    shutil.copy(root / "q2-suite" / "validation_suite.json", tmp_path / "validation_suite.json")
    found = read_studies(tmp_path)
    v, suite = found.validation, found.suites[0]
    row = v["genes"][0]
    assert v["analysis"] == stats.ANALYSIS and v["recomputed"] and v["recomputed_from"] == "paired-2"
    assert row["verdict"] == "undetermined" and row["test"] == "sign-flip" and row["p_holm"] == 0.25
    assert row["cannot_decide"] == "3 seeds cannot decide: the smallest possible p is 0.25"
    assert "recomputed by the paired-3 rule" in v["headline"] and row["boot_ci_low"] is None
    # the suite keeps its own margin (0.02 of accuracy) and is recomputed too
    assert suite["recomputed"] and suite["margin"] == 0.02 and suite["genes"][0]["verdict"] == "undetermined"


def test_the_advice_of_an_undetermined_verdict_follows_the_effect_and_the_exact_floor():
    """A gene +95% worse on every one of 5 seeds, Holm over 3 genes: the exact test cannot decide (its
    smallest p 0.0625, times 3), and the advice is the few seeds that show such a difference, not the
    hundreds an equivalence test would need (0.5 said ~209..502)."""
    from evo_attention.report.studies.common import verdict_cell
    from evo_attention.util import stats

    base = [100.0, 101.0, 99.0, 100.5, 100.2]
    gene = [b * f for b, f in zip(base, (1.93, 1.97, 1.95, 1.90, 1.99))]
    result = stats.paired(gene, base)
    v = stats.paired_verdict(result, margin=0.01, alpha=0.05, p_adjusted=min(1.0, 3 * result["p_value"]),
                             family_size=3)
    assert v["verdict"] == stats.UNDETERMINED and "cannot" in v["cannot_decide"]
    assert v["seeds_to_decide"] == stats.decisive_seeds(3) == 7
    assert "~7 seeds to decide" in verdict_cell({**v, "verdict_label": v["label"]})
    assert stats.decisive_seeds(1) == 6 and stats.cannot_decide(5, 0.05, 1)


def test_a_comparison_row_keeps_the_verdicts_advice():
    """versus_reference's row carries paired_verdict's seeds to decide: its verdict cell gave the seeds for
    equivalence (~85..376) where the observed difference, beyond the margin, needs few (6..11)."""
    from evo_attention.report.studies.common import verdict_cell

    ref, gene = [100.0, 110.0, 105.0], [92.0, 107.0, 97.0]
    row = stats.versus_reference({"g": gene}, ref, margin=0.01)["g"]
    expected = stats.paired_verdict(stats.paired(gene, ref), 0.01)["seeds_to_decide_range"]
    assert row["seeds_to_decide_range"] == expected == [6, 11]
    assert "~6..11 seeds to decide" in verdict_cell(row)


def test_the_verdict_cell_of_a_comparison_without_pairs_says_so():
    """Every seed diverged: the cell said 'more seeds than planned to decide' beside a text of 0 paired seeds."""
    from evo_attention.report.studies.common import verdict_cell

    row = stats.versus_reference({"g": [None, None, None]}, [1.0, 2.0, 3.0], margin=0.01)["g"]
    assert verdict_cell(row) == "undetermined (0 paired seeds finished: a test needs 2)"
    one = stats.versus_reference({"g": [None, None, 3.0]}, [1.0, 2.0, 3.0], margin=0.01)["g"]
    assert verdict_cell(one) == "undetermined (1 paired seed finished: a test needs 2)"
