"""Scoring genes on a suite of tasks: the score, compare --suite, validate --suite, search --suite."""

import importlib.util
import json
import math

import pytest
import yaml

from evo_attention import AttentionGene, Config, components
from evo_attention.cli import main
from evo_attention.data.suites import load_suite, parse_suite
from evo_attention.report import load_run, write_report
from evo_attention.report.attachments import load_attachments
from evo_attention.report.status import format_status, run_status
from evo_attention.search.driver import Search
from evo_attention.search.executors import LocalExecutor
from evo_attention.search.store import RunStore
from evo_attention.studies.common import StudySetup
from evo_attention.studies.compare import named_dropout, resolve_configs, run_compare
from evo_attention.studies.suite import run_suite
from evo_attention.train.suite import FAILED_ACCURACY, point_config, suite_score
from evo_attention.util.errors import UserError

VANILLA = AttentionGene.vanilla().key
BASELINE = AttentionGene.vanilla().replace(attention_dropout=0.0).key  # the baseline of a generated task
ROPE = AttentionGene.vanilla().replace(position="rope").key
TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0, "batch_size": 4,
        "eval_batch_size": 16, "eval_steps": None, "learning_rate": 2e-3, "log_every": 1, "max_seq_len": 12,
        "train_steps": 2}
TINY_FLAGS = ["--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--batch-size", "4",
              "--eval-batch-size", "16", "--eval-steps", "all", "--lr", "2e-3", "--seq-len", "12"]
SUITE = {"suite": "tiny", "steps": 2, "defaults": {"vocab": 12, "train_examples": 64, "eval_examples": 16},
         "points": [{"label": "recall", "task": "mad:in_context_recall", "knobs": {"seq_len": 12, "pairs": 2}},
                    {"label": "copy", "task": "mad:selective_copy", "knobs": {"seq_len": 12, "copy": 2}, "steps": 3}]}


@pytest.fixture
def tiny_suite(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    return str(path)


@pytest.fixture
def boom():
    """A normalization that always raises: every training of a gene using it fails."""

    @components.register_normalization("boom")
    def boom_norm(scores, mask):
        raise RuntimeError("boom went the normalization")

    yield "dot|boom|none|fixed"
    components.unregister("normalization", "boom")


class CountingExecutor(LocalExecutor):
    def __init__(self):
        self.trained = []

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.gene, task.trial.task.data, task.seed))
            yield task, record


# -- the score ------------------------------------------------------------------------------------------
def test_the_aggregate_is_the_mean_accuracy_and_a_failed_point_counts_zero():
    ok = {"status": "ok", "accuracy": 0.8, "val_loss": 0.5}
    score = suite_score(["a", "b", "c"], {"a": ok, "b": {**ok, "accuracy": 0.4},
                                          "c": {"status": "diverged", "accuracy": math.nan, "val_loss": math.inf,
                                                "error": "loss nan"}})
    assert score.aggregate == pytest.approx((0.8 + 0.4 + FAILED_ACCURACY) / 3)
    assert score.failed == ("c",) and score.complete and not score.all_failed
    assert score.point("c").status == "diverged" and score.point("c").error == "loss nan"
    assert score.point("c").accuracy is None and score.point("c").scored == 0.0
    # an 'ok' training without a finite accuracy is a failure too; a missing point leaves no aggregate
    odd = suite_score(["a", "b"], {"a": {**ok, "accuracy": math.nan}})
    assert odd.point("a").status == "no_accuracy" and odd.failed == ("a",)
    assert odd.missing == ("b",) and odd.aggregate is None and not odd.complete
    dead = suite_score(["a"], {"a": {"status": "oom"}})
    assert dead.all_failed and dead.aggregate == 0.0
    assert json.dumps(score.to_dict())  # plain data


def test_a_point_config_is_the_config_with_the_points_data_and_the_suites_steps(tiny_suite):
    suite = load_suite(tiny_suite)
    config = Config(**{**TINY, "train_steps": 7, "data": "recall", "recall": {"num_pairs": 2}})
    recall, copy = (point_config(config, p) for p in suite.points)
    assert recall.data == suite.points[0].data and recall.recall == {} and recall.train_steps == 2  # the suite's
    assert copy.train_steps == 3 and copy.d_model == 16 and copy.learning_rate == 2e-3
    no_steps = load_suite_from({**SUITE, "steps": None, "points": [dict(SUITE["points"][0])]}, tiny_suite)
    assert point_config(config, no_steps.points[0]).train_steps == 7  # the config's, where the suite gives none
    with pytest.raises(UserError, match="suite point recall: .*warmup"):
        point_config(config.replace(lr_schedule="cosine", warmup_steps=5), suite.points[0])


