"""Hostile testing of 0.5 (issue: reliability 4): each case here was a traceback, a silent wrong
result or a misleading message there."""

import pytest
import torch

from evo_attention import AttentionGene, Config, EvolvedAttention, TinyTransformer, train_and_evaluate
from evo_attention.genes import canonical_program
from evo_attention.programs import ProgramError
from evo_attention.util.errors import UserError


@pytest.mark.parametrize("call, error, says", [
    (lambda: AttentionGene.vanilla().mutate("0.3"), TypeError, "mutation_rate must be a number"),
    (lambda: AttentionGene.vanilla().crossover("dot|softmax|none|fixed"), TypeError, "other must be an AttentionGene"),
    (lambda: TinyTransformer(Config(), 5), TypeError, "gene must be an AttentionGene"),
    (lambda: EvolvedAttention(32, 0, "dot|softmax|none|fixed"), UserError, "n_heads 0 must be a positive integer"),
    (lambda: EvolvedAttention(32.0, 4, "dot|softmax|none|fixed"), TypeError, "d_model must be a positive integer"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), Config(data="recall"), "recall"), TypeError,
     "data must be a TaskData"),
])
def test_the_python_api_checks_its_arguments_at_the_front_door(call, error, says):
    with pytest.raises(error, match=says):
        call()


def test_a_model_refuses_ids_without_a_batch_dimension():
    model = TinyTransformer(Config(d_model=16, n_heads=2, n_layers=1, vocab_size=50, max_seq_len=12), "dot|softmax|none|fixed")
    with pytest.raises(UserError, match=r"shape \[batch, time\], not of shape \(5,\)"):
        model(torch.randint(0, 50, (5,)))


@pytest.mark.parametrize("text, says", [
    ("o(" + "neg(" * 300 + "v" + ")" * 301, "nested 301 deep"),
    ("o(add(v,1e400))", "constant '1e400'"),
    ("o(add(v,0x10))", "constant '0x10'"),
])
def test_program_text_is_refused_in_one_line_naming_what_is_wrong(text, says):
    with pytest.raises(ProgramError, match=says):
        canonical_program(text)


def test_gene_fields_are_refused_in_the_users_words():
    with pytest.raises(UserError, match="program False must be a program's text"):
        AttentionGene(program=False)
    with pytest.raises(UserError, match=r"dconv=5 is not a convolution width"):
        AttentionGene.parse("dot|softmax|none|fixed|dconv=5")


def test_search_overwrite_never_deletes_another_commands_store(tmp_path, capsys):
    """0.5: `validate --out D` then `search --out D --overwrite` exited 0 and deleted the validation's
    trainings; a search's --overwrite now replaces only a search's store, and says what it deletes."""
    import sqlite3

    from conftest import STUDY_FLAGS
    from evo_attention.cli import main

    out = tmp_path / "d"
    assert main(["validate", "--genes", "dot|softmax|output_gate|fixed", "--seeds", "2", *STUDY_FLAGS,
                 "--out", str(out)]) == 0
    with sqlite3.connect(out / "run.db") as conn:
        before = conn.execute("SELECT count(*) FROM evaluations").fetchone()[0]
    search = ["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
              "--elite", "1", "--d-model", "16", "--heads", "2", "--layers", "1", "--quiet"]
    capsys.readouterr()
    assert main([*search, "--out", str(out), "--overwrite"]) != 0
    err = capsys.readouterr().err
    assert "holds the store of a validate, not of a search" in err and "--resume" not in err
    with sqlite3.connect(out / "run.db") as conn:
        assert conn.execute("SELECT count(*) FROM evaluations").fetchone()[0] == before > 0
    run = tmp_path / "run"
    assert main([*search, "--out", str(run)]) == 0
    with pytest.warns(UserWarning, match=r"overwrite: the search in .* \(\d+ trainings\) is deleted"):
        assert main([*search, "--out", str(run), "--overwrite"]) == 0


def test_init_from_carries_program_genes_and_classic_genes_into_a_program_search(tmp_path):
    """0.5 skipped every program gene of a program run ('not an option of this run's search space'),
    so the warm start did nothing; a classic run's genes now enter a program search as their programs."""
    from evo_attention import Evolution
    from evo_attention.search.store import RunStore

    tiny = dict(data="recall", vocab_size=16, max_seq_len=16, recall={"num_pairs": 2, "train_examples": 64,
                                                                     "eval_examples": 16},
                d_model=16, n_heads=2, n_layers=1, train_steps=2, batch_size=4, eval_batch_size=16,
                population_size=3, n_generations=1, elite_size=1)
    programs_space = {"program": {"max_nodes": 8}}
    with Evolution(Config(**tiny, search_space=programs_space), out_dir=tmp_path / "a") as evo:
        evo.run()
    with Evolution(Config(**tiny), out_dir=tmp_path / "c") as evo:  # a classic run
        evo.run()
    for source in ("a", "c"):
        with Evolution(Config(**tiny, search_space=programs_space, init_from=f"{tmp_path / source}:2"),
                       out_dir=tmp_path / f"from-{source}") as evo:
            evo.run()
        with RunStore.open(tmp_path / f"from-{source}", readonly=True) as store:
            start = store.get_meta("init_from")
        assert len(start["genes"]) == 2 and not start["skipped"], (source, start)
        assert all("prog=" in key for key in start["genes"])


