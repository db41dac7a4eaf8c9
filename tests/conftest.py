"""Shared fixtures: small configs, the path of the shared WikiText-2 corpus."""

import json
import os
from pathlib import Path

import pytest
import torch

from evo_attention import Config
from evo_attention.search.executors import LocalExecutor

REPO = Path(__file__).resolve().parents[1]
WIKITEXT_DIR = REPO.parent / "shared" / "data" / "wikitext-2"

# Trainings in tests never depend on timing, module- and session-scoped fixtures included (they are
# built before any function-scoped fixture could set these): batch_models auto means off, and
# precision auto is not measured (bf16 where the CPU has it, fp32 elsewhere). A test of either probe
# changes the variable with monkeypatch, which restores it.
os.environ["EVO_ATTENTION_BATCH_MODELS"] = "off"
os.environ["EVO_ATTENTION_PRECISION_PROBE"] = "off"
# A search's fresh-seed check (studies.fresh_check) trains 4 genes on 2 more seeds: off for the many tiny
# searches of the suite, on in the tests of the check itself (test_climb.py), which delete this variable.
os.environ["EVO_ATTENTION_FRESH_CHECK"] = "off"
# A training that starts beside other busy processes takes the cores they leave free (util.threads):
# results would then depend on what else runs on the machine; the test of it sets the variable.
os.environ["EVO_ATTENTION_SHARE_CORES"] = "off"


class CountingExecutor(LocalExecutor):
    """The local executor, counting what it trains; it stops the run (as Ctrl-C does) after
    ``stop_after`` trainings."""

    def __init__(self, stop_after=None):
        self.trained = []
        self.stop_after = stop_after

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append(task.gene)
            yield task, record
            if self.stop_after is not None and len(self.trained) >= self.stop_after:
                raise KeyboardInterrupt


def train_a_few(model, loss_of, vocab: int, steps: int = 4, length: int = 12) -> list[float]:
    """``steps`` AdamW steps (lr 1e-2) on random ids (4 x ``length``, a fixed generator) of a model
    whose loss on ids is ``loss_of(ids)``; the losses, the model left in eval mode."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    losses = []
    model.train()
    for _ in range(steps):
        ids = torch.randint(0, vocab, (4, length), generator=generator)
        loss = loss_of(ids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def assert_resume_is_uninterrupted(config, tmp_path, stop_after: int, trainings: int) -> None:
    """The search of ``config`` stopped after ``stop_after`` trainings and resumed retrains only the
    ``trainings - stop_after`` missing ones and ends as the uninterrupted run in ``tmp_path / "full"``."""
    from evo_attention import Evolution

    with Evolution(config, out_dir=tmp_path / "cut", executor=CountingExecutor(stop_after=stop_after)) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    resumed = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "cut", resume=True, executor=resumed) as evo:
        evo.run()
    assert len(resumed.trained) == trainings - stop_after
    full, cut = (json.loads((tmp_path / d / "final_results.json").read_text()) for d in ("full", "cut"))
    for key in ["best_gene", "best_perplexity", "history", "top_5"]:
        assert full[key] == cut[key], key


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never write the tokenization cache into the home directory from tests."""
    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def tiny_config():
    return Config(vocab_size=50, d_model=16, n_heads=2, n_layers=2, max_seq_len=12, dropout=0.0)


@pytest.fixture
def wikitext_dir():
    if not (WIKITEXT_DIR / "valid.txt").exists():
        pytest.skip(f"shared WikiText-2 corpus not found at {WIKITEXT_DIR}")
    return WIKITEXT_DIR


@pytest.fixture
def shakespeare_dir():
    found = REPO.parent / "shared" / "data" / "shakespeare"
    if not (found / "valid.txt").exists():
        pytest.skip(f"shared Shakespeare corpus not found at {found}")
    return found


torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

# The CLI flags of a study test (validate, ablate, compare, baseline, ...): a 16-dim 1-layer model on
# the recall task, 2 training steps and 2 evaluation batches, so a study's test trains in seconds.
STUDY_FLAGS = ["--data", "recall", "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2",
               "--batch-size", "4", "--eval-batch-size", "16", "--eval-steps", "2", "--quiet"]