def load_suite_from(raw, next_to):
    from pathlib import Path

    path = Path(next_to).with_name("other.yaml")
    path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))
    return load_suite(path)


def test_config_objectives_and_what_a_suite_does_not_take(tiny_suite):
    assert Config(suite=tiny_suite).objectives == ["suite_accuracy"]  # the default objective on a suite
    assert Config(suite=tiny_suite, objectives=["suite_accuracy"]).objectives == ["suite_accuracy"]
    with pytest.raises(UserError, match="one objective, suite_accuracy"):
        Config(suite=tiny_suite, objectives=["perplexity", "params"])
    with pytest.raises(UserError, match="give suite"):
        Config(objectives=["suite_accuracy"])
    for bad in ({"fidelity": "halving"}, {"max_params": 1000}, {"init_from": "runs/a"}):
        with pytest.raises(UserError, match="cannot be combined with suite"):
            Config(suite=tiny_suite, **bad)
    with pytest.raises(UserError, match="suite must be"):
        Config(suite="")


# -- compare and validate -----------------------------------------------------------------------------
def test_compare_on_a_suite_writes_its_table_and_heat_map_and_a_repeat_trains_nothing(tmp_path, tiny_suite):
    config = Config(**TINY)
    # the named configuration without attention dropout, like the baseline (which joins by itself)
    entries = resolve_configs("rope_only", config.d_model, attention_dropout=named_dropout(config.replace(suite=tiny_suite)))
    executor = CountingExecutor()
    out = tmp_path / "cmp"
    result = run_compare(config, entries, seeds=2, out_dir=out, executor=executor, quiet=True, suite=tiny_suite)
    assert len(executor.trained) == 2 * 2 * 2  # genes x points x seeds
    assert {seed for *_, seed in executor.trained} == {43, 44}
    assert result.baseline["name"] == "baseline" and [g["name"] for g in result.genes] == ["rope_only"]
    assert result.baseline["gene"] == BASELINE and result.genes[0]["gene"].endswith("|0.00|pos=rope")
    row = result.genes[0]
    for r in (result.baseline, row):  # the aggregate is the mean of the point means, per seed too
        assert r["mean"] == pytest.approx(sum(r["points"][p]["mean"] for p in ("recall", "copy")) / 2)
        assert len(r["values"]) == 2 and all(0.0 <= v <= 1.0 for v in r["values"])
    assert row["scale"] == "linear" and row["verdict"] in ("better", "worse", "equivalent", "undetermined")
    assert row["difference"] == pytest.approx(row["mean"] - result.baseline["mean"])
    written = json.loads((out / "compare_suite.json").read_text())
    assert written["kind"] == "suite" and written["study"] == "compare" and written == result.to_dict()
    assert [p["steps"] for p in written["suite"]["points"]] == [2, 3]
    table = (out / "compare_suite.md").read_text()
    assert "| Name | Gene | recall | copy | Suite accuracy |" in table and "rope_only" in table
    assert (out / "compare_suite.png").read_bytes()[:4] == b"\x89PNG"
    with RunStore.open(out, readonly=True) as store:
        assert len(store.evaluations()) == 8 and {r["role"] for r in store.evaluations()} == {"compare"}

    executor.trained.clear()
    again = run_compare(config, entries, seeds=2, out_dir=out, executor=executor, quiet=True, suite=tiny_suite)
    assert executor.trained == []  # every training served from the store
    assert again["baseline"]["values"] == result["baseline"]["values"]
    found = load_attachments(out)  # compare_suite.json in --out: a run report there would show it
    assert [s["_file"] for s in found.suites] == ["compare_suite.json"]


