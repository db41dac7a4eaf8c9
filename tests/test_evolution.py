"""The search driver: GA end to end, cache hits, failures, resume after interruption, the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CountingExecutor

from evo_attention import AttentionGene, Config, components
from evo_attention.cli import main
from evo_attention import Evolution, Individual
from evo_attention.search.store import RunStore
from evo_attention.util.errors import UserError
from evo_attention.report.status import format_status

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3,
            population_size=4, n_generations=3, elite_size=1)
TINY_FLAGS = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
              "--layers", "1", "--batch-size", "8", "--steps", "6", "--population", "4", "--generations", "3",
              "--elite", "1", "--quiet"]


def _final(run_dir):
    return json.loads((Path(run_dir) / "final_results.json").read_text())


def test_ga_search_end_to_end(tmp_path):
    config = Config(**TINY)
    executor = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "run", executor=executor) as evo:
        best = evo.run()
    # 4 + 2 x 3 fitness requests + the baseline; duplicates are trained once
    assert 1 < len(executor.trained) <= 4 + 2 * 3 + 1
    assert len(set(executor.trained)) == len(executor.trained)
    assert isinstance(best, Individual) and best is evo.population[0]
    assert [i.perplexity for i in evo.population] == sorted(i.perplexity for i in evo.population)
    assert best.fitness == -best.perplexity and len(evo.history) == 3
    assert evo.baseline.gene == AttentionGene.vanilla()
    for name in ["final_results.json", "evaluations.csv", "evolution_progress.png", "report.md",
                 "component_analysis.csv", "component_analysis.md"]:
        assert (tmp_path / "run" / name).is_file(), name
    final = _final(tmp_path / "run")
    assert final["best_gene"]["key"] == best.gene.key
    assert final["best_perplexity"] == pytest.approx(best.perplexity)
    assert {"best_gene", "best_perplexity", "best_generation", "history", "top_5"} <= set(final)
    # written by the search itself while it still holds the run's lock: the run is finished, not running
    assert "still writing" not in (tmp_path / "run" / "report.md").read_text()


def test_elites_are_not_retrained_and_duplicates_are_cache_hits(tmp_path):
    config = Config(**{**TINY, "n_generations": 4, "strategy_options": {}})
    executor = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "run", executor=executor) as evo:
        evo.run()
    store = RunStore.open(tmp_path / "run")
    assert len(store.evaluations()) == len(executor.trained)  # one training per distinct gene
    elites = {m["gene"] for g in store.generations()[1:] for m in g["members"] if m["is_elite"]}
    assert elites and all(executor.trained.count(k) == 1 for k in elites)


def test_resume_after_interruption_gives_the_uninterrupted_result(tmp_path):
    config = Config(**TINY)
    with Evolution(config, out_dir=tmp_path / "full") as evo:
        evo.run()
    interrupted = CountingExecutor(stop_after=4)
    with Evolution(config, out_dir=tmp_path / "cut", executor=interrupted) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    assert len(RunStore.open(tmp_path / "cut").evaluations()) == 4
    resumed = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "cut", resume=True, executor=resumed) as evo:
        evo.run()
    assert not set(resumed.trained) & set(interrupted.trained)  # nothing trained twice
    full, cut = _final(tmp_path / "full"), _final(tmp_path / "cut")
    for key in ["best_gene", "best_perplexity", "best_generation", "history", "top_5"]:
        assert full[key] == cut[key], key


def test_resume_after_sigkill_via_the_cli(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "evo_attention.cli", "search", *TINY_FLAGS, "--steps", "40", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            if RunStore.exists(out):
                try:
                    with RunStore.open(out, readonly=True) as store:
                        if len(store.evaluations()) >= 3:
                            break
                except UserError as exc:  # the search is still creating its store
                    assert "holds no run yet" in str(exc)
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    with RunStore.open(out, readonly=True) as store:
        before = len(store.evaluations())
        assert store.get_meta("done") is False
    assert 3 <= before
    assert main(["search", *TINY_FLAGS, "--steps", "40", "--out", str(out), "--resume"]) == 0
    assert main(["search", *TINY_FLAGS, "--steps", "40", "--out", str(tmp_path / "clean")]) == 0
    a, b = _final(out), _final(tmp_path / "clean")
    assert a["best_gene"] == b["best_gene"] and a["history"] == b["history"] and a["top_5"] == b["top_5"]


@pytest.fixture
def failing_normalization():
    @components.register_normalization("always_fails")
    def always_fails(scores, mask):
        raise RuntimeError("this component always fails")

    yield "always_fails"
    components.unregister("normalization", "always_fails")


def test_failed_evaluations_rank_last_and_the_search_goes_on(tmp_path, failing_normalization):
    config = Config(**{**TINY, "search_space": {"normalization": ["softmax", "always_fails"]}})
    with Evolution(config, out_dir=tmp_path / "run") as evo:
        evo.run()
    statuses = [i.status for i in evo.population]
    assert "error" in [e["status"] for e in RunStore.open(tmp_path / "run").evaluations()]
    assert statuses[0] == "ok"
    failed_at = [i for i, s in enumerate(statuses) if s != "ok"]
    assert all(i > statuses.index("ok") for i in failed_at)


def test_all_failed_run_says_so(tmp_path, failing_normalization, capsys):
    flags = [f for f in TINY_FLAGS]
    cfg = tmp_path / "space.yaml"
    cfg.write_text("search_space:\n  normalization: [always_fails]\n")
    code = main(["search", *flags, "--config", str(cfg), "--no-baseline", "--generations", "2",
                 "--out", str(tmp_path / "run")])
    assert code == 1
    assert "failed" in capsys.readouterr().err.lower()
    assert _final(tmp_path / "run")["best_gene"] is None


def test_seed_quick_start_snippet(wikitext_dir, tmp_path):
    from evo_attention import Config, Evolution
    from evo_attention.utils import get_dataloaders, set_seed

    config = Config(vocab_size=300, d_model=16, n_heads=2, n_layers=1, max_seq_len=16, batch_size=4,
                    eval_batch_size=32, train_steps=4, eval_steps=2, population_size=3, n_generations=2,
                    elite_size=1)
    set_seed(config.seed)
    train_loader, eval_loader = get_dataloaders(config.vocab_size, config.max_seq_len, config.batch_size,
                                                config.eval_batch_size, data_dir=str(wikitext_dir))
    evolution = Evolution(config, train_loader, eval_loader)
    best = evolution.run()
    print(f"Best: {best.gene}  perplexity {best.perplexity:.2f}")
    assert evolution.population[0] is best and len(evolution.history) == 2
    evolution.save_results(tmp_path / "results")
    evolution.plot_history(tmp_path / "results" / "history.png")
    assert (tmp_path / "results" / "final_results.json").is_file()
    assert (tmp_path / "results" / "history.png").stat().st_size > 1000
    evolution.save_checkpoint()
    first = [i.gene for i in evolution.population]
    evolution.load_checkpoint(0)
    assert len(evolution.history) == 1
    evolution.load_checkpoint(1)
    assert [i.gene for i in evolution.population] == first


def test_random_strategy_runs_with_the_same_budget(tmp_path):
    config = Config(**{**TINY, "strategy": "random", "baseline": False})
    executor = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "run", executor=executor) as evo:
        evo.run()
    assert len(executor.trained) == 4 + 2 * 3  # the GA's 10 fitness requests, no repeats


def test_status_command(tmp_path, capsys):
    assert main(["search", *TINY_FLAGS, "--generations", "1", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["status", str(tmp_path / "run"), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    for key in ["generation", "trained", "failed", "planned", "done", "best"]:
        assert key in status
    assert status["done"] is True and status["trained"] == status["planned"] == 5
    assert main(["status", str(tmp_path / "run")]) == 0
    text = capsys.readouterr().out
    assert "best" in text and "1 of 1 generations done; 5 trainings recorded (0 failed) of 5 planned" in text
    assert main(["report", str(tmp_path / "run")]) == 0


def test_status_says_when_earlier_trainings_answered_requests():
    status = {"run_dir": "r", "state": "done", "done": True, "generation": 3, "generations_done": 4,
              "generations": 4, "trained": 26, "failed": 0, "planned": 27, "cache_hits": 1, "best": None, "baseline": None,
              "fidelity": None, "executor": None, "workers": []}
    text = format_status(status)
    assert ("4 of 4 generations done; 26 trainings recorded (0 failed) for 27 planned evaluations "
            "(1 answered by an earlier training of the same gene)") in text
    status.update(state="interrupted", done=False, generations_done=2, cache_hits=None)
    assert "2 of 4 generations done; 26 trainings recorded (0 failed) of 27 planned" in format_status(status)


def test_status_of_a_study_store_names_the_study_and_no_search(tmp_path, capsys):
    # a study's store (curve, validate, ...) has no generations, no lock and no search to resume
    RunStore.create(tmp_path / "curve", config=Config(**TINY).to_dict(), meta={"study": "curve"}).close()
    assert main(["status", str(tmp_path / "curve")]) == 0
    text = capsys.readouterr().out
    assert "the store of a curve study" in text and "0 trainings recorded (0 failed)" in text
    assert "generations" not in text and "search --resume" not in text


@pytest.mark.parametrize("setup, flags, words", [
    (None, ["--resume"], "no run in"),
    ("run", [], "--resume"),
    ("run", ["--resume", "--steps", "99"], "--steps 99 contradicts"),
    ("run", ["--resume", "--overwrite"], "contradict"),
    (None, ["--strategy", "annealing"], "annealing"),
    (None, ["--population", "3", "--elite", "3"], "--elite 3 must be smaller than --population 3"),
])
def test_search_bad_input(tmp_path, capsys, setup, flags, words):
    out = tmp_path / "run"
    if setup:
        assert main(["search", *TINY_FLAGS, "--generations", "1", "--out", str(out)]) == 0
        capsys.readouterr()
    assert main(["search", *TINY_FLAGS, "--generations", "1", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def test_resume_with_no_changes_finishes_instantly(tmp_path):
    assert main(["search", *TINY_FLAGS, "--generations", "1", "--out", str(tmp_path / "run")]) == 0
    before = (tmp_path / "run" / "final_results.json").read_text()
    assert main(["search", "--resume", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert (tmp_path / "run" / "final_results.json").read_text() == before


@pytest.mark.parametrize("given", [("train",), ("eval",), ("train", "eval", "data")])
def test_a_loader_without_its_pair_or_beside_data_is_refused(given):
    loaders = {"train_loader": [] if "train" in given else None, "eval_loader": [] if "eval" in given else None}
    data = object() if "data" in given else None
    with pytest.raises(UserError, match=r"^Evolution was given .*: pass train_loader with eval_loader, or data= alone$"):
        Evolution(Config(**TINY), **loaders, data=data)
