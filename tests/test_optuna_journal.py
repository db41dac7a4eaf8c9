"""report --optuna-journal: a run as an Optuna study in a journal file (for optuna-dashboard), read
back with optuna.load_study: every evaluation a trial, the genes as categorical parameters, the
objectives as values, failed and infeasible genes with their states and constraints."""

import math

import pytest

from evo_attention import Config, Evolution, components
from evo_attention.cli import main
from evo_attention.genes import OPT_IN, OPTIONS
from evo_attention.report.optuna import journal_storage, write_optuna_journal
from evo_attention.search.store import RunStore
from evo_attention.util.errors import UserError

optuna = pytest.importorskip("optuna")

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, population_size=4, n_generations=2, elite_size=1)


@pytest.fixture
def failing_normalization():
    @components.register_normalization("journal_fails")
    def journal_fails(scores, mask):
        raise RuntimeError("this component always fails")

    yield "journal_fails"
    components.unregister("normalization", "journal_fails")


def _load(path):
    return optuna.load_study(study_name=None, storage=journal_storage(path))


def test_the_journal_holds_every_evaluation(tmp_path, failing_normalization):
    config = Config(**TINY, objectives=["perplexity", "params"], max_params=3824,
                    search_space={"normalization": ["softmax", "entmax15", failing_normalization]})
    with Evolution(config, out_dir=tmp_path / "run") as evo:
        evo.run()
    with RunStore.open(tmp_path / "run", readonly=True) as store:
        evaluations = store.evaluations()
        refused = store.get_meta("infeasible") or []
    assert any(r["status"] != "ok" for r in evaluations) and refused  # failed and infeasible genes are in it
    written = write_optuna_journal(tmp_path / "run", tmp_path / "optuna.log")
    study = _load(tmp_path / "optuna.log")
    assert study.study_name == "run" and written["trials"] == len(study.trials) == len(evaluations) + len(refused)
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE] * 2
    assert study.metric_names == ["perplexity", "params"]
    by_id = {t.user_attrs.get("id"): t for t in study.trials}
    for record in evaluations:
        trial = by_id[record["id"]]
        assert trial.user_attrs["gene"] == record["gene"] and trial.user_attrs["role"] == record["role"]
        assert set(trial.params) >= {"similarity", "normalization", "gating", "temperature_mode"}
        assert trial.params["normalization"] == record["gene"].split("|")[1]
        if record["status"] != "ok":
            assert trial.state == optuna.trial.TrialState.FAIL and "fails" in trial.user_attrs["error"]
        else:
            assert trial.state == optuna.trial.TrialState.COMPLETE
            assert trial.values == [pytest.approx(record["val_perplexity"]), record["params"]]
            assert (max(trial.constraints.values()) > 0) == (record["params"] > 3824)
    # real times from the store (optuna-dashboard's durations and timeline), curves as intermediate values
    for record in evaluations:
        trial = by_id[record["id"]]
        assert trial.duration.total_seconds() == pytest.approx(record["time_s"], abs=1e-3) and record["time_s"] > 0
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert sorted(trial.intermediate_values) == [s for s, _ in record["val_curve"]]
            assert trial.intermediate_values[record["val_curve"][-1][0]] == pytest.approx(record["val_perplexity"])
    starts = sorted(t.datetime_start for t in study.trials if t.user_attrs.get("id") is not None)
    assert starts[0] < starts[-1]
    # the whole space's choices (not only those seen); axes the run never varied are left out
    distribution = study.trials[0].distributions
    assert distribution["normalization"].choices == ("softmax", "entmax15", failing_normalization)
    assert set(distribution["similarity"].choices) == set(OPTIONS["similarity"]) - set(OPT_IN["similarity"])
    assert "window" not in distribution and "kv_heads" not in distribution
    never = [t for t in study.trials if t.user_attrs.get("status") == "infeasible"]
    assert [t.user_attrs["gene"] for t in never] == [e["gene"] for e in refused]
    for trial in never:
        assert trial.state == optuna.trial.TrialState.FAIL and max(trial.constraints.values()) > 0
        assert trial.user_attrs["constraints"] == list(trial.constraints.values())
        assert trial.user_attrs["constraint_names"] == ["max_params"] and "max_params" in trial.user_attrs["error"]
    # written again, the file is replaced, not appended to
    write_optuna_journal(tmp_path / "run", tmp_path / "optuna.log")
    assert len(_load(tmp_path / "optuna.log").trials) == written["trials"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".optuna.log")]