def test_validate_on_a_suite_gives_paired_verdicts_and_failed_points_score_zero(tmp_path, tiny_suite, boom):
    config = Config(**{**TINY, "seed": 10})
    with RunStore.create(tmp_path / "store", config=config.to_dict()) as store:
        setup = StudySetup.resolve(config, None, role="validate", n_seeds=3, metric="suite_accuracy", store=store,
                                   margin=0.05)
        result = run_suite(setup, load_suite(tiny_suite), [("rope", ROPE), ("boom", boom), ("base", BASELINE)],
                           study="validation")
    assert result.seeds == [11, 12, 13] and result["family_size"] == 2
    assert result.baseline["name"] == "base" and [g["name"] for g in result.genes] == ["rope", "boom"]
    rope, broken = result.genes
    for row in (rope, broken):
        assert row["p_holm"] is not None and row["verdict"] and row["scale"] == "linear"
    assert broken["values"] == [0.0, 0.0, 0.0] and broken["n_failed"] == 6  # every point of every seed: 0
    assert {f["point"] for f in broken["failures"]} == {"recall", "copy"} and broken["failures"][0]["status"] == "error"
    assert broken["points"]["copy"]["mean"] == 0.0 and broken["points"]["copy"]["n_failed"] == 3
    assert broken["difference"] == pytest.approx(-result.baseline["mean"])
    assert result["metric"] == "suite_accuracy" and result["lower_is_better"] is False
    assert "suite accuracy" in result.headline


