"""The search's terminal view: at 80 columns the bars keep their count and ETA, the ETA counts only
trained evaluations (not replays from the store), and an interruption leaves one clean line."""

import io
import re

import pytest
from rich.console import Console

from evo_attention.util import progress

GENE = "cosine|sparsemax|output_gate|adaptive|nobias|0.05|pos=rope:ntk:4|rank=16|abias=rel|win=64"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _screen(out):
    return ANSI.sub("", out.getvalue()).replace("\r", "\n")


def test_the_bars_keep_count_and_eta_at_80_columns():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    with progress.SearchView(10, console=console) as view:
        view.set_best(GENE, 123.456)
        for i in range(3):
            view.start(f"gen {i}", GENE, 400, worker="local")
            view.step(150, 400, 2.25, worker="local")
            view.finished(f"gen {i}", GENE, {"status": "ok", "val_perplexity": 3.0}, False, i + 1, worker="local")
        view.start("gen 3", GENE, 400, worker="local")
        view.step(200, 400, 2.0, worker="local")
        out.truncate(0)
        out.seek(0)
        view._progress.refresh()
        lines = [line for line in _screen(out).splitlines() if line.strip()]
    assert lines and all(len(line) <= 80 for line in lines)
    search = next(line for line in lines if line.startswith("search"))
    assert "3/10" in search and re.search(r"ETA \d+s", search)  # the count and the ETA survive
    training = next(line for line in lines if line.startswith("gen 3"))
    assert "200/400" in training and "…" in training  # the long gene is cut, not the count


def test_the_eta_counts_trained_evaluations_only(monkeypatch):
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(clock)))
    view = progress.SearchView(10, enabled=False)
    for i in range(5):  # a resumed run: five replays from the store, instant
        view.finished("gen 0", GENE, {"status": "ok", "val_perplexity": 3.0}, True, i + 1)
    assert view.eta_text() == "ETA -"  # no training yet: no speed to read
    view.start("gen 1", GENE, 400)  # t = 10 (the first training starts)
    view.finished("gen 1", GENE, {"status": "ok", "val_perplexity": 3.0}, False, 6)
    assert view.eta_text() == "ETA 40s"  # (t 20 - 10) / 1 trained x 4 left; replays counted nothing


def test_an_interruption_leaves_one_clean_line():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    with pytest.raises(KeyboardInterrupt):
        with progress.SearchView(10, console=console) as view:
            view.start("gen 0", GENE, 400, worker="local")
            view.step(10, 400, 3.0, worker="local")
            view.finished("gen 0", GENE, {"status": "ok", "val_perplexity": 3.0}, False, 1, worker="local")
            raise KeyboardInterrupt
    text = ANSI.sub("", out.getvalue())
    assert text.count("interrupted at 1/10 evaluations") == 1
    assert text.rstrip().endswith("evaluations in 0s") or "interrupted at 1/10 evaluations" in text.splitlines()[-1]


TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=4, log_every=2, population_size=2, n_generations=1, elite_size=1,
            seed=7)


def test_the_python_api_says_where_it_writes_and_each_trial_unless_quiet(tmp_path, capsys, monkeypatch):
    from evo_attention import Config, Evolution

    monkeypatch.setattr(progress, "is_interactive", lambda: False)
    with Evolution(Config(**TINY), out_dir=tmp_path / "run") as evolution:
        evolution.run()
    err = capsys.readouterr().err
    assert f"run directory {tmp_path / 'run'}" in err
    assert err.count("] baseline ") == 1 and "[2/" in err and "ETA" in err  # a line per trial
    assert f"report: {tmp_path / 'run' / 'report.html'}" in err and (tmp_path / "run" / "report.html").is_file()
    assert f"evo-attention validate --from-run {tmp_path / 'run'}" in err
    with Evolution(Config(**TINY), out_dir=tmp_path / "quiet", quiet=True) as evolution:
        evolution.run()
    assert capsys.readouterr().err == ""


def test_the_cli_search_ends_with_the_report_and_the_next_commands(tmp_path, capsys, monkeypatch):
    from evo_attention.cli import main

    monkeypatch.setattr(progress, "is_interactive", lambda: False)
    run = tmp_path / "run"
    assert main(["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
                 "--elite", "1", "--keep-models", "1", "--out", str(run)]) == 0
    tail = capsys.readouterr().err.splitlines()[-4:]
    assert tail[0].startswith(f"report: {run / 'report.html'}")
    assert tail[1].startswith(f"next: evo-attention validate --from-run {run}")
    assert tail[2].startswith(f"next: evo-attention export --from-run {run} --rank 1 --format hf")
