"""Batched training of same-shape trials (the engine of train/trainer.py with K > 1) and the
measured precision choice.

The bound a batched trial is held to against the same trial trained alone is
``trainer.SAME_RESULT_RTOL`` (relative, final val_loss and every point of the loss curve); the
measurements behind it are in the module's docstring. On this machine most genes give bitwise the
same result in fp32 and bf16: the tests hold those exactly.
"""

import json
import math
import time

import pytest
import torch

from evo_attention import Config, components
from evo_attention.data import data_from_config
from evo_attention.data.base import fingerprint_of
from evo_attention.nn.losses import linear_cross_entropy
from evo_attention.train import environment, probe_cache
from evo_attention.train import trainer as engine
from evo_attention.train.optim import StackedAdamW, clip_per_model
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import Member, Trainer, batch_problem, run_batched, run_training, state_from_bytes
from evo_attention.util.errors import UserError

SMALL = dict(data="recall", vocab_size=32, max_seq_len=32, recall={"num_pairs": 4, "train_examples": 2000,
                                                                   "eval_examples": 200},
             d_model=32, n_heads=4, n_layers=2, dropout=0.1, batch_size=16, eval_batch_size=100, eval_steps=None,
             learning_rate=2e-3, train_steps=30, log_every=10, precision="fp32")
VANILLA = "dot|softmax|none|fixed|bias|0.10"  # attention dropout 0.1 (the explicit CPU path), model dropout 0.1
RATES = [(0, 2e-3), (1, 1e-3), (2, 3e-3)]


@pytest.fixture(scope="module")
def setup():
    config = Config(**SMALL)
    return config, data_from_config(config)


def trials_of(config, data, gene=VANILLA, rates=RATES, **changes):
    return [Trial.from_config(gene, config.replace(seed=seed, learning_rate=lr, **changes), data=data)
            for seed, lr in rates]


def relative_gaps(a, b) -> tuple[float, float]:
    """(val_loss, worst point of the loss and validation curves) relative differences of two records
    of one trial."""
    assert [s for s, _ in a.curve] == [s for s, _ in b.curve]
    assert [s for s, _ in a.val_curve] == [s for s, _ in b.val_curve]
    val = abs(a.val_loss - b.val_loss) / abs(b.val_loss)
    points = list(zip(a.curve, b.curve)) + list(zip(a.val_curve, b.val_curve))
    curve = max((abs(x - y) / abs(y) for (_, x), (_, y) in points), default=0.0)
    return val, curve


def assert_same_result(batch, alone, rtol, size=None):
    for b, a in zip(batch, alone):
        rb, ra = b.record, a.record
        assert rb.key == ra.key and rb.status == ra.status == "ok"
        assert rb.extra["batched"] == (size or len(batch)) and "batch_fallback" not in rb.extra
        assert rb.params == ra.params and rb.flops_per_step == ra.flops_per_step
        assert rb.precision == ra.precision and rb.extra["precision_reason"] == ra.extra["precision_reason"]
        assert rb.trained_steps == ra.trained_steps and rb.eval_tokens == ra.eval_tokens
        assert rb.latency_ms > 0 and rb.train_time_s > 0 and rb.compiled is False
        val, curve = relative_gaps(rb, ra)
        assert val <= rtol and curve <= rtol, (rb.gene, rb.seed, val, curve)


# -- same trial, same result -------------------------------------------------------------------------