def test_generated_tasks_compare_against_a_baseline_without_attention_dropout_unless_a_gene_asks(tmp_path, tiny_suite,
                                                                                                capsys):
    text = Config(**TINY, data="recall")
    assert text.resolved_baseline().key == VANILLA and not text.generated_task and named_dropout(text) is None
    for generated in (Config(**TINY, data="mqar"), Config(**TINY, data="mad:selective_copy"),
                      Config(**TINY, suite=tiny_suite)):
        assert generated.generated_task and generated.resolved_baseline().key == BASELINE
        assert named_dropout(generated) == 0.0
    # compare --suite through the CLI: the named baseline and rope_only train without attention
    # dropout; a gene string that asks for it (|0.10) trains as written, against that baseline
    out = tmp_path / "cmp"
    argv = ["compare", "--suite", tiny_suite, "--configs", f"baseline,rope_only,{VANILLA}", "--seeds", "2",
            "--out", str(out), "--quiet"] + TINY_FLAGS
    assert main(argv) == 0
    written = json.loads((out / "compare_suite.json").read_text())
    assert written["baseline"]["name"] == "baseline" and written["baseline"]["gene"] == BASELINE
    genes = {g["name"]: g["gene"] for g in written["genes"]}
    assert genes == {"rope_only": BASELINE + "|pos=rope", VANILLA: VANILLA}
    assert all(g["verdict"] for g in written["genes"])
    with RunStore.open(out, readonly=True) as store:
        assert {r["gene"] for r in store.evaluations()} == {BASELINE, BASELINE + "|pos=rope", VANILLA}
    # validate --suite: a gene equal to the baseline is not validated against itself; the vanilla
    # gene (with dropout) is a gene like any other there
    capsys.readouterr()
    assert main(["validate", "--suite", tiny_suite, "--genes", BASELINE, "--out", str(tmp_path / "v")]
                + TINY_FLAGS) == 2
    assert "no gene to validate other than the baseline" in capsys.readouterr().err
    # --baseline-gene names the baseline (here the vanilla gene with dropout): the named
    # configurations follow its attention dropout; the earlier trainings are served from the store
    argv = ["compare", "--suite", tiny_suite, "--configs", "rope_only", "--baseline-gene", VANILLA, "--seeds", "2",
            "--out", str(out), "--quiet"] + TINY_FLAGS
    assert main(argv) == 0
    written = json.loads((out / "compare_suite.json").read_text())
    assert written["baseline"]["gene"] == VANILLA and [g["gene"] for g in written["genes"]] == [ROPE]
    # a baseline of another mechanism replaces the configuration named baseline: one entry of that name
    sparse = "dot|sparsemax|none|fixed|bias|0.10"
    argv = ["compare", "--suite", tiny_suite, "--configs", "baseline,rope_only", "--baseline-gene", sparse,
            "--seeds", "2", "--out", str(out), "--quiet"] + TINY_FLAGS
    assert main(argv) == 0
    written = json.loads((out / "compare_suite.json").read_text())
    assert written["baseline"]["name"] == "baseline" and written["baseline"]["gene"] == sparse
    assert [(g["name"], g["gene"]) for g in written["genes"]] == [("rope_only", ROPE)]
    assert Config(**TINY, suite=tiny_suite, baseline_gene=VANILLA).resolved_baseline().key == VANILLA
    with pytest.raises(UserError, match="baseline_gene") as info:
        Config(**TINY, baseline_gene="dot|nope|none|fixed")
    assert info.value.settings == ("baseline_gene",)
    assert main(["compare", "--suite", tiny_suite, "--baseline-gene", "dot|nope", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "baseline" in err and "\n" not in err and "Traceback" not in err


def test_an_ablation_on_a_generated_task_is_against_the_baseline_without_dropout(tmp_path, capsys):
    data = ["--data", "mad:selective_copy:seq_len=12,copy=2,vocab=12,train_examples=64,eval_examples=16"]
    out = tmp_path / "abl"
    sparse = "dot|sparsemax|none|fixed|bias|0.00"
    assert main(["ablate", "--gene", sparse, "--seeds", "2", "--steps", "2", "--out", str(out), "--quiet"]
                + data + TINY_FLAGS) == 0
    written = json.loads((out / "ablation.json").read_text())
    assert written["baseline_gene"] == BASELINE and written["fields"] == ["normalization"]  # dropout is not one
    capsys.readouterr()
    assert main(["ablate", "--gene", BASELINE, "--out", str(tmp_path / "none")] + data + TINY_FLAGS) == 2
    assert "is the baseline itself" in capsys.readouterr().err and not (tmp_path / "none").exists()
    # --baseline-gene asks for another baseline: against the vanilla gene, dropout is a difference too
    assert main(["ablate", "--gene", sparse, "--baseline-gene", VANILLA, "--seeds", "2", "--steps", "2",
                 "--out", str(tmp_path / "vs-vanilla"), "--quiet"] + data + TINY_FLAGS) == 0
    written = json.loads((tmp_path / "vs-vanilla" / "ablation.json").read_text())
    assert written["baseline_gene"] == VANILLA and written["fields"] == ["normalization", "attention_dropout"]


def test_compare_without_a_suite_judges_against_the_baseline_gene_it_is_given(tmp_path):
    data = ["--data", "mad:selective_copy:seq_len=12,copy=2,vocab=12,train_examples=64,eval_examples=16"]
    out = tmp_path / "cmp"
    assert main(["compare", "--configs", "baseline,rope_only", "--baseline-gene", VANILLA, "--seeds", "2",
                 "--steps", "2", "--out", str(out), "--quiet"] + data + TINY_FLAGS) == 0
    written = json.loads((out / "compare_results.json").read_text())
    genes = {a["name"]: a["gene"] for a in written["aggregates"]}
    assert genes == {"baseline": VANILLA, "rope_only": ROPE}  # named configurations follow its dropout
    assert set(written["summary"]["paired"]) == {"rope_only"}


def test_validate_from_a_suite_run_and_bad_suites_through_the_cli(tmp_path, tiny_suite, capsys):
    out = tmp_path / "val"
    argv = ["validate", "--suite", tiny_suite, "--genes", ROPE, "--seeds", "2", "--out", str(out), "--quiet",
            "--steps", "5"] + TINY_FLAGS
    assert main(argv) == 0
    written = json.loads((out / "validation_suite.json").read_text())
    assert written["study"] == "validation" and written["genes"][0]["gene"] == ROPE
    # how its 8 trainings ran, kept in the file (the resolved precision of precision auto)
    assert sum(written["trained_as"].values()) == 8 and all(k.startswith("cpu ") for k in written["trained_as"])
    assert (out / "validation_suite.png").is_file() and (out / "validation_suite.md").is_file()
    with RunStore.open(out, readonly=True) as store:  # kept in a store of its own: a repeat trains nothing
        n = len(store.evaluations())
    assert n == 8 and main(argv) == 0
    with RunStore.open(out, readonly=True) as store:
        assert len(store.evaluations()) == n
    capsys.readouterr()
    for command in (["search", "--suite", "nope", "--out", str(tmp_path / "s")],
                    ["compare", "--suite", "nope", "--out", str(tmp_path / "c")],
                    ["validate", "--suite", "nope", "--genes", ROPE, "--out", str(tmp_path / "v")],
                    ["search", "--suite", "mad-cpu", "--data", "recall", "--out", str(tmp_path / "s")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evo-attention: error: ") and "\n" not in err and "Traceback" not in err
        assert "--suite" in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "c").exists()


# -- search -------------------------------------------------------------------------------------------
def test_search_on_a_suite_end_to_end_and_a_resume_trains_nothing(tmp_path, tiny_suite, capsys):
    config = Config(**TINY, suite=tiny_suite, population_size=3, n_generations=2, elite_size=1, seed=3)
    out = tmp_path / "run"
    executor = CountingExecutor()
    with Search(config, out_dir=out, executor=executor) as search:
        best = search.run()
    genes = {gene for gene, *_ in executor.trained}
    assert len(executor.trained) == 2 * len(genes)  # every gene on both points, once
    assert {data for _, data, _ in executor.trained} == {p.data for p in load_suite(tiny_suite).points}
    assert {seed for *_, seed in executor.trained} == {3}
    summary = load_run(out)
    assert summary.suite is not None and [p["label"] for p in summary.suite["points"]] == ["recall", "copy"]
    ranked = [r for r in summary.suite["genes"] if r["rank"] is not None]
    assert best.fitness == pytest.approx(ranked[0]["suite_accuracy"])  # the strategy maximised the suite accuracy
    assert summary.best["key"] == ranked[0]["gene"] and summary.best_perplexity is None
    for row in ranked:
        points = row["points"]
        assert row["suite_accuracy"] == pytest.approx((points["recall"]["accuracy"] + points["copy"]["accuracy"]) / 2)
    assert [r["suite_accuracy"] for r in ranked] == sorted((r["suite_accuracy"] for r in ranked), reverse=True)
    assert summary.baseline["gene"] == BASELINE and summary.baseline["suite_accuracy"] is not None
    assert summary.history[-1]["best_so_far"] == pytest.approx(ranked[0]["suite_accuracy"])
    with RunStore.open(out, readonly=True) as store:
        assert [p["label"] for p in store.get_meta("suite")["points"]] == ["recall", "copy"]
        assert store.get_meta("planned") == 2 * 5  # (3 + 2 new genes) x 2 points; the baseline on top

    paths = write_report(out)  # the report and status are rebuilt from the store
    assert paths["suite"].is_file() and "## Suite" in paths["report"].read_text()
    assert "suite accuracy" in paths["report"].read_text() and "Best suite acc" in paths["report"].read_text()
    final = json.loads(paths["final_results"].read_text())
    assert final["suite"]["name"] == "tiny" and final["top_5"][0]["suite_accuracy"] == ranked[0]["suite_accuracy"]
    status = run_status(out)
    assert status["suite"]["best"]["gene"] == ranked[0]["gene"] and status["planned"] == 12
    assert "suite accuracy" in format_status(status)
    if importlib.util.find_spec("optuna") is not None:  # the run as an Optuna study: a trial per gene, maximised
        from evo_attention.report.optuna import write_optuna_journal

        journal = write_optuna_journal(out, tmp_path / "optuna.log")
        assert journal["trials"] == len(summary.suite["genes"]) + 1
        assert journal["states"].get("COMPLETE") == len(ranked) + 1

    executor.trained.clear()
    with Search(config, out_dir=out, executor=executor, resume=True) as search:
        again = search.run()
    assert executor.trained == [] and again.gene.key == best.gene.key

    # the CLI resumes it too, and refuses a suite whose points changed
    assert main(["search", "--resume", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    changed = {**SUITE, "points": [SUITE["points"][0]]}
    with open(tiny_suite, "w") as f:
        yaml.safe_dump(changed, f)
    assert main(["search", "--resume", "--out", str(out)]) == 2
    assert "whose points differ" in capsys.readouterr().err


MIXED = {"suite": "mixed", "steps": 2, "defaults": {"vocab": 12, "train_examples": 64, "eval_examples": 16},
         "points": [{"label": "recall", "task": "mad:in_context_recall", "knobs": {"seq_len": 12, "pairs": 2},
                     "weight": 3},
                    {"label": "language", "task": "text", "tokenizer": "byte", "knobs": {"seq_len": 12}}]}


def test_a_suite_mixes_language_and_task_points_with_stated_weights(tmp_path, shakespeare_dir):
    raw = {**MIXED, "points": [MIXED["points"][0], {**MIXED["points"][1], "data_dir": str(shakespeare_dir)}]}
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(raw))
    suite = load_suite(str(path))
    assert suite.weights == (3.0, 1.0) and suite.point("language").language
    assert point_config(Config(**TINY), suite.point("language")).tokenizer == "byte"
    config = Config(**TINY, suite=str(path), population_size=2, n_generations=1, elite_size=1, seed=3)
    with Search(config, out_dir=tmp_path / "run") as search:
        search.run()
    summary = load_run(tmp_path / "run")
    for row in [summary.suite["baseline"]] + summary.suite["genes"]:  # the search reports each part
        points = row["points"]
        assert 0 <= points["language"]["accuracy"] <= 1  # next-token accuracy
        assert row["suite_accuracy"] == pytest.approx((3 * points["recall"]["accuracy"]
                                                       + points["language"]["accuracy"]) / 4)
    assert "weight 3" in write_report(tmp_path / "run")["report"].read_text()
    for bad, match in [({"weight": 0}, "weight must be a positive number"),
                       ({"weight": True}, "weight must be a positive number"),
                       ({"data_dir": None}, "add data_dir, the directory of the corpus"),
                       ({"data_dir": 5}, "data_dir must name the corpus"),
                       ({"knobs": {"pairs": 2, "seq_len": 12}}, "not a knob of a corpus"),
                       ({"knobs": {}}, "set knobs: {seq_len: N}"),
                       ({"seed": 1}, "a corpus has no data seed"),
                       ({"knobs": {"seq_len": 12, "vocab": 50}}, "knob vocab is the vocabulary of the word tokenizer"),
                       ({"task": ["text"]}, r"task \['text'\] is not a task")]:
        with pytest.raises(UserError, match=match):
            parse_suite({**MIXED, "points": [MIXED["points"][0], {**raw["points"][1], **bad}]})
    with pytest.raises(UserError, match="tokenizer applies to a language point"):
        parse_suite({**MIXED, "points": [{**MIXED["points"][0], "tokenizer": "byte"}]})


@pytest.mark.parametrize("command", ["search", "validate", "fitness-check", "compare"])
def test_every_suite_flag_names_every_shipped_suite(command):
    """validate's, fitness-check's and compare's --suite help left out fitness-recall, which the README uses."""
    import re

    from evo_attention.cli import build_parser
    from evo_attention.data.suites import shipped_suites

    subparsers = next(a for a in build_parser()._actions if a.choices and command in a.choices)
    text = " ".join(subparsers.choices[command].format_help().split())
    suite_help = re.search(r"--suite NAME\|FILE (.*?) --", text).group(1).replace("- ", "-")
    assert all(name in suite_help for name in shipped_suites())


def test_a_suite_study_says_per_point_the_tokens_scored_and_a_partial_evaluation(tmp_path, capsys):
    """eval_steps 1 of 16 examples scores the whole of the recall point's split but half of copy's (32 examples):
    each point of each row keeps its tokens and whether they were the whole split; the markdown, the printed
    summary and a run report say the evaluation was partial; a file without the fields still renders, silent."""
    from evo_attention.report.markdown import _attachment_sections
    from evo_attention.report.studies.suite import suite_markdown

    raw = {**SUITE, "points": [SUITE["points"][0], {**SUITE["points"][1], "knobs": {"seq_len": 12, "copy": 2,
                                                                                   "eval_examples": 32}}]}
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "val"
    flags = [f for f in TINY_FLAGS if f not in ("--eval-steps", "all")] + ["--eval-steps", "1"]
    assert main(["validate", "--suite", str(path), "--genes", ROPE, "--seeds", "2", "--out", str(out)] + flags) == 0
    written = json.loads((out / "validation_suite.json").read_text())
    for row in (written["baseline"], *written["genes"]):
        recall, copy = row["points"]["recall"], row["points"]["copy"]
        assert recall["eval_complete"] is True and copy["eval_complete"] is False
        assert (recall["eval_tokens"], copy["eval_tokens"]) == (64, 32)  # one batch of 16 examples each
    said = "eval_steps 1 cut the evaluation short, so each value is measured on 32 of the scored tokens"
    assert said in (out / "validation_suite.md").read_text() and said in capsys.readouterr().err
    assert any(said in line for section in _attachment_sections(load_attachments(out)) for line in section)
    for row in (written["baseline"], *written["genes"]):
        for point in row["points"].values():
            del point["eval_tokens"], point["eval_complete"]  # a file written before the points kept them
    assert "Partial" not in suite_markdown(written)
