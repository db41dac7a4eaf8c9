"""A search that starts from what works: program edits that matter (programs.edit), seeded starts
(start_from), and the (1 + lambda) hill climb (strategy climb)."""

import dataclasses
import json
import random
from collections import Counter

import pytest

from tests.conftest import assert_resume_is_uninterrupted

from evo_attention import Evolution, programs
from evo_attention.cli import main
from evo_attention.genes import AttentionGene, SearchSpace, gene_label, program_grammar
from evo_attention.search import make_strategy
from evo_attention.search.base import neighbour
from evo_attention.search.warm_start import starting_genes
from evo_attention.train.config import Config
from evo_attention.util.errors import UserError

VANILLA_PROGRAM = "o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"
KEEPS_SOFTMAX = ("time", "gate", "qk", "temperature", "paths")  # edits that never replace the weighting


def vanilla():
    return programs.parse(VANILLA_PROGRAM, program_grammar())


def test_edits_of_vanilla_keep_softmax_over_a_dot_product_unless_they_replace_it():
    grammar, space, rng = program_grammar(), programs.ProgramSpace(), random.Random(0)
    kinds = Counter()
    for _ in range(300):
        kind, child = programs.edit(vanilla(), rng, space, grammar)
        kinds[kind] += 1
        assert child != vanilla() and programs.mixes_tokens(child, grammar)
        if kind in KEEPS_SOFTMAX:
            assert programs.FEATURES["softmax over a dot product"](child), (kind, child.text)
        if kind == "weighting":
            assert not any(n.op == "w.softmax" for n in child.nodes())
    assert set(kinds) >= set(KEEPS_SOFTMAX) | {"weighting"}
    assert kinds["time"] > kinds["weighting"]  # the default weights favour token mixing
    assert census_share([programs.mutate(vanilla(), rng, space, grammar) for _ in range(200)]) > 0.8


def census_share(drawn) -> float:
    return programs.census(drawn)["softmax over a dot product"]


def test_random_programs_rarely_hold_softmax_and_census_counts_them():
    grammar, space, rng = program_grammar(), programs.ProgramSpace(), random.Random(1)
    drawn = [programs.random_program(rng, space, grammar) for _ in range(100)]
    found = programs.census(drawn)
    assert found["n"] == 100 and found["softmax over a dot product"] < 0.05
    assert 0 < found["kernel form (kmix)"] < 1 and found["mean_op_nodes"] >= 1


def test_edit_weights_are_a_space_setting():
    grammar = program_grammar()
    only_time = programs.ProgramSpace.from_dict({"edits": {"time": 1}}, grammar)
    rng = random.Random(2)
    for _ in range(20):
        kind, child = programs.edit(vanilla(), rng, only_time, grammar)
        assert kind == "time" and any(n.op in programs.TIME_OPS for n in child.nodes())
    assert only_time.to_dict()["edits"] == {"time": 1}
    legacy = programs.ProgramSpace.from_dict({"edits": {"any": 1}}, grammar)  # the generic edit alone
    a, b = random.Random(3), random.Random(3)
    assert programs.edit(vanilla(), a, legacy, grammar) == programs.edit(vanilla(), b, legacy, grammar)
    assert programs.edit(vanilla(), a, legacy, grammar)[0] == "any"
    for bad in ({"edits": {"teleport": 1}}, {"edits": {"time": -1}}, {"edits": {"time": 0}}, {"edits": [1]}):
        with pytest.raises(UserError):
            programs.ProgramSpace.from_dict(bad, grammar)


def test_neighbour_is_one_edit_in_either_space():
    rng = random.Random(4)
    gene = AttentionGene.parse("dot|softmax|none|fixed|bias|0.00")
    program_space = SearchSpace.from_dict({"program": {"max_nodes": 8}})
    child = neighbour(gene, rng, program_space)
    assert child.program is not None and child.program != VANILLA_PROGRAM and child.attention_dropout == 0.0
    classic = neighbour(gene, rng, SearchSpace())
    changed = [k for k, v in classic.to_dict().items() if v != gene.to_dict()[k]]
    assert len(changed) == 1


def test_starting_genes_forms_and_refusals(tmp_path):
    space = SearchSpace.from_dict({"program": {"max_nodes": 8}})
    base = "dot|softmax|none|fixed|bias|0.00"
    start = starting_genes("vanilla", space=space, population_size=4, vanilla=base)
    assert start["genes"] == [AttentionGene.parse(base).replace(program=VANILLA_PROGRAM).key]
    assert starting_genes("random", space=space, population_size=4, vanilla=base) is None
    two = starting_genes(f"{base},dot|sparsemax|none|fixed|bias|0.00", space=space, population_size=4, vanilla=base)
    assert len(two["genes"]) == 2
    with pytest.raises(UserError, match="names 2 genes, more than population_size 1 holds"):
        starting_genes(f"{base},dot|sparsemax|none|fixed|bias|0.00", space=space, population_size=1, vanilla=base)
    with pytest.raises(UserError, match="not a gene"):
        starting_genes("nonsense", space=space, population_size=4, vanilla=base)
    small = SearchSpace.from_dict({"program": {"max_nodes": 4}})
    with pytest.raises(UserError, match="^the climb strategy starts from the vanilla gene .* when no start_from is "
                                        "given, .* more than max_nodes 4; give start_from genes inside it$"):
        starting_genes("vanilla", space=small, population_size=4, vanilla=base, default_of="climb")
    with pytest.raises(UserError, match="init_from and start_from"):
        Config(start_from="vanilla", init_from=str(tmp_path))


