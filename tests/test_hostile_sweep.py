"""The defects the hostile sweep of this version found (benchmarks/hostile_sweep.py,
docs/results/hostile/hostile-sweep.json), each held to its fix: no data loss, no silent change, no
traceback, and messages in the user's words."""

import json
import random

import pytest
import torch
import yaml

from evo_attention import AttentionGene, Config, EvolvedAttention, TinyTransformer, train_and_evaluate
from evo_attention.cli import main
from evo_attention.data import load_data
from evo_attention.data.suites import load_suite
from evo_attention.nn.components import register_normalization
from evo_attention.studies.fitness import run_fitness_check
from evo_attention.studies.validate import validate_genes
from evo_attention.util.errors import UserError

TINY = ["--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "3", "--quiet"]
SEARCH = [*TINY, "--population", "2", "--generations", "1", "--elite", "1", "--keep-models", "0"]
CFG = Config(d_model=16, n_heads=2, n_layers=1, vocab_size=16, max_seq_len=16, train_steps=3)


def last_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "\n".join(lines)
    return lines[-1]


def test_search_overwrite_deletes_the_results_built_on_the_run_it_replaces(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["search", *SEARCH, "--no-check", "--out", str(out)]) == 0
    assert main(["validate", "--from-run", str(out), "--top", "1", "--seeds", "2", "--steps", "3", "--quiet"]) == 0
    assert (out / "validation.json").is_file()
    capsys.readouterr()
    with pytest.warns(UserWarning, match="the results built on the deleted run are deleted too: validation.json"):
        assert main(["search", *SEARCH, "--no-check", "--out", str(out), "--overwrite"]) == 0
    assert not list(out.glob("validation*")) and "Validated:" not in (out / "report.md").read_text()


def test_search_never_writes_into_a_saved_model_or_an_export(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    for flags in ([], ["--overwrite"]):
        assert main(["search", *SEARCH, "--no-check", "--out", str(model), *flags]) == 2
        assert "holds a saved model" in last_error(capsys)
    assert sorted(p.name for p in model.iterdir()) == ["model.safetensors"]


def test_search_never_writes_into_a_baselines_directory(tmp_path, capsys):
    out = tmp_path / "baseline"  # result.json, vocab.json and model/model.safetensors: nothing protected at the top
    assert main(["baseline", *TINY, "--save-model", "--out", str(out)]) == 0
    before = sorted(p.name for p in out.iterdir())
    assert main(["search", *SEARCH, "--no-check", "--out", str(out)]) == 2
    assert "holds a baseline, not a search run" in last_error(capsys)
    assert sorted(p.name for p in out.iterdir()) == before


def test_gene_lists_too_long_for_a_file_name_are_read_as_genes(tmp_path, capsys):
    genes = ",".join(["dot|softmax|output_gate|fixed|bias|0.10", "dot|sparsemax|none|fixed|bias|0.10"] * 4)
    assert len(genes) > 255
    assert main(["search", *SEARCH, "--no-check", "--start-from", genes, "--out", str(tmp_path / "a")]) == 0
    assert main(["search", *SEARCH, "--no-check", "--init-from", "x" * 300, "--out", str(tmp_path / "b")]) == 2
    assert "--init-from xxx" in last_error(capsys)
    assert main(["search", *SEARCH, "--no-check", "--start-from", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    said = last_error(capsys)
    assert said.startswith("evo-attention: error: --start-from") and "--init-from" not in said


def test_seeds_past_the_largest_and_a_confidence_of_one_are_refused_in_one_line(tmp_path, capsys):
    gene = ["--genes", "dot|sparsemax|none|fixed|bias|0.10"]
    assert main(["validate", *TINY, *gene, "--seeds", "2", "--seed", str(2**63 - 1), "--out", str(tmp_path / "v")]) == 2
    assert "pass 2^63-1: give a smaller --seed" in last_error(capsys)
    assert main(["validate", *TINY, *gene, "--confidence", "1", "--out", str(tmp_path / "w")]) == 2
    assert "--confidence 1.0 is outside (0.5, 1)" in last_error(capsys)


def test_a_resumed_run_keeps_the_fresh_check_it_started_with(tmp_path, monkeypatch):
    monkeypatch.delenv("EVO_ATTENTION_FRESH_CHECK")
    out = tmp_path / "run"
    assert main(["search", *SEARCH, "--no-check", "--out", str(out)]) == 0
    assert main(["search", "--resume", "--out", str(out), "--quiet"]) == 0  # no --no-check: the run's own setting
    assert not (out / "fresh_check.json").exists()


@pytest.mark.parametrize("text, says", [
    ("x=dot|softmax|output_gate|fixed|bias|0.10>", "a gene on each side"),
    ("x=dot|softmax|output_gate|fixed|bias|0.10>dot|softmax|output_gate|fixed|bias|0.10", "with itself"),
])
def test_a_known_improvement_needs_two_different_genes(tmp_path, capsys, text, says):
    assert main(["fitness-check", *TINY, "--seeds", "2", "--lr", "1e-3", "--improvement", text,
                 "--out", str(tmp_path / "f")]) == 2
    assert says in last_error(capsys)


def test_suite_files_are_spoken_of_in_their_own_words(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("suite: [tiny\n")
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump({"suite": "t", "stepz": 3, "points": []}))
    assert main(["search", *SEARCH, "--suite", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "a")]) == 2
    said = last_error(capsys)
    assert "is not valid YAML at line 2" in said and "--suite:" not in said and "unicode string" not in said
    assert main(["search", *SEARCH, "--suite", str(tmp_path / "unknown.yaml"), "--out", str(tmp_path / "b")]) == 2
    assert "valid keys: suite, description" in last_error(capsys)


def test_an_optuna_journal_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(["search", *SEARCH, "--no-check", "--out", str(out)]) == 0
    from evo_attention.report import optuna as journal

    for error in (PermissionError(1, "Operation not permitted"), OSError(30, "Read-only file system"),
                  FileNotFoundError(2, "No such file or directory")):  # the last: a place like /proc
        def refuse(path, error=error):
            raise error

        monkeypatch.setattr(journal, "journal_storage", refuse)
        capsys.readouterr()
        assert main(["report", str(out), "--optuna-journal", str(out / "optuna.log")]) == 2
        assert f"cannot write the Optuna journal {out / 'optuna.log'} ({error.strerror})" in last_error(capsys)


def _data():
    return load_data("recall", vocab_size=16, seq_len=16, num_pairs=2, num_queries=2, train_examples=64,
                     eval_examples=16)


@pytest.mark.parametrize("call, error, says", [
    (lambda: AttentionGene.vanilla().mutate(0.3, rng=5), TypeError, "rng must be a random.Random"),
    (lambda: AttentionGene.random(space="big"), TypeError, "space must be a SearchSpace"),
    (lambda: TinyTransformer("cfg", AttentionGene.vanilla()), TypeError, "spec must be a ModelSpec or a Config"),
    (lambda: TinyTransformer(CFG, AttentionGene.vanilla())(torch.rand(2, 8)), TypeError, "ids must be integer"),
    (lambda: TinyTransformer(CFG, AttentionGene.vanilla())(torch.full((2, 8), 99)), ValueError,
     r"ids must be token ids in \[0, 16\)"),
    (lambda: TinyTransformer(CFG, "dot|sparsemax|none|fixed")(torch.zeros(2, 0, dtype=torch.long)), ValueError,
     r"ids of shape \(2, 0\) hold no positions"),  # one answer for every gene (sparsemax's was torch's)
    (lambda: EvolvedAttention(32, 4, AttentionGene.vanilla())(torch.randn(2, 32)), ValueError, "x must be"),
    (lambda: EvolvedAttention(32, 4, AttentionGene.vanilla())(torch.randn(2, 8, 16)), ValueError, "d_model=32"),
    (lambda: EvolvedAttention(32, 4, AttentionGene.vanilla())(torch.ones(2, 8, 32, dtype=torch.long)), ValueError,
     "x must be floating-point"),
    (lambda: EvolvedAttention(32, 4, AttentionGene.vanilla())(torch.randn(2, 8, 32), mask=torch.ones(2, 8)), ValueError,
     r"mask must be a bool tensor .* not torch.float32 of shape \(2, 8\)"),
    (lambda: EvolvedAttention(32, 4, AttentionGene.vanilla())(torch.randn(2, 8, 32), mask=torch.ones(2, 3).bool()),
     ValueError, r"broadcastable to \[batch=2, heads=4, time=8, time=8\]"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), "cfg", _data()), TypeError, "config must be a Config"),
    (lambda: train_and_evaluate(7, CFG, _data()), TypeError, "gene must be an AttentionGene"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), CFG, _data(), seed="1"), TypeError, "seed must be"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), CFG, _data(), steps=0), ValueError, "steps must be at"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), CFG, _data(), eval_split="train"), ValueError,
     "eval_split must be"),
    (lambda: run_fitness_check("cfg"), TypeError, "config must be a Config"),
    (lambda: run_fitness_check(CFG, "recall"), TypeError, "data must be a TaskData"),
    (lambda: run_fitness_check(CFG, None, evaluations=5), TypeError, "evaluations must be a list"),
    (lambda: run_fitness_check(CFG, None, lr_grid="1e-3"), TypeError, "lr_grid must be a list"),
    (lambda: load_suite(5), TypeError, "suite must be a shipped suite's name"),
    (lambda: register_normalization("zz_hostile")(5), TypeError, "decorates a class or function"),
])
def test_the_front_door_names_the_argument(call, error, says):
    with pytest.raises(error, match=says):
        call()