def test_per_layer_genomes_have_a_parameter_per_layer_and_the_cli_writes_it(tmp_path, capsys):
    config = Config(**{**TINY, "genome": "per_layer", "n_layers": 2, "n_generations": 1})
    with Evolution(config, out_dir=tmp_path / "run") as evo:
        evo.run()
    journal = tmp_path / "dash" / "study.log"
    assert main(["report", str(tmp_path / "run"), "--optuna-journal", str(journal)]) == 0
    assert "optuna-dashboard" in capsys.readouterr().out
    study = _load(journal)
    n = len(RunStore.open(tmp_path / "run", readonly=True).evaluations())
    assert len(study.trials) == n
    search = [t for t in study.trials if t.user_attrs["role"] == "search"]
    for trial in search:
        layers = trial.user_attrs["gene"].split(" / ")
        assert trial.params["L1.similarity"] == layers[0].split("|")[0]
        assert trial.params["L2.similarity"] == layers[1].split("|")[0]
        assert math.isfinite(trial.values[0])
    assert main(["report", str(tmp_path / "run"), str(tmp_path / "run"), "--out", str(tmp_path / "x"),
                 "--optuna-journal", str(journal)]) == 2
    assert "one run directory" in capsys.readouterr().err
    with pytest.raises(UserError, match="is a directory"):
        write_optuna_journal(tmp_path / "run", tmp_path)


def test_each_role_is_a_study_of_its_own_and_a_read_only_run_still_gives_its_journal(tmp_path, capsys):
    """The search's study holds the search alone (its best trial is a search trial), a validation of
    the run is a study of its own, program genes carry no component parameters they do not use,
    and a read-only run gives its journal without rewriting its report."""
    config = Config(**{**TINY, "n_generations": 1, "search_space": {"program": {"max_nodes": 6}}})
    with Evolution(config, out_dir=tmp_path / "run") as evo:
        evo.run()
    from conftest import STUDY_FLAGS  # noqa: F401  (the study sizes used across the tests)

    gene = next(r["gene"] for r in RunStore.open(tmp_path / "run", readonly=True).evaluations()
                if r["role"] == "search" and r["status"] == "ok")
    assert main(["validate", "--from-run", str(tmp_path / "run"), "--genes", gene, "--seeds", "2", "--quiet"]) == 0
    written = write_optuna_journal(tmp_path / "run", tmp_path / "j.log")
    assert set(written["studies"]) == {"run", "run:validate"}
    storage = journal_storage(tmp_path / "j.log")
    search = optuna.load_study(study_name="run", storage=storage)
    assert {t.user_attrs["role"] for t in search.trials} <= {"search", "baseline"}
    assert all("similarity" not in t.params for t in search.trials if "prog=" in t.user_attrs["gene"])
    validate = optuna.load_study(study_name="run:validate", storage=storage)
    assert {t.user_attrs["role"] for t in validate.trials} == {"validate"}
    import os
    import stat

    mode = os.stat(tmp_path / "run").st_mode
    os.chmod(tmp_path / "run", stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(tmp_path / "run", os.W_OK):  # root writes anyway: nothing to test here
            return
        assert main(["report", str(tmp_path / "run"), "--optuna-journal", str(tmp_path / "j2.log")]) == 0
        assert "read-only" in capsys.readouterr().err and (tmp_path / "j2.log").exists()
    finally:
        os.chmod(tmp_path / "run", mode)


def test_without_optuna_the_journal_is_refused_before_any_file_and_never_suggested(tmp_path, capsys, monkeypatch):
    from evo_attention.studies.evolution import end_of_run_lines

    run = tmp_path / "run"
    with Evolution(Config(**{**TINY, "population_size": 2, "n_generations": 1}), out_dir=run, quiet=True,
                   report=False, check=0) as evo:
        evo.run()
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)  # as where Optuna is not installed
    assert main(["report", str(run), "--optuna-journal", str(tmp_path / "optuna.log")]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["evo-attention: error: --optuna-journal needs Optuna, which is not installed: pip install "
                    "'evo-attention[tpe]' (or pip install optuna)"]
    assert not (run / "report.md").exists() and not (tmp_path / "optuna.log").exists()
    assert not any("--optuna-journal" in line for line in end_of_run_lines(run))
