"""A training step replayed as a CUDA graph (train/graph.py): the same numbers as the eager step.

On the CPU a stand-in graph runs the captured body again at each replay, on the graph's static
inputs: the trainer's side of the contract (the batch, the rate and the dropout keys of each step
reach the body; the steps before the capture are ordinary ones) against the plain eager training,
bit for bit. On a CUDA device the real capture is held to the eager training too.
"""

import pytest
import torch

from evo_attention.data import data_from_config
from evo_attention.genes import AttentionGene
from evo_attention.train import graph
from evo_attention.train.presets import build_config
from evo_attention.train.trainer import Trainer, run_training
from evo_attention.train.spec import Trial


class EagerGraph(graph.StepGraph):
    """The body, captured as a function, runs eagerly at each replay on the static inputs."""

    def __init__(self, device, body, before_capture):
        self.device, self.body, self.before_capture = device, body, before_capture
        self.graph, self.keys, self.calls, self.captured_at, self.failure = None, None, 0, None, None
        self.x = self.y = self.losses = None
        self.replays = 0

    def warm(self, step):
        return step()

    def capture(self, x, y, calls, at_step):
        self.x, self.y, self.calls = torch.empty_like(x), torch.empty_like(y), calls
        self.keys = torch.zeros(calls, 2, dtype=torch.int64) if calls else None
        self.graph, self.captured_at = "eager stand-in", at_step
        return True

    def replay(self, x, y, keys):
        self.x.copy_(x)
        self.y.copy_(y)
        if self.keys is not None:
            self.keys.copy_(torch.tensor(keys, dtype=torch.int64))
        self.before_capture()  # a real graph rewrites the gradients; eagerly they start from none
        self.losses = self.body(self.x, self.y)
        self.replays += 1
        return self.losses


def _config(**changes):
    settings = {"train_steps": 12, "log_every": 4, "compile": "off", "d_model": 32, "batch_size": 8,
                "dropout_stream": "counter", "dropout": 0.1, "lr_schedule": "cosine", "warmup_steps": 3}
    settings.update(changes)
    return build_config("quick", overrides=settings)


def _train(config, gene, device="cpu"):
    data = data_from_config(config)
    trainer = Trainer.from_config(AttentionGene.parse(gene), config, data, device=device)
    trainer.train()
    return trainer, [p.detach().float().cpu().clone() for p in trainer.model.parameters()], trainer.curve


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("gene", ["dot|softmax|none|fixed|bias|0.10",
                                  "multiplicative|entmax15|output_gate|adaptive|bias|0.10|pos=rope|kvh=2"])
def test_the_replayed_body_is_the_eager_step(monkeypatch, precision, gene):
    config = _config(precision=precision)
    _, plain, plain_curve = _train(config, gene)
    monkeypatch.setattr(graph, "graph_problem", lambda *args: None)
    monkeypatch.setattr(Trainer, "graph_class", EagerGraph)
    trainer, replayed, curve = _train(config, gene)
    g = trainer.graph
    assert isinstance(g, EagerGraph) and g.captured_at == graph.CAPTURE_AFTER
    assert g.replays == config.train_steps - graph.CAPTURE_AFTER and g.calls > 0  # dropout keys were replayed
    assert curve == plain_curve
    assert all(torch.equal(a, b) for a, b in zip(plain, replayed))


def test_a_captured_step_that_reads_no_keys_would_differ(monkeypatch):
    """The check above can fail: replaying with the keys of the capture's step (not each step's own)
    changes the training."""
    config = _config()
    _, plain, _ = _train(config, "dot|softmax|none|fixed|bias|0.10")

    class StaleKeys(EagerGraph):
        def replay(self, x, y, keys):
            return super().replay(x, y, self.first or self.__dict__.setdefault("first", keys))
        first = None

    monkeypatch.setattr(graph, "graph_problem", lambda *args: None)
    monkeypatch.setattr(Trainer, "graph_class", StaleKeys)
    _, stale, _ = _train(config, "dot|softmax|none|fixed|bias|0.10")
    assert not all(torch.equal(a, b) for a, b in zip(plain, stale))


def test_masks_drawn_on_the_cpu_keep_the_step_eager(monkeypatch):
    monkeypatch.setattr(graph, "graph_problem", lambda *args: None)
    monkeypatch.setattr(Trainer, "graph_class", EagerGraph)
    trainer, _, _ = _train(_config(dropout_stream="cpu"), "dot|softmax|none|fixed|bias|0.10")
    assert trainer.graph is None and trainer.graph_problem == "dropout masks drawn on the CPU (dropout_stream cpu)"
    trainer, _, _ = _train(_config(dropout_stream="cpu", dropout=0.0), "dot|softmax|none|fixed|bias|0.00")
    assert trainer.graph is not None and trainer.graph.replays > 0  # no dropout at all: nothing is drawn


