"""evo-attention curve: accuracy against a knob of a generated task, per gene, with seeds."""

import json

import pytest

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.report.attachments import CURVE_FIGURE, CURVE_RESULTS, CURVE_TABLE, load_attachments
from evo_attention.report.studies.curves import BREAK_MARK, curve_table
from evo_attention.search.executors import LocalExecutor
from evo_attention.search.store import RunStore
from evo_attention.studies.curves import first_break, parse_knob, plan_points, point_row, run_curve
from evo_attention.util import stats
from evo_attention.util.errors import UserError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DATA = "mqar:seq_len=16,vocab=16,train_examples=64,eval_examples=16"
TINY = {"data": DATA, "vocab_size": None, "max_seq_len": 16, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32,
        "dropout": 0.0, "batch_size": 4, "eval_batch_size": 16, "eval_steps": None, "train_steps": 3, "log_every": 1}
TINY_FLAGS = ["--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4",
              "--eval-batch-size", "16"]
WINDOWED = "dot|softmax|none|fixed|bias|0.10|win=4"


class CountingExecutor(LocalExecutor):
    def __init__(self):
        self.trained = []

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.trial.task.data, task.gene, task.seed))
            yield task, record


# -- the points: every check before anything trains ----------------------------------------------------
def test_points_set_the_knob_inline_and_keep_the_rest():
    task, points = plan_points(Config(**TINY), "pairs", [2, 4])
    assert task == "mqar" and [p.value for p in points] == [2, 4]
    assert points[0].data == "mqar:eval_examples=16,pairs=2,seq_len=16,train_examples=64,vocab=16"
    assert points[1].knobs["pairs"] == 4 and points[1].knobs["queries"] == 4 and points[1].knobs["vocab"] == 16
    assert points[0].chance_accuracy == pytest.approx(1 / 8)
    # the values as text (the command line's) and a float knob
    assert [p.value for p in plan_points(Config(**TINY), "pairs", "2, 4")[1]] == [2, 4]
    noisy = Config(**{**TINY, "data": "mad:noisy_recall:seq_len=32"})
    assert [p.value for p in plan_points(noisy, "noise", ["0.1", "0.3"])[1]] == [0.1, 0.3]


@pytest.mark.parametrize("data, knob, values, words", [
    ("wikitext2", "pairs", [2, 4], "not a generated task"),
    (DATA, "pairz", [2, 4], "its knobs: seq_len, vocab, train_examples, eval_examples, pairs, queries, power, layout, filler"),
    (DATA, "seed", [1, 2], "its knobs:"),
    (DATA + ",pairs=2", "pairs", [2, 4], "also given in data"),
    (DATA, "pairs", ["2", "x"], "pairs=x: pairs must be an integer >= 1"),
    (DATA, "pairs", [2, 40], "pairs=40: mqar: vocab 16 has only 7 keys for pairs 40"),  # the task's own check
    (DATA, "pairs", [2], "at least 2"),
    (DATA, "pairs", [2, 4, 2], "gives 2 more than once"),
])
def test_bad_knobs_are_one_line_errors(data, knob, values, words):
    config = Config(**{**TINY, "data": data, "vocab_size": 16 if data == "wikitext2" else None})
    with pytest.raises(UserError) as info:
        plan_points(config, knob, values)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert info.value.setting in ("knob", "data")


def test_a_knob_in_the_task_options_is_refused():
    with pytest.raises(UserError, match="also given in the task options"):
        plan_points(Config(**{**TINY, "recall": {"pairs": 2, "seed": 1}}), "pairs", [2, 4])
    assert len(plan_points(Config(**{**TINY, "recall": {"seed": 1}}), "pairs", [2, 4])[1]) == 2  # the data seed is not


def test_parse_knob():
    assert parse_knob("pairs=4,8, 16") == ("pairs", ["4", "8", "16"])
    for bad in ("pairs", "=4,8", "pairs=4,,8", "pairs="):
        with pytest.raises(UserError, match="is not NAME=V1,V2"):
            parse_knob(bad)


