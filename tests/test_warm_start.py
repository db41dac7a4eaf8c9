"""Warm start (init_from): the first generation holds an earlier run's best genes, genes outside the
new space are named and skipped, the run records where its genes came from, a resume replays the
same first generation, and TPE enqueues its warm genes as its first trials."""

import json
import shutil
import warnings
from pathlib import Path

import pytest

from tests.conftest import CountingExecutor

from evo_attention import AttentionGene, Config, Evolution
from evo_attention.cli import main
from evo_attention.report import load_run
from evo_attention.report.status import format_status, run_status
from evo_attention.search import make_strategy
from evo_attention.search.store import RunStore
from evo_attention.search.warm_start import outside_space, parse_init_from, ranked_genes, starting_genes
from evo_attention.util.errors import UserError

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, population_size=4, n_generations=2, elite_size=1,
            baseline=False)
TINY_FLAGS = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
              "--layers", "1", "--batch-size", "8", "--steps", "6", "--population", "4", "--generations", "2",
              "--elite", "1", "--quiet", "--no-baseline"]


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory):
    """A finished run to start from (random search: 4 + 3 genes)."""
    out = tmp_path_factory.mktemp("earlier") / "run"
    with Evolution(Config(**{**TINY, "strategy": "random"}), out_dir=out) as evo:
        evo.run()
    with RunStore.open(out, readonly=True) as store:
        ranked = ranked_genes(store, ["perplexity"])
    return out, ranked


def _first_generation(run_dir) -> list[str]:
    """The genes generation 0 asked, in asked order (its evaluations, by id)."""
    with RunStore.open(run_dir, readonly=True) as store:
        return [r["gene"] for r in store.evaluations(role="search") if r.get("generation") == 0]


def test_parse_and_rank():
    assert parse_init_from("runs/a:3") == ("runs/a", 3)
    assert parse_init_from("runs/a") == ("runs/a", None)
    assert parse_init_from("C:/runs/a") == ("C:/runs/a", None)


def test_a_raced_run_is_ranked_by_its_racing_bound(tmp_path):
    genes = [f"{s}|{n}|none|fixed|bias|0.00" for s, n in
             [("dot", "entmax15"), ("dot", "sparsemax"), ("cosine", "softmax"), ("additive", "softmax")]]
    raced = [{"gene": genes[0], "told": 9.0}, {"gene": genes[1], "told": 8.0}, {"gene": genes[2], "told": None}]
    with RunStore.create(tmp_path / "run", {"train_steps": 2}, {"racing": {"genes": raced}}) as store:
        for gene, ppl in zip(genes, [5.0, 6.0, 1.0, 7.0]):  # one-seed values: entmax15 and cosine look best
            store.record({"gene": gene, "seed": 0, "steps": 2, "data_fingerprint": "f", "context": "c", "status": "ok",
                          "val_perplexity": ppl}, generation=0)
        assert ranked_genes(store, ["perplexity"]) == [genes[3], genes[1], genes[0]]  # cosine failed a race seed


def test_a_seeded_start_from_a_run_names_start_from_and_shows_a_default_option(tmp_path):
    with RunStore.create(tmp_path / "run", {"train_steps": 2}) as store:
        store.record({"gene": "dot|softmax|none|fixed|bias|0.00|lr=0.03", "seed": 0, "steps": 2, "status": "ok",
                      "data_fingerprint": "f", "context": "c", "val_perplexity": 5.0}, generation=0)
    with pytest.warns(UserWarning, match=r"^start_from .*: skipping gene .*lr=0.03: learning_rate 0.03 is not an "
                                         r"option of this run's search space \(default\)$"):
        with pytest.raises(UserError, match="names no gene"):
            starting_genes(str(tmp_path / "run"), space=Config(**TINY).space(), population_size=2, vanilla="")


def test_the_first_generation_holds_the_earlier_runs_best_genes(earlier_run, tmp_path):
    source, ranked = earlier_run
    assert len(ranked) >= 3
    config = Config(**{**TINY, "init_from": f"{source}:3", "seed": 7})
    with Evolution(config, out_dir=tmp_path / "warm") as evo:
        evo.run()
    first = _first_generation(tmp_path / "warm")
    assert first[:3] == ranked[:3] and len(first) == config.population_size
    info = RunStore.open(tmp_path / "warm", readonly=True).get_meta("init_from")
    assert info == {"run": str(source), "k": 3, "genes": ranked[:3], "skipped": [], "available": len(ranked)}
    assert load_run(tmp_path / "warm").init_from == info
    assert "warm start from run" in format_status(run_status(tmp_path / "warm"))
    final = json.loads((tmp_path / "warm" / "final_results.json").read_text())
    assert final["init_from"]["genes"] == ranked[:3]
    assert "Warm start" in (tmp_path / "warm" / "report.md").read_text()
    # K defaults to the population size; a cold run of the same seed starts elsewhere
    with Evolution(Config(**{**TINY, "init_from": str(source)}), out_dir=tmp_path / "all") as evo:
        assert [g.key for g in evo.strategy.ask()] == ranked[:4]
    with pytest.warns(UserWarning, match=f"init_from {source}:6: 6 genes fit this run, and its population holds "
                                         "4: the best 4 are taken"):  # more than the population: said
        Evolution(Config(**{**TINY, "init_from": f"{source}:6"}), out_dir=tmp_path / "six").close()


