"""Search strategies against an instant, deterministic fake fitness (no training)."""

import hashlib
import math
import statistics

import pytest

from evo_attention.util.errors import UserError
from evo_attention.genes import FIELDS, AttentionGene, SearchSpace
from evo_attention.train.config import Config
from evo_attention.search import (
    GeneticAlgorithm,
    Individual,
    RandomSearch,
    Strategy,
    make_strategy,
    rank_members,
    ranking_key,
)


def _score(salt, field, value):
    digest = hashlib.sha256(f"{salt}:{field}={value}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


def additive_fitness(salt=0):
    """A fake perplexity with structure: a sum of per-field scores (good parts combine)."""
    return lambda gene: 10.0 + sum(3.0 * _score(salt, f, getattr(gene, f)) for f in FIELDS)


def run(strategy, fitness):
    """Drive a strategy to the end; returns the list of asked batches (keys)."""
    batches = []
    while not strategy.done:
        genes = strategy.ask()
        batches.append([g.key for g in genes])
        strategy.tell([(g, fitness(g)) for g in genes])
    return batches


FIT = additive_fitness()


# -- ranking --------------------------------------------------------------------------------------
def test_ranking_puts_failures_last_and_breaks_ties_by_key():
    a, b, c, d = (AttentionGene.parse(k) for k in (
        "dot|softmax|none|fixed", "cosine|softmax|none|fixed", "dot|sigmoid|none|fixed", "additive|softmax|none|fixed"))
    results = [(a, float("nan")), (b, 5.0), (c, None), (d, 5.0), (a, float("inf"))]
    ranked = sorted(results, key=lambda r: ranking_key(*r))
    assert [g.key for g, _ in ranked[:2]] == sorted([b.key, d.key])
    assert {g.key for g, _ in ranked[2:]} == {a.key, c.key}
    members = rank_members([Individual(a, math.inf, 0), Individual(b, 7.0, 0), Individual(c, 3.0, 0)])
    assert [m.gene for m in members] == [c, b, a] and members[-1].failed


# -- genetic algorithm ----------------------------------------------------------------------------
def test_ga_counts_match_the_original_schedule():
    ga = GeneticAlgorithm(population_size=12, n_generations=10, elite_size=3, seed=0)
    assert ga.total_evaluations() == 93
    batches = run(ga, FIT)
    assert [len(b) for b in batches] == [12] + [9] * 9
    assert sum(map(len, batches)) == 93
    assert ga.done and ga.ask() == [] and ga.generation == 10
    assert len(ga.history) == 10 and len(ga.population) == 12
    with pytest.raises(RuntimeError):
        ga.tell([])


def test_generation_zero_is_distinct():
    ga = GeneticAlgorithm(population_size=30, seed=3)
    keys = [g.key for g in ga.ask()]
    assert len(set(keys)) == 30


def test_ask_is_idempotent_until_tell():
    ga = GeneticAlgorithm(seed=5)
    assert ga.ask() == ga.ask()


def test_elites_are_carried_with_their_fitness():
    ga = GeneticAlgorithm(seed=1)
    previous = None
    while not ga.done:
        genes = ga.ask()
        ga.tell([(g, FIT(g)) for g in genes])
        carried = [m for m in ga.population if m.is_elite]
        if previous is None:
            assert carried == []
        else:
            # the best 3 of the previous population, same fitness and birth generation, not retrained
            assert [(m.gene, m.perplexity, m.generation) for m in carried] == \
                   [(m.gene, m.perplexity, m.generation) for m in previous[:3]]
            assert len(ga.population) == 12 and ga.history[-1]["n_evaluated"] == 9
        previous = ga.population


def test_elites_are_never_reasked():
    # With dedupe no offspring reproduces an evaluated key, so an elite key showing up in a
    # later ask could only mean the elite itself was asked again.
    ga = GeneticAlgorithm(seed=2, dedupe=True)
    while not ga.done:
        elite_keys = {m.gene.key for m in ga.population[:3]} if ga.generation else set()
        genes = ga.ask()
        assert not elite_keys & {g.key for g in genes}
        ga.tell([(g, FIT(g)) for g in genes])


def test_best_so_far_never_gets_worse():
    for seed in range(4):
        ga = GeneticAlgorithm(seed=seed)
        run(ga, FIT)
        best = [h["best_perplexity"] for h in ga.history]
        assert all(b2 <= b1 for b1, b2 in zip(best, best[1:]))
        assert best[-1] == ga.best.perplexity == min(FIT(m.gene) for m in ga.population)
        assert ga.history[-1]["best_gene"] == ga.best.gene.key
        entry = ga.history[-1]
        assert set(entry) == {"generation", "best_perplexity", "mean_perplexity", "best_gene", "members", "n_evaluated"}
        assert entry["mean_perplexity"] == pytest.approx(statistics.mean(p for _, p in entry["members"]))


def test_seeded_determinism():
    assert run(GeneticAlgorithm(seed=11), FIT) == run(GeneticAlgorithm(seed=11), FIT)
    assert run(GeneticAlgorithm(seed=11), FIT) != run(GeneticAlgorithm(seed=12), FIT)


def test_tell_order_does_not_matter():
    a, b = GeneticAlgorithm(seed=4), GeneticAlgorithm(seed=4)
    while not a.done:
        genes = a.ask()
        assert genes == b.ask()
        results = [(g, FIT(g)) for g in genes]
        a.tell(results)
        b.tell({g.key: v for g, v in reversed(results)})
    assert a.history == b.history


def test_replay_from_stored_results_resumes_identically():
    original = GeneticAlgorithm(seed=9)
    stored = []  # what a run store would hold: one results list per told generation
    for _ in range(4):
        genes = original.ask()
        results = [(g.key, FIT(g)) for g in genes]
        stored.append(results)
        original.tell(results)
    next_batch = original.ask()

    fresh = GeneticAlgorithm(seed=9)
    for results in stored:
        fresh.ask()
        fresh.tell(results)
    assert fresh.ask() == next_batch
    assert fresh.population == original.population


def test_failed_genes_rank_last_without_crashing():
    def flaky(gene):
        return float("nan") if gene.normalization == "softmax" else (None if gene.gating == "highway" else FIT(gene))

    ga = GeneticAlgorithm(seed=6)
    run(ga, flaky)
    pop = ga.population
    failed = [m for m in pop if m.failed]
    assert all(math.isinf(m.perplexity) for m in failed)
    assert pop[len(pop) - len(failed):] == failed  # failures at the end
    assert not ga.best.failed


def test_all_failed_generation_still_breeds():
    ga = GeneticAlgorithm(seed=7, n_generations=3)
    batches = run(ga, lambda g: float("inf"))
    assert [len(b) for b in batches] == [12, 9, 9]
    assert math.isinf(ga.history[-1]["best_perplexity"]) and math.isnan(ga.history[-1]["mean_perplexity"])


def test_tell_must_cover_the_asked_genes():
    ga = GeneticAlgorithm(seed=0)
    genes = ga.ask()
    with pytest.raises(ValueError, match="missing"):
        ga.tell([(g, 1.0) for g in genes[:-1]])
    with pytest.raises(ValueError, match="not asked"):
        ga.tell([(g, 1.0) for g in genes] + [(AttentionGene.vanilla() if AttentionGene.vanilla() not in genes
                                              else AttentionGene.parse("cosine|sigmoid|highway|adaptive"), 1.0)])
    ga.tell([(g, 1.0) for g in genes])  # still usable after the rejected calls
    assert ga.generation == 1


def test_duplicate_offspring_are_asked_without_dedupe():
    # no mutation or crossover: every offspring copies one of 6 parents, so duplicates are certain
    ga = GeneticAlgorithm(seed=0, mutation_rate=0.0, crossover_rate=0.0)
    batches = run(ga, FIT)
    assert sum(map(len, batches)) == 93
    assert any(len(set(b)) < len(b) for b in batches[1:])


def test_dedupe_never_repeats_a_key():
    ga = GeneticAlgorithm(seed=0, dedupe=True)
    batches = run(ga, FIT)
    keys = [k for b in batches for k in b]
    assert len(keys) == 93 and len(set(keys)) == 93


def test_seed_vanilla():
    vanilla = AttentionGene.vanilla()
    plain = GeneticAlgorithm(seed=3).ask()
    seeded = GeneticAlgorithm(seed=3, seed_vanilla=True).ask()
    assert vanilla in seeded and len(seeded) == 12 and len(set(seeded)) == 12
    assert vanilla not in plain  # (for this seed) so exactly one random gene was replaced
    assert len(set(seeded) & set(plain)) == 11


def test_seed_vanilla_seeds_the_configs_vanilla_gene_the_baseline_trains():
    from evo_attention.search import strategy_from_config

    for data, dropout in (("mqar", 0.0), ("recall", 0.1)):  # a generated task's baseline has no attention dropout
        config = Config(data=data, strategy_options={"seed_vanilla": True})
        genes = strategy_from_config(config).ask()
        assert config.vanilla_gene() in genes and config.vanilla_gene().attention_dropout == dropout


def test_adaptive_mutation_schedule_decreases():
    ga = GeneticAlgorithm(mutation_schedule="adaptive", mutation_rate=0.1, mutation_rate_start=0.6, n_generations=10)
    rates = [ga.mutation_rate_at(g) for g in range(1, 10)]
    assert rates[0] == pytest.approx(0.6) and rates[-1] == pytest.approx(0.1)
    assert all(r2 < r1 for r1, r2 in zip(rates, rates[1:]))
    assert all(GeneticAlgorithm().mutation_rate_at(g) == 0.3 for g in range(10))
    run(ga, FIT)  # runs to the end with the schedule


def test_small_space_does_not_hang():
    space = SearchSpace(similarity=("dot",), normalization=("softmax",), gating=("none",),
                        temperature_mode=("fixed",), use_bias=(True,), attention_dropout=(0.0, 0.1))
    for strategy in (GeneticAlgorithm(space=space, dedupe=True, seed=0), RandomSearch(space=space, seed=0)):
        batches = run(strategy, FIT)
        assert sum(map(len, batches)) == 93
        assert len(set(batches[0])) == 2


def test_space_restricts_proposals():
    space = {"similarity": ["cosine"], "normalization": ["sparsemax", "sigmoid"]}
    ga = GeneticAlgorithm(space=space, seed=1)
    genes = [AttentionGene.parse(k) for b in run(ga, FIT) for k in b]
    assert {g.similarity for g in genes} == {"cosine"}
    assert {g.normalization for g in genes} <= {"sparsemax", "sigmoid"}


# -- random search --------------------------------------------------------------------------------
def test_random_search_budget_no_repeats_and_determinism():
    rs = RandomSearch(seed=0)
    batches = run(rs, FIT)
    assert [len(b) for b in batches] == [12] + [9] * 9
    assert rs.total_evaluations() == GeneticAlgorithm().total_evaluations() == 93
    keys = [k for b in batches for k in b]
    assert len(set(keys)) == 93
    assert len(rs.population) == 93 and rs.population[0].perplexity == min(FIT(AttentionGene.parse(k)) for k in keys)
    best = [h["best_perplexity"] for h in rs.history]
    assert all(b2 <= b1 for b1, b2 in zip(best, best[1:]))
    assert run(RandomSearch(seed=0), FIT) == batches
    assert run(RandomSearch(seed=1), FIT) != batches
    # same seed, same starting point as the GA
    assert batches[0] == run(GeneticAlgorithm(seed=0), FIT)[0]


def test_ga_beats_random_search_on_a_structured_fitness():
    # Additive fitness: the GA combines good parts. Averaged over 5 seeds it finds a better best
    # gene than random search with the same budget (deterministic: everything is seeded).
    for salt in (0, 1):
        fitness = additive_fitness(salt)
        ga_best = statistics.mean(run_best(GeneticAlgorithm(seed=s), fitness) for s in range(5))
        rs_best = statistics.mean(run_best(RandomSearch(seed=s), fitness) for s in range(5))
        assert ga_best < rs_best


def run_best(strategy, fitness):
    run(strategy, fitness)
    return strategy.best.perplexity


# -- construction ---------------------------------------------------------------------------------
def test_make_strategy():
    assert isinstance(make_strategy("ga", seed=1), GeneticAlgorithm)
    assert isinstance(make_strategy("random", population_size=4, elite_size=1), RandomSearch)
    assert isinstance(make_strategy("ga"), Strategy)
    # a strategy takes only its own settings: the GA's options are an error for random search
    with pytest.raises(UserError, match="unknown option 'dedupe' for strategy 'random'"):
        make_strategy("random", dedupe=True)


@pytest.mark.parametrize("name, options, fragment", [
    ("nsga", {}, "valid strategies are ga, random"),
    ("ga", {"elite_size": 12}, "elite_size 12"),
    ("ga", {"population_size": 0}, "population_size 0"),
    ("ga", {"n_generations": "ten"}, "n_generations 'ten'"),
    ("ga", {"mutation_rate": 1.5}, "mutation_rate 1.5"),
    ("ga", {"crossover_rate": -0.1}, "crossover_rate -0.1"),
    ("ga", {"mutation_schedule": "cosine"}, "valid schedules are constant, adaptive"),
    ("ga", {"tournament": 3}, "unknown option 'tournament'"),
    ("random", {"space": 7}, "space 7"),
])
def test_bad_input_is_a_one_line_user_error(name, options, fragment):
    with pytest.raises(UserError) as info:
        make_strategy(name, **options)
    message = str(info.value)
    assert fragment in message and "\n" not in message and ":" in message


def test_a_run_keeps_the_gene_seed_vanilla_seeded_when_it_was_made(tmp_path):
    import sqlite3

    from evo_attention.cli import main
    from evo_attention.search.driver import SEEDED, Search
    from evo_attention.search.store import RunStore

    run = tmp_path / "run"
    flags = ["--data", "mqar", "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2",
             "--batch-size", "4", "--eval-steps", "2", "--population", "3", "--generations", "1", "--elite", "1",
             "--seed-vanilla", "--no-baseline", "--no-check", "--quiet"]
    assert main(["search", *flags, "--out", str(run)]) == 0
    with RunStore.open(run, readonly=True) as store:
        config = Config.from_dict(store.config())
    with Search(config, out_dir=run, resume=True) as search:
        assert search.strategy.vanilla == config.vanilla_gene()  # without attention dropout on mqar
    with sqlite3.connect(run / "run.db") as db:  # a run made before the meta: it seeded the space's vanilla gene
        db.execute("DELETE FROM meta WHERE key = ?", (SEEDED,))
    with Search(config, out_dir=run, resume=True) as search:
        assert search.strategy.vanilla == AttentionGene.vanilla()


def test_a_plugin_strategys_member_helper_takes_its_elite_flag():
    """``Strategy._member`` (the helper docs/extending.md gives plugin strategies) keeps its third argument."""
    member = make_strategy("ga", seed=1)._member(AttentionGene(), 12.5, True)
    assert member.is_elite and member.perplexity == 12.5 and not make_strategy("ga", seed=1)._member(
        AttentionGene(), 12.5).is_elite
