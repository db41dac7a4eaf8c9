"""Every generated table in the docs equals what its committed result file gives
(benchmarks/doc_tables.py): a number edited by hand, or a result file changed without
regenerating the doc, fails here."""

import importlib.util
import json
import math
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _doc_tables():
    spec = importlib.util.spec_from_file_location("doc_tables", REPO / "benchmarks" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_generated_tables_equal_their_result_files():
    assert _doc_tables().run(check=True) == []


def test_a_number_changed_by_hand_is_found(tmp_path):
    tables = _doc_tables()
    source = REPO / "docs" / "results" / "validate-wikitext-small" / "validation.json"
    (tmp_path / "docs" / "results").mkdir(parents=True)
    shutil.copy(source, tmp_path / "docs" / "results" / "v.json")
    body = tables.verdicts(json.loads(source.read_text()))
    marker = "<!-- generated: docs/results/v.json table=verdicts -->\n"
    doc = tmp_path / "docs" / "x.md"
    doc.write_text("text\n" + marker + body + "<!-- end generated -->\n")
    assert tables.run(check=True, root=tmp_path) == []
    number = next(cell for cell in body.split("|") if "±" in cell).strip()  # a mean ± sd cell
    doc.write_text(doc.read_text().replace(number, number.replace("±", "+-"), 1))
    assert tables.run(check=True, root=tmp_path) == ["docs/x.md: docs/results/v.json table=verdicts"]
    tables.run(check=False, root=tmp_path)  # regenerating restores the file's numbers
    assert tables.run(check=True, root=tmp_path) == [] and number in doc.read_text()


def test_the_versus_table_shows_a_difference_of_logs_as_a_relative_change_on_the_scored_split():
    versus = _doc_tables().versus
    row = {"values": [110.0, 111.0], "difference": math.log(1.1), "diff_ci_low": math.log(1.05),
           "diff_ci_high": math.log(1.15), "test": "sign-flip", "p_holm": 0.5, "p_tost_holm": 1.0,
           "verdict_label": "undetermined"}
    payload = {"reference": "gate", "metric": "val_perplexity", "metric_label": "perplexity",
               "eval_split": "test", "log": True, "margin": 0.01, "seeds": [1, 2],
               "reference_values": [100.0, 101.0], "genes": {"p": row}}
    table = versus(payload)
    assert "Mean test perplexity (2 seeds)" in table and "+10.00% [+5.00, +15.00]" in table
    # an accuracy file (raw scale, no split recorded) keeps its differences in units
    raw = {**payload, "metric": "accuracy", "log": False, "metric_label": None, "eval_split": None,
           "genes": {"p": {**row, "difference": 0.1, "diff_ci_low": 0.05, "diff_ci_high": 0.15}}}
    assert "Mean accuracy (2 seeds)" in versus(raw) and "+0.100 [+0.050, +0.150]" in versus(raw)


def test_the_strategies_table_keeps_a_suite_accuracy_difference_in_units():
    comparison = {"difference": -0.0245, "diff_ci_low": -0.1174, "diff_ci_high": 0.0683, "relative": None,
                  "relative_ci_low": None, "relative_ci_high": None, "p_holm": 0.578, "verdict_label": "undetermined",
                  "mde": 0.1284, "mde_relative": None}
    winner = {"gene": "g", "mean": 0.5}
    payload = {"reference": "random", "search_seeds": [1], "comparisons": {"ga": comparison},
               "searches": {"ga": {"1": winner}, "random": {"1": winner}}}
    table = _doc_tables().strategies(payload)
    assert "| ga | -0.0245 [-0.1174, +0.0683] | 0.578 | undetermined | 0.1284 |" in table.splitlines()


def test_the_rediscovery_table_counts_each_feature_per_strategy_and_tests_it_against_the_reference():
    def row(solved, n, low, high):
        return {"solved": solved, "n": n, "rate": solved / n, "ci_low": low, "ci_high": high, "in_top_5": n - 1,
                "first_evaluation_median": 3.5, "first_evaluation_range": [2, 16], "base_rate": 0.21875}
    payload = {"reference": "random", "features": {"output gate": ["sgate"]},
               "strategies": {"ga": {"output gate": row(3, 8, 0.085, 0.755)},
                              "random": {"output gate": row(1, 8, 0.003, 0.527)}},
               "comparisons": {"ga": {"output gate": {"difference": 0.25, "p_value": 0.569, "p_holm": 1.0,
                                                      "p_barnard_holm": 0.648, "words": "no difference shown"}}}}
    lines = _doc_tables().rediscovery(payload).splitlines()
    assert "| output gate | random | 1/8 | 0.12 [0.00, 0.53] | 7/8 | 3.5 (2-16) | 0.219 |" in lines
    assert "| output gate | ga | 3/8 | 0.38 [0.09, 0.76] | 7/8 | 3.5 (2-16) | 0.219 |" in lines
    assert "| output gate | ga | +0.25 | 0.569 | 1.000 | 0.648 | no difference shown |" in lines
