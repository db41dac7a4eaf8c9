"""The neighbours strategy: seeded random one-edit sampling, the control arm of the GA and the climb."""

from pathlib import Path

import pytest
import yaml

from tests.conftest import assert_resume_is_uninterrupted

from evo_attention import Evolution, programs
from evo_attention.cli import main
from evo_attention.genes import AttentionGene, SearchSpace, in_program_form, program_grammar
from evo_attention.search import make_strategy, random_search
from evo_attention.search.base import enumerate_space, neighbour
from evo_attention.search.store import RunStore
from evo_attention.search.warm_start import outside_space
from evo_attention.train.config import Config
from evo_attention.util.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
LM_SPACE = yaml.safe_load((ROOT / "benchmarks" / "climb_lm_space.yaml").read_text())["search_space"]
SIZES = {"population_size": 5, "n_generations": 4, "elite_size": 2, "seed": 11}


def strategy(name="neighbours", space=LM_SPACE, start=True, **settings):
    made = make_strategy(name, **{**SIZES, **settings}, space=space)
    if start:
        made.warm_start([AttentionGene.parse(in_program_form(AttentionGene.vanilla().key, made.space))],
                        neighbours=True)
    return made


def run_through(made) -> list[list[str]]:
    """Every batch the strategy asks, told a fitness that depends only on the gene."""
    batches = []
    while not made.done:
        genes = made.ask()
        batches.append([g.key for g in genes])
        made.tell({g: 10.0 + (sum(map(ord, g.key)) % 97) / 10 for g in genes})
    return batches


def test_later_genes_are_new_program_edits_of_the_start_and_generation_0_is_the_gas(monkeypatch):
    made = strategy()
    start = made._warm[0]
    edits = []  # (edited gene, its edit) of every neighbour call: the later genes must be among the edits

    def spy(gene, rng, space):
        edits.append((gene, neighbour(gene, rng, space)))
        return edits[-1][1]

    monkeypatch.setattr(random_search, "neighbour", spy)
    batches = run_through(made)
    assert {g for g, _ in edits} == {start} and {k for b in batches[1:] for k in b} <= {e.key for _, e in edits}
    later = [programs.parse(AttentionGene.parse(k).program, program_grammar()) for b in batches[1:] for k in b]
    assert programs.census(later)["softmax over a dot product"] > 0.5  # edits of vanilla; random programs: < 0.05
    assert [len(b) for b in batches] == [5, 3, 3, 3]  # the GA's batch sizes
    for name in ("ga", "climb", "random"):
        assert strategy(name).ask() == [AttentionGene.parse(k) for k in batches[0]], name
    asked = set(batches[0])
    for batch in batches[1:]:
        for key in batch:
            gene = AttentionGene.parse(key)
            assert key not in asked and outside_space(key, made.space) is None
            others = {k: v for k, v in gene.to_dict().items() if k != "program"}
            assert others == {k: v for k, v in start.to_dict().items() if k != "program"}  # one program edit
            assert gene.program != start.program
            asked.add(key)


def test_the_same_seed_proposes_the_same_genes_and_another_seed_others():
    first = run_through(strategy())
    assert run_through(strategy()) == first
    assert run_through(strategy(seed=12))[1:] != first[1:]


def test_a_spent_neighbourhood_falls_back_to_random_genes_never_asked_before():
    space = {"similarity": ["dot", "cosine"], "normalization": ["softmax", "sigmoid"], "gating": ["none"],
             "temperature_mode": ["fixed"], "use_bias": [True], "attention_dropout": [0.1]}
    assert len(enumerate_space(SearchSpace.from_dict(space))) == 4
    batches = run_through(strategy(space=space, population_size=2, elite_size=1, n_generations=3))
    assert batches[0][0] == "dot|softmax|none|fixed|bias|0.10"
    assert sorted(batches[0][1:] + batches[1]) == ["cosine|softmax|none|fixed|bias|0.10",
                                                   "dot|sigmoid|none|fixed|bias|0.10"]  # the two neighbours
    assert batches[2] == ["cosine|sigmoid|none|fixed|bias|0.10"]  # not a neighbour: the one gene left


def test_without_a_start_it_refuses_and_the_cli_defaults_to_vanilla(tmp_path):
    with pytest.raises(UserError, match="neighbours strategy samples one-edit neighbours of a start"):
        strategy(start=False).ask()
    with pytest.raises(UserError, match="set start_from to"):
        Config(strategy="neighbours", start_from="random")
    out = tmp_path / "run"
    assert main(["search", "--preset", "quick", "--strategy", "neighbours", "--population", "3", "--generations",
                 "2", "--elite", "1", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "5", "--config",
                 str(ROOT / "benchmarks" / "climb_lm_space.yaml"), "--no-check", "--no-baseline", "--quiet",
                 "--keep-models", "0", "--out", str(out)]) == 0
    with RunStore.open(out, readonly=True) as store:
        assert store.get_meta("start_from")["start_from"] == "vanilla"  # no --start-from: vanilla, as the climb
        trained = [e["gene"] for e in store.evaluations(role="search")]
    assert len(trained) == len(set(trained)) == 5 and "|prog=" in trained[0]
    assert all(g.split("|prog=")[0] == trained[0].split("|prog=")[0] for g in trained)  # program edits only


def test_a_neighbours_search_resumes_to_the_uninterrupted_result(tmp_path):
    config = Config(data="recall", vocab_size=16, max_seq_len=16, d_model=16, n_heads=2, n_layers=1, train_steps=3,
                    recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
                    batch_size=4, eval_batch_size=16, eval_steps=2, population_size=3, n_generations=3, elite_size=1,
                    strategy="neighbours", search_space={"program": {"max_nodes": 8}}, baseline=False, seed=7)
    with Evolution(config, out_dir=tmp_path / "full") as evo:
        evo.run()
    assert_resume_is_uninterrupted(config, tmp_path, 4, 7)
