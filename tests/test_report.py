"""The reporting layer: every output written from a synthetic run store (no training)."""

import csv
import json
import math

import pytest

from evo_attention import Config
from evo_attention.report import FINAL_RESULTS_KEYS, OUTPUTS, load_run, write_report
from evo_attention.report.summary import component_analysis, option_labels
from evo_attention.search.store import RunStore

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VANILLA = "dot|softmax|none|fixed|bias|0.10"

# A 3-generation GA run (population 4, elite 1): generation -> [(gene, status, perplexity)].
RUN = {
    0: [("cosine|softmax|none|fixed|bias|0.10", "ok", 180.0),
        ("dot|sparsemax|none|fixed|bias|0.10", "ok", 150.0),
        ("dot|softmax|output_gate|learned|nobias|0.20", "diverged", math.nan),
        ("additive|sigmoid|none|fixed|bias|0.00", "ok", 300.0)],
    1: [("dot|sparsemax|output_gate|fixed|bias|0.10", "ok", 120.0),
        ("cosine|sparsemax|none|fixed|bias|0.10", "ok", 140.0),
        ("additive|softmax|none|fixed|bias|0.10", "oom", None)],
    2: [("dot|sparsemax|output_gate|learned|bias|0.10", "ok", 130.0),
        ("dot|relu_norm|none|fixed|bias|0.10", "ok", 170.0),
        ("cosine|softmax|none|fixed|bias|0.05", "ok", 250.0)],
}
# The population after each generation, best first (elites carried over).
POPULATIONS = {
    0: [(1, False), (0, False), (3, False), (2, False)],
    1: [(0, False), (1, False), ("0:1", True), (2, False)],
    2: [("1:0", True), (0, False), (1, False), (2, False)],
}
BASELINE_PPL = 160.0


def record(gene, status, ppl, seed=0, **extra):
    ok = status == "ok"
    return {
        "gene": gene, "seed": seed, "steps": 100, "data_fingerprint": "wt2:abc123", "context": "ctx",
        "status": status, "error": None if ok else f"{status}: loss went to nan\nat step 7",
        "val_perplexity": ppl, "val_loss": math.log(ppl) if ok else math.inf,
        "accuracy": 0.2 if ok else None, "eval_tokens": 4096, "train_loss": 5.0 if ok else math.nan,
        "curve": [[0, 9.2], [50, 6.1]], "params": 120_000 + len(gene), "flops_per_step": 1.5e9,
        "time_s": 3.5, "tokens_per_s": 1.2e4, "peak_memory_mb": 55.0, "device": "cpu",
        "precision": "fp32", **extra,
    }


def new_store(run_dir, **meta):
    config = Config(population_size=4, n_generations=3, elite_size=1, train_steps=100, d_model=32,
                    n_heads=2, seed=7).to_dict()
    base_meta = {
        "strategy": {"name": "ga", "options": {"seed_vanilla": False}},
        "data": {"name": "wikitext2", "vocab_size": 10000, "seq_len": 128, "fingerprint": "wt2:abc123"},
        "versions": {"evo_attention": "0.1.0", "torch": "2.13"},
        "done": False, "planned": 10,
    }
    base_meta.update(meta)
    return RunStore.create(run_dir, config=config, meta=base_meta)


@pytest.fixture
def normal_run(tmp_path):
    run_dir = tmp_path / "run"
    with new_store(run_dir, done=True, finished_at="2024-01-01T00:00:00+00:00") as store:
        store.record(record(VANILLA, "ok", BASELINE_PPL, seed=99), role="baseline")
        for generation, members in RUN.items():
            for gene, status, ppl in members:
                store.record(record(gene, status, ppl), role="search", generation=generation)
            population = []
            for ref, elite in POPULATIONS[generation]:
                g, i = (int(x) for x in ref.split(":")) if isinstance(ref, str) else (generation, ref)
                gene, status, ppl = RUN[g][i]
                population.append((gene, ppl if status == "ok" else math.inf, elite))
            store.record_generation(generation, population)
    return run_dir


