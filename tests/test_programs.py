"""Attention programs: the grammar (programs.py), what they compute (nn/program.py), and the gene part."""

import itertools
import random

import pytest
import torch

from evo_attention import AttentionGene, EvolvedAttention, TinyTransformer, programs
from evo_attention.genes import (AXIS_DEFAULTS, CATEGORICAL_FIELDS, SearchSpace, canonical_program, program_grammar,
                                 violation)
from evo_attention.nn.fold import Rows, fold_models
from evo_attention.nn.spec import ModelSpec
from evo_attention.programs import ProgramError, ProgramSpace
from evo_attention.util.errors import UserError

GRAMMAR = program_grammar()
N_RANDOM = 1000


@pytest.fixture(scope="module")
def random_programs():
    rng = random.Random(0)
    return [programs.random_program(rng, ProgramSpace(max_nodes=12), GRAMMAR) for _ in range(N_RANDOM)]


def _perturbed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every weight moved off its initial value (an identity-initialised convolution or a zero
    gate would hide a leak)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return module


# -- the language ------------------------------------------------------------------------------------

def test_known_programs_parse_round_trip_and_run():
    for name, text in programs.KNOWN_PROGRAMS.items():
        program = programs.parse(text, GRAMMAR)
        assert str(program) == text and programs.parse(str(program), GRAMMAR) == program, name
        assert canonical_program(text).text == text, name  # written in canonical form
        gene = AttentionGene.parse(f"prog={text}")
        assert gene.program == text and AttentionGene.parse(gene.key) == gene
        y = EvolvedAttention(16, 2, gene)(torch.randn(2, 6, 16))
        assert y.shape == (2, 6, 16) and torch.isfinite(y).all()


def test_random_programs_type_check_round_trip_and_stay_in_the_space(random_programs):
    assert len(random_programs) == N_RANDOM
    for program in random_programs:
        assert 1 <= program.size <= 12
        assert GRAMMAR.type_of(program.root) == "X"
        assert programs.parse(program.text, GRAMMAR) == program
        assert programs.canonical(program, GRAMMAR) == program
        assert programs.mixes_tokens(program, GRAMMAR)
    assert len(set(random_programs)) > 0.9 * N_RANDOM


X = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))


def assert_contracts(program, seed: int) -> None:
    """In an attention layer with perturbed weights: rows before a changed position do not change
    (in eval and in train mode) nor when the later positions are cut off, nor a batch row when another
    row changes, weights on keys a query may not see are exactly 0, and a training-mode forward and
    backward pass is finite."""
    changed = X.clone()
    changed[:, 5] += torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    mixed = changed.clone()  # row 0 changed at position 5, row 1 everywhere: row 0 keeps its first 5 rows
    mixed[1] += 1.0
    future = ~torch.ones(8, 8, dtype=torch.bool).tril()
    torch.manual_seed(seed)
    attn = _perturbed(EvolvedAttention(16, 2, AttentionGene(program=program.text), max_seq_len=8), seed=seed)
    attn.eval()
    with torch.no_grad():
        a, b = attn(X), attn(changed)
        _, weights = attn(X, need_weights=True)  # explicit weights (a kernel's running sum forms none)
        c = attn(mixed)
        cut = attn(X[:, :5])  # the first 5 positions alone, as decoding computes them
    assert torch.equal(a[:, :5], b[:, :5]), f"{program} leaks the future"
    gap = (a[:, :5] - cut).abs().max()  # to the values' scale: another length may sum in another order
    assert gap <= 1e-5 * (1 + a.abs().max()), f"{program} depends on the sequence length"
    assert torch.allclose(a[0, :5], c[0, :5], rtol=0, atol=1e-6), f"{program} mixes batch rows"
    if weights is not None:
        assert (weights[..., future] == 0).all(), f"{program} weighs a future key"
    attn.train()
    xg = X.clone().requires_grad_(True)
    torch.manual_seed(seed)  # the same dropout masks in both passes
    y = attn(xg)
    with torch.no_grad():
        torch.manual_seed(seed)
        c = attn(mixed)
    assert torch.allclose(y[0, :5], c[0, :5], rtol=0, atol=1e-5), f"{program} leaks in train mode"
    assert torch.isfinite(y).all(), program
    y.square().mean().backward()
    assert torch.isfinite(xg.grad).all(), program
    for name, p in attn.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), f"{program}: {name}"