def test_status_of_a_file_says_it_is_a_file(tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x")
    assert main(["status", str(tmp_path / "f.txt")]) == 2
    said = last_error(capsys)
    assert "is a file, not a run directory" in said and "search --out" not in said


def test_a_damaged_store_is_never_advised_deleted(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.db").write_bytes(random.Random(0).randbytes(5000))
    assert main(["search", *SEARCH, "--out", str(tmp_path / "run")]) == 2
    said = last_error(capsys)
    assert "cannot be opened as a run store" in said and "overwrite" not in said
    assert (tmp_path / "run" / "run.db").stat().st_size == 5000


def test_a_vocabulary_of_zero_and_a_program_space_of_no_ops_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["search", *SEARCH, "--vocab-size", "0", "--out", str(tmp_path / "a")])
    assert "vocab size '0' must be a positive integer (or 'full')" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"search_space": {"program": {"ops": []}}}))
    assert main(["search", *SEARCH, "--config", str(config), "--out", str(tmp_path / "b")]) == 2
    assert "lists no program ops (ops: [])" in last_error(capsys)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_overwrite_never_deletes_results_beside_a_store_it_cannot_read(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["validate", "--genes", "dot|sparsemax|none|fixed", *TINY, "--seeds", "2", "--out", str(out)]) == 0
    (out / "run.db").write_bytes(random.Random(1).randbytes(8192))
    for side in ("run.db-wal", "run.db-shm"):
        (out / side).unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["search", *SEARCH, "--out", str(out), "--overwrite"]) == 2
    assert "cannot be read beside validation.json" in last_error(capsys)
    assert (out / "validation.json").is_file() and (out / "run.db").stat().st_size == 8192