# Axes that, cycled beside the components, put every position option, rank, relative bias,
# window and grouped-K/V setting into a short list of genes (heads: 4, so kvh 1 and 2 divide them);
# one carries recipe parts, which the model ignores (the trainers apply them).
COVERING_AXES = ("pos=learned|lr=0.002|wd=0.05", "pos=rope|kvh=1|dconv=3", "pos=rope:ntk:4|win=3", "pos=alibi|abias=rel",
                 "pos=none|rank=4|kvh=2|dconv=2", "pos=rope:linear:2|rank=8|abias=rel|win=4", "pos=learned|abias=rel|win=2")


def covering_gene_keys(skip=frozenset()) -> list:
    """Gene keys in which every registered option of every component (but the ``(field, name)``
    pairs in ``skip``) and every axis option appears at least once, with and without biases."""
    from evo_attention.genes import CATEGORICAL_FIELDS, OPTIONS

    from evo_attention.genes import KERNEL_NORMALIZATIONS

    options = [[name for name in OPTIONS[f] if (f, name) not in skip] for f in CATEGORICAL_FIELDS]
    n = max(max(len(o) for o in options), len(COVERING_AXES))
    keys = []
    for i in range(n):
        parts = [o[i % len(o)] for o in options]
        axes = COVERING_AXES[i % len(COVERING_AXES)]
        if parts[1] in KERNEL_NORMALIZATIONS:  # the validity rules: a dot-product similarity, no score bias
            parts[0] = ("dot", "cosine")[i % 2]
            axes = "|".join(a for a in axes.split("|") if a != "abias=rel").replace("pos=alibi", "pos=rope")
        keys.append("|".join(parts) + ("|nobias|0.00|" if i % 2 else "|bias|0.10|") + axes)
    # the kernel normalizations once more without a window: their running-sum paths
    keys += [f"cosine|{name}|highway|adaptive|bias|0.00|pos=rope|kvh=2" for name in options[1]
             if name in KERNEL_NORMALIZATIONS]
    return keys + PROGRAM_KEYS


# Programs that, together, take every path of the engine (nn.program: fused softmax, explicit
# weights, kernel running sums, along-time ops, gates, the projection input) beside the axes; every
# op itself is held to the contracts by tests/test_programs.py without a list.
PROGRAM_KEYS = [
    "prog=o(sgate(mix(w.softmax(t.learned(s.dot(dconv3(q),lfeat(k)))),scale(v))))|pos=rope|kvh=2",
    "prog=g.highway(o(add(decay(v),mix(w.none(sdecay(s.additive(q,k))),bias(shift(v))))))|nobias|0.00|pos=alibi",
    "prog=pin(gi.input_gate(x),lin(o(kmix(elu1(dconv2(q)),sqrelu(k),cummean(v)))))|win=3",
    "prog=o(kmix.favor(t.adaptive(l2n(q)),rmsn(k),dconv4(v)))|bias|0.00|pos=none|rank=4",
]


@pytest.fixture
def covering_genes():
    return covering_gene_keys


@pytest.fixture
def plugin(monkeypatch):
    """tests/plugins/example_plugin.py imported as a user's plugin (it registers the op hgate and the
    task shifted_copy); unregistered afterwards."""
    import sys

    from evo_attention.data import unregister_task
    from evo_attention.nn.program import unregister_op

    monkeypatch.syspath_prepend(str(REPO / "tests" / "plugins"))
    import example_plugin  # noqa: F401
    yield
    unregister_op("hgate")
    unregister_task("shifted_copy")
    sys.modules.pop("example_plugin", None)


UNFOLDABLE_SIMILARITY = "test_unfolded_scale"


@pytest.fixture
def unfoldable_similarity():
    """A registered similarity with a weight of its own (a learned scale per head) and no folded
    form: its trials cannot share a batch. Yields its name; unregistered afterwards."""
    from evo_attention.nn import components

    @components.register_similarity(UNFOLDABLE_SIMILARITY)
    class UnfoldedScale(components.Similarity):
        def __init__(self, d_head, n_heads):
            super().__init__(d_head, n_heads)
            self.scale = torch.nn.Parameter(torch.ones(n_heads, 1, 1))

        def forward(self, q, k):
            return self.scale * (q @ k.transpose(-2, -1))

    yield UNFOLDABLE_SIMILARITY
    components.unregister("similarity", UNFOLDABLE_SIMILARITY)