@pytest.mark.parametrize("start", [None, "vanilla"])
def test_vanilla_is_the_vanilla_gene_whatever_the_baseline_gene(tmp_path, start):
    plain = dict(data="recall", vocab_size=32, max_seq_len=32, strategy="climb", population_size=2,
                 n_generations=1, start_from=start)
    config = Config(**plain, baseline_gene="cosine|sigmoid|highway|learned|bias|0.00")
    with Evolution(config, out_dir=tmp_path / "run") as evo:
        assert evo.start_from["genes"] == [Config(**plain).resolved_baseline().key]


def test_climb_starts_from_neighbours_and_keeps_its_incumbent():
    strategy = make_strategy("climb", population_size=3, n_generations=3, elite_size=1, seed=5,
                             space={"program": {"max_nodes": 8}}, min_gain=0.5)
    start = AttentionGene.parse("dot|softmax|none|fixed|bias|0.00").replace(program=VANILLA_PROGRAM)
    strategy.warm_start([start], neighbours=True)
    first = strategy.ask()
    assert first[0] == start and len({g.key for g in first}) == 3
    strategy.tell({g: 10.0 if g == start else 11.0 for g in first})
    assert strategy.incumbent.gene == start
    second = strategy.ask()
    assert len(second) == 3 and not {g.key for g in second} & {g.key for g in first}
    # a child better by less than min_gain does not replace the incumbent; one better by more does
    strategy.tell({g: 9.8 for g in second})
    assert strategy.incumbent.gene == start and strategy.population[0].gene != start
    third = strategy.ask()
    strategy.tell({g: 9.0 if i == 0 else 12.0 for i, g in enumerate(third)})
    assert strategy.incumbent.gene == third[0] and strategy.done


@pytest.mark.parametrize("name", ["climb", "neighbours"])
def test_strategies_that_edit_a_start_refuse_a_per_layer_genome(name):
    space = dataclasses.replace(SearchSpace(), layers=2)
    with pytest.raises(UserError, match=f"{name} edits one gene shared by every layer") as refused:
        make_strategy(name, population_size=2, n_generations=2, elite_size=1, seed=0, space=space)
    assert refused.value.settings == ("strategy", "genome")


def test_the_climb_never_stands_on_a_gene_over_a_cap():
    strategy = make_strategy("climb", population_size=2, n_generations=3, seed=0, constraints=("max_latency_ms",))
    strategy.warm_start([AttentionGene.vanilla()], neighbours=True)
    strategy.tell({g: 10.0 for g in strategy.ask()})
    start = strategy.incumbent
    strategy.tell({g: 9.0 for g in strategy.ask()}, violations={g: {"max_latency_ms": 0.5}
                                                               for g in strategy.ask()})
    assert strategy.incumbent == start and start.feasible


def test_seed_vanilla_outside_the_program_space_is_refused_as_start_from_is():
    with pytest.raises(UserError, match="seed_vanilla: the vanilla gene .* is outside this run's search space"):
        make_strategy("nsga2", population_size=3, elite_size=1, n_generations=1, seed=0, seed_vanilla=True,
                      space={"program": {"max_nodes": 4}})
    with pytest.raises(UserError, match="outside this run's search space"):
        starting_genes("vanilla", space=SearchSpace.from_dict({"program": {"max_nodes": 4}}), population_size=3,
                       vanilla=AttentionGene.vanilla().key)


def test_climb_search_from_the_cli_starts_from_vanilla(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("search_space:\n  program: {max_nodes: 8}\n")
    assert main(["search", "--preset", "quick", "--config", str(space), "--d-model", "16", "--heads", "2", "--layers",
                 "1", "--steps", "3", "--strategy", "climb", "--population", "2", "--generations", "2",
                 "--no-baseline", "--quiet", "--keep-models", "0", "--out", str(tmp_path / "run")]) == 0
    from evo_attention.search.store import RunStore

    with RunStore.open(tmp_path / "run", readonly=True) as store:
        assert store.get_meta("start_from")["start_from"] == "vanilla"
        trained = [e["gene"] for e in store.evaluations(role="search")]
    assert trained[0].endswith("|prog=" + VANILLA_PROGRAM) and len(set(trained)) == 4


def test_a_seeded_climb_resumes_to_the_uninterrupted_result(tmp_path):
    config = Config(data="recall", vocab_size=16, max_seq_len=16, d_model=16,
                    recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64}, n_heads=2, n_layers=1, train_steps=3,
                    batch_size=4, eval_batch_size=16, eval_steps=2, population_size=3, n_generations=3,
                    elite_size=1, strategy="climb", start_from="dot|softmax|none|fixed|bias|0.10",
                    search_space={"program": {"max_nodes": 8}}, baseline=False, seed=7)
    with Evolution(config, out_dir=tmp_path / "full") as evo:
        evo.run()
    assert_resume_is_uninterrupted(config, tmp_path, 4, 9)


