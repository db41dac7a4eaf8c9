"""The optimized training path computes what the plain implementation computes."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from evo_attention import AttentionGene, Config, TinyTransformer
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.nn.losses import linear_cross_entropy, linear_nll_stats
from evo_attention.train.trainer import Trainer

# the plain eager model the benchmarks time the real step against (benchmarks/reference_model.py)
_spec = importlib.util.spec_from_file_location(
    "reference_model", Path(__file__).resolve().parents[1] / "benchmarks" / "reference_model.py")
reference_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference_model)
PlainTransformer, plain_loss = reference_model.PlainTransformer, reference_model.plain_loss


@pytest.mark.parametrize("chunk", [7, 1024])
def test_fused_chunked_loss_equals_cross_entropy(chunk):
    torch.manual_seed(0)
    h = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(300, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 300, (50,))
    y[::5] = -100  # never scored
    expected = F.cross_entropy(h @ w.t(), y, ignore_index=-100)
    gh, gw = torch.autograd.grad(expected * 3.0, (h, w))
    got = linear_cross_entropy(h, w, y, chunk=chunk, dtype=torch.float64)
    fh, fw = torch.autograd.grad(got * 3.0, (h, w))
    assert torch.allclose(got.double(), expected, atol=1e-6)
    assert torch.allclose(fh, gh, atol=1e-10) and torch.allclose(fw.double(), gw, atol=1e-10)
    nll, correct, count = linear_nll_stats(h, w, y, chunk=chunk, dtype=torch.float64)
    assert int(count) == 40
    assert float(nll) / 40 == pytest.approx(expected.item(), rel=1e-6)
    assert int(correct) == int((((h @ w.t()).argmax(-1) == y) & (y != -100)).sum())


@pytest.mark.parametrize("rows", [300, 2100])  # one partial chunk; several chunks and weight groups
def test_bf16_fused_loss_is_within_bf16_rounding_of_the_exact_one(rows):
    torch.manual_seed(0)
    h = (torch.randn(rows, 32, dtype=torch.float64) * 2).requires_grad_()
    w = (torch.randn(500, 32, dtype=torch.float64) * 0.5).requires_grad_()
    y = torch.randint(0, 500, (rows,))
    y[::3] = -100
    y[1] = int((h[1].detach() @ w.detach().t()).argmin())  # a target far below the row's max logit
    expected = F.cross_entropy(h @ w.t(), y, ignore_index=-100)
    gh, gw = torch.autograd.grad(expected, (h, w))
    hf, wf = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    got = linear_cross_entropy(hf, wf, y, dtype=torch.bfloat16)
    got.backward()
    assert got.dtype == torch.float32 and torch.isfinite(got)
    assert got.item() == pytest.approx(expected.item(), rel=1e-2)
    for mine, exact in ((hf.grad, gh), (wf.grad, gw)):
        assert mine.dtype == torch.float32
        assert ((mine.double() - exact).norm() / exact.norm()).item() < 1e-2
    assert (hf.grad[::3] == 0).all()  # unscored rows: exactly no gradient


def test_the_loss_of_a_vanishing_target_probability_is_finite_and_exact():
    """-log p(target) underflows where p < 1e-38 in float32; max - picked - log(max p) does not."""
    h = torch.tensor([[1.0, 0.0]])
    w = torch.tensor([[100.0, 0.0], [-100.0, 0.0], [0.0, 0.0]])
    y = torch.tensor([1])
    got = linear_cross_entropy(h, w, y)
    expected = torch.logsumexp(torch.tensor([100.0, -100.0, 0.0], dtype=torch.float64), 0) + 100.0
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_all_targets_ignored_gives_zero_loss_and_gradient():
    h = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(10, 8, requires_grad=True)
    loss = linear_cross_entropy(h, w, torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0 and (h.grad == 0).all() and (w.grad == 0).all()


def test_training_step_matches_the_plain_implementation():
    config = Config(vocab_size=200, d_model=32, n_heads=4, n_layers=2, max_seq_len=16, dropout=0.0,
                    batch_size=4, precision="fp32")
    torch.manual_seed(0)
    gene = AttentionGene.parse("dot|softmax|none|fixed|bias|0.00")
    model = TinyTransformer(config, gene)
    plain = PlainTransformer.from_tiny(model)
    x = torch.randint(0, 200, (4, 16))
    y = torch.randint(0, 200, (4, 16))
    y[:, :3] = -100
    expected = plain_loss(plain, x, y)
    expected.backward()
    hidden, _ = model.hidden_states(x)
    got = linear_cross_entropy(hidden, model.head.weight, y)
    got.backward()
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(model.tok_emb.weight.grad, plain.tok_emb.weight.grad, atol=1e-6)
    fused_qkv = model.blocks[0].attn.qkv.weight.grad
    split = torch.cat([plain.blocks[0].attn.q.weight.grad, plain.blocks[0].attn.k.weight.grad,
                       plain.blocks[0].attn.v.weight.grad])
    assert torch.allclose(fused_qkv, split, atol=1e-6)


def test_trainer_evaluation_equals_plain_perplexity():
    config = Config(data="recall", vocab_size=32, max_seq_len=32, recall={"num_pairs": 4, "train_examples": 500,
                                                                          "eval_examples": 100},
                    d_model=32, n_heads=4, n_layers=1, dropout=0.0, eval_steps=None, train_steps=3, precision="fp32")
    data = data_from_config(config)
    trainer = Trainer.from_config("dot|softmax|none|fixed|bias|0.00", config, data)
    trainer.train()
    result = trainer.evaluate("valid")
    plain = PlainTransformer.from_tiny(trainer.model).eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for x, y in data.eval_batches("valid", 64):
            nll += plain_loss(plain, x, y).item() * int((y != -100).sum())
            n += int((y != -100).sum())
    assert result["eval_tokens"] == n
    assert result["val_loss"] == pytest.approx(nll / n, rel=1e-5)


def test_bench_command_json_keys(capsys):
    assert main(["bench", "--preset", "quick", "--steps", "2", "--warmup", "1", "--d-model", "16",
                 "--layers", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ["ms_per_step", "tokens_per_s", "flops_per_step", "achieved_flops_per_s", "est_evaluation_s",
                "est_search_s", "peak_flops_per_s", "mfu", "decode_tokens_per_s"]:
        assert key in result and result[key] > 0
    assert result["train_steps"] == 400 and result["planned_evaluations"] == 27
    assert result["mfu"] == pytest.approx(result["achieved_flops_per_s"] / result["peak_flops_per_s"])


def test_the_matmul_probe_is_cached_per_machine(monkeypatch):
    from evo_attention.train import bench

    first = bench.matmul_peak("cpu", "fp32", repeats=1)
    assert first > 1e8  # any CPU of this century: more than 0.1 GFLOP/s
    monkeypatch.setattr(bench.torch, "randn", lambda *a, **k: pytest.fail("measured again instead of the cache"))
    assert bench.matmul_peak("cpu", "fp32") == first


def test_a_damaged_matmul_probe_is_said_once_and_replaced(tmp_path, monkeypatch):
    from evo_attention.train import bench

    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path))
    bench.matmul_peak("cpu", "fp32", repeats=1)
    path = next(tmp_path.glob("matmul-peak-*.json"))
    path.write_text('{"x":')
    with pytest.warns(UserWarning, match="is damaged: measured again and replaced"):
        peak = bench.matmul_peak("cpu", "fp32", repeats=1)
    assert json.loads(path.read_text())["flops_per_s"] == peak


def test_bench_profile_lists_the_step_s_operators(capsys):
    assert main(["bench", "--preset", "quick", "--d-model", "16", "--layers", "1", "--warmup", "1", "--profile"]) == 0
    table = capsys.readouterr().out
    assert "aten::mm" in table and "Self CPU" in table


def test_compile_auto_only_where_it_was_measured_to_pay(monkeypatch):
    from evo_attention.train import environment
    from evo_attention.util.errors import UserError

    cpu = torch.device("cpu")
    additive, dot = AttentionGene.parse("additive|softmax|none|fixed"), AttentionGene.vanilla()
    monkeypatch.setattr(environment, "cpp_compiler", lambda: "g++")
    assert environment.resolve_compile("auto", cpu, [dot, additive], 5000)
    assert not environment.resolve_compile("auto", cpu, [dot, dot], 5000)
    assert not environment.resolve_compile("auto", cpu, [additive], 400)  # too short to repay the compile
    assert not environment.resolve_compile("off", cpu, [additive], 5000)
    assert environment.resolve_compile("on", cpu, [dot], 10)
    monkeypatch.setattr(environment, "cpp_compiler", lambda: None)
    assert not environment.resolve_compile("auto", cpu, [additive], 5000)
    with pytest.raises(UserError, match="no C.. compiler"):
        environment.resolve_compile("on", cpu, [dot], 10)


def test_a_compiled_training_matches_the_eager_one_and_says_so():
    from evo_attention.train.trainer import train_and_evaluate

    config = Config(data="recall", vocab_size=32, max_seq_len=16, d_model=16, n_heads=2, n_layers=1,
                    recall={"num_pairs": 2, "train_examples": 200, "eval_examples": 50},
                    dropout=0.0, eval_steps=None, train_steps=4, log_every=2, precision="fp32")
    data = data_from_config(config)
    gene = "dot|softmax|none|fixed|bias|0.00"
    eager = train_and_evaluate(gene, config.replace(compile="off"), data)
    compiled = train_and_evaluate(gene, config.replace(compile="on"), data)
    assert (eager.compiled, compiled.compiled) == (False, True)
    assert compiled.flops_per_step == eager.flops_per_step
    assert compiled.val_loss == pytest.approx(eager.val_loss, rel=1e-4)
    assert compiled.key == eager.key  # the same result: compiling is not part of the cache key


def test_the_flop_count_prices_the_fused_and_the_explicit_attention_path_alike():
    from evo_attention.train.trainer import train_and_evaluate

    config = Config(data="recall", vocab_size=32, max_seq_len=16, d_model=16, n_heads=2, n_layers=1,
                    recall={"num_pairs": 2, "train_examples": 200, "eval_examples": 50},
                    dropout=0.0, eval_steps=None, train_steps=2, log_every=1, precision="fp32")
    data = data_from_config(config)
    fused = train_and_evaluate("dot|softmax|none|fixed|bias|0.00", config, data)  # SDPA's CPU kernel
    explicit = train_and_evaluate("dot|softmax|none|fixed|bias|0.10", config, data)  # dropout: explicit path
    assert fused.flops_per_step == explicit.flops_per_step
    # attention's products are in the count: a window skips most of a long sequence's scores
    assert fused.flops_per_step > train_and_evaluate("dot|softmax|none|fixed|bias|0.00|win=2", config, data).flops_per_step
    # the GPU kernels are priced alike: two products forward, their four gradients backward
    from evo_attention.train.trainer import sdpa_flop_formulas

    q, kv = (2, 8, 64, 16), (2, 4, 64, 16)  # grouped K/V heads too
    formulas = {op.__name__: f for op, f in sdpa_flop_formulas().items()}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention"):
        forward, backward = formulas[name], formulas[f"{name}_backward"]
        assert forward(q, kv, kv) == 2 * (2 * 2 * 8 * 64 * 64 * 16)  # q k^T and p v: 2 flops per multiply-add
        assert backward(q, q, kv, kv) == 2 * forward(q, kv, kv)


TINY_BENCH = dict(data="recall", vocab_size=16, max_seq_len=16, recall={"num_pairs": 2, "train_examples": 256,
                                                                        "eval_examples": 64},
                  d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, precision="fp32")


def test_a_matmul_limit_below_what_a_step_achieved_is_measured_again(tmp_path, monkeypatch):
    """A limit kept from a busy machine (here 1 FLOP/s) cannot be right once a training step beats
    it: bench measures it again, keeps the new answer, and never reports an mfu above 1."""
    from evo_attention.train import bench

    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EVO_ATTENTION_BATCH_MODELS", "off")
    bench.matmul_peak("cpu", "fp32", repeats=1)
    path = next(tmp_path.glob("matmul-peak-*.json"))
    path.write_text(json.dumps({"flops_per_s": 1.0}))
    config = Config(**TINY_BENCH)
    result = bench.bench_gene("dot|softmax|none|fixed", config, data_from_config(config), steps=2, warmup=1,
                              time_eval=False, time_decode=False)
    assert result["achieved_flops_per_s"] > 1.0 and result["peak_flops_per_s"] > 1.0
    assert result["mfu"] is None or 0 < result["mfu"] <= 1
    assert json.loads(path.read_text())["flops_per_s"] == result["peak_flops_per_s"]


def test_bench_reprobe_forgets_the_kept_probe_answers(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EVO_ATTENTION_BATCH_MODELS", "off")
    kept = ["precision-0000000000000000.json", "batch-models-0000000000000000.json",
            "matmul-peak-0000000000000000.json"]
    for name in kept + ["corpus-keep.json"]:
        (tmp_path / name).write_text("{}")
    (tmp_path / "c.yaml").write_text(json.dumps(TINY_BENCH))
    assert main(["bench", "--reprobe", "--config", str(tmp_path / "c.yaml"), "--steps", "1", "--warmup", "1",
                 "--json"]) == 0
    assert "forgot 3 kept probe answers" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in kept) and (tmp_path / "corpus-keep.json").exists()


def test_bench_reprobe_with_a_bad_flag_forgets_nothing(tmp_path, monkeypatch):
    """It forgot every kept answer (a busy machine's kept fp32 among them) and then refused --lr nan."""
    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path))
    (tmp_path / "precision-0000000000000000.json").write_text("{}")
    for bad in (["--lr", "nan"], ["--gene", "dot|nosuchnorm"]):
        assert main(["bench", "--reprobe", "--preset", "quick", *bad]) == 2
        assert (tmp_path / "precision-0000000000000000.json").exists()


def test_the_engine_gives_torch_compile_no_lock_to_break_its_graph_on():
    """A pass's cached mask and score bias are plain attributes: ``functools.cached_property`` takes a
    lock before Python 3.12, and Dynamo breaks the graph at each first access of one."""
    from evo_attention.nn.spec import ModelSpec
    spec = ModelSpec(vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_seq_len=8, dropout=0.0)
    model = TinyTransformer(spec, "additive|softmax|none|fixed").eval()
    explained = torch._dynamo.explain(model.hidden_states)(torch.randint(0, 32, (2, 8)))
    assert not [b for b in explained.break_reasons if "lock" in str(b.reason).lower()]