def test_a_baseline_never_replaces_another_trainings_result_or_leaves_its_model(tmp_path, capsys):
    out = tmp_path / "b"
    sparse = "dot|sparsemax|output_gate|learned"
    assert main(["baseline", *TINY, "--gene", sparse, "--save-model", "--out", str(out)]) == 0
    saved = (out / "model" / "config.json").read_text()
    assert main(["baseline", *TINY, "--gene", sparse, "--compile", "off", "--out", str(out)]) == 0  # the same again
    assert (out / "model" / "config.json").read_text() == saved
    for other in (["--gene", "dot|softmax|none|fixed"], ["--gene", sparse, "--seed", "5"],
                  ["--gene", sparse, "--lr", "1e-3"]):
        capsys.readouterr()
        assert main(["baseline", *TINY, *other, "--out", str(out)]) == 2
        assert "holds the result of another training" in last_error(capsys)
        assert json.loads((out / "result.json").read_text())["gene"].startswith(sparse)
    assert main(["baseline", *TINY, "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "result.json").read_text())["gene"].startswith("dot|softmax|none|fixed")
    assert not (out / "model").exists()  # the replaced result's model went with it


@pytest.mark.parametrize("value", ["5", "mymod", "{a: 1}"])
def test_plugins_in_a_config_file_must_be_a_list(tmp_path, capsys, value):
    config = tmp_path / "c.yaml"
    config.write_text(f"plugins: {value}\n")
    assert main(["search", *SEARCH, "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    assert "plugins must be a list of module names or .py files" in last_error(capsys)


def test_study_check_of_a_document_that_is_missing_or_a_folder_is_one_line(tmp_path, capsys):
    from pathlib import Path

    plan = Path(__file__).resolve().parents[1] / "docs" / "study-example.yaml"
    for doc in (tmp_path / "missing.md", tmp_path):
        assert main(["study", "check", str(plan), str(doc)]) == 2
        assert f"cannot read the document {doc}" in last_error(capsys)


def test_flags_a_saved_models_maps_and_export_do_not_use_are_said(tmp_path, capsys, recwarn):
    model = tmp_path / "b" / "model"
    assert main(["baseline", *TINY, "--save-model", "--out", str(tmp_path / "b")]) == 0
    assert main(["attention-maps", "--model", str(model), "--lr", "5", "--data", "recall", "--length", "999",
                 "--out", str(tmp_path / "maps"), "--quiet"]) == 0
    assert main(["attention-maps", "--model", str(model), "--text", "k1 k2", "--sample", "3",
                 "--out", str(tmp_path / "maps2"), "--quiet"]) == 0
    assert main(["export", "--model", str(model), "--lm-eval-split", "test", "--out", str(tmp_path / "ex")]) == 0
    said = [str(w.message) for w in recwarn]
    for flag in ("--lr", "--data"):
        assert f"{flag} is not used with --model (a saved model is drawn as it was trained, on its own data): " \
               "ignored" in said
    assert any(s.startswith("--length 999 is beyond the example's") for s in said)
    assert "--sample picks the validation example drawn without --text: ignored" in said
    assert any(s.startswith("--lm-eval-split names the split of an hf export's") for s in said)
    capsys.readouterr()
    assert main(["bench", "--gene", "dot|softmax|none|fixed", "--seq-lens", "32"]) == 2
    assert "--gene times one gene; long-context mode (--seq-lens)" in last_error(capsys)


def test_report_reads_every_run_before_it_writes_and_takes_each_run_once(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["search", *SEARCH, "--no-check", "--out", str(run)]) == 0
    (run / "report.md").unlink()
    assert main(["report", str(run), str(tmp_path / "nothing"), "--out", str(tmp_path / "cmp")]) == 2
    assert "no run in" in last_error(capsys)
    assert main(["report", str(run), str(tmp_path / "." / "run"), "--out", str(tmp_path / "cmp")]) == 2
    assert "names a run given before: give each run once" in last_error(capsys)
    assert not (run / "report.md").exists() and not (tmp_path / "cmp").exists()


def test_a_resumed_finished_run_names_its_kept_models_as_next(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["search", *TINY, "--population", "2", "--generations", "1", "--elite", "1", "--no-check",
                 "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["search", "--resume", "--out", str(run)]) == 0
    said = capsys.readouterr()
    said = said.out + said.err
    assert "kept 1 trained model" in said and f"export --from-run {run} --rank 1" in said
    assert "--keep-models K" not in said


def test_status_names_workers_only_while_a_process_writes_the_run(tmp_path):
    from evo_attention.report.status import format_status, run_status
    from evo_attention.search.lock import RunLock
    from evo_attention.search.store import RunStore

    run = tmp_path / "run"
    assert main(["search", *SEARCH, "--no-check", "--out", str(run)]) == 0
    with RunStore.open(run) as store:
        store.set_activity("local", "dot|softmax|none|fixed", 0, 3, None)
    assert "worker local" not in format_status(run_status(run))  # killed: its last activity is no training
    with RunLock(run):
        said = format_status(run_status(run))
    assert "  worker local: dot|softmax|none|fixed step 0/3" in said and "loss" not in said.split("worker local")[1]


def test_a_search_refused_before_its_store_leaves_no_directory(tmp_path, capsys):
    for flags in (["--start-from", "foo"], ["--init-from", str(tmp_path / "nothing")]):
        assert main(["search", *SEARCH, *flags, "--out", str(tmp_path / "new")]) == 2
        last_error(capsys)
        assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a directory the user made stays, even empty
    assert main(["search", *SEARCH, "--start-from", "foo", "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir()


@pytest.mark.parametrize("scale, words", [("log", "the relative change of perplexity in %"),
                                          ("linear", "the difference in accuracy")])
def test_the_ablation_page_says_the_paired_change_it_shows(scale, words):
    from evo_attention.report.studies.ablation import ablation_markdown

    label = "perplexity" if scale == "log" else "accuracy"
    row = {"scale": scale, "difference": 0.1, "relative": 0.1, "diff_ci_low": 0.0, "diff_ci_high": 0.2}
    text = ablation_markdown({"gene": "g", "str": "g", "seeds": [43, 44], "metric_label": label,
                              "variants": [{"name": "full gene", "gene": "g", "values": [1.0, 2.0], "vs_full": row}]})
    assert f"seed by seed: {words}" in text and "paired t interval" in text and "Welch" not in text


@pytest.mark.parametrize("call, error, says", [
    (lambda: AttentionGene("dot|softmax|none|fixed"), TypeError, r"a gene key .* is read by AttentionGene.parse"),
    (lambda: AttentionGene(5), TypeError, "gene_dict must be a mapping"),
    (lambda: AttentionGene(rng=5), TypeError, "rng must be a random.Random"),
    (lambda: __import__("evo_attention").Search({"d_model": 16}), TypeError, "config must be a Config"),
    (lambda: __import__("evo_attention").Search(CFG, data="recall"), TypeError, "data must be a TaskData"),
    (lambda: __import__("evo_attention").Search(CFG, executor="local"), TypeError, "executor must be an Executor"),
    (lambda: __import__("evo_attention").Search(CFG, out_dir=5), TypeError, "out_dir must be a directory path"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), CFG, _data(), seed=-1), ValueError, "seed must be a whole"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), CFG, _data(), progress=3), TypeError, "progress must be"),
    (lambda: run_fitness_check(CFG, None, improvements="dconv=3"), TypeError, "improvements must be a list"),
    (lambda: run_fitness_check(CFG, None, lr_grid=[1e-3]), ValueError, "lr_grid .* holds 1 distinct rate"),
    (lambda: run_fitness_check(CFG, None, seeds="2"), TypeError, "seeds must be a whole number of seeds"),
    (lambda: validate_genes(["dot|sparsemax|none|fixed"], CFG, _data(), n_seeds="2"), ValueError, "n_seeds '2' is not a number of seeds"),
])
def test_the_front_door_names_the_argument_too(call, error, says):
    with pytest.raises(error, match=says):
        call()


def test_one_bare_option_of_a_component_is_a_list_of_one():
    from evo_attention import SearchSpace

    assert SearchSpace(similarity="dot").options("similarity") == ["dot"]


@pytest.mark.parametrize("kwargs, says", [({"max_seq_len": -1}, "max_seq_len must be a whole number >= 1"),
                                          ({"input_conv": -1}, "input_conv must be a whole number >= 0"),
                                          ({"input_conv": 20}, "input_conv 20 is not a convolution width")])
def test_an_attention_of_impossible_sizes_is_one_line(kwargs, says):
    with pytest.raises(UserError, match=says):
        EvolvedAttention(16, 2, "dot|softmax|none|fixed|abias=rel", **kwargs)


@pytest.mark.parametrize("strategy, flag", [("tpe", "--mutation-rate"), ("random", "--crossover-rate"),
                                            ("climb", "--mutation-rate")])
def test_a_breeding_rate_for_a_strategy_that_does_not_breed_is_refused(tmp_path, capsys, strategy, flag):
    if strategy == "tpe":
        pytest.importorskip("optuna")
    out = tmp_path / "run"
    assert main(["search", "--data", "recall", "--strategy", strategy, flag, "0.9", "--out", str(out), "--quiet"]) == 2
    said = last_error(capsys)
    assert f"{flag} is read only by the strategies ga, nsga2;" in said
    assert f"--strategy {strategy} does not use it" in said and not out.exists()


def test_the_climb_reads_no_elite(tmp_path, capsys):
    from evo_attention.search import strategy_from_config

    with pytest.raises(UserError, match="elite_size 2 must be smaller than population_size 2"):
        strategy_from_config(Config(population_size=2, elite_size=2))  # the GA keeps an elite
    climb = strategy_from_config(Config(population_size=2, elite_size=2, strategy="climb"))
    assert climb.batch_size(1) == 2 and climb.elite_places == 1
    with pytest.warns(UserWarning, match="--elite is read only by the strategies ga, random.*climb does not use it"):
        assert main(["search", *TINY, "--strategy", "climb", "--elite", "1", "--population", "2", "--generations",
                     "1", "--no-check", "--out", str(tmp_path / "run")]) == 0


def test_validate_says_which_of_its_flags_it_does_not_use(tmp_path, recwarn):
    gated = "dot|softmax|output_gate|fixed"
    assert main(["validate", "--genes", f"{gated},{gated}|bias|0.10", *TINY, "--seeds", "2", "--top", "3",
                 "--seed", "5", "--seed-block", "3", "--out", str(tmp_path / "v")]) == 0
    said = [str(w.message) for w in recwarn]
    assert "--top is used only without --genes (the best of the --from-run run): ignored" in said
    assert any(s.startswith("--genes names dot|softmax|output_gate|fixed|bias|0.10 more than once") for s in said)
    assert "--seed is not used with --seed-block (every seed comes from the block): ignored" in said
    result = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert len(result["genes"]) == 1


def test_a_command_leaves_no_flags_behind(tmp_path):
    from evo_attention.cli.common import SETTING_ORIGINS, given

    (tmp_path / "c.yaml").write_text("lr_schedule: constant\n")
    assert main(["baseline", *TINY, "--warmup-steps", "5", "--config", str(tmp_path / "c.yaml"),
                 "--out", str(tmp_path / "b")]) == 2  # read its flags and its file's settings, then refused
    # what runs after it in the process (the library, another command) does not read them
    assert not given("--warmup-steps") and "lr_schedule" not in SETTING_ORIGINS


SIMILARITY_PLUGIN = '''
from evo_attention import register_similarity
from evo_attention.nn.components import Similarity

@register_similarity("centered_dot_probe")
class Centered(Similarity):  # minus each row's mean over all keys: the future ones too
    def forward(self, q, k):
        s = q @ k.transpose(-2, -1)
        return s - s.mean(-1, keepdim=True)
'''
GATING_PLUGIN = '''
import torch, torch.nn as nn
from evo_attention import register_gating, register_temperature
from evo_attention.nn.components import Gating

@register_temperature("causal_temp_probe")
class Temperature(nn.Module):  # from each position's own input: causal, accepted
    def __init__(self, d_model, n_heads, d_head):
        super().__init__()
        self.proj = nn.Linear(d_model, n_heads)

    def forward(self, x):
        return 1 + torch.sigmoid(self.proj(x)).transpose(1, 2).unsqueeze(-1)

@register_gating("suffix_gate_probe")
class SuffixGate(Gating):  # a gate from the sum of the positions after t
    def __init__(self, d_model):
        super().__init__(d_model)
        self.gate = nn.Linear(d_model, d_model)

    def forward(self, x, y):
        return torch.sigmoid(self.gate(x.flip(1).cumsum(1).flip(1))) * y
'''


BARE_GATING_PLUGIN = '''
import torch.nn as nn
from evo_attention import register_gating

@register_gating("bare_gate_probe")
class Bare(nn.Module):  # no gate_input (the classic path calls forward only); the mean over every position
    def __init__(self, d_model):
        super().__init__()

    def forward(self, x, y):
        return y + x.mean(1, keepdim=True)
'''


@pytest.mark.parametrize("text, says", [(SIMILARITY_PLUGIN, "similarity 'centered_dot_probe' reads future positions"),
                                        (GATING_PLUGIN, "gating 'suffix_gate_probe' reads future positions"),
                                        (BARE_GATING_PLUGIN, "gating 'bare_gate_probe' reads future positions")])
def test_a_plugin_component_that_reads_the_future_is_refused(tmp_path, capsys, text, says):
    from evo_attention.nn import components

    plugin = tmp_path / "plugin.py"
    plugin.write_text(text)
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    try:
        assert main(["search", *TINY, "--generations", "1", "--plugin", str(plugin), "--out", str(tmp_path / "run")]) == 2
        assert says in last_error(capsys) and not (tmp_path / "run").exists()
        assert torch.equal(torch.random.get_rng_state(), before)  # the probe draws from its own generator
        if "suffix" in says:
            assert "causal_temp_probe" in components.TEMPERATURES  # registered before the gating was refused
    finally:
        components.unregister("temperature_mode", "causal_temp_probe")
        components.unregister("similarity", "centered_dot_probe")
        for name in ("suffix_gate_probe", "bare_gate_probe"):
            components.unregister("gating", name)


def test_a_path_no_file_system_call_can_use_is_one_line(tmp_path, capsys):
    long = str(tmp_path / ("n" * 300))  # a name over the 255 bytes a directory entry holds
    for command in (["search", "--out", long], ["status", long]):
        assert main(command) == 2
        assert "File name too long: give a shorter path" in last_error(capsys)


def test_printed_commands_quote_their_paths(tmp_path):
    import shlex

    from evo_attention.studies.evolution import end_of_run_lines

    run = tmp_path / "my runs" / "b"
    lines = end_of_run_lines(run, kept=1)
    assert f"validate --from-run {shlex.quote(str(run))} " in lines[1]
    assert shlex.split(lines[2].split("   #")[0])[-1] == str(run / "hf")  # pasted into a shell, one argument


def test_a_run_stopped_in_its_fresh_check_is_not_called_finished(tmp_path, monkeypatch, capsys):
    from evo_attention.report.attachments import CHECK_PENDING
    from evo_attention.report.status import run_status
    from evo_attention.search.store import RunStore
    from evo_attention.studies.evolution import CHECK_META, Evolution

    monkeypatch.setenv("EVO_ATTENTION_FRESH_CHECK", "on")
    out = tmp_path / "run"
    assert main(["search", *SEARCH, "--out", str(out)]) == 0
    assert run_status(out)["state"] == "finished"
    with RunStore.open(out) as store:  # as a Ctrl-C during the check leaves it
        store.set_meta(CHECK_PENDING, True)
    status = run_status(out)
    assert status["state"] == "interrupted in its fresh-seed check" and "--resume" in status["resume_command"]
    assert main(["report", str(out)]) == 0 and "its fresh-seed check was stopped" in (out / "report.md").read_text()
    with RunStore.open(out) as store:
        store.set_meta(CHECK_PENDING, True)
        config = Config.from_dict(store.config())
    capsys.readouterr()
    assert main(["search", "--resume", "--no-check", "--out", str(out), "--quiet"]) == 2  # the run keeps its check
    assert last_error(capsys) == (f"evo-attention: error: --no-check contradicts the run in {out} (it was started "
                                  "with a fresh-seed check): drop it to resume, or start a new run with --overwrite")
    with pytest.raises(UserError, match="check 0 differs from the 3 the run in .* started with: drop check"):
        Evolution(config, out_dir=out, resume=True, check=0, quiet=True)
    with RunStore.open(out, readonly=True) as store:
        assert store.get_meta(CHECK_META) == 3 and run_status(out)["state"] == "interrupted in its fresh-seed check"
    assert main(["search", "--resume", "--out", str(out), "--quiet"]) == 0  # the lock was let go
    assert run_status(out)["state"] == "finished" and (out / "fresh_check.json").is_file()


def test_a_task_option_that_is_a_setting_of_its_own_is_one_line():
    with pytest.raises(UserError, match="task option seq_len is a setting of its own"):
        Config(data="mqar", recall={"seq_len": 32})


@pytest.mark.parametrize("text", ["warmup: 0.1\n", "warmup_steps: 10\nlr_schedule: constant\n"])
def test_a_config_files_warmup_under_the_constant_schedule_is_refused_as_the_flags_are(text, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(text)
    assert main(["baseline", *TINY, "--lr-schedule", "constant", "--config", str(tmp_path / "c.yaml"),
                 "--out", str(tmp_path / "b")]) == 2
    assert "does not apply to --lr-schedule constant (it has no warm-up)" in last_error(capsys)
    assert not (tmp_path / "b").exists()


def test_train_and_evaluate_refuses_a_config_changed_after_construction_and_a_seed_out_of_range():
    import dataclasses

    for name, value, says in (("lr_schedule", "bogus", "unknown lr_schedule 'bogus'"),
                              ("learning_rate", -1.0, "learning_rate must be a positive number")):
        config = dataclasses.replace(CFG)
        setattr(config, name, value)
        with pytest.raises(UserError, match=says):
            train_and_evaluate(AttentionGene.vanilla(), config, _data())
    with pytest.raises(UserError, match=r"seed must be a whole number in 0..2\^63-1"):
        train_and_evaluate(AttentionGene.vanilla(), CFG, _data(), seed=2**64)


def test_a_zero_suite_accuracy_is_told_and_shown_as_zero_not_minus_zero():
    import math

    from evo_attention.search.base import Individual

    assert math.copysign(1.0, Individual(AttentionGene.vanilla(), 0.0).fitness) == 1.0


def test_a_file_name_holding_a_setting_is_not_made_its_flag():
    from evo_attention.cli.common import user_message

    error = UserError("plan plan.yaml: alpha 0.7 is refused; give another plan.", setting="plan")
    assert user_message(error) == "--plan plan.yaml: alpha 0.7 is refused; give another --plan."


@pytest.mark.parametrize("name, value", [("EVO_ATTENTION_THREADS", "of"), ("EVO_ATTENTION_SHARE_CORES", "disable"),
                                         ("EVO_ATTENTION_FRESH_CHECK", "disabled")])
def test_a_mistyped_switch_in_the_environment_is_refused_in_one_line(tmp_path, capsys, monkeypatch, name, value):
    from evo_attention.util import threads

    monkeypatch.setattr(threads, "_state", threads._state)  # restored after the test
    monkeypatch.setattr(threads, "_mode", threads._mode)
    monkeypatch.setenv(name, value)
    threads.configure()  # as importing evo_attention does
    assert main(["search", *SEARCH, "--out", str(tmp_path / "run")]) == 2
    assert f"{name}={value!r} is not a setting: use on or off" in last_error(capsys)
    if name == "EVO_ATTENTION_FRESH_CHECK":  # read before the store is made: the corrected command runs anew
        assert not (tmp_path / "run").exists()


def test_a_resume_command_names_the_executor_and_a_resume_on_workers_batches_as_the_run_did(tmp_path, recwarn):
    from evo_attention.report.status import run_status
    from evo_attention.search.store import RunStore

    run = tmp_path / "run"
    assert main(["search", *SEARCH, "--no-check", "--out", str(run)]) == 0
    assert main(["search", "--resume", "--workers", "2", "--cpus-per-trial", "1", "--quiet", "--out", str(run)]) == 0
    assert not any("batched with other trials" in str(w.message) for w in recwarn)  # a resume plans the same batches
    with RunStore.open(run) as store:
        store.set_meta("done", False)  # as if this session had been stopped
    assert run_status(run)["resume_command"].endswith(f"--out {run} --workers 2 --cpus-per-trial 1")


@pytest.mark.parametrize("command, flags, says", [
    ("validate", ["--genes", "dot|sparsemax|none|fixed", "--power", "0"], "--power must be a fraction"),
    ("validate", ["--genes", "dot|sparsemax|none|fixed", "--seeds", "auto"], "give --mde"),
    ("ablate", ["--gene", "dot|sparsemax|none|fixed", "--confidence", "2"], "--confidence 2.0 is outside"),
    ("ablate", ["--gene", "dot|sparsemax|none|fixed", "--margin", "0.7"], "--margin must be a fraction")])
def test_a_study_flag_is_refused_before_its_store_is_made(tmp_path, capsys, command, flags, says):
    assert main([command, *TINY, "--data", "recall", *flags, "--out", str(tmp_path / "out")]) == 2
    assert says in last_error(capsys) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, flags, says", [
    ("baseline", ["--data", "text", "--data-dir", "."], "has no train split"),
    ("baseline", ["--data", "recall", "--ffn", "32", "--matched-to", "dot|sparsemax|none|fixed"], "drop --ffn"),
    ("baseline", ["--data", "recall", "--workers", "0", "--lr-grid", "1e-3,2e-3"], "--workers must be"),
    ("fitness-check", ["--data", "recall", "--improvement", "0"], "improvement '0' is not a known one")])
def test_a_refused_baseline_or_fitness_check_leaves_no_directory(tmp_path, capsys, monkeypatch, command, flags, says):
    monkeypatch.chdir(tmp_path)  # --data-dir .: a directory without the splits
    assert main([command, *TINY, *flags, "--out", str(tmp_path / "out")]) == 2
    assert says in last_error(capsys) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, flag", [("baseline", "--preset"), ("baseline", "--config"),
                                           ("baseline", "--matched-to"), ("search", "--config"),
                                           ("validate", "--plan"), ("compare", "--from-run"), ("bench", "--genes")])
def test_an_empty_value_is_refused_not_taken_as_the_flag_not_given(tmp_path, capsys, command, flag):
    assert main([command, flag, "", "--out", str(tmp_path / "out")]) == 2
    assert last_error(capsys).startswith(f"evo-attention: error: {flag} is empty: give ")
    assert main(["status", ""]) == 2 and "run_dir is empty" in last_error(capsys)  # not a command to run on ''
    assert main(["report", str(tmp_path), ""]) == 2 and "run_dirs is empty" in last_error(capsys)  # one of a list
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["ablate", "transfer"])
def test_only_validate_offers_the_flags_of_seeds_auto(command, capsys):
    for flag, value in (("--mde", "nan"), ("--max-seeds", "-3")):
        with pytest.raises(SystemExit):
            main([command, "--genes" if command == "transfer" else "--gene", "dot|sparsemax|none|fixed", flag, value])
        assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_a_plugin_path_that_is_no_py_file_and_a_folder_that_is_no_run_are_named_so(tmp_path, capsys):
    from evo_attention.util.plugins import load_plugins

    (tmp_path / "notes").write_text("x=1\n")
    for path, says in ((tmp_path / "notes", "is not a .py file"), (tmp_path, "is a directory"),
                       (tmp_path / "none.py", "does not exist")):
        with pytest.raises(UserError, match=f"plugin file {path} {says}: give the path of a .py file"):
            load_plugins([str(path)])
    with pytest.raises(UserError, match="plugin file notes is not a .py file"):  # a bare name is a file too
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(tmp_path)
            load_plugins(["notes"])
    assert main(["export", "--from-run", str(tmp_path), "--out", str(tmp_path / "e")]) == 2
    assert f"{tmp_path} holds no run (no run.db)" in last_error(capsys)