@pytest.mark.parametrize("stream", ["cpu", "counter"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_batched_trial_gives_what_it_gives_alone(setup, precision, stream):
    """Seeds and rates differ, dropout and attention dropout on: each model its own batches and
    dropout stream (either kind). The vanilla gene is bitwise the same here; the stated bound covers
    every gene."""
    config, data = setup
    trials = trials_of(config.replace(precision=precision, dropout_stream=stream), data)
    batch = run_batched(trials, data)
    alone = [run_training(t, data) for t in trials]
    assert_same_result(batch, alone, engine.SAME_RESULT_RTOL[precision])
    for b, a in zip(batch, alone):
        assert b.record.val_loss == a.record.val_loss and b.record.curve == a.record.curve
        assert b.record.val_curve == a.record.val_curve and len(a.record.val_curve) == 4  # three folded points
        for (name, x), y in zip(b.trainer.model.state_dict().items(), a.trainer.model.state_dict().values()):
            assert torch.equal(x, y), name


def test_the_llama_block_folds_exactly(setup):
    config, data = setup
    trials = trials_of(config.replace(block="llama", train_steps=12, log_every=4), data, rates=RATES[:2])
    batch = run_batched(trials, data)
    alone = [run_training(t, data) for t in trials]
    assert_same_result(batch, alone, 0.0)


def test_every_gene_either_folds_within_the_bound_or_trains_alone(setup, covering_genes):
    config, data = setup
    config = config.replace(train_steps=8, log_every=4, eval_batch_size=50, eval_steps=1)
    folded = 0
    for gene in covering_genes():
        trials = trials_of(config, data, gene=gene, rates=RATES[:2])
        batch = run_batched(trials, data)
        alone = [run_training(t, data) for t in trials]
        for b, a in zip(batch, alone):
            assert b.record.key == a.record.key and b.record.status == a.record.status, gene
            if "batch_fallback" in b.record.extra:  # only where folding is refused, never a batch that broke
                assert b.record.extra["batch_fallback"].startswith("not batched: "), (gene, b.record.extra)
                assert b.record.val_loss == a.record.val_loss, gene
                continue
            folded += 1
            assert b.record.flops_per_step == a.record.flops_per_step, gene
            if a.record.status == "ok":
                val, curve = relative_gaps(b.record, a.record)
                assert max(val, curve) <= engine.SAME_RESULT_RTOL["fp32"], (gene, val, curve)
    assert folded >= 2 * (len(covering_genes()) - 2)


@pytest.mark.parametrize("stream", ["cpu", "counter"])
def test_a_diverging_model_leaves_the_batch_and_the_others_go_on(setup, stream):
    config, data = setup
    config = config.replace(dropout_stream=stream)  # the step retried without it: the others' masks again
    gene = "dot|relu_norm|none|fixed"
    trials = [Trial.from_config(gene, config.replace(seed=0, learning_rate=1e6, grad_clip=1e9), data=data),
              Trial.from_config(gene, config.replace(seed=1), data=data),
              Trial.from_config(gene, config.replace(seed=2, learning_rate=1e-3), data=data)]
    batch = run_batched(trials, data)
    alone = [run_training(t, data) for t in trials]
    assert batch[0].record.status == alone[0].record.status == "diverged"
    assert batch[0].record.trained_steps == alone[0].record.trained_steps < config.train_steps
    assert batch[0].record.curve == alone[0].record.curve and batch[0].record.error
    assert_same_result(batch[1:], alone[1:], engine.SAME_RESULT_RTOL["fp32"], size=3)


# genes of one frame (no learned position table) whose attentions differ: four classic genes, two
# programs and a genome of one gene per layer, the first gene twice (a group of two, not side by side)
DIFFERENT = ["multiplicative|sparsemax|input_gate|learned|nobias|0.00|pos=rope|kvh=1|dconv=3",
             "additive|relu_norm|output_gate|adaptive|bias|0.10|pos=rope:ntk:4|win=3",
             "cosine|sigmoid|highway|fixed|nobias|0.00|pos=alibi|abias=rel",
             "dot|entmax15|none|learned|bias|0.10|pos=none|rank=4|kvh=2|dconv=2",
             "prog=o(sgate(mix(w.softmax(t.learned(s.dot(dconv3(q),lfeat(k)))),scale(v))))|pos=rope|kvh=2",
             "prog=g.highway(o(add(decay(v),mix(w.none(sdecay(s.additive(q,k))),bias(shift(v))))))|nobias|0.00|pos=alibi",
             "multiplicative|sparsemax|input_gate|learned|nobias|0.00|pos=rope|kvh=1|dconv=3",
             # a gene per layer: its first layer groups with the third gene's, its second with the first's
             "cosine|sigmoid|highway|fixed|nobias|0.00|pos=alibi|abias=rel / "
             "multiplicative|sparsemax|input_gate|learned|nobias|0.00|pos=rope|kvh=1|dconv=3"]


@pytest.mark.parametrize("stream", ["cpu", "counter"])
def test_different_genes_fold_and_each_gives_what_it_gives_alone(setup, stream):
    """One batch of different attentions (nn.fold.Split): each trial its own record (FLOPs and
    parameters its own), within the engine's bound of its training alone."""
    config, data = setup
    config = config.replace(train_steps=12, log_every=4, dropout_stream=stream)
    trials = [Trial.from_config(g, config.replace(seed=i, learning_rate=RATES[i % 3][1]), data=data)
              for i, g in enumerate(DIFFERENT)]
    assert engine.shape_difference(trials) is None
    batch = run_batched(trials, data)
    alone = [run_training(t, data) for t in trials]
    assert_same_result(batch, alone, engine.SAME_RESULT_RTOL["fp32"])
    assert len({r.record.flops_per_step for r in batch}) >= 5 and len({r.record.params for r in batch}) >= 5


def test_a_diverging_model_leaves_its_group_and_the_others_go_on(setup):
    config, data = setup
    a, b, c = ("dot|relu_norm|none|fixed|pos=rope", "cosine|sigmoid|highway|fixed|nobias|0.00|pos=alibi|abias=rel",
               "prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),sgate(v)))|pos=rope")
    bad = dict(learning_rate=1e6, grad_clip=1e9)
    trials = [Trial.from_config(a, config.replace(seed=0, **bad), data=data),  # its group goes on with seed 2
              Trial.from_config(b, config.replace(seed=1), data=data),
              Trial.from_config(a, config.replace(seed=2, learning_rate=1e-3), data=data),
              Trial.from_config(c, config.replace(seed=3), data=data)]
    trials.append(Trial.from_config(b.replace("pos=alibi", "pos=rope"), config.replace(seed=4, **bad), data=data))  # a group of one
    batch = run_batched(trials, data)
    alone = [run_training(t, data) for t in trials]
    for i in (0, 4):
        assert batch[i].record.status == alone[i].record.status == "diverged"
        assert batch[i].record.trained_steps == alone[i].record.trained_steps < config.train_steps
    assert_same_result(batch[1:4], alone[1:4], engine.SAME_RESULT_RTOL["fp32"], size=5)


def test_a_state_from_a_batch_of_different_genes_continues_alone(setup):
    """Each model's moments come from its own slices (a group's parameters hold only its models')."""
    config, data = setup
    genes = ["cosine|sigmoid|highway|fixed|nobias|0.00|pos=alibi|abias=rel", "dot|relu_norm|none|fixed|pos=rope",
             "prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),sgate(v)))|pos=rope"]
    full = [Trial.from_config(g, config.replace(seed=s, lr_schedule="cosine", warmup_steps=5), data=data)
            for s, g in enumerate(genes)]
    partial = [t.replace(steps=3, budget=30) for t in full]
    for result, alone, trial in zip(run_batched(partial, data, keep_state=True),
                                    [run_training(t, data, keep_state=True) for t in partial], full):
        mine, theirs = (state_from_bytes(r.state, torch.device("cpu"))["optimizer"]["state"] for r in (result, alone))
        assert len(mine) == len(theirs)
        for i, moments in theirs.items():
            for name in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(mine[i][name], moments[name], rtol=1e-4, atol=1e-9)
        resumed = run_training(trial, data, state=result.state).record
        straight = run_training(trial, data).record
        assert abs(resumed.val_loss - straight.val_loss) <= engine.SAME_RESULT_RTOL["fp32"] * straight.val_loss


def test_a_batched_state_continues_alone_exactly(setup):
    """keep_state gives the single trainer's state: a partial training (budget) batched, continued alone."""
    config, data = setup
    full = [Trial.from_config(VANILLA, config.replace(seed=s, learning_rate=lr, lr_schedule="cosine", warmup_steps=5),
                              data=data) for s, lr in RATES[:2]]
    partial = [t.replace(steps=20, budget=30) for t in full]
    first = run_batched(partial, data, keep_state=True)
    for result, trial in zip(first, full):
        assert result.state is not None and result.record.resumed_from == 0
        state = state_from_bytes(result.state, torch.device("cpu"))
        assert state["step"] == 20 and torch.equal(state["rng"], result.trainer.dropout_generator.get_state())
        resumed = run_training(trial.replace(budget=30), data, state=result.state).record
        straight = run_training(trial, data).record
        assert resumed.resumed_from == 20 and resumed.val_loss == straight.val_loss
        assert resumed.curve == straight.curve


def test_trials_that_differ_in_shape_are_refused_naming_the_field(setup):
    config, data = setup
    trials = trials_of(config, data)
    with pytest.raises(UserError, match="d_model") as info:
        run_batched([trials[0], Trial.from_config(VANILLA, config.replace(d_model=64), data=data)], data)
    assert info.value.setting == "d_model"
    with pytest.raises(UserError, match="batch_size"):
        run_batched([trials[0], trials[1].replace(train=trials[1].train.replace(batch_size=8))], data)
    with pytest.raises(UserError, match="genome .*no learned position table"):  # the model around the attention differs
        run_batched([trials[0], Trial.from_config("dot|sigmoid|none|fixed|pos=rope", config, data=data)], data)
    with pytest.raises(UserError, match="steps"):
        run_batched([trials[0], trials[1].replace(steps=10)], data)
    # what may differ: seed, rate, decay, warm-up, schedule, clipping
    other = trials[1].replace(train=trials[1].train.replace(weight_decay=0.0, grad_clip=0.5, lr_schedule="cosine",
                                                            warmup_steps=3))
    assert engine.shape_difference([trials[0], other]) is None


def test_a_plugin_component_folds_or_is_refused_naming_it(setup, unfoldable_similarity):
    """A plugin's parameter-free similarity folds with no declaration (bitwise the same here, as the
    built-in dot product); one with weights and no folded form is refused naming it, and trains alone."""
    config, data = setup

    @components.register_similarity("batch_test_dot")
    class PluginDot(components.Similarity):
        dot_form = True

    try:
        trials = trials_of(config, data, gene="batch_test_dot|softmax|none|fixed", rates=RATES[:2])
        assert batch_problem(trials[0]) is None
        batch = run_batched(trials, data)
        alone = [run_training(t, data) for t in trials]
        assert_same_result(batch, alone, 0.0)
        weighted = trials_of(config, data, gene=f"{unfoldable_similarity}|softmax|none|fixed", rates=RATES[:2])
        problem = batch_problem(weighted[0])
        assert problem.startswith(f"similarity '{unfoldable_similarity}' cannot be folded") and "scale" in problem
        batch = run_batched(weighted, data)
        alone = [run_training(t, data) for t in weighted]
        for b, a in zip(batch, alone):
            assert "batch_fallback" in b.record.extra and "batched" not in b.record.extra
            assert b.record.val_loss == a.record.val_loss
    finally:
        components.unregister("similarity", "batch_test_dot")
    # a relative bias folds on the block-wise sliding-window path too
    window = trials_of(config.replace(train_steps=8, log_every=4), data, gene="dot|softmax|none|fixed|abias=rel|win=4",
                       rates=RATES[:2])
    assert batch_problem(window[0]) is None
    assert_same_result(run_batched(window, data), [run_training(t, data) for t in window],
                       engine.SAME_RESULT_RTOL["fp32"])


def test_a_name_registered_again_is_judged_again(setup):
    """Whether a genome folds is kept per registered component, not per name: a name unregistered
    and registered again by another plugin (here with a weight and no folded form) is asked again."""
    config, data = setup

    @components.register_similarity("batch_test_again")
    class Plain(components.Similarity):
        pass

    try:
        trial = trials_of(config, data, gene="batch_test_again|softmax|none|fixed", rates=RATES[:1])[0]
        assert batch_problem(trial) is None
        components.unregister("similarity", "batch_test_again")

        @components.register_similarity("batch_test_again")
        class Weighted(components.Similarity):
            def __init__(self, d_head, n_heads):
                super().__init__(d_head, n_heads)
                self.scale = torch.nn.Parameter(torch.ones(n_heads, 1, 1))

        assert batch_problem(trial).startswith("similarity 'batch_test_again' cannot be folded")
    finally:
        components.unregister("similarity", "batch_test_again")


def test_a_batch_that_fails_as_a_whole_trains_its_trials_alone(setup, monkeypatch):
    config, data = setup
    trials = trials_of(config.replace(train_steps=6, log_every=3), data, rates=RATES[:2])

    train = Trainer.train

    def out_of_memory(self, *args, **kwargs):
        if self.size > 1:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return train(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train", out_of_memory)
    batch = run_batched(trials, data)
    alone = [run_training(t, data) for t in trials]
    for b, a in zip(batch, alone):
        assert "failed" in b.record.extra["batch_fallback"] and b.record.status == "ok"
        assert b.record.val_loss == a.record.val_loss and b.record.curve == a.record.curve


def test_a_batch_keeps_its_models_and_their_records_read_alike(setup, tmp_path):
    from evo_attention.train.saving import load_model, save_model

    config, data = setup
    results = run_batched(trials_of(config.replace(train_steps=10), data, rates=RATES[:2]), data)
    trainer = results[1].trainer
    assert isinstance(trainer, Member) and trainer.step == 10
    assert trainer.evaluate()["val_loss"] == results[1].record.val_loss
    save_model(trainer.model, tmp_path / "m", vocab=data.vocab)
    x, _ = next(data.eval_batches("valid", 4))
    trainer.model.eval()
    assert torch.equal(load_model(tmp_path / "m")(x), trainer.model(x))
    record = results[0].record.to_dict()
    json.dumps(record)
    assert record["batched"] == 2 and record["batch_time_s"] > 0


# -- the pieces --------------------------------------------------------------------------------------

def test_stacked_adamw_is_k_torch_adamws():
    torch.manual_seed(0)
    rates, decays = [1e-3, 3e-2, 5e-4], [0.01, 0.0, 0.1]
    singles = [[torch.nn.Parameter(torch.randn(5, 4)), torch.nn.Parameter(torch.randn(4))] for _ in rates]
    optims = [torch.optim.AdamW([{"params": [w], "weight_decay": d}, {"params": [b], "weight_decay": 0.0}], lr=r,
                                betas=(0.9, 0.95)) for (w, b), r, d in zip(singles, rates, decays)]
    stacked = [torch.nn.Parameter(torch.stack([s[i].detach() for s in singles])) for i in range(2)]
    adam = StackedAdamW({"weight": stacked[0], "bias": stacked[1]})  # decayed by the rule: the matrix only
    for _ in range(5):
        grads = [torch.randn(len(rates), 5, 4), torch.randn(len(rates), 4)]
        for k, (params, optim) in enumerate(zip(singles, optims)):
            for p, g in zip(params, grads):
                p.grad = g[k].clone()
            optim.step()
        for p, g in zip(stacked, grads):
            p.grad = g.clone()
        adam.step(rates, decays, [math.inf] * len(rates))  # no clipping
    for k, params in enumerate(singles):
        for p, s in zip(params, stacked):
            assert torch.equal(p.detach(), s.detach()[k])


def test_gradients_are_clipped_per_model():
    torch.manual_seed(1)
    grads = [torch.randn(3, 6, 2) * 3, torch.randn(3, 7)]
    limits = [1.0, 100.0, 0.5]
    stacked = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(stacked, grads):
        p.grad = g.clone()
    clip_per_model(stacked, limits)
    for k, limit in enumerate(limits):
        single = [torch.nn.Parameter(torch.zeros_like(g[k])) for g in grads]
        for p, g in zip(single, grads):
            p.grad = g[k].clone()
        torch.nn.utils.clip_grad_norm_(single, limit)
        for p, s in zip(single, stacked):
            assert torch.equal(p.grad, s.grad[k])



def test_models_that_differ_in_a_part_are_clipped_as_each_alone():
    # a Split's parameters hold some models' slices only: each model's norm must add its own parameters'
    # norms in its own order, as its clip_grad_norm_ does, not with zeros for the others' in between
    torch.manual_seed(3)
    for _ in range(20):
        shapes = [(6, 5), (7,), (3, 4), (9,)] * 8
        owners = [None if i % 3 == 0 else torch.tensor([i % 3 - 1]) for i in range(len(shapes))]
        grads = [torch.randn(2 if index is None else 1, *shape) * torch.rand(()) * 5
                 for shape, index in zip(shapes, owners)]
        stacked = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(stacked, grads):
            p.grad = g.clone()
        clip_per_model(stacked, [1.0, 1.0], owners)
        for k in range(2):
            own = [(g[0 if index is not None else k], s.grad[0 if index is not None else k])
                   for g, s, index in zip(grads, stacked, owners) if index is None or int(index) == k]
            single = [torch.nn.Parameter(torch.zeros_like(g)) for g, _ in own]
            for p, (g, _) in zip(single, own):
                p.grad = g.clone()
            torch.nn.utils.clip_grad_norm_(single, 1.0)
            assert all(torch.equal(p.grad, clipped) for p, (_, clipped) in zip(single, own))

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_loss_is_each_models_loss(dtype):
    from evo_attention.data.base import IGNORE_INDEX

    torch.manual_seed(2)
    k, n, d, vocab = 3, 300, 8, 11  # a short last chunk (chunk 128)
    hidden = torch.randn(k, n, d, requires_grad=True)
    weight = torch.randn(k, vocab, d, requires_grad=True)
    targets = torch.randint(vocab, (k, n))
    targets[1, ::7] = IGNORE_INDEX
    losses = linear_cross_entropy(hidden, weight, targets, chunk=128, dtype=dtype)
    (losses * torch.tensor([1.0, 2.0, 0.5])).sum().backward()
    for i, scale in enumerate([1.0, 2.0, 0.5]):
        h, w = hidden.detach()[i].clone().requires_grad_(), weight.detach()[i].clone().requires_grad_()
        loss = linear_cross_entropy(h, w, targets[i], chunk=128, dtype=dtype)
        (loss * scale).backward()
        assert torch.equal(loss.detach(), losses.detach()[i])
        assert torch.equal(h.grad, hidden.grad[i]) and torch.equal(w.grad, weight.grad[i])


def test_the_batch_draws_each_models_batches_and_dropout_stream(setup):
    config, data = setup
    trials = trials_of(config, data)
    batch = Trainer(trials, data)
    for trial, member in zip(trials, batch.members):
        single = Trainer(trial, data)
        assert torch.equal(next(single.batches)[0], next(member.batches)[0])
        assert torch.equal(torch.get_rng_state(), member.dropout_generator.get_state())  # right after its model


# -- precision auto ----------------------------------------------------------------------------------

@pytest.fixture
def probe_env(tmp_path, monkeypatch):
    """A fresh probe cache, a CPU with native bf16, and a fake probe that counts its calls."""
    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(environment.ENV_PRECISION_PROBE, "on")
    monkeypatch.setattr(environment, "_PRECISION_CHOICES", {})
    monkeypatch.setattr(environment, "cpu_has_fast_bf16", lambda: True)
    for name in ("_PINNED", "_USED"):
        monkeypatch.setattr(probe_cache, name, {})
    monkeypatch.setattr(probe_cache, "_WARNED", set())
    calls = []

    def fake(trial, data, device, **_):
        calls.append(trial.model.d_model)
        return {"fp32": 0.010, "bf16": 0.012} if trial.model.d_model < 128 else {"fp32": 0.030, "bf16": 0.020}

    monkeypatch.setattr(engine, "precision_step_times", fake)
    return calls


def timer(spec):
    """The timer a trainer hands choose_precision, for a shape (through the patched probe)."""
    return lambda: engine.precision_step_times(Trial("dot|softmax|none|fixed", 0, 1, model=spec), None, None)


def test_auto_precision_is_measured_per_shape_and_kept(probe_env, tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    small, large = Config(d_model=64, vocab_size=32).model, Config(d_model=128, vocab_size=10000).model
    assert environment.choose_precision("auto", cpu, small, seq_len=32, batch_size=32, timer=timer(small))[0] == "fp32"
    precision, reason = environment.choose_precision("auto", cpu, large, seq_len=128, batch_size=32,
                                                     timer=timer(large))
    assert precision == "bf16" and "30.0 ms" in reason and "20.0 ms" in reason
    assert probe_env == [64, 128]
    environment.choose_precision("auto", cpu, large, seq_len=128, batch_size=32, timer=timer(large))
    monkeypatch.setattr(environment, "_PRECISION_CHOICES", {})  # another process: reads the file
    assert environment.choose_precision("auto", cpu, large, seq_len=128, batch_size=32,
                                        timer=timer(large))[0] == "bf16"
    assert probe_env == [64, 128]
    files = sorted(tmp_path.glob("precision-*.json"))
    assert len(files) == 2 and {json.loads(f.read_text())["precision"] for f in files} == {"fp32", "bf16"}
    # another batch size is another shape; so is another dropout stream (its masks cost other time),
    # while the default stream keeps the file names probes had before streams existed
    environment.choose_precision("auto", cpu, large, seq_len=128, batch_size=8, timer=timer(large))
    assert probe_env == [64, 128, 128]
    environment.choose_precision("auto", cpu, large, seq_len=128, batch_size=8, timer=timer(large),
                                 dropout_stream="counter")
    assert probe_env == [64, 128, 128, 128] and len(list(tmp_path.glob("precision-*.json"))) == 4
    assert probe_cache.probe_shape(large, 128, 8, "cpu") == probe_cache.probe_shape(large, 128, 8)
    assert "dropout_stream" not in probe_cache.probe_shape(large, 128, 8)
    assert environment.choose_precision("bf16", cpu, small, seq_len=32, batch_size=32) == ("bf16", "set to bf16")


def test_the_first_answer_written_wins(probe_env, tmp_path):
    cpu = torch.device("cpu")
    spec = Config(d_model=128, vocab_size=100).model
    path = probe_cache.probe_path(probe_cache.probe_shape(spec, 16, 4), cpu, kind="precision",
                                  version=environment.PROBE_VERSION)
    path.write_text(json.dumps({"precision": "fp32", "fp32_ms": 1.0, "bf16_ms": 2.0, "measured_at": time.time()}))
    assert environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4, timer=timer(spec))[0] == "fp32"
    assert probe_env == []
    path.write_text("not json")  # damaged: probed again, the file repaired, said once
    environment._PRECISION_CHOICES.clear()
    with pytest.warns(UserWarning, match="is damaged: measured again and replaced"):
        assert environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4,
                                            timer=timer(spec))[0] == "bf16"
    assert json.loads(path.read_text())["precision"] == "bf16" and probe_env == [128]


def test_a_probe_answer_is_the_machines_whatever_threads_a_training_takes():
    # a training beside other work takes fewer threads (util.threads.sharing); its precision must not differ
    from evo_attention.util import threads

    shape = probe_cache.probe_shape(Config(d_model=128, vocab_size=100).model, 16, 4)
    with threads.using(1):
        alone = probe_cache.probe_path(shape, torch.device("cpu"), kind="precision", version=environment.PROBE_VERSION)
    with threads.using(2):
        assert probe_cache.probe_path(shape, torch.device("cpu"), kind="precision",
                                      version=environment.PROBE_VERSION) == alone
    # a run that pinned its answer under the name keyed on its thread count resumes on that answer
    old = {"v": environment.PROBE_VERSION, "device": "cpu", "cpu": probe_cache.cpu_name(),
           "threads": torch.get_num_threads(), "torch": torch.__version__, "shape": shape}
    answer = {"precision": "fp32", "fp32_ms": 1.0, "bf16_ms": 0.5, "measured_at": time.time()}
    probe_cache.pin_probes({f"precision-{fingerprint_of(old)[:16]}.json": answer})
    try:
        assert probe_cache.probe_answer(alone, lambda entry: True, measure=lambda: 1 / 0) == (answer, True)
    finally:
        probe_cache.pin_probes(None)


def test_a_probe_whose_rounds_disagree_chooses_fp32_and_is_kept(probe_env, tmp_path):
    """A busy machine disturbs some rounds: such an answer is fp32 (bf16's gain was not measured), and it is
    kept like any answer (it was not: a later idle probe chose bf16, so the same command on the same machine
    trained in another precision and gave other numbers, depending on the load when it first ran)."""
    cpu, spec = torch.device("cpu"), Config(d_model=128, vocab_size=100).model
    busy = {"fp32": 0.030, "bf16": 0.020, "spread": 3.0}
    precision, reason = environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4,
                                                     timer=lambda: busy)
    assert precision == "fp32" and reason.startswith("auto: fp32, the machine was too busy to measure bf16's gain")
    kept = list(tmp_path.glob("precision-*.json"))
    assert len(kept) == 1 and f"kept in {kept[0].name}" in reason
    environment._PRECISION_CHOICES.clear()  # another process: the kept answer, not a new measurement
    assert environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4,
                                        timer=lambda: 1 / 0) == (precision, reason)
    probe_cache.forget_probes()  # bench --reprobe: measured again, now steady
    environment._PRECISION_CHOICES.clear()
    assert environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4, timer=timer(spec))[0] == "bf16"