def programs_using(op: str, grammar, n: int = 3) -> list:
    """``n`` random programs that use ``op``, drawn from a small space around it."""
    rng = random.Random(op)
    base = ("o", "mix", "kmix", "elu1", "w.softmax", "s.dot", "t.fixed")  # elu1: the features plain kmix reads
    space = ProgramSpace(max_nodes=8, ops=tuple(dict.fromkeys((op,) + base)))
    found = []
    for _ in range(2000):
        program = programs.random_program(rng, space, grammar)
        if any(node.op == op for node in program.ops()) and program not in found:
            found.append(program)
            if len(found) == n:
                break
    return found


def test_random_programs_are_causal_exactly_zero_on_masked_keys_and_finite(random_programs):
    """1,000 programs of up to 12 nodes are held to the contracts (``assert_contracts``)."""
    for i, program in enumerate(random_programs):
        assert_contracts(program, seed=i)


def test_every_op_of_the_language_is_held_to_the_contracts():
    """No hand-kept list: each op the grammar has now (built in, registered, or given by a
    component) appears in random programs that are held to the contracts."""
    for op in sorted(GRAMMAR.ops):
        if GRAMMAR.op(op).kind == "root":  # pin: never drawn, only written
            continue
        drawn = programs_using(op, GRAMMAR)
        assert drawn, f"no random program uses {op}"
        for i, program in enumerate(drawn):
            assert_contracts(program, seed=i)


def every_classic_gene():
    options = [AttentionGene.SIMILARITY_FUNCS, AttentionGene.NORMALIZATIONS, AttentionGene.GATING,
               AttentionGene.TEMPERATURE_MODES]
    for combo in itertools.product(*(o[:len(f.builtins)] for o, f in zip(options, _builtin_fields()))):
        values = dict(zip(CATEGORICAL_FIELDS, combo))
        if violation({**AXIS_DEFAULTS, **values, "program": None}) is None:
            yield AttentionGene(gene_dict={**values, "attention_dropout": 0.0})


def _builtin_fields():
    from evo_attention.genes import FIELD
    return [FIELD[name] for name in CATEGORICAL_FIELDS]


def _load_classic_weights(program_attn: EvolvedAttention, classic: EvolvedAttention) -> None:
    """The program's modules take the classic module's weights: its projections, and each
    registered component from the attribute that holds it there."""
    program_attn.qkv.load_state_dict(classic.qkv.state_dict())
    program_attn.out.load_state_dict(classic.out.state_dict())
    core = program_attn.program
    for node in core.nodes:
        name = f"n{core.index[node.text]}"
        if name not in core.ops:
            continue
        source = {"s": classic.similarity, "t": classic.temperature, "g": classic.gating, "gi": classic.gating,
                  "kmix": classic.kernel}[node.op.partition(".")[0]]
        core.ops[name].load_state_dict(source.state_dict())


@pytest.mark.parametrize("fused", [True, False])
def test_each_classic_gene_equals_its_program_on_the_same_weights(fused):
    genes = list(every_classic_gene())
    assert len(genes) == 288
    x = torch.randn(2, 12, 32)
    for i, gene in enumerate(genes):
        text = programs.classic_program(gene.similarity, gene.normalization, gene.gating, gene.temperature_mode)
        torch.manual_seed(i)
        classic = EvolvedAttention(32, 4, gene, fused=fused).eval()
        for part in (classic.similarity, classic.temperature, classic.gating):  # zero-initialised gates would agree
            _perturbed(part, seed=i)
        program_attn = EvolvedAttention(32, 4, gene.replace(similarity="dot", normalization="softmax", gating="none",
                                                             temperature_mode="fixed", program=text), fused=fused).eval()
        _load_classic_weights(program_attn, classic)
        with torch.no_grad():
            want, got = classic(x), program_attn(x)
        assert torch.allclose(got, want, atol=1e-6, rtol=0), (gene.key, (got - want).abs().max().item())


