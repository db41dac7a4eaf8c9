"""The counter dropout stream (nn.dropout_counter, ``dropout_stream: counter``): its bits
against a plain-Python reference, its statistics, its keys, and trainings that use it (folded equals
alone, a seed reproduces, the step and call it hashes, CPU == CUDA)."""

import json
import math

import pytest
import torch

from evo_attention import Config
from evo_attention.cli import build_parser
from evo_attention.cli.common import config_from_args
from evo_attention.data import data_from_config
import evo_attention.nn.dropout_counter as counter_module
from evo_attention.nn.dropout import drop_threshold, dropout, mask_source
from evo_attention.nn.dropout_counter import counter_key, counter_keep_mask
from evo_attention.train import trainer as engine
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import Trainer, run_batched, run_training
from evo_attention.util.errors import UserError

# -- a plain-Python reference, written from the definition in nn/dropout_counter.py's docstring ------

M32, M64 = 2**32 - 1, 2**64 - 1


def ref_splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def ref_key(seed: int, step: int, call: int) -> tuple[int, int]:
    z = ref_splitmix(ref_splitmix(ref_splitmix(seed % 2**64) ^ step) ^ call)
    return (z % 2**31) | 1, z >> 32


def ref_lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) % 2**32
    x ^= x >> 15
    x = (x * 0x846CA68B) % 2**32
    return x ^ (x >> 16)