def test_cli_errors_are_one_line_and_train_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    base = ["curve", "--genes", "baseline", "--out", str(out)] + TINY_FLAGS
    cases = [(["--data", DATA, "--knob", "pairz=2,4"], "--knob 'pairz' is not one of mqar's; its knobs: seq_len"),
             (["--data", DATA + ",pairs=2", "--knob", "pairs=2,4"], "--knob pairs is also given in --data"),
             (["--data", DATA, "--knob", "pairs=2,40"], "--knob pairs=40: mqar: vocab 16 has only 7 keys"),
             (["--data", DATA, "--knob", "pairs=2,x"], "--knob pairs=x: pairs must be an integer >= 1"),
             (["--data", "recall", "--knob", "pairs=2,4"], "--data 'recall' is not a generated task"),
             (["--data", DATA, "--knob", "pairs=2,4", "--break-at", "1.5"], "--break-at must be an accuracy"),
             (["--data", DATA, "--knob", "pairs=2,4", "--genes", "nonesuch"], "unknown configuration 'nonesuch'")]
    for flags, words in cases:
        assert main(base + flags) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evo-attention: error: ") and words in err and "\n" not in err, err
    assert not out.exists()  # nothing was trained or written


# -- the breakpoint rule on synthetic numbers ---------------------------------------------------------------
def test_first_break():
    values = [4, 8, 16, 32]
    assert first_break(values, [0.95, 0.7, 0.4, 0.6], 0.5) == 16  # the first below, even if a later one recovers
    assert first_break(values, [0.95, None, 0.45, 0.2], 0.5) == 16  # a value without a mean is passed over
    assert first_break(values, [0.3, 0.9, 0.9, 0.9], 0.5) == 4
    assert first_break(values, [0.9, 0.8, 0.5, 0.51], 0.5) is None  # at the threshold is not below it
    assert first_break(values, [0.9, 0.8, 0.6, 0.4], 0.7) == 16
    assert first_break([32, 16, 8], [0.2, 0.6, 0.9], 0.5) == 32  # in the order given


def test_point_row_statistics():
    records = [{"status": "ok", "accuracy": a, "val_loss": 1.0 + a, "device": "cpu", "eval_tokens": 64,
                "eval_complete": False} for a in (0.6, 0.8, 0.7)]
    records.append({"status": "diverged", "accuracy": 0.9, "val_loss": float("nan"), "error": "diverged"})
    records.append(None)  # did not run
    row = point_row(8, records, [1, 2, 3, 4, 5], 0.95)
    ci = stats.describe([0.6, 0.8, 0.7])
    assert row["accuracy"] == [0.6, 0.8, 0.7, None, None] and row["n_ok"] == 3 and row["n_failed"] == 2
    assert row["mean"] == pytest.approx(0.7) and row["ci_low"] == pytest.approx(ci["ci_low"])
    assert row["half_width"] == pytest.approx((ci["ci_high"] - ci["ci_low"]) / 2)
    assert row["statuses"] == ["ok", "ok", "ok", "diverged", "not run"] and row["errors"] == ["diverged", "not run"]
    assert row["devices"] == ["cpu", "cpu", "cpu", None, None]  # where each seed trained, as its record says
    assert row["eval_tokens"] == [64, 64, 64, None, None] and row["eval_complete"] is False  # eval_steps cut it
    assert point_row(8, records[:1], [1], 0.95)["half_width"] is None  # one seed: no interval


def test_the_table_marks_where_each_gene_breaks():
    def row(value, mean, half=0.05, failed=0):
        return {"value": value, "mean": mean, "half_width": half, "n_ok": 3 - failed, "n_failed": failed}

    result = {"knob": "pairs", "values": [4, 8], "break_at": 0.5,
              "points": [{"value": 4, "chance_accuracy": 0.125}, {"value": 8, "chance_accuracy": 0.125}],
              "genes": [{"name": "a", "gene": "g1", "points": [row(4, 0.9), row(8, 0.3, failed=1)], "breaks_at": 8},
                        {"name": "b", "gene": "g2", "points": [row(4, 0.9), row(8, 0.8)], "breaks_at": None,
                         "holds": True},
                        {"name": "c", "gene": "g3", "points": [row(4, None, None, 3), row(8, 0.9)], "breaks_at": None,
                         "holds": False}]}
    headers, rows, align = curve_table(result)
    assert headers == ["Configuration", "Gene", "pairs=4", "pairs=8", "Breaks at (mean < 0.5)"]
    assert rows[0] == ["a", "g1", "0.900 ± 0.050", f"{BREAK_MARK} 0.300 ± 0.050 (2/3)", "pairs=8"]
    assert rows[1][-1] == "holds" and rows[2][2] == "failed" and rows[2][-1] == "-"
    assert rows[-1] == ["chance", None, "0.125", "0.125", ""] and len(align) == len(headers)