def test_auto_without_native_bf16_or_probe(probe_env, monkeypatch):
    cpu, spec = torch.device("cpu"), Config(d_model=128, vocab_size=100).model
    monkeypatch.delenv(environment.ENV_PRECISION_PROBE)  # the probe is on by default
    assert environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4, timer=timer(spec))[0] == "bf16"
    assert probe_env == [128]
    monkeypatch.setenv(environment.ENV_PRECISION_PROBE, "off")  # off: bf16 wherever the CPU has it, unmeasured
    small = Config(d_model=64, vocab_size=100).model
    assert environment.choose_precision("auto", cpu, small, seq_len=16, batch_size=4, timer=timer(small)) == (
        "bf16", f"auto: native bf16 on this CPU ({environment.ENV_PRECISION_PROBE}=off: not measured)")
    assert probe_env == [128]
    monkeypatch.setenv(environment.ENV_PRECISION_PROBE, "maybe")
    with pytest.raises(UserError, match=environment.ENV_PRECISION_PROBE):
        environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=8, timer=timer(spec))
    monkeypatch.setattr(environment, "cpu_has_fast_bf16", lambda: False)
    assert environment.choose_precision("auto", cpu, spec, seq_len=16, batch_size=4, timer=timer(spec)) == (
        "fp32", "auto: this CPU has no native bf16")
    assert probe_env == [128]
    with pytest.raises(UserError, match="unknown precision 'fp16'"):  # no loss scaling: not offered
        Config(precision="fp16")