def test_a_search_ends_with_a_fresh_seed_check_unless_told_not_to(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("EVO_ATTENTION_FRESH_CHECK")
    flags = ["search", "--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "3",
             "--population", "3", "--generations", "1", "--elite", "1", "--keep-models", "0"]
    assert main([*flags, "--out", str(tmp_path / "run")]) == 0
    said = capsys.readouterr().err
    found = json.loads((tmp_path / "run" / "fresh_check.json").read_text())
    assert found["seeds"] == [43, 44] and len(found["genes"]) == 3 and found["vanilla"]["fresh"] is not None
    assert all(row["fresh"] is not None and row["search"] is not None for row in found["genes"])
    assert f"fresh-seed check: {found['line']}" in said and ("held" in found["line"])
    # each check's progress line shows its gene once (its label named the gene too)
    checks = [line for line in said.splitlines() if " at lr " in line]
    genes = [gene_label(row["gene"]) for row in found["genes"]] + [gene_label(found["vanilla"]["gene"])]
    assert len(checks) == 2 * 4 and all(sum(line.count(g) for g in set(genes)) == 1 for line in checks), checks
    assert "Fitness reliability:" in (tmp_path / "run" / "report.md").read_text()
    from evo_attention.search.store import RunStore

    with RunStore.open(tmp_path / "run", readonly=True) as store:
        assert len(store.evaluations(role="check")) == 2 * 4  # the top 3 and the vanilla gene, 2 seeds each
    assert main([*flags, "--no-check", "--out", str(tmp_path / "unchecked")]) == 0
    assert not (tmp_path / "unchecked" / "fresh_check.json").exists()


def test_the_fresh_seed_check_names_a_baseline_gene_as_such_and_says_it_failed():
    from evo_attention.studies.fresh_check import check_line, check_markdown

    result = {"metric": "val_loss", "lower_is_better": True, "seeds": [43, 44], "search_seed": 42,
              "rank_correlation": None, "held": False,
              "genes": [{"rank": 1, "gene": "g", "search": 9.2, "fresh": 9.1}],
              "vanilla": {"gene": "dot|nan_norm|none|fixed|bias|0.10", "fresh": None}}
    result["line"] = check_line(result, "baseline")
    assert result["line"] == ("the winner did not hold on 2 fresh seeds (val loss 9.1000; the baseline gene failed "
                              "there)")
    assert "`dot\\|nan_norm\\|none\\|fixed\\|bias\\|0.10` (baseline)" in check_markdown(result, "baseline")


def test_a_rate_axis_is_edited_beside_the_program():
    space = SearchSpace.from_dict({"program": {"max_nodes": 8}, "learning_rate": [1e-3, 2e-3, 4e-3]})
    gene = AttentionGene.parse("dot|softmax|none|fixed|bias|0.00|lr=0.002")
    rng = random.Random(6)
    children = [neighbour(gene, rng, space) for _ in range(200)]
    rates = [c for c in children if c.learning_rate != 0.002]
    assert rates and all(c.program == VANILLA_PROGRAM for c in rates)  # a rate edit leaves the program
    assert all(c.learning_rate == 0.002 for c in children if c.program != VANILLA_PROGRAM)  # one edit at a time
    assert 0.02 < len(rates) / len(children) < 0.2  # the program weighs 13 (its edit weights), the rate 1


@pytest.mark.parametrize("name", ["ga", "random", "nsga2", "climb"])
def test_every_strategy_starts_from_a_seeded_start_and_its_neighbours(name):
    strategy = make_strategy(name, population_size=4, n_generations=2, elite_size=1, seed=8,
                             space={"program": {"max_nodes": 8}})
    start = AttentionGene.parse("dot|softmax|none|fixed|bias|0.00").replace(program=VANILLA_PROGRAM)
    strategy.warm_start([start], neighbours=True)
    first = strategy.ask()
    assert first[0] == start and len({g.key for g in first}) == 4
    from evo_attention.search.warm_start import outside_space

    for child in first[1:]:  # each one edit from the start: its program, or one other field
        assert outside_space(child.key, strategy.space) is None
        fields = [k for k, v in child.to_dict().items() if k != "program" and v != start.to_dict()[k]]
        assert (child.program != VANILLA_PROGRAM) + len(fields) == 1, child.key