def test_a_program_decodes_as_its_forward_pass():
    torch.manual_seed(0)
    for text in list(programs.KNOWN_PROGRAMS.values()) + ["o(add(shift(v),mix(w.softmax(s.dot(dconv3(q),k)),v)))"]:
        attn = _perturbed(EvolvedAttention(16, 2, f"prog={text}|win=4|pos=rope")).eval()
        x = torch.randn(2, 9, 16)
        with torch.no_grad():
            whole = attn(x)
            cache = attn.new_cache()
            rows = [attn.decode(x[:, :5], cache)] + [attn.decode(x[:, i:i + 1], cache) for i in range(5, 9)]
        assert torch.allclose(torch.cat(rows, dim=1), whole, atol=1e-6), text


def test_the_fused_path_of_a_dot_softmax_program_equals_its_plain_path():
    x = torch.randn(2, 10, 32)
    for text in ("o(mix(w.softmax(t.learned(s.dot(dconv3(q),k))),v))", "o(mix(w.softmax(s.cosine(q,k)),sgate(v)))"):
        torch.manual_seed(0)
        fused = _perturbed(EvolvedAttention(32, 4, f"prog={text}|pos=alibi")).eval()
        assert fused.can_fuse
        plain = EvolvedAttention(32, 4, f"prog={text}|pos=alibi", fused=False).eval()
        plain.load_state_dict(fused.state_dict())
        with torch.no_grad():
            assert torch.allclose(fused(x), plain(x), atol=1e-5)


# a one-argument op on a value of each type (a learned op's weights are shaped per type)
ON_TYPE = {"H": "o(mix(w.softmax(s.dot({}(q),k)),v))", "X": "{}(o(mix(w.softmax(s.dot(q,k)),v)))",
           "S": "o(mix(w.softmax({}(s.dot(q,k))),v))"}


def test_every_op_folded_with_other_models_gives_what_it_gives_alone():
    """K = 3 models of a program, each its own perturbed weights, folded into one batch as the trainer
    folds them (nn.fold): each model's rows equal the model alone. No hand-kept list: each op of the
    grammar now, an op of one value on each type it takes, any other in a random program."""
    spec = ModelSpec(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_seq_len=8, dropout=0.0)
    ids = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    for op in sorted(GRAMMAR.ops):
        if GRAMMAR.op(op).kind == "root":
            continue
        typed = [ON_TYPE[t].format(op) for args, t in GRAMMAR.op(op).signatures if args == (t,) and t in ON_TYPE]
        for text in typed or [programs_using(op, GRAMMAR, n=1)[0].text]:
            models = [_perturbed(TinyTransformer(spec, f"prog={text}"), seed=k).eval() for k in range(3)]
            rows = Rows()
            with torch.no_grad():
                alone = [m.hidden_states(ids)[0] for m in models]
                fold = fold_models(models, rows)
                rows.batch = len(ids)
                folded = fold.model.hidden_states(ids.repeat(len(models), 1))[0].split(len(ids))
            for k, (got, want) in enumerate(zip(folded, alone)):
                assert torch.allclose(got, want, rtol=0, atol=1e-6), (text, k, (got - want).abs().max().item())


# -- syntax errors, canonical form, gene rules ---------------------------------------------------------

@pytest.mark.parametrize("text, says", [
    ("o(mix(w.softmax(s.dot(q,k)),v)", "is not closed"),
    ("o(mix(w.softmax(s.dot(q,k)),v)))", "unexpected ')'"),
    ("o(mix(s.dot(q,k),v))", "mix takes (W, H), not (S, H)"),
    ("mix(w.softmax(s.dot(q,k)),v)", "not H"),
    ("o(mix(w.softmax(s.dot(q,z)),v))", "unknown input 'z'"),
    ("o(frob(q))", "unknown program op 'frob'"),
    ("o(kmix(q,k,v))", "kmix takes (F, F, H)"),
    ("pin(lin(q),o(v))", "inside pin's first argument"),
    ("g.output_gate(pin(x,o(v)))", "stands only at the root"),
])
def test_a_bad_program_is_one_line_naming_what_is_wrong(text, says):
    with pytest.raises(ProgramError) as error:
        programs.parse(text, GRAMMAR)
    assert says in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(UserError):
        AttentionGene.parse(f"prog={text}")