def test_records_say_which_precision_ran_and_why(setup, probe_env):
    config, data = setup
    trial = Trial.from_config(VANILLA, config.replace(precision="auto", train_steps=4), data=data)
    record = run_training(trial, data).record
    assert record.precision == "fp32" and record.extra["precision_reason"].startswith("auto: measured")
    assert record.settings["precision"] == "auto"  # the key keeps the configured value
    assert run_batched([trial, trial.replace(seed=5)], data)[0].record.precision == "fp32"


def test_the_real_probe_times_both_precisions_and_leaves_the_rng_alone(setup, monkeypatch):
    config, data = setup
    trial = Trial.from_config(VANILLA, config.replace(d_model=16, n_heads=2, n_layers=1), data=data)
    evaluated = []  # a validation point is K evaluations, not a training step: never among the timed steps
    monkeypatch.setattr(Member, "validation_point", lambda self: evaluated.append(self.step))
    assert all(min(engine.validation_steps(engine.timing_budget(n))) > n for n in range(1, 200))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    times = engine.precision_step_times(trial, data, torch.device("cpu"), rounds=2, steps=1)
    assert set(times) == {"fp32", "bf16", "spread"} and all(t > 0 and math.isfinite(t) for t in times.values())
    assert times["spread"] >= 1.0
    assert torch.equal(torch.get_rng_state(), before)
    _, seconds = engine.step_seconds([trial.replace(steps=7), trial.replace(seed=1, steps=7)], data,
                                     device=torch.device("cpu"), warmup=2, steps=5)
    assert evaluated == [] and seconds > 0
