"""Trackers: a search logged to TensorBoard and MLflow, read back with their own readers."""

import warnings

import pytest

from evo_attention.cli import main
from evo_attention.search.store import RunStore

FLAGS = ["--preset", "quick", "--steps", "4", "--population", "3", "--generations", "2", "--elite", "1",
         "--d-model", "16", "--heads", "2", "--layers", "1", "--quiet"]


def _stored(run):
    with RunStore.open(run, readonly=True) as store:
        return store.evaluations(), store.generations()


def test_tensorboard_gets_every_evaluation_curve_and_generation(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from evo_attention.search.trackers import run_directory

    run = tmp_path / "run"
    assert main(["search", *FLAGS, "--track", f"tensorboard:{tmp_path / 'tb'}", "--out", str(run)]) == 0
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    evaluations, generations = _stored(run)
    perplexities = [e.value for e in events.Scalars("evaluations/val_perplexity")]
    assert sorted(perplexities) == pytest.approx(sorted(r.val_perplexity for r in evaluations), rel=1e-6)
    assert [e.step for e in events.Scalars("search/best_so_far")] == [g["generation"] for g in generations]
    assert {"config/text_summary", "evaluations/gene/text_summary"} <= set(events.Tags()["tensors"])
    # one run directory per evaluation: its curves and its HParams row (the gene's parts as hparams)
    for index, record in enumerate(evaluations):
        trial = EventAccumulator(str(tmp_path / "tb" / run_directory(index, record.gene)),
                                 size_guidance={"scalars": 0, "tensors": 0})
        trial.Reload()
        assert [(e.step, e.value) for e in trial.Scalars("curve/train_loss")] == \
            [(s, pytest.approx(v, rel=1e-6)) for s, v in record.curve]
        assert [e.step for e in trial.Scalars("curve/val_loss")] == [s for s, _ in record.val_curve]
        content = trial.PluginTagToContent("hparams")
        start = next(plugin_data_pb2.HParamsPluginData.FromString(c).session_start_info for c in content.values()
                     if plugin_data_pb2.HParamsPluginData.FromString(c).HasField("session_start_info"))
        gene = record.gene.split("|")
        assert start.hparams["similarity"].string_value == gene[0] and start.hparams["role"].string_value == record.role
        assert trial.Scalars("final/val_perplexity")[0].value == pytest.approx(record.val_perplexity, rel=1e-6)


def test_mlflow_gets_a_run_with_a_child_per_evaluation(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    run = tmp_path / "run"
    assert main(["search", *FLAGS, "--track", "mlflow", "--out", str(run)]) == 0
    assert (run / "mlflow.db").is_file()  # the default store: SQLite in the run directory
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")  # read back with no extra settings
    experiment = client.get_experiment_by_name("evo-attention")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("evo_attention.role") == "search")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    evaluations, generations = _stored(run)
    assert parent.info.status == "FINISHED" and parent.data.params["population_size"] == "3"
    assert sorted(c.data.params["gene"] for c in children) == sorted(r.gene for r in evaluations)
    child = next(c for c in children if c.data.params["role"] == "baseline")
    baseline = next(r for r in evaluations if r.role == "baseline")
    parts = baseline.gene.split("|")
    assert (child.data.params["similarity"], child.data.params["normalization"], child.data.params["gating"]) == \
        tuple(parts[:3])
    assert child.data.metrics["val_perplexity"] == pytest.approx(baseline.val_perplexity)
    curve = client.get_metric_history(child.info.run_id, "curve_train_loss")
    assert [(m.step, m.value) for m in curve] == [tuple(p) for p in baseline.curve]
    val = client.get_metric_history(child.info.run_id, "curve_val_loss")
    assert [m.step for m in val] == [s for s, _ in baseline.val_curve]
    history = client.get_metric_history(parent.info.run_id, "best_so_far")
    assert [m.step for m in history] == [g["generation"] for g in generations]


def test_a_failing_tracker_is_reported_once_and_the_search_goes_on(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from evo_attention.search import trackers

    calls = []

    def broken(self, index, record):
        calls.append(index)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trackers.TensorBoardTracker, "log_evaluation", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["search", *FLAGS, "--track", "tensorboard", "--out", str(tmp_path / "run")]) == 0
    assert calls == [0]  # dropped after its first failure
    assert len([w for w in caught if "tracker tensorboard failed" in str(w.message)]) == 1
    assert len(_stored(tmp_path / "run")[0]) > 1


@pytest.mark.parametrize("spec, fragment", [("comet", "unknown tracker 'comet'"), ("wandb:somewhere", "takes no target")])
def test_bad_trackers_are_one_line_errors_before_training(spec, fragment, tmp_path, capsys):
    assert main(["search", *FLAGS, "--track", spec, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and not (tmp_path / "run" / "run.db").exists()


def test_a_missing_tracker_package_is_named(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert main(["search", *FLAGS, "--track", "mlflow", "--out", str(tmp_path / "run")]) == 2
    assert 'tracker mlflow needs the mlflow package' in capsys.readouterr().err


def test_a_down_mlflow_server_fails_the_tracker_after_few_retries_unless_the_user_chose(monkeypatch):
    pytest.importorskip("mlflow")
    import os

    from evo_attention.search import trackers

    seen = []

    class Down:
        def __init__(self, tracking_uri):
            seen.append(tuple(os.environ.get(f"MLFLOW_HTTP_REQUEST_{name}") for name in ("MAX_RETRIES", "TIMEOUT")))
            raise ConnectionError("refused")

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")  # the user's choice is kept
    tracker = trackers.make_tracker("mlflow:http://127.0.0.1:1", "run")
    monkeypatch.setattr(tracker.tracker, "_client_class", Down)
    with pytest.warns(UserWarning, match="tracker mlflow failed"):
        tracker.start("run", {})
    assert seen == [("2", "60")] and "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # for its own calls only


def test_a_resumed_search_continues_its_tracker_runs_without_logging_anything_twice(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, track = tmp_path / "run", ["--track", "mlflow", "--track", "tensorboard"]
    assert main(["search", *FLAGS, "--generations", "1", *track, "--out", str(run)]) == 0
    assert main(["search", "--resume", "--quiet", *track, "--out", str(run)]) == 0  # a replay from the store
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("evo-attention").experiment_id])
    evaluations, _ = _stored(run)
    assert [r.info.status for r in runs if r.data.tags.get("evo_attention.role") == "search"] == ["FINISHED"]
    assert len(runs) == 1 + len(evaluations)  # the parent and a child per evaluation, each once
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("evaluations/val_perplexity")] == list(range(len(evaluations)))
    # a destination new to the run gets the whole run; an MLflow store without the run's parent, a new one
    (run / "mlflow.db").unlink()
    elsewhere = ["--track", "mlflow", "--track", f"tensorboard:{tmp_path / 'tb2'}"]
    assert main(["search", "--resume", "--quiet", *elsewhere, "--out", str(run)]) == 0
    assert len(MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}").search_runs(
        [client.get_experiment_by_name("evo-attention").experiment_id])) == 1 + len(evaluations)
    events = EventAccumulator(str(tmp_path / "tb2"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("evaluations/val_perplexity")] == list(range(len(evaluations)))