def test_genes_outside_the_new_space_are_named_and_skipped(earlier_run, tmp_path):
    source, ranked = earlier_run
    # a space without the best gene's similarity: that gene (and any other using it) does not fit
    similarity = AttentionGene.parse(ranked[0]).similarity
    others = [s for s in ("dot", "cosine", "multiplicative", "additive") if s != similarity]
    config = Config(**{**TINY, "init_from": f"{source}:4", "search_space": {"similarity": others}})
    with pytest.warns(UserWarning) as caught:
        with Evolution(config, out_dir=tmp_path / "narrow") as evo:
            asked = [g.key for g in evo.strategy.ask()]
    lines = [str(w.message) for w in caught if "skipping gene" in str(w.message)]
    outside = [k for k in ranked[:4] if AttentionGene.parse(k).similarity == similarity]
    assert len(lines) == len(outside) >= 1
    for key, line in zip(outside, lines):
        assert key in line and f"similarity {similarity} is not an option" in line and "\n" not in line
    taken = [k for k in ranked[:4] if k not in outside]
    assert asked[: len(taken)] == taken and not set(asked) & set(outside)
    info = evo.init_from
    assert [s["gene"] for s in info["skipped"]] == outside and info["genes"] == taken


def test_a_genome_of_another_shape_is_skipped(earlier_run, tmp_path):
    source, ranked = earlier_run
    space = Config(**{**TINY, "genome": "per_layer", "n_layers": 2}).space()
    assert "per-layer genomes of 2 layers (one is its layers' genes joined by ' / ')" in outside_space(ranked[0], space)
    assert outside_space(f"{ranked[0]} / {ranked[0]}", space) is None
    assert "per-layer genome of 2 layers" in outside_space(f"{ranked[0]} / {ranked[0]}", Config(**TINY).space())
    three = " / ".join([AttentionGene.vanilla().key] * 3)
    assert "this run's genomes have 2" in outside_space(three, space)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Evolution(Config(**{**TINY, "genome": "per_layer", "n_layers": 2, "init_from": f"{source}:2"}),
                       out_dir=tmp_path / "layers") as evo:
            assert evo.init_from["genes"] == [] and len(evo.init_from["skipped"]) == 2
    assert sum("skipping gene" in str(w.message) for w in caught) == 2


def test_a_resume_replays_the_same_first_generation(earlier_run, tmp_path):
    source, ranked = earlier_run
    copy = tmp_path / "earlier"
    shutil.copytree(source, copy)
    config = Config(**{**TINY, "init_from": f"{copy}:2", "strategy": "nsga2"})
    with Evolution(config, out_dir=tmp_path / "full") as evo:
        evo.run()
    cut = CountingExecutor(stop_after=2)
    with Evolution(config, out_dir=tmp_path / "cut", executor=cut) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    shutil.rmtree(copy)  # the earlier run is gone meanwhile: the resumed run reads its genes from its own store
    resumed = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "cut", resume=True, executor=resumed) as evo:
        evo.run()
    assert not set(resumed.trained) & set(cut.trained)
    assert _first_generation(tmp_path / "cut") == _first_generation(tmp_path / "full")
    full = json.loads((tmp_path / "full" / "final_results.json").read_text())
    again = json.loads((tmp_path / "cut" / "final_results.json").read_text())
    for key in ("best_gene", "history", "top_5", "init_from"):
        assert full[key] == again[key], key


@pytest.mark.parametrize("name", ["ga", "random", "nsga2", "tpe"])
def test_every_strategy_starts_with_the_warm_genes(name):
    warm = [make_strategy("random", seed=s, population_size=1, n_generations=1, elite_size=0).ask()[0]
            for s in (11, 12)]
    strategy = make_strategy(name, population_size=4, n_generations=2, elite_size=1, seed=0)
    strategy.warm_start(warm + warm[:1])  # a repeat is dropped
    genes = strategy.ask()
    assert genes[:2] == warm and len({g.key for g in genes}) == 4
    if name == "tpe":  # enqueued: the study's first trials, asked with the warm genes' parameters
        trials = strategy.study.trials
        assert len(trials) == 2 and [strategy._params(g) for g in warm] == [
            {k: t.params[k] for k in strategy.distributions} for t in trials]
    strategy.tell([(g, 1.0 + i) for i, g in enumerate(genes)])
    assert len(strategy.ask()) == 3
    with pytest.raises(RuntimeError):
        strategy.warm_start(warm)


def test_init_from_on_the_command_line(earlier_run, tmp_path, capsys):
    source, ranked = earlier_run
    out = tmp_path / "run"
    assert main(["search", *TINY_FLAGS, "--init-from", f"{source}:2", "--out", str(out)]) == 0
    assert _first_generation(out)[:2] == ranked[:2]
    assert main(["status", str(out)]) == 0
    assert f"warm start from run {source}: its best 2 genes; 2 taken" in capsys.readouterr().out
    assert main(["search", *TINY_FLAGS, "--init-from", str(tmp_path / "nothing"), "--out", str(tmp_path / "b")]) == 2
    assert "--init-from" in capsys.readouterr().err and not (tmp_path / "b" / "run.db").exists()
    with pytest.raises(UserError, match="K must be a whole number"):
        Config(init_from=f"{source}:0")