def test_an_export_never_goes_into_another_formats_directory_or_a_runs_own(tmp_path, capsys):
    """0.5 wrote hf over standalone (and the reverse) and into a run's models/ without a word."""
    from evo_attention.cli import main

    run = tmp_path / "run"
    assert main(["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
                 "--elite", "1", "--d-model", "16", "--heads", "2", "--layers", "1", "--quiet", "--out", str(run)]) == 0
    assert (run / "models").is_dir()  # the quick preset keeps its winner
    export = ["export", "--from-run", str(run), "--rank", "1"]
    assert main([*export, "--out", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    for fmt, target, says in (("hf", tmp_path / "s", "holds an attention export, not a transformers export"),
                              ("hf-attention", tmp_path / "s", "not a transformers attention export"),
                              ("standalone", run / "models", "is the models directory of the run")):
        assert main([*export, "--format", fmt, "--out", str(target)]) != 0
        assert says in capsys.readouterr().err, fmt
    assert main([*export, "--format", "hf-attention", "--out", str(tmp_path / "a")]) == 0
    assert main([*export, "--out", str(tmp_path / "a")]) != 0
    assert "holds a transformers attention export" in capsys.readouterr().err


def test_a_directory_given_for_a_file_is_named_in_plain_words(tmp_path):
    from evo_attention.report.optuna import journal_path

    with pytest.raises(UserError) as error:
        journal_path(tmp_path)
    assert "the file to write (an Optuna journal)" in str(error.value) and "the an" not in str(error.value)


def test_a_vocabulary_set_by_the_data_is_blamed_on_the_data_not_the_preset():
    """0.5: `--preset quick --data mqar:vocab=99999999` blamed 'vocab_size is set in preset quick'."""
    import torch

    from evo_attention.nn.spec import ModelSpec
    from evo_attention.train.trainer import check_training_memory

    spec = ModelSpec(vocab_size=99_999_999, d_model=64, n_heads=4, n_layers=2, max_seq_len=32)
    with pytest.raises(UserError) as error:
        check_training_memory(spec, "dot|softmax|none|fixed", 1, torch.device("cpu"), "mqar:vocab=99999999")
    assert "vocab knob of data mqar:vocab=99999999" in str(error.value) and error.value.settings == ("data", "d_model")


def test_a_new_search_never_starts_beside_another_commands_results(tmp_path, capsys):
    """A hostile rerun found `validate --from-run RUN --out D` then `search --out D --overwrite` mixing
    a search into D beside the validation's files (its trainings live in RUN's store)."""
    from evo_attention.cli import main

    search = ["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
              "--elite", "1", "--d-model", "16", "--heads", "2", "--layers", "1", "--quiet"]
    assert main([*search, "--out", str(tmp_path / "run")]) == 0
    out = tmp_path / "d"
    assert main(["validate", "--from-run", str(tmp_path / "run"), "--genes", "dot|softmax|output_gate|fixed",
                 "--seeds", "2", "--steps", "2", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*search, "--out", str(out), "--overwrite"]) != 0
    assert "holds validation.json, the result of another command" in capsys.readouterr().err
    assert not (out / "run.db").exists()


def test_a_model_too_large_for_memory_is_refused_before_its_task_is_generated(tmp_path, capsys, monkeypatch):
    """0.5: a 10^7-symbol task was generated for minutes before the training's memory check refused the model."""
    from evo_attention.cli import main
    from evo_attention.data import synthetic
    from evo_attention.train import trainer

    monkeypatch.setattr(trainer, "available_memory_mb", lambda device: 8 * 1024)  # the data (4.5 GB) would fit
    monkeypatch.setattr(synthetic.SyntheticData, "__init__", lambda *a, **k: pytest.fail("the task was generated"))
    assert main(["search", "--preset", "quick", "--data", "mqar:vocab=30000000", "--steps", "3", "--population", "2",
                 "--generations", "1", "--elite", "1", "--no-check", "--out", str(tmp_path / "run")]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "training a model of 1,920,102,144 parameters needs about 28.6 GB" in said and "vocab knob" in said