def test_a_ray_resume_command_names_the_workers_that_sized_its_instance():
    """RayExecutor.describe had no workers: the resume command read ' --executor ray' and resumed on a Ray
    instance sized to every core."""
    pytest.importorskip("ray")
    from evo_attention.report.status import executor_flags
    from evo_attention.search.executors import make_executor

    assert executor_flags(make_executor("ray", workers=2).describe()) == " --executor ray --workers 2"
    executor = make_executor("ray", workers=3, cpus_per_trial=0.5)
    assert executor_flags(executor.describe()).endswith(" --workers 3 --cpus-per-trial 0.5") and executor.num_cpus == 2


def test_a_damaged_record_on_resume_advises_restoring_before_resuming(tmp_path, capsys):
    import sqlite3

    out = tmp_path / "run"
    assert main(["search", *SEARCH, "--no-check", "--out", str(out)]) == 0
    with sqlite3.connect(out / "run.db") as db:
        db.execute("UPDATE evaluations SET record = 'x' WHERE id = (SELECT MIN(id) FROM evaluations)")
    capsys.readouterr()
    assert main(["search", *SEARCH, "--no-check", "--out", str(out), "--resume"]) == 2
    said = last_error(capsys)
    assert "is not a record" in said and "restore a copy of the run directory, then resume with:" in said
    assert "; resume with" not in said