def test_canonical_form_orders_folds_and_drops():
    canon = canonical_program
    assert canon("o(mul(v,add(k,q)))").text == "o(mul(add(k,q),v))"
    assert canon("o(add(v,mul(2,0.5)))").text == "o(add(v,1))"
    assert canon("o(mul(add(v,0),1))").text == "o(v)"
    assert canon("o(neg(neg(v)))").text == "o(v)"
    assert canon("pin(lin(x),lin(x))").text == "lin(x)"  # nothing reads the projections
    gene = AttentionGene.parse("prog=o(mix(w.softmax(s.dot(k,q)),add(v,0)))")
    assert gene.program == "o(mix(w.softmax(s.dot(k,q)),v))"  # a score's arguments are not commutative


def test_a_program_gene_keeps_default_components_and_its_score_bias_needs_weights():
    gene = AttentionGene.parse("prog=o(mix(w.softmax(s.dot(q,k)),v))|pos=rope")
    assert gene.key == "dot|softmax|none|fixed|bias|0.10|pos=rope|prog=o(mix(w.softmax(s.dot(q,k)),v))"
    assert gene.short == "prog=o(mix(w.softmax(s.dot(q,k)),v))|pos=rope"
    with pytest.raises(UserError, match="program-replaces-components"):
        AttentionGene.parse("dot|sparsemax|none|fixed|prog=o(mix(w.softmax(s.dot(q,k)),v))")
    with pytest.raises(UserError, match="program-score-bias-needs-weights"):
        AttentionGene.parse("prog=o(kmix(elu1(q),elu1(k),v))|pos=alibi")
    assert AttentionGene.parse("prog=o(mix(w.none(s.dot(q,k)),v))|abias=rel").attn_bias == "rel"
    assert AttentionGene.parse("dot|softmax|none|fixed").program is None  # older keys unchanged


# -- search operators -----------------------------------------------------------------------------

def test_mutation_and_crossover_give_new_valid_programs_deterministically(random_programs):
    space = ProgramSpace(max_nodes=12)

    def children(seed):
        rng = random.Random(seed)
        out = []
        for a, b in zip(random_programs[:100], random_programs[100:200]):
            out.append(programs.mutate(a, rng, space, GRAMMAR))
            out.append(programs.crossover(a, b, rng, space, GRAMMAR))
        return out

    first = children(1)
    assert first == children(1)
    assert sum(c not in random_programs[:200] for c in first) > 150
    for child in first:
        assert child.size <= 12 and programs.parse(child.text, GRAMMAR) == child


def test_a_space_of_listed_ops_draws_only_those():
    ops = ["o", "mix", "w.softmax", "s.dot", "t.fixed", "dconv3", "sgate", "shift", "add"]
    space = ProgramSpace.from_dict({"max_nodes": 8, "ops": ops}, GRAMMAR)
    rng = random.Random(3)
    for _ in range(50):
        program = programs.random_program(rng, space, GRAMMAR)
        assert {n.op for n in program.ops()} <= set(ops) and program.size <= 8
    with pytest.raises(UserError, match="unknown program op 'nope'"):
        ProgramSpace.from_dict({"ops": ["o", "mix", "nope"]}, GRAMMAR)
    with pytest.raises(UserError, match="max_nodes"):
        ProgramSpace.from_dict({"max_nodes": 1}, GRAMMAR)


def test_a_search_space_with_a_program_draws_and_breeds_program_genes():
    space = SearchSpace.from_dict({"program": {"max_nodes": 10}, "position": ["learned", "rope"]})
    assert space.program_space == ProgramSpace(max_nodes=10) and space.size() == float("inf")
    rng = random.Random(0)
    genes = [space.random(rng) for _ in range(20)]
    assert all(g.program is not None and g.similarity == "dot" for g in genes)
    assert len({g.program for g in genes}) > 15
    child = genes[0].crossover(genes[1], rng, space).mutate(0.1, rng, space)
    assert child.program is not None and child not in genes[:2]
    assert space.to_dict()["program"] == {"max_nodes": 10, "ops": []}
    with pytest.raises(UserError, match="leave normalization out"):
        SearchSpace.from_dict({"program": {}, "normalization": ["sparsemax"]})


# -- functional-equivalence caching ----------------------------------------------------------------