# -- running ------------------------------------------------------------------------------------------------
def test_a_curve_writes_its_files_and_a_repeat_trains_nothing(tmp_path):
    config = Config(**TINY)
    executor = CountingExecutor()
    first = run_curve(config, f"baseline,{WINDOWED}", "pairs", [2, 4], seeds=2, out_dir=tmp_path,
                      executor=executor, quiet=True)
    assert len(executor.trained) == 8 and {s for _, _, s in executor.trained} == {43, 44}  # seeds seed+1, seed+2
    assert {d for d, _, _ in executor.trained} == {p["data"] for p in first["points"]}
    for name in (CURVE_RESULTS, CURVE_TABLE, CURVE_FIGURE):
        assert (tmp_path / name).is_file()
    assert (tmp_path / CURVE_FIGURE).read_bytes().startswith(PNG_SIGNATURE)
    written = json.loads((tmp_path / CURVE_RESULTS).read_text())
    assert written == first.to_dict() and written["kind"] == "curve" and written["values"] == [2, 4]
    assert written["task"] == "mqar"  # the generated task's name
    assert [g["name"] for g in written["genes"]] == ["baseline", WINDOWED]
    for gene in written["genes"]:
        assert [r["value"] for r in gene["points"]] == [2, 4] and "breaks_at" in gene
        for row in gene["points"]:
            assert len(row["accuracy"]) == len(row["val_loss"]) == 2 and row["n_ok"] + row["n_failed"] == 2
            assert set(row) >= {"mean", "sd", "ci_low", "ci_high", "half_width", "statuses"}
    assert [p["chance_accuracy"] for p in written["points"]] == [p["description"]["chance_accuracy"]
                                                                 for p in written["points"]]
    assert "| Configuration | Gene | pairs=2 | pairs=4 |" in (tmp_path / CURVE_TABLE).read_text()
    with RunStore.open(tmp_path, readonly=True) as store:
        assert {r["role"] for r in store.evaluations()} == {"curve"} and len(store.evaluations()) == 8
    assert load_attachments(tmp_path).curves[0]["knob"] == "pairs"  # the report finds it

    executor.trained.clear()
    again = run_curve(config, f"baseline,{WINDOWED}", "pairs", [2, 4], seeds=2, out_dir=tmp_path,
                      executor=executor, quiet=True)
    assert executor.trained == []  # served from the store
    assert again["genes"] == first["genes"]

    # the same training elsewhere gives the same numbers: deterministic
    fresh = run_curve(config, "baseline", "pairs", [2, 4], seeds=1, out_dir=tmp_path / "fresh", quiet=True)
    assert [r["accuracy"][0] for r in fresh["genes"][0]["points"]] == \
        [r["accuracy"][0] for r in first["genes"][0]["points"]]


def test_the_command_runs_a_curve(tmp_path, capsys):
    out = tmp_path / "curve"
    assert main(["curve", "--genes", "baseline", "--data", DATA + ",pairs=2", "--knob", "queries=1,2",  # half the split
                 "--out", str(out), "--eval-steps", "1"] + TINY_FLAGS[:-1] + ["8"]) == 0
    written = json.loads((out / CURVE_RESULTS).read_text())
    partial = "Partial evaluation: eval_steps 1 cut the evaluation short"
    assert partial in capsys.readouterr().err and partial in (out / CURVE_TABLE).read_text()
    assert {p["eval_complete"] for p in written["genes"][0]["points"]} == {False}
    assert written["knob"] == "queries" and written["config"]["vocab_size"] is None  # the task's own vocabulary
    assert [p["knobs"]["queries"] for p in written["points"]] == [1, 2] and written["seeds"] == [43]


class InterruptedExecutor(LocalExecutor):
    """Trains one task, then stops as Ctrl-C would."""

    def run(self, tasks, **kw):
        for task, record in super().run(tasks[:1], **kw):
            yield task, record
        raise KeyboardInterrupt