def test_normal_run_writes_every_output(normal_run):
    paths = write_report(normal_run)
    assert set(paths) == set(OUTPUTS)
    for name, path in paths.items():
        assert path == normal_run / OUTPUTS[name] and path.is_file() and path.stat().st_size > 0
    assert not list(normal_run.glob(".*.tmp*"))  # no temporary file left behind


def test_a_report_at_the_file_size_limit_says_to_raise_it(normal_run):
    import resource

    from evo_attention.util.errors import UserError

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))  # report.html passes it: EFBIG (SIGXFSZ is ignored)
    try:
        with pytest.raises(UserError, match=r"\(File too large\): raise the file-size limit \(ulimit -f\), then write"):
            write_report(normal_run)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_final_results(normal_run):
    write_report(normal_run)
    results = json.loads((normal_run / "final_results.json").read_text())
    assert tuple(results) == FINAL_RESULTS_KEYS
    assert results["best_gene"] == {
        "similarity": "dot", "normalization": "sparsemax", "gating": "output_gate", "temperature_mode": "fixed",
        "use_bias": True, "attention_dropout": 0.1, "position": "learned", "qkv_rank": 0, "attn_bias": "none",
        "window": 0, "kv_heads": 0, "qkv_conv": 0, "key": "dot|sparsemax|output_gate|fixed|bias|0.10",
        "str": "Attn(dot|sparsemax|output_gate|fixed)",
    }
    assert results["best_perplexity"] == 120.0 and results["best_generation"] == 1
    assert results["history"] == [
        {"generation": 0, "best_perplexity": 150.0, "mean_perplexity": 210.0,
         "best_gene": "dot|sparsemax|none|fixed|bias|0.10"},
        {"generation": 1, "best_perplexity": 120.0, "mean_perplexity": pytest.approx(410.0 / 3),
         "best_gene": "dot|sparsemax|output_gate|fixed|bias|0.10"},
        {"generation": 2, "best_perplexity": 120.0, "mean_perplexity": 167.5,
         "best_gene": "dot|sparsemax|output_gate|fixed|bias|0.10"},
    ]
    assert results["top_5"] == [
        {"gene": "dot|sparsemax|output_gate|fixed|bias|0.10", "perplexity": 120.0, "generation": 1},
        {"gene": "dot|sparsemax|output_gate|learned|bias|0.10", "perplexity": 130.0, "generation": 2},
        {"gene": "cosine|sparsemax|none|fixed|bias|0.10", "perplexity": 140.0, "generation": 1},
        {"gene": "dot|sparsemax|none|fixed|bias|0.10", "perplexity": 150.0, "generation": 0},
        {"gene": "dot|relu_norm|none|fixed|bias|0.10", "perplexity": 170.0, "generation": 2},
    ]
    assert results["baseline"]["gene"] == VANILLA and results["baseline"]["perplexity"] == BASELINE_PPL
    assert results["change"] == {"absolute": -40.0, "percent": -25.0}
    assert results["counts"] == {"trained": 10, "ok": 8, "failed": {"diverged": 1, "oom": 1}, "planned": 10,
                                 "cache_hits": 0, "by_role": {"baseline": 1, "search": 10}}
    assert results["config"]["population_size"] == 4 and results["strategy"]["name"] == "ga"
    assert results["data"]["fingerprint"] == "wt2:abc123" and results["versions"]["torch"] == "2.13"
    assert results["done"] is True