def test_equivalent_programs_share_a_fingerprint_and_different_ones_do_not():
    from evo_attention.search.equivalence import fingerprint, functional_genome

    assert fingerprint("o(mul(v,2))") == fingerprint("o(add(v,v))")
    assert fingerprint("o(mix(w.softmax(s.dot(q,k)),sgate(v)))") == fingerprint("o(mix(w.softmax(s.dot(q,k)),sgate(v)))")
    assert fingerprint("o(v)") != fingerprint("o(mul(v,2))") != fingerprint("o(mix(w.softmax(s.dot(q,k)),v))")
    assert fingerprint("o(dconv3(v))") != fingerprint("o(v)")  # an identity-initialised op is not the identity
    assert functional_genome("dot|softmax|none|fixed") is None
    assert functional_genome("prog=o(mul(v,2))|pos=rope") == functional_genome("prog=o(add(v,v))|pos=rope")
    assert functional_genome("prog=o(mul(v,2))|pos=rope") != functional_genome("prog=o(add(v,v))")


def test_the_runner_answers_an_equivalent_program_from_the_store_without_training(tmp_path):
    from evo_attention import Config
    from evo_attention.data import data_from_config
    from evo_attention.search.executors import EvalTask, LocalExecutor
    from evo_attention.search.runner import Runner
    from evo_attention.search.store import RunStore
    from evo_attention.train.spec import Trial

    config = Config(data="recall", vocab_size=16, max_seq_len=16, recall={"num_pairs": 2, "train_examples": 200,
                                                                        "eval_examples": 40},
                    d_model=16, n_heads=2, n_layers=1, batch_size=8, eval_batch_size=40, train_steps=3, log_every=1,
                    precision="fp32")
    data = data_from_config(config)
    first, twin, other = (Trial.from_config(f"prog={p}", config)
                          for p in ("o(mix(w.softmax(s.dot(q,k)),mul(v,2)))", "o(mix(w.softmax(s.dot(q,k)),add(v,v)))",
                                    "o(mix(w.softmax(s.dot(q,k)),v))"))
    trained = []

    class Counting(LocalExecutor):
        def run(self, tasks, **kw):
            trained.extend(str(getattr(t.trial.genome, "key", t.trial.genome)) for t in tasks)
            yield from super().run(tasks, **kw)

    store = RunStore.create(tmp_path / "run", config.to_dict())
    runner = Runner(Counting(), store=store, data={config.task: data}, equivalence=True)
    records = runner.evaluate([first])
    again = runner.evaluate([EvalTask(twin), EvalTask(other)])
    assert trained == [str(first.genome), str(other.genome)] and runner.equivalent_answers == 1
    copy = again[EvalTask(twin)]
    assert copy.gene == str(twin.genome) and copy.extra["equivalent_to"] == str(first.genome)
    assert copy.val_loss == records[first].val_loss
    assert store.lookup(*twin.with_data(data).key()) is not None  # stored under its own key: later a plain hit
    plain = Runner(Counting(), store=store, data={config.task: data})  # studies: no equivalence
    assert plain.lookup(EvalTask(twin)) is not None
    store.close()


def test_a_resumed_call_trains_an_equivalent_program_it_was_to_train_as_the_uninterrupted_run_did(tmp_path):
    """A cut call stored one of two equivalent programs; on resume the other was answered by a copy of it
    (equivalent_to), where the uninterrupted call trained both."""
    from evo_attention import Config
    from evo_attention.data import data_from_config
    from evo_attention.search.executors import EvalTask
    from evo_attention.search.runner import Runner
    from evo_attention.search.store import RunStore
    from evo_attention.train.spec import Trial
    from tests.conftest import CountingExecutor

    config = Config(data="recall", vocab_size=16, max_seq_len=16, recall={"num_pairs": 2, "train_examples": 200,
                                                                        "eval_examples": 40},
                    d_model=16, n_heads=2, n_layers=1, batch_size=8, eval_batch_size=40, train_steps=3, log_every=1,
                    precision="fp32")
    data = data_from_config(config)
    call = [EvalTask(Trial.from_config(f"prog={p}", config)) for p in ("o(mix(w.softmax(s.dot(q,k)),mul(v,2)))",
                                                                      "o(mix(w.softmax(s.dot(q,k)),add(v,v)))")]
    store = RunStore.create(tmp_path / "run", config.to_dict())
    cut = CountingExecutor(stop_after=1)
    with pytest.raises(KeyboardInterrupt):
        Runner(cut, store=store, data={config.task: data}, equivalence=True).evaluate(call)
    executor = CountingExecutor()
    resumed = Runner(executor, store=store, data={config.task: data}, equivalence=True)
    records = resumed.evaluate(call)
    assert len(executor.trained) == 1 and resumed.equivalent_answers == 0
    assert "equivalent_to" not in records[call[1]].extra
    store.close()