def ref_keep(seed: int, step: int, call: int, n: int, p: float) -> list[bool]:
    """The keep bits of one model's n elements, one by one."""
    a, b = ref_key(seed, step, call)
    threshold = round(p * 65536)
    out = []
    for i in range(n):
        h = ref_lowbias32((a * (i // 2) + b) % 2**32)
        lane = (h >> (16 * (i % 2))) & 0xFFFF
        signed = lane - 65536 if lane >= 32768 else lane  # the lane read as a signed 16-bit number
        out.append(signed >= threshold - 32768)
    return out


CASES = [((7,), 0.1, 0, 0, 0), ((3, 5), 0.5, 1, 0, 3), ((2, 3, 5, 7), 0.25, 42, 17, 1), ((1, 1), 0.9, 2**40, 4999, 6),
         ((64, 33), 0.1, 123, 2**33, 2**20), ((4, 4, 16, 16), 0.3, -5, 3, 2)]


@pytest.mark.parametrize("shape,p,seed,step,call", CASES)
def test_the_tensor_mask_is_the_reference_bit_for_bit(shape, p, seed, step, call):
    assert counter_key(seed, step, call) == ref_key(seed, step, call)
    mask = counter_keep_mask(shape, p, [counter_key(seed, step, call)])
    assert mask.dtype == torch.bool and mask.shape == shape
    assert mask.flatten().tolist() == ref_keep(seed, step, call, math.prod(shape), p)


def test_the_device_form_and_the_cpu_form_are_the_same_function(monkeypatch):
    """The int64 tensor ops a GPU runs, run here on the CPU, against the CPU's numpy form, and both
    against the reference where a mask crosses the CPU form's blocks."""
    keys = [counter_key(s, 3, 1) for s in (0, 1, 2)]
    for pairs in (1, 2, 1000, counter_module._CPU_BLOCK + 5):
        assert torch.equal(counter_module._counter_lanes_torch(pairs, keys, "cpu"),
                           counter_module._counter_lanes_numpy(pairs, keys))
        assert torch.equal(counter_module._counter_lanes_torch(pairs, keys[:1], None),
                           counter_module._counter_lanes_numpy(pairs, keys[:1]))
        table = torch.tensor(keys, dtype=torch.int64)  # keys already in a tensor (a CUDA graph's form)
        assert torch.equal(counter_module._counter_lanes_torch(pairs, table, "cpu"),
                           counter_module._counter_lanes_numpy(pairs, keys))
        assert torch.equal(counter_module._counter_lanes_torch(pairs, table[1:2], "cpu"),
                           counter_module._counter_lanes_numpy(pairs, keys[1:2]))
    assert torch.equal(counter_keep_mask((3, 7), 0.3, torch.tensor(keys)), counter_keep_mask((3, 7), 0.3, keys))
    monkeypatch.setattr(counter_module, "_CPU_BLOCK", 4)
    for n in (7, 8, 9, 33):  # blocks of 4 pairs: whole and partial blocks, odd and even sizes
        mask = counter_keep_mask((2, n), 0.4, [counter_key(0, 1, 2), counter_key(1, 1, 2)])
        assert mask[0].tolist() == ref_keep(0, 1, 2, n, 0.4) and mask[1].tolist() == ref_keep(1, 1, 2, n, 0.4)


def test_folded_models_each_get_the_mask_they_get_alone():
    streams = [(0, 5, 2), (1, 5, 2), (9, 5, 2)]
    keys = [counter_key(*s) for s in streams]
    for rows in ((3, 7, 5), (6, 4, 4, 3)):  # an odd part of 35 elements, an even one
        shape = (len(keys) * rows[0], *rows[1:])
        folded = counter_keep_mask(shape, 0.3, keys)
        for k, key in enumerate(keys):
            part = folded[k * rows[0]:(k + 1) * rows[0]]
            assert torch.equal(part, counter_keep_mask(rows, 0.3, [key]))
            assert part.flatten().tolist() == ref_keep(*streams[k], math.prod(rows), 0.3)
    with pytest.raises(RuntimeError, match="does not split over 3 models"):
        counter_keep_mask((4, 5), 0.3, keys)


def test_other_seeds_steps_and_calls_give_unrelated_masks():
    n, p = 200_000, 0.5
    base = counter_keep_mask((n,), p, [counter_key(3, 10, 1)])
    assert torch.equal(base, counter_keep_mask((n,), p, [counter_key(3, 10, 1)]))  # a pure function
    for other in ((4, 10, 1), (3, 11, 1), (3, 10, 2), (2**32 + 3, 10, 1)):
        mask = counter_keep_mask((n,), p, [counter_key(*other)])
        agree = (mask == base).double().mean().item()  # independent fair bits agree half the time
        assert abs(agree - 0.5) < 5 * math.sqrt(0.25 / n), (other, agree)
    keys = {counter_key(seed, step, call) for seed in range(4) for step in range(50) for call in range(8)}
    assert len(keys) == 4 * 50 * 8


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
def test_the_drop_rate_is_the_rounded_probability_within_binomial_noise(p):
    n = 2_000_000
    q = drop_threshold(p) / 65536
    dropped = 1.0 - counter_keep_mask((n,), p, [counter_key(7, 1, 0)]).double().mean().item()
    assert abs(dropped - q) < 5 * math.sqrt(q * (1 - q) / n), (p, dropped)


def test_neighbouring_lanes_are_uncorrelated_and_each_lane_is_fair():
    m = counter_keep_mask((1_000_000,), 0.5, [counter_key(11, 0, 0)]).double()
    for lag in (1, 2, 3, 4):  # the two lanes of one hash, and the next hashes
        corr = torch.corrcoef(torch.stack([m[:-lag], m[lag:]]))[0, 1].item()
        assert abs(corr) < 0.006, (lag, corr)
    assert torch.all((m.view(-1, 2).mean(0) - 0.5).abs() < 0.005)


def test_dropout_with_the_counter_source_scales_the_kept_and_drops_the_rest():
    x = torch.randn(6, 4, 8, 8, requires_grad=True)
    key = counter_key(0, 0, 0)
    with mask_source(lambda shape, p: counter_keep_mask(shape, p, [key])):
        y = dropout(x, 0.1)
    kept = counter_keep_mask(x.shape, 0.1, [key])
    scale = 65536 / (65536 - drop_threshold(0.1))
    assert torch.equal(y, x.detach() * kept * scale)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, kept.float() * scale)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_give_the_same_bits():
    for shape, p, seed, step, call in CASES + [((4096, 4, 32, 32), 0.1, 5, 123, 4)]:
        keys = [counter_key(seed, step, call)]
        cpu = counter_keep_mask(shape, p, keys)
        cuda = counter_keep_mask(shape, p, keys, device="cuda")
        assert cuda.device.type == "cuda" and torch.equal(cpu, cuda.cpu()), shape
    keys = [counter_key(s, 7, 3) for s in range(16)]  # folded: the keys copied to the device
    assert torch.equal(counter_keep_mask((16 * 32, 4, 64, 64), 0.1, keys),
                       counter_keep_mask((16 * 32, 4, 64, 64), 0.1, keys, device="cuda").cpu())


# -- trainings on the counter stream -------------------------------------------------------------------

SMALL = dict(data="recall", vocab_size=32, max_seq_len=32, recall={"num_pairs": 4, "train_examples": 2000,
                                                                   "eval_examples": 200},
             d_model=32, n_heads=4, n_layers=2, dropout=0.1, batch_size=16, eval_batch_size=100, eval_steps=None,
             learning_rate=2e-3, train_steps=12, log_every=4, precision="fp32", dropout_stream="counter",
             device="cpu")  # bitwise claims (folded = alone) are the CPU's; a GPU's are within rounding
VANILLA = "dot|softmax|none|fixed|bias|0.10"  # attention dropout 0.1 and model dropout 0.1: every site drops


@pytest.fixture(scope="module")
def setup():
    config = Config(**SMALL)
    return config, data_from_config(config)


def test_the_setting_is_checked_reaches_the_key_only_when_set_and_has_a_flag(setup):
    config, data = setup
    with pytest.raises(UserError, match="unknown dropout_stream 'gpu'") as caught:
        Config(dropout_stream="gpu")
    assert caught.value.settings == ("dropout_stream",)
    default = Trial.from_config(VANILLA, config.replace(dropout_stream="cpu"), data=data)
    counter = Trial.from_config(VANILLA, config, data=data)
    assert "dropout_stream" not in default.settings() and counter.settings()["dropout_stream"] == "counter"
    assert default.key() != counter.key()
    args = build_parser().parse_args(["baseline", "--preset", "quick", "--dropout-stream", "counter"])
    assert config_from_args(args).dropout_stream == "counter"


def test_each_step_hashes_its_step_and_numbers_its_calls_from_zero(setup, monkeypatch):
    config, data = setup
    seen = []
    real = engine.counter_keep_mask
    monkeypatch.setattr(engine, "counter_keep_mask", lambda shape, p, keys, device=None: seen.append(keys)
                        or real(shape, p, keys, device))
    trainer = Trainer(Trial.from_config(VANILLA, config.replace(seed=3, train_steps=2), data=data), data)
    trainer.train()
    sites = len(seen) // 2  # per layer: attention weights, attention output, feed-forward; plus the embedding
    assert sites == 1 + 3 * config.n_layers
    assert seen == [[counter_key(3, step, call)] for step in range(2) for call in range(sites)]


def test_a_seed_reproduces_its_training_and_the_stream_is_part_of_it(setup):
    """(Folded against alone: tests/test_batched.py, for both streams.)"""
    config, data = setup
    trial = Trial.from_config(VANILLA, config.replace(seed=1), data=data)
    once, again = run_training(trial, data), run_training(trial, data)
    assert once.record.status == "ok" and once.record.curve == again.record.curve
    assert once.record.val_loss == again.record.val_loss
    cpu = run_training(trial.replace(train=trial.train.replace(dropout_stream="cpu")), data)
    assert cpu.record.val_loss != once.record.val_loss  # another stream, another training


def test_a_partial_training_continues_exactly(setup):
    config, data = setup
    trial = Trial.from_config(VANILLA, config, data=data)
    first = run_batched([trial.replace(steps=8, budget=12), trial.replace(seed=5, steps=8, budget=12)], data,
                        keep_state=True)[0]
    resumed = run_training(trial.replace(budget=12), data, state=first.state).record
    straight = run_training(trial, data).record
    assert resumed.resumed_from == 8 and resumed.val_loss == straight.val_loss and resumed.curve == straight.curve


def test_the_cpu_benchmark_runs_both_streams_and_writes_its_json(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_dropout.py"
    spec = importlib.util.spec_from_file_location("bench_dropout", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--smoke", "--out", str(tmp_path / "d.json")])
    assert json.loads((tmp_path / "d.json").read_text()) == result
    assert result["machine"]["torch"] == torch.__version__ and result["settings"]["smoke"] is True
    for row in [*result["masks"].values(), result["step"]]:
        assert set(row) >= {"cpu", "counter", "ratio_counter_vs_cpu"}
        assert all(row[arm]["ms_median"] > 0 and len(row[arm]["ms_rounds"]) == 1 for arm in ("cpu", "counter"))
    assert "| quick preset training step |" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a real run takes the median of at least 5 rounds
        bench.main(["--rounds", "3", "--out", str(tmp_path / "x.json")])


def test_a_compiled_training_draws_the_counter_masks_eagerly_without_recompiling():
    """A compiled forward calls the counter's mask function outside the graph
    (``torch.compiler.disable``): its step and call would otherwise be guards that recompile every
    step. The graphs made for 4 steps serve 8 as well, and the compiled training draws the same
    masks as the eager one (the same loss to rounding)."""
    from torch._dynamo.utils import counters

    from evo_attention.train.environment import cpp_compiler

    if cpp_compiler() is None:
        pytest.skip("torch.compile's CPU backend needs a C++ compiler")
    data_name = "mad:selective_copy:seq_len=12,copy=2,vocab=12,train_examples=64,eval_examples=16"
    config = Config(d_model=16, n_heads=2, n_layers=1, d_ff=32, batch_size=4, eval_batch_size=16, eval_steps=1,
                    max_seq_len=12, log_every=2, data=data_name, compile="on", dropout_stream="counter",
                    precision="fp32")
    data = data_from_config(config)
    graphs, losses = {}, {}
    for steps in (4, 8):
        counters.clear()
        result = run_training(Trial.from_config(VANILLA, config.replace(train_steps=steps), data=data), data)
        record = result.record
        assert record.status == "ok" and record.compiled is True
        graphs[steps], losses[steps] = counters["stats"]["unique_graphs"], record.val_loss
    assert graphs[8] == graphs[4] > 0
    eager = run_training(Trial.from_config(VANILLA, config.replace(train_steps=8, compile="off"), data=data), data).record
    assert eager.compiled is False and losses[8] == pytest.approx(eager.val_loss, rel=1e-5)


def test_device_cuda_draws_masks_on_the_device_unless_told_otherwise(capsys, monkeypatch):
    from argparse import Namespace

    from evo_attention.cli.common import explicit_settings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert explicit_settings(Namespace(device="cuda"))["dropout_stream"] == "counter"
    assert "--dropout-stream counter, the GPU default" in capsys.readouterr().err
    assert explicit_settings(Namespace(device="cuda:1", dropout_stream="cpu"))["dropout_stream"] == "cpu"
    assert "dropout_stream" not in explicit_settings(Namespace(device="cuda", resume=True))  # keeps its stream
    assert "dropout_stream" not in explicit_settings(Namespace(device="cpu"))


def test_device_cuda_without_cuda_is_refused_without_the_note_on_its_masks(capsys, monkeypatch):
    from argparse import Namespace

    from evo_attention.cli.common import explicit_settings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="CUDA is not available"):
        explicit_settings(Namespace(device="cuda"))
    assert "dropout masks" not in capsys.readouterr().err