def test_what_is_not_graphed_and_why():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graph.graph_problem("auto", cuda, 1, False) is None
    assert graph.graph_problem("off", cuda, 1, False) == "cuda_graph off"
    assert graph.graph_problem("auto", cuda, 4, False) == "4 models folded into one step"
    assert graph.graph_problem("auto", cuda, 1, True) == "the model is compiled"
    assert graph.graph_problem("auto", cpu, 1, False) == "not on CUDA (cpu)"
    trainer, _, _ = _train(_config(), "dot|softmax|none|fixed|bias|0.10")
    assert trainer.graph is None and trainer.graph_state() is None  # the CPU: no graph, nothing recorded


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("gene", ["dot|softmax|none|fixed|bias|0.10",
                                  "multiplicative|entmax15|output_gate|adaptive|bias|0.10|pos=rope|kvh=2",
                                  "additive|sparsemax|input_gate|learned|bias|0.00",
                                  "dot|softmax|none|fixed|bias|0.10|prog=o(kmix(sqrelu(q),exp(v),k))"])
def test_cuda_graph_training_is_the_eager_training(precision, gene):
    config = _config(precision=precision, train_steps=30, log_every=10)
    eager, plain, plain_curve = _train(config.replace(cuda_graph="off"), gene, device="cuda")
    graphed, replayed, curve = _train(config, gene, device="cuda")
    assert eager.graph_state() == "eager: cuda_graph off"
    assert graphed.graph_state() == f"captured at step {graph.CAPTURE_AFTER}", graphed.graph_state()
    worst = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item() for a, b in zip(replayed, plain))
    print(f"{gene} {precision}: graphed vs eager, largest relative difference of a weight {worst:.3g}")
    assert worst <= 1e-6
    assert [s for s, _ in curve] == [s for s, _ in plain_curve]


@needs_cuda
def test_a_step_that_cannot_be_captured_trains_eagerly_and_says_why(monkeypatch):
    config = _config(train_steps=12, log_every=4)
    gene = "dot|softmax|none|fixed|bias|0.10"
    _, plain, _ = _train(config.replace(cuda_graph="off"), gene, device="cuda")
    body = Trainer._graph_body

    def reads_the_host(self, x, y):
        float(x.sum())  # waits for the device: not allowed while a stream is captured
        return body(self, x, y)

    monkeypatch.setattr(Trainer, "_graph_body", reads_the_host)
    trainer, eager, _ = _train(config, gene, device="cuda")
    state = trainer.graph_state()
    assert state.startswith("eager: capture failed (") and "previous error" not in state, state
    assert all(torch.equal(a, b) for a, b in zip(plain, eager))


@needs_cuda
def test_a_cuda_record_says_how_its_steps_ran():
    gene = AttentionGene.parse("dot|softmax|none|fixed|bias|0.10")
    for stream, said in (("counter", f"captured at step {graph.CAPTURE_AFTER}"),
                         ("cpu", "eager: dropout masks drawn on the CPU (dropout_stream cpu)")):
        config = _config(train_steps=8, log_every=4, dropout_stream=stream)
        data = data_from_config(config)
        record = run_training(Trial.from_config(gene, config, data=data), data, device="cuda").record
        assert record.ok and record.extra["cuda_graph"] == said


def test_a_batch_of_another_shape_ends_the_graph_and_training_goes_on(monkeypatch):
    monkeypatch.setattr(graph, "graph_problem", lambda *args: None)
    monkeypatch.setattr(Trainer, "graph_class", EagerGraph)
    config = _config()
    data = data_from_config(config)
    trainer = Trainer.from_config(AttentionGene.parse("dot|softmax|none|fixed|bias|0.10"), config, data, device="cpu")
    member, batches = trainer.members[0], trainer.members[0].batches

    def odd():  # a loader's short last batch at step 6
        for step, (x, y) in enumerate(batches, start=1):
            yield (x[:-1], y[:-1]) if step == 6 else (x, y)

    member.batches = odd()
    trainer.train()
    assert trainer.step == config.train_steps and trainer.graph is None
    assert trainer.graph_problem == f"a batch of another shape ({(config.batch_size - 1, data.seq_len)}) at step 6"