def test_the_engine_step_time_benchmark_runs(tmp_path):
    """benchmarks/bench_engine.py, one round at the quick preset, this checkout against itself."""
    import importlib.util
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_engine", repo / "benchmarks" / "bench_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--reference", str(repo), "--presets", "quick", "--rounds", "1", "--steps", "1",
                        "--repeats", "1", "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["summary"] and all(s["ratio_median"] > 0 for s in result["summary"].values())


def test_a_program_search_runs_from_the_cli_resumes_reports_and_ablates(tmp_path):
    """A GA over programs end to end: its genes are programs, a resumed run replays it, the
    report draws the best program, the TPE sampler refuses the space, and an ablation of the best
    program trains one variant per removable node."""
    import json

    from evo_attention.cli import main

    config = tmp_path / "programs.yaml"
    config.write_text("search_space:\n  program: {max_nodes: 6}\n  use_bias: [true]\n  attention_dropout: [0.0]\n")
    flags = ["--preset", "quick", "--config", str(config), "--vocab-size", "16", "--seq-len", "16", "--d-model", "16",
             "--heads", "2", "--layers", "1", "--batch-size", "8", "--steps", "6", "--population", "4", "--elite", "1",
             "--quiet", "--out", str(tmp_path / "run")]
    assert main(["search", *flags, "--generations", "2"]) == 0
    results = json.loads((tmp_path / "run" / "final_results.json").read_text())
    assert main(["search", "--resume", "--quiet", "--out", str(tmp_path / "run")]) == 0  # replayed from the store
    again = json.loads((tmp_path / "run" / "final_results.json").read_text())
    assert again["best_gene"] == results["best_gene"] and again["history"] == results["history"]
    assert results["best_gene"]["program"] and results["strategy"]["name"] == "ga"
    assert (tmp_path / "run" / "best_program.png").stat().st_size > 0
    assert "## The best gene's program" in (tmp_path / "run" / "report.md").read_text()
    assert main(["search", *flags[:-2], "--strategy", "tpe", "--generations", "1", "--out", str(tmp_path / "t")]) == 2
    best = results["best_gene"]["key"]
    assert main(["ablate", "--gene", best, "--seeds", "2", *flags[:12], "--steps", "3", "--quiet",
                 "--out", str(tmp_path / "ablation")]) == 0
    ablation = json.loads((tmp_path / "ablation" / "ablation.json").read_text())
    removals = [v for v in ablation["variants"] if v["kind"] == "remove" and v["field"] == "program"]
    assert removals and all(v["gene"] != best for v in removals)


# -- programs in lists of genes -------------------------------------------------------------------------
PROGRAM_ITEM = "prog=o(sgate(mix(w.softmax(t.fixed(s.dot(q,k))),v)))"


def test_a_list_of_genes_splits_only_at_commas_outside_a_program():
    from evo_attention.genes import is_gene_text, split_genes

    text = f" baseline, {PROGRAM_ITEM} ,dot|softmax|none|fixed|prog=mix(w.softmax(s.dot(q,k)),v),, linear"
    assert split_genes(text) == ["baseline", PROGRAM_ITEM, "dot|softmax|none|fixed|prog=mix(w.softmax(s.dot(q,k)),v)",
                                 "linear"]
    assert is_gene_text(PROGRAM_ITEM) and not is_gene_text("baseline")