def test_evaluations_csv_has_one_row_per_evaluation(normal_run):
    write_report(normal_run)
    with open(normal_run / "evaluations.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with RunStore.open(normal_run, readonly=True) as store:
        assert len(rows) == len(store.evaluations()) == 11
    assert list(rows[0])[:5] == ["id", "role", "generation", "gene", "status"]
    assert list(rows[0])[-16:] == ["similarity", "normalization", "gating", "temperature_mode", "use_bias",
                                   "attention_dropout", "position", "qkv_rank", "attn_bias", "window", "kv_heads",
                                   "qkv_conv", "program", "learning_rate", "warmup",
                                   "weight_decay"]  # the program and recipe parts: empty = none, the run's
    assert rows[0]["position"] == "learned" and rows[0]["qkv_rank"] == "0" and rows[0]["attn_bias"] == "none"
    assert rows[0]["role"] == "baseline" and rows[0]["generation"] == "" and rows[0]["use_bias"] == "true"
    diverged = next(r for r in rows if r["status"] == "diverged")
    assert diverged["val_perplexity"] == "" and diverged["val_loss"] == "" and "\n" in diverged["error"]
    assert diverged["gating"] == "output_gate" and diverged["attention_dropout"] == "0.2"


def test_component_analysis_hand_computed(normal_run):
    summary = load_run(normal_run)
    search = [r for r in summary.evaluations if r["role"] == "search"]
    rows = {(r["field"], r["option"]): r for r in component_analysis(search, top_n=3)}
    # top 3 distinct genes: dot|sparsemax|output_gate|fixed 120, dot|sparsemax|output_gate|learned 130,
    # cosine|sparsemax|none|fixed 140
    assert rows["similarity", "dot"] == {"field": "similarity", "option": "dot", "n_ok": 4, "n_failed": 1,
                                         "best_perplexity": 120.0, "mean_perplexity": 142.5, "in_top": 2}
    assert rows["similarity", "cosine"] == {"field": "similarity", "option": "cosine", "n_ok": 3, "n_failed": 0,
                                            "best_perplexity": 140.0, "mean_perplexity": 190.0, "in_top": 1}
    assert rows["similarity", "additive"]["n_ok"] == 1 and rows["similarity", "additive"]["n_failed"] == 1
    assert rows["normalization", "sparsemax"]["mean_perplexity"] == 135.0
    assert rows["normalization", "sparsemax"]["in_top"] == 3
    assert rows["gating", "output_gate"]["n_failed"] == 1 and rows["gating", "output_gate"]["in_top"] == 2
    assert rows["use_bias", "nobias"] == {"field": "use_bias", "option": "nobias", "n_ok": 0, "n_failed": 1,
                                          "best_perplexity": None, "mean_perplexity": None, "in_top": 0}
    assert rows["attention_dropout", "0.10"]["n_ok"] == 6
    assert sum(r["in_top"] for r in rows.values()) == 3 * 6  # each top gene counted once per field
    # the default top 10 holds all 8 finished genes: every option's count equals its distinct genes
    written = summary.components
    assert {(r["field"], r["option"]): r["in_top"] for r in written}[("similarity", "dot")] == 4
    # within a field, options are listed best first
    sims = [r["option"] for r in written if r["field"] == "similarity"]
    assert sims == ["dot", "cosine", "additive"]


def test_component_outputs(normal_run):
    write_report(normal_run)
    with open(normal_run / "component_analysis.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["field", "option", "n_ok", "n_failed", "best_perplexity", "mean_perplexity",
                             "in_top_10"]
    assert len(rows) == 3 + 3 + 3 + 2 + 2 + 4  # options that occurred per field
    md = (normal_run / "component_analysis.md").read_text()
    assert md.startswith("# Component analysis") and "`sparsemax`" in md


def test_png_is_valid(normal_run):
    path = write_report(normal_run)["evolution_progress"]
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000


def test_report_md(normal_run):
    write_report(normal_run)
    text = (normal_run / "report.md").read_text()
    for expected in ("Attn(dot|sparsemax|output_gate|fixed)", "120.00", "-25.0%", "## Settings",
                     "](evolution_progress.png)", "## Per generation", "## Top 10 genes", "## Component analysis",
                     "## Failures", "diverged", "oom", "wt2:abc123", f"evo-attention report {normal_run}",
                     "| torch | 2.13 |", "4 x 3 (elite 1)"):
        assert expected in text, expected
    # gene keys inside tables have their pipes escaped, so every row has its header's column count
    columns = None
    for line in text.splitlines():
        if not line.startswith("|"):
            columns = None
            continue
        cells = line.replace("\\|", "").count("|")
        columns = columns or cells
        assert cells == columns, line


def test_no_nan_or_inf_in_json_and_regeneration_is_identical(normal_run):
    write_report(normal_run)
    first = (normal_run / "final_results.json").read_text()
    for token in ("NaN", "Infinity", "inf"):
        assert token not in first
    json.loads(first, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    csv_first = (normal_run / "evaluations.csv").read_text()
    md_first = (normal_run / "report.md").read_text()
    write_report(normal_run)
    assert (normal_run / "final_results.json").read_text() == first
    assert (normal_run / "evaluations.csv").read_text() == csv_first
    assert (normal_run / "report.md").read_text() == md_first


def test_all_failed_run(tmp_path):
    run_dir = tmp_path / "failed"
    with new_store(run_dir) as store:
        for i, status in enumerate(("diverged", "oom", "error")):
            store.record(record(f"dot|softmax|none|fixed|bias|0.{i}0", status, math.inf), generation=0)
        store.record(record(VANILLA, "diverged", math.nan, seed=99), role="baseline")
        store.record_generation(0, [(f"dot|softmax|none|fixed|bias|0.{i}0", math.inf, False) for i in range(3)])
    paths = write_report(run_dir)
    results = json.loads(paths["final_results"].read_text())
    assert tuple(results) == FINAL_RESULTS_KEYS
    assert results["best_gene"] is None and results["best_perplexity"] is None and results["top_5"] == []
    assert results["change"] is None and results["baseline"]["perplexity"] is None
    assert results["history"] == [{"generation": 0, "best_perplexity": None, "mean_perplexity": None,
                                   "best_gene": None}]
    assert results["counts"]["failed"] == {"diverged": 1, "error": 1, "oom": 1}
    assert results["counts"]["cache_hits"] is None  # not derivable before the run is done
    text = paths["report"].read_text()
    assert "All 3 evaluations failed" in text.splitlines()[2]
    components = paths["component_analysis_md"].read_text()
    assert "All 3 evaluations failed" in components and "| similarity | `dot` | 0 | 3 |" in components
    assert paths["evolution_progress"].read_bytes()[:8] == PNG_SIGNATURE
    with open(paths["evaluations"], newline="") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert "NaN" not in paths["final_results"].read_text()


def test_empty_run(tmp_path):
    run_dir = tmp_path / "empty"
    new_store(run_dir).close()
    paths = write_report(run_dir)
    results = json.loads(paths["final_results"].read_text())
    assert tuple(results) == FINAL_RESULTS_KEYS
    assert results["best_gene"] is None and results["history"] == [] and results["top_5"] == []
    assert results["baseline"] is None and results["counts"]["trained"] == 0 and results["done"] is False
    assert "No evaluation finished yet." in paths["report"].read_text()
    assert "No evaluation finished yet." in paths["component_analysis_md"].read_text()
    assert paths["evolution_progress"].read_bytes()[:8] == PNG_SIGNATURE
    assert paths["evaluations"].read_text().count("\n") == 1  # the header only
    assert paths["component_analysis_csv"].read_text().count("\n") == 1


def test_run_in_progress(tmp_path):
    """A generation that has evaluations but is not recorded yet is reported as in progress."""
    run_dir = tmp_path / "live"
    with new_store(run_dir, planned=11) as store:
        for gene, status, ppl in RUN[0]:
            store.record(record(gene, status, ppl), generation=0)
        store.record_generation(0, [(g, p if s == "ok" else math.inf, False) for g, s, p in RUN[0]])
        store.record(record(RUN[1][0][0], "ok", 120.0), generation=1)
        summary = load_run(run_dir)
        assert [h["complete"] for h in summary.history] == [True, False]
        assert summary.history[1]["best_perplexity"] == 120.0 and summary.best_generation == 1
        assert summary.baseline is None and summary.change is None
        paths = write_report(run_dir)
    text = paths["report"].read_text()
    assert "5 of 11 planned" in text and "1 (in progress)" in text and "--resume" in text
    assert "Baseline: none" in text


def test_cache_hits_once_done(tmp_path):
    run_dir = tmp_path / "hits"
    with new_store(run_dir, done=True, planned=12) as store:
        for generation, members in RUN.items():
            for gene, status, ppl in members:
                store.record(record(gene, status, ppl), generation=generation)
    assert load_run(run_dir).counts["cache_hits"] == 2


def test_unknown_component_does_not_break_the_report(tmp_path):
    run_dir = tmp_path / "plugin"
    with new_store(run_dir) as store:
        store.record(record("dot|mystery_norm|none|fixed|nobias|0.15", "ok", 99.0), generation=0)
    paths = write_report(run_dir)
    best = json.loads(paths["final_results"].read_text())["best_gene"]
    assert best["normalization"] == "mystery_norm" and best["use_bias"] is False
    assert best["attention_dropout"] == 0.15 and best["str"] == "Attn(dot|mystery_norm|none|fixed)"


def test_missing_run_is_a_user_error(tmp_path):
    from evo_attention.util.errors import UserError

    with pytest.raises(UserError, match="no run in"):
        write_report(tmp_path / "nothing")


def test_baseline_only_run(tmp_path):
    run_dir = tmp_path / "baseline_only"
    with new_store(run_dir) as store:
        store.record(record(VANILLA, "ok", BASELINE_PPL, seed=99), role="baseline")
    paths = write_report(run_dir)
    results = json.loads(paths["final_results"].read_text())
    assert results["best_gene"] is None and results["change"] is None
    assert results["baseline"]["perplexity"] == BASELINE_PPL
    assert "No search evaluation finished yet" in paths["report"].read_text()
    assert paths["evolution_progress"].read_bytes()[:8] == PNG_SIGNATURE


def test_status_names_each_study_file_the_report_leaves_out(normal_run):
    from evo_attention.report.status import format_status, run_status
    from evo_attention.report.studies import read_studies

    (normal_run / "validation.json").write_text('{"kind": "validation", "genes": "x"}')  # a field of the wrong type
    (normal_run / "validation_test.json").write_text("{not json")
    problems = read_studies(normal_run).problems  # the report's own lines
    assert len(problems) == 2
    status = run_status(normal_run)
    text = format_status(status)
    assert status["unreadable"] == problems and all(f"  unreadable analysis file, left out: {p}" in text.splitlines()
                                                    for p in problems)
    assert "validation.json: damaged: a field is not what its command writes" in text
    assert "best: dot|sparsemax|output_gate|fixed|bias|0.10" in text and "baseline: " + VANILLA in text


def test_a_study_file_nested_too_deeply_is_named_unreadable_by_status_and_report(normal_run):
    from evo_attention.report.status import format_status, run_status

    (normal_run / "validation.json").write_text("[" * 100000 + "]" * 100000)  # json's decoder recurses per level
    text = format_status(run_status(normal_run))
    assert "  unreadable analysis file, left out: validation.json: cannot be read (RecursionError: " in text
    assert "- validation.json: cannot be read (RecursionError: " in write_report(normal_run)["report"].read_text()


@pytest.mark.parametrize("name, text", [("attention_maps.json", '{"layers": [1, "a", null]}'),
                                        ("maps/one/attention_maps.json", '{"layers": [{"heads": 3}]}'),
                                        ("curve.json", '{"kind": "curve", "genes": "x"}'),
                                        ("curve/curve.json", '{"kind": "curve", "values": 5}')])
def test_damaged_maps_and_curves_are_named_damaged_by_status_and_report(normal_run, name, text):
    from evo_attention.report.status import format_status, run_status

    (normal_run / name).parent.mkdir(parents=True, exist_ok=True)
    (normal_run / name).write_text(text)
    said = f"{name}: damaged: a field is not what its command writes ("
    assert f"  unreadable analysis file, left out: {said}" in format_status(run_status(normal_run))
    report = write_report(normal_run)["report"].read_text()
    assert f"- {said}" in report and "## Attention maps" not in report and "## Difficulty curve" not in report


FRESH_CHECK = {"kind": "fresh_check", "metric": "val_loss", "lower_is_better": True, "seeds": [43, 44],
               "search_seed": 42, "rank_correlation": None, "held": False, "line": "the winner did not hold",
               "genes": [{"rank": 1, "gene": VANILLA, "search": 2.2, "fresh": 2.1}],
               "vanilla": {"gene": VANILLA, "fresh": 2.0}}


@pytest.mark.parametrize("damage", [{"genes": "x"}, {"genes": [1, 2]}, {"genes": []}, {"vanilla": {"fresh": "x"}},
                                    {"rank_correlation": "x"}, {"line": None}])
def test_a_damaged_fresh_check_is_named_damaged_not_dropped(normal_run, damage):
    from evo_attention.report.status import format_status, run_status

    (normal_run / "fresh_check.json").write_text(json.dumps(FRESH_CHECK))  # as the check writes it: shown
    assert "Fitness reliability: the winner did not hold." in write_report(normal_run)["report"].read_text()
    (normal_run / "fresh_check.json").write_text(json.dumps({**FRESH_CHECK, **damage}))
    said = "fresh_check.json: damaged: a field is not what its command writes ("
    assert f"  unreadable analysis file, left out: {said}" in format_status(run_status(normal_run))
    report = write_report(normal_run)["report"].read_text()
    assert f"- {said}" in report and "Fitness reliability" not in report


def test_a_gene_told_from_the_baseline_training_is_ranked(tmp_path):
    # a climb's start gene is the baseline gene: the store answers it from the baseline's training
    from evo_attention.report.status import run_status

    run_dir, worse = tmp_path / "told", "dot|sparsemax|none|fixed|bias|0.10"
    with new_store(run_dir, done=True, planned=2) as store:
        store.record(record(VANILLA, "ok", BASELINE_PPL), role="baseline")
        store.record(record(worse, "ok", BASELINE_PPL + 1), role="search", generation=0)
        store.record_generation(0, [(VANILLA, BASELINE_PPL, False), (worse, BASELINE_PPL + 1, False)])
    summary = load_run(run_dir)
    assert [r["gene"] for r in summary.ranking] == [VANILLA, worse]
    assert summary.best_gene == VANILLA and summary.best_generation == 0
    assert summary.history[0]["best_gene"] == VANILLA
    assert summary.counts["trained"] == 1 and summary.counts["cache_hits"] == 1
    assert run_status(run_dir)["best"]["gene"] == VANILLA
    from evo_attention.search.store import RunStore
    from evo_attention.search.warm_start import ranked_genes

    with RunStore.open(run_dir, readonly=True) as store:  # a warm start from the run takes it too
        assert ranked_genes(store, ["perplexity"]) == [VANILLA, worse]
    refused = tmp_path / "refused"  # the vanilla gene over a cap: listed told nothing, never the baseline's value
    with new_store(refused, done=True, planned=2) as store:
        store.record(record(VANILLA, "ok", BASELINE_PPL), role="baseline")
        store.record(record(worse, "ok", BASELINE_PPL + 1), role="search", generation=0)
        store.record_generation(0, [(worse, BASELINE_PPL + 1, False), (VANILLA, None, False)])
    assert [r["gene"] for r in load_run(refused).ranking] == [worse]
    with RunStore.open(refused, readonly=True) as store:
        assert ranked_genes(store, ["perplexity"]) == [worse]


def test_component_analysis_lists_axes_that_vary():
    def rec(gene, ppl):
        return {"gene": gene, "status": "ok", "val_perplexity": ppl}

    records = [rec("dot|softmax|none|fixed|bias|0.10", 10.0),
               rec("dot|softmax|none|fixed|bias|0.10|pos=rope:ntk:4|rank=32", 8.0),
               rec("dot|softmax|none|fixed|bias|0.10|pos=alibi", 9.0)]
    rows = {(r["field"], r["option"]): r for r in component_analysis(records, top_n=1)}
    assert rows["position", "rope:ntk:4"]["best_perplexity"] == 8.0 and rows["position", "rope:ntk:4"]["in_top"] == 1
    assert rows["position", "learned"]["n_ok"] == 1 and rows["position", "alibi"]["in_top"] == 0
    assert rows["qkv_rank", "32"]["n_ok"] == 1 and rows["qkv_rank", "0"]["n_ok"] == 2
    assert not any(field == "attn_bias" for field, _ in rows)  # one value throughout: not listed
    assert option_labels("dot|softmax|none|fixed|bias|0.10|abias=rel")["attn_bias"] == "rel"


@pytest.mark.filterwarnings("ignore:No artists with labels")  # plot is mocked in the first call: nothing drawn
def test_learning_curves_of_the_best_genes_and_the_baseline(tmp_path):
    """The figure draws one curve per top gene plus the baseline, from the stored records alone."""
    from unittest import mock

    import matplotlib.axes

    from evo_attention.report import load_run
    from evo_attention.report.figures import plot_learning_curves
    from evo_attention.search.store import RunStore

    curve = [[10, 3.0], [20, 2.5]]
    with RunStore.create(tmp_path / "run", {"seed": 1}) as store:
        for i, gene in enumerate(["dot|softmax|none|fixed|bias|0.10", "dot|sparsemax|none|fixed|bias|0.10",
                                  "cosine|softmax|none|fixed|bias|0.10"]):
            store.record({"gene": gene, "seed": 1, "steps": 20, "data_fingerprint": "f", "context": "c",
                          "status": "ok", "val_perplexity": 5.0 - i, "val_loss": 1.0, "curve": curve},
                         role="baseline" if i == 0 else "search", generation=None if i == 0 else 0)
    with mock.patch.object(matplotlib.axes.Axes, "plot", wraps=None, autospec=True) as plot:
        plot_learning_curves(load_run(tmp_path / "run"), tmp_path / "curves.png")
    assert plot.call_count == 3  # the baseline and the two search genes
    plot_learning_curves(load_run(tmp_path / "run"), tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_a_study_directory_and_writes_nothing(tmp_path, capsys):
    from evo_attention.cli import main

    RunStore.create(tmp_path / "c", config=Config().to_dict(), meta={"study": "curve"}).close()
    assert main(["report", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds the store of a curve, not of a search" in err and "evo-attention curve" in err
    assert [p.name for p in (tmp_path / "c").iterdir() if not p.name.startswith("run.db")] == []


def test_report_names_the_search_files_it_does_not_write_and_the_command_that_does(normal_run, recwarn):
    """`report DIR` was said to rebuild every output, but the generation snapshots and the fresh-seed check's
    files come from the search's code: report names those missing and `search --resume`, which rewrites them."""
    from evo_attention.cli import main

    with RunStore.open(normal_run) as store:
        store.record(record(VANILLA, "ok", BASELINE_PPL, seed=43), role="check")
    assert main(["report", str(normal_run)]) == 0
    said = [str(w.message) for w in recwarn.list if "report does not write" in str(w.message)]
    assert len(said) == 1 and "checkpoints/generation_000.json" in said[0]
    assert "fresh_check.json, fresh_check.md" in said[0]
    assert said[0].endswith(f"`evo-attention search --resume --out {normal_run}` rewrites them from the store "
                            "(a finished run trains nothing)")
    for name in said[0].split("report does not write ")[1].split(" (the search does)")[0].split(", "):
        (normal_run / name).parent.mkdir(exist_ok=True)
        (normal_run / name).write_text("{}")
    recwarn.clear()
    assert main(["report", str(normal_run)]) == 0
    assert not [w for w in recwarn.list if "report does not write" in str(w.message)]


def test_report_names_the_command_that_rewrites_an_unreadable_fresh_check(normal_run, recwarn):
    """A truncated fresh_check.json was listed as unreadable, with no word of the command that rewrites it."""
    from evo_attention.cli import main

    with RunStore.open(normal_run) as store:
        store.record(record(VANILLA, "ok", BASELINE_PPL, seed=43), role="check")
    (normal_run / "fresh_check.json").write_text('{"kind": "fresh_check", "ge')  # cut short
    assert main(["report", str(normal_run)]) == 0
    said = [str(w.message) for w in recwarn.list if "report does not write" in str(w.message)]
    assert len(said) == 1 and ", fresh_check.json, which cannot be read, fresh_check.md (the search does)" in said[0]
    assert said[0].endswith(f"`evo-attention search --resume --out {normal_run}` rewrites them from the store "
                            "(a finished run trains nothing)")