def test_an_interrupted_curve_keeps_what_finished_and_resumes(tmp_path):
    config = Config(**TINY)
    with pytest.raises(KeyboardInterrupt):
        run_curve(config, "baseline", "pairs", [2, 4], seeds=1, out_dir=tmp_path, executor=InterruptedExecutor(),
                  quiet=True)
    written = json.loads((tmp_path / CURVE_RESULTS).read_text())
    points = written["genes"][0]["points"]
    assert written["interrupted"] and points[0]["statuses"] == ["ok"] and points[1]["statuses"] == ["interrupted"]
    assert "Interrupted" in (tmp_path / CURVE_TABLE).read_text()
    executor = CountingExecutor()
    resumed = run_curve(config, "baseline", "pairs", [2, 4], seeds=1, out_dir=tmp_path, executor=executor, quiet=True)
    assert [d for d, _, _ in executor.trained] == [resumed["points"][1]["data"]]  # only the one that had not finished
    assert "interrupted" not in resumed.to_dict()


# -- each gene at its best rate; no attention dropout on a generated task -----------------------------
def test_named_configurations_train_without_attention_dropout_on_a_generated_task():
    from evo_attention.studies.curves import gene_entries

    entries = dict(gene_entries(f"baseline,linear,{WINDOWED}", Config(**TINY)))
    assert entries["baseline"].attention_dropout == 0.0 and entries["linear"].attention_dropout == 0.0
    assert entries[WINDOWED].attention_dropout == 0.1  # a gene string is used as written: it asked for dropout
    text = dict(gene_entries("baseline", Config(**{**TINY, "data": "wikitext2"})))
    assert text["baseline"].attention_dropout == 0.1  # text keeps the named configuration's dropout


def test_a_curve_with_a_learning_rate_grid(tmp_path, capsys):
    class RateExecutor(CountingExecutor):
        rates = []

        def run(self, tasks, **kw):
            for task, record in super().run(tasks, **kw):
                self.rates.append((task.trial.task.data, task.gene, task.seed, task.trial.train.learning_rate))
                yield task, record

    config = Config(**TINY)
    executor = RateExecutor()
    run_curve(config, f"baseline,{WINDOWED}", "pairs", [2, 4], seeds=2, out_dir=tmp_path,
              executor=executor, quiet=True, lr_grid=[1e-3, 1e-2], n_tuning_seeds=1)
    tuning = [t for t in executor.trained if t[2] == 1043]  # seed + 1001: the one tuning seed
    assert len(tuning) == 2 * 2 * 2  # genes x rates x points
    assert len(executor.trained) == len(tuning) + 2 * 2 * 2  # and genes x seeds x points on the curve's seeds
    written = json.loads((tmp_path / CURVE_RESULTS).read_text())
    assert [g["value"] for g in written["grids"]] == [2, 4]
    for grid in written["grids"]:
        assert grid["rates"] == [1e-3, 1e-2] and grid["tuning_seeds"] == [1043] and grid["metric"] == "accuracy"
        assert grid["lower_is_better"] is False  # the best rate is the one of the highest accuracy
    for gene in written["genes"]:
        assert gene["lr"] == [written["grids"][i]["genes"][gene["gene"]]["selected"] for i in range(2)]
    with RunStore.open(tmp_path, readonly=True) as store:
        records = store.evaluations()
    assert {r["role"] for r in records} == {"curve", "lr-grid"}
    rate_of = {(d, g, s): r for d, g, s, r in executor.rates}
    for gene in written["genes"]:  # each curve training ran at its gene's rate at that point
        for i, point in enumerate(written["points"]):
            assert {rate_of[(point["data"], gene["gene"], s)] for s in (43, 44)} == {gene["lr"][i]}
    assert "## Learning rates" in (tmp_path / CURVE_TABLE).read_text()

    executor.trained.clear()  # a repeat trains nothing, the grid included
    run_curve(config, f"baseline,{WINDOWED}", "pairs", [2, 4], seeds=2, out_dir=tmp_path, executor=executor,
              quiet=True, lr_grid=[1e-3, 1e-2], n_tuning_seeds=1)
    assert executor.trained == []


def test_the_command_takes_a_grid_and_refuses_it_with_match_params(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["curve", "--genes", "baseline", "--data", DATA, "--knob", "pairs=2,4", "--lr-grid", "1e-3,1e-2",
                 "--tuning-seeds", "1", "--out", str(out)] + TINY_FLAGS) == 0
    assert "selected learning rates at pairs=2:" in capsys.readouterr().err
    assert main(["curve", "--genes", "baseline,linear", "--data", DATA, "--knob", "pairs=2,4", "--lr-grid",
                 "1e-3,1e-2", "--match-params", "--out", str(tmp_path / "m")] + TINY_FLAGS) == 2
    err = capsys.readouterr().err
    assert "match_params cannot be combined with lr_grid" in err or "--match-params" in err
    assert "Traceback" not in err