def test_compare_curve_and_validate_take_programs_in_their_gene_lists(tmp_path):
    from evo_attention.cli import main
    from evo_attention.studies.compare import resolve_configs

    entries = resolve_configs(f"baseline,{PROGRAM_ITEM}", d_model=32, n_heads=2)
    assert [name for name, _ in entries][0] == "baseline" and len(entries) == 2
    assert entries[1][1].program is not None
    out = tmp_path / "v"
    rc = main(["validate", "--genes", f"{PROGRAM_ITEM},dot|softmax|none|fixed", "--seeds", "2", "--out", str(out),
               "--data", "mqar:seq_len=16,vocab=16,pairs=2,train_examples=64,eval_examples=16", "--vocab-size", "16",
               "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4",
               "--eval-batch-size", "16", "--quiet"])
    assert rc == 0 and (out / "validation.json").is_file()


def test_random_programs_never_give_up_on_a_space_that_draws_them():
    """Draws 2,061 and 5,666 of random.Random(0) gave up after 200 tries in 0.5 (about 1 draw in 25
    of the default space mixes tokens); 20,000 draws now all succeed."""
    rng = random.Random(0)
    space = ProgramSpace(max_nodes=12)
    assert all(programs.mixes_tokens(programs.random_program(rng, space, GRAMMAR), GRAMMAR) for _ in range(20_000))


def test_a_space_that_cannot_draw_is_refused_when_read():
    with pytest.raises(UserError, match="draws no program that mixes tokens"):
        ProgramSpace.from_dict({"max_nodes": 3, "ops": ["o", "mix", "w.none", "s.dot", "relu"]}, GRAMMAR)
    with pytest.raises(UserError, match="must be a list of op names"):
        ProgramSpace.from_dict({"ops": 5}, GRAMMAR)


def test_fingerprints_merge_no_two_different_small_programs():
    """Every pair of small programs with one fingerprint computes one function on long inputs; a
    chain of shifts longer than the probe is not the zero function (0.5 merged them)."""
    from evo_attention.search.equivalence import fingerprint, probe_output

    shifts = "o(" + "shift(" * 9 + "v" + ")" * 10
    assert fingerprint(shifts) != fingerprint("o(mul(v,0))")
    assert fingerprint("o(" + "shift(" * 8 + "q" + ")" * 9) != fingerprint("o(" + "shift(" * 8 + "v" + ")" * 9)
    leaves = ["q", "k", "v"]
    unary = [f"{op}({a})" for op in ("shift", "neg", "relu", "dconv2") for a in leaves]
    binary = [f"{op}({a},{b})" for op in ("add", "sub", "mul") for a in leaves + unary[:3] for b in leaves]
    heads = leaves + unary + binary
    texts = {canonical_program(f"o({h})").text for h in heads} | {
        canonical_program(f"o(mix(w.softmax(s.dot(q,k)),{h}))").text for h in heads}
    groups: dict = {}
    for text in sorted(texts):
        groups.setdefault(fingerprint(text), []).append(text)
    for same in (g for g in groups.values() if len(g) > 1):
        want = probe_output(same[0], 40)
        for other in same[1:]:
            assert torch.allclose(probe_output(other, 40), want, rtol=1e-9, atol=1e-12), (same[0], other)


def test_tpe_refuses_a_program_space_naming_every_strategy_that_searches_one():
    from evo_attention.search import make_strategy

    with pytest.raises(UserError, match="use ga, random, neighbours, nsga2 or climb for a program search space"):
        make_strategy("tpe", population_size=4, n_generations=1, elite_size=1, space={"program": {"max_nodes": 8}})


def test_the_search_operators_name_an_argument_of_the_wrong_type():
    space, rng = ProgramSpace(max_nodes=12), random.Random(0)
    program = programs.parse(programs.KNOWN_PROGRAMS["softmax attention"], GRAMMAR)
    for call, says in [(lambda: programs.random_program(3, space, GRAMMAR), "rng must be a random.Random"),
                       (lambda: programs.edit(program, rng, None, GRAMMAR), "space must be a ProgramSpace"),
                       (lambda: programs.crossover(program, program, rng, space, None), "grammar must be a Grammar"),
                       (lambda: programs.parse(program.text, None), "grammar must be a Grammar")]:
        with pytest.raises(TypeError, match=f"^{says}"):
            call()
    programs.mutate(program, random, space, GRAMMAR)  # the random module is an rng (the genes' default)
