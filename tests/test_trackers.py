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

    run = tmp_path / "run"
    assert main(["search", *FLAGS, "--track", f"tensorboard:{tmp_path / 'tb'}", "--out", str(run)]) == 0
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    evaluations, generations = _stored(run)
    scalars = events.Tags()["scalars"]
    perplexities = [e.value for e in events.Scalars("evaluations/val_perplexity")]
    assert sorted(perplexities) == pytest.approx(sorted(r.val_perplexity for r in evaluations), rel=1e-6)
    assert len([t for t in scalars if t.startswith("curves/")]) == len(evaluations)
    assert [e.step for e in events.Scalars("search/best_so_far")] == [g["generation"] for g in generations]
    assert {"config/text_summary", "evaluations/gene/text_summary"} <= set(events.Tags()["tensors"])


def test_mlflow_gets_a_run_with_a_child_per_evaluation(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    store = tmp_path / "mlruns"
    assert main(["search", *FLAGS, "--track", f"mlflow:{store}", "--out", str(run)]) == 0
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("evo-attention")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("evo_attention.role") == "search")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    evaluations, generations = _stored(run)
    assert parent.info.status == "FINISHED" and parent.data.params["population_size"] == "3"
    assert sorted(c.data.tags["gene"] for c in children) == sorted(r.gene for r in evaluations)
    child = next(c for c in children if c.data.tags["role"] == "baseline")
    baseline = next(r for r in evaluations if r.role == "baseline")
    assert child.data.metrics["val_perplexity"] == pytest.approx(baseline.val_perplexity)
    curve = client.get_metric_history(child.info.run_id, "curve_train_loss")
    assert [(m.step, m.value) for m in curve] == [tuple(p) for p in baseline.curve]
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
