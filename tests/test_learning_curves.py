"""Learning curves are never empty: the log interval adapts to a short budget, every point gets a
marker, and a few validation-loss points join the record, the figure and the trackers."""

from unittest import mock

from evo_attention import Config
from evo_attention.train.spec import load_task
from evo_attention.train.trainer import MIN_CURVE_POINTS, log_interval, train_and_evaluate, validation_steps

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=16, eval_steps=None,
            learning_rate=3e-3, seed=7)


def test_the_log_interval_adapts_to_the_budget():
    assert log_interval(50, 400) == 50  # long enough: as configured
    assert log_interval(50, 20) == 6 and log_interval(50, 3) == 1 and log_interval(10, 30) == 10  # short: at least MIN_CURVE_POINTS points
    assert validation_steps(20) == {5, 10, 15} and validation_steps(1) == set()


def test_a_training_shorter_than_the_log_interval_has_a_curve_and_validation_points():
    config = Config(**TINY, train_steps=12, log_every=50)
    record = train_and_evaluate("dot|softmax|none|fixed|bias|0.00", config, load_task(config.task))
    assert record.ok and len(record.curve) >= MIN_CURVE_POINTS  # it was one point (at step 12)
    assert [s for s, _ in record.val_curve] == [3, 6, 9, 12]
    assert record.val_curve[-1][1] == record.val_loss
    assert record.to_dict()["val_curve"] == record.val_curve


def test_the_figure_draws_markers_and_the_validation_points(tmp_path):
    from evo_attention.report import load_run
    from evo_attention.report import figures
    from evo_attention.search.store import RunStore

    with RunStore.create(tmp_path / "run", {"seed": 1}) as store:
        for i, gene in enumerate(["dot|softmax|none|fixed|bias|0.10", "dot|sparsemax|none|fixed|bias|0.10"]):
            store.record({"gene": gene, "seed": 1, "steps": 4, "data_fingerprint": "f", "context": "c",
                          "status": "ok", "val_perplexity": 5.0 - i, "val_loss": 1.0, "curve": [[4, 2.0]],
                          "val_curve": [[2, 2.4], [4, 2.2]]},
                         role="baseline" if i == 0 else "search", generation=None if i == 0 else 0)
    seen = {}

    def keep(fig, path):
        seen["axes"] = fig.axes[0]
        return original(fig, path)

    original = figures.save_figure
    with mock.patch.object(figures, "save_figure", keep):
        figures.plot_learning_curves(load_run(tmp_path / "run"), tmp_path / "curves.png")
    lines = [line for line in seen["axes"].get_lines() if len(line.get_xdata())]
    assert lines and all(line.get_marker() not in (None, "None", "") for line in lines)  # a one-point curve shows
    assert sum(1 for line in lines if list(line.get_xdata()) == [2, 4]) == 2  # both validation curves
