"""A plugin that registers a program op and a generated task, with no edit anywhere else, gives a
program search whose programs use the op, the op folded equal to alone, and the task as a suite
point and a curve's task (tests/plugins/example_plugin.py)."""

import json
import sqlite3
import sys
import types

import pytest
import torch

from evo_attention import Config, programs
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.data.base import IGNORE_INDEX
from evo_attention.data.suites import parse_suite
from evo_attention.genes import program_grammar
from evo_attention.report import load_run
from evo_attention.report.attachments import CURVE_RESULTS
from evo_attention.train import trainer as engine
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_batched, run_training
from evo_attention.util.errors import UserError
from test_programs import assert_contracts, programs_using


REMOVE_FIRST = "exists already with .*: choose another name, or remove the existing one first"


def test_the_op_joins_the_language_and_every_contract(plugin):
    grammar = program_grammar()
    assert "hgate" in grammar.ops and programs.OPS["hgate"].kind == "learned"
    program = programs.parse("o(hgate(mix(w.softmax(t.fixed(s.dot(q,k))),v)))", grammar)
    assert str(program) == "o(hgate(mix(w.softmax(t.fixed(s.dot(q,k))),v)))"
    with pytest.raises(programs.ProgramError, match=REMOVE_FIRST):
        programs.add_op(programs.Op("hgate", (programs.signature("X->X"),), "learned"))
    drawn = programs_using("hgate", grammar)  # the same contracts as every built-in op
    assert drawn
    for i, program in enumerate(drawn):
        assert_contracts(program, seed=i)


@pytest.mark.parametrize("name,signature,apply,problem", [
    ("shift", "H->H", lambda call, z: z, "exists already"),  # a built-in: same signature and kind, still refused
    ("mix", "H->H", lambda call, z: z, "exists already"),
    ("const", "H->H", lambda call, z: z, "not an input or 'const'"),
    ("zeroh", "->H", lambda call: None, "at least one argument"),
    ("notfn", "H->H", 3, "must be functions"),
    ("nosig", [], lambda call, z: z, "one or more signatures"),
    ("badsig", 5, lambda call, z: z, "one or more signatures"),
    (123, "H->H", lambda call, z: z, "give a name"),
    # reads the next position / every key of a row / the whole block input: a program with it sees the future
    ("peek", "H->H", lambda call, z: torch.roll(z, -1, dims=-2), "reads future positions"),
    ("rowmean", "S->S", lambda call, s: s - s.mean(-1, keepdim=True), "reads future positions"),
    ("xsum", "T->T", lambda call, z: z + call.x.sum(1).mean(), "reads future positions"),
    # reads 4 positions ahead; raises on 4 positions (the longer probe sees it); only on sequences over 4
    ("look4", "H->H", lambda call, z: z + torch.roll(z, -4, dims=-2), "reads future positions as H->H"),
    ("topk5", "H->H", lambda call, z: z + z.topk(5, dim=-2).values.mean(-2, keepdim=True), "reads future"),
    ("long", "H->H", lambda call, z: z + (z.mean(-2, keepdim=True) if z.shape[-2] > 4 else 0), "reads future"),
    # reads 20 positions ahead (zeros past the end): only a probe of over 20 positions sees it
    ("look20", "H->H", lambda call, z: z + torch.nn.functional.pad(z, (0, 0, 0, 20))[..., 20:, :], "reads future"),
    # its value at position t depends on how many positions follow: decoding could not match the forward pass
    ("lenscale", "T->T", lambda call, z: z * z.shape[-2], r"\(its value depends on the sequence length\) as X->X"),
    ("cummeanT", "H->H", lambda call, z: z.cumsum(-2) * (1 / z.shape[-2]), r"sequence length\) as H->H"),
    ("prevt", "T->T", lambda call, z: torch.nn.functional.pad(z, (0, 0, 1, 0))[..., :-1, :],
     "reads future positions as S->S"),  # the previous row is causal for values, not for scores
    # K models fold into one batch: a row must not read another; the probe runs in train mode too
    ("batchmix", "H->H", lambda call, z: z - z.mean(0, keepdim=True), "mixes batch rows as H->H"),
    ("trainpeek", "H->H", lambda call, z: z - z.mean(-2, keepdim=True) if call.attn.training else z,
     "reads future positions in train mode as H->H"),
    # what a program computes is finite and of its type's shape (elementwise: as clipped to +-CLIP)
    ("logz", "T->T", lambda call, z: torch.log(z), "gives NaN or inf as X->X at its initial weights on random"),
    ("narrow", "H->H", lambda call, z: z[..., :2], r"returns shape \(2, 2, 4, 2\) as H->H, where a tensor of \[B"),
    ("nothing", "H->H", lambda call, z: None, "returns None as H->H"),
    # of its inputs' dtype (another fails in training: "mat1 and mat2 must have the same dtype")
    ("tolong", "H->H", lambda call, z: z.long(), "returns torch.int64 as H->H on torch.float32 inputs: keep its "),
    ("todouble", "T->T", lambda call, z: z.double(), "returns torch.float64 as X->X on torch.float32 inputs"),
    # F is a non-negative feature (kmix's normaliser needs it)
    ("negfeat", "H->F", lambda call, z: z, r"gives negative values as H->F at its initial weights on random inputs"),
])
def test_a_registration_that_would_change_or_break_the_language_is_refused(name, signature, apply, problem):
    from evo_attention import register_op

    before = dict(programs.OPS)
    kind = "time" if name in ("shift", "zeroh", "peek", "look4", "topk5", "long", "look20", "cummeanT",
                              "prevt") else "elementwise"
    with pytest.raises(programs.ProgramError, match=problem) as info:
        register_op(name, signature, kind, apply=apply)
    assert programs.OPS == before and "\n" not in str(info.value)


def test_a_module_that_reads_the_batch_or_the_future_in_train_mode_is_refused_in_its_mode_restored():
    from evo_attention import register_op
    from evo_attention.nn import components

    built = []

    def build(shapes):  # batch statistics over every position in train mode; per position in eval mode
        built.append(torch.nn.BatchNorm2d(shapes.n_heads).eval())
        return built[-1]
    with pytest.raises(programs.ProgramError, match=r"^program op 'headnorm' reads future positions in train "
                                                    r"mode as H->H: [^\n]*$"):
        register_op("headnorm", "H->H", "learned", apply=lambda call, z: call.module(z), build=build)
    assert "headnorm" not in programs.OPS and built and not built[0].training

    class BatchCentered(components.Similarity):  # minus the batch's mean score
        def forward(self, q, k):
            s = q @ k.transpose(-2, -1)
            return s - s.mean(0, keepdim=True)
    with pytest.raises(UserError, match="^similarity 'batch_centered' mixes batch rows: "):
        components.register_similarity("batch_centered")(BatchCentered)
    assert "batch_centered" not in components.SIMILARITIES

    class LengthScaled(components.Similarity):  # divided by the sequence length: decoding would differ
        def forward(self, q, k):
            return q @ k.transpose(-2, -1) / q.shape[-2]
    with pytest.raises(UserError, match=r"^similarity 'length_scaled' reads future positions \(its value "
                                        r"depends on the sequence length\): [^\n]*$"):
        components.register_similarity("length_scaled")(LengthScaled)
    assert "length_scaled" not in components.SIMILARITIES


def test_the_causality_probe_passes_every_built_in_op_and_a_causal_time_op():
    from evo_attention import register_op
    from evo_attention.nn import program as engine_ops

    assert not [name for name, impl in engine_ops.IMPLEMENTATIONS.items()
                if engine_ops._probe(programs.OPS[name], impl)]
    lag = lambda call, z: torch.cat([torch.zeros_like(z[..., :1, :]), z[..., :-1, :]], -2)  # noqa: E731
    register_op("lag1", "H->H", "time", apply=lag)
    # random draws in an op (its own dropout) are no leak: the probe draws them alike in both runs
    register_op("noisy", "X->X", "learned", apply=lambda call, z: call.module(z),
                build=lambda shapes: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1)))
    try:
        assert "lag1" in programs.OPS and "noisy" in programs.OPS
        with pytest.raises(programs.ProgramError, match="exists already with another"):  # the first stays
            register_op("lag1", "H->H", "time", apply=lambda call, z: torch.roll(z, -1, dims=-2))
        assert engine_ops.IMPLEMENTATIONS["lag1"].apply is lag
    finally:
        engine_ops.unregister_op("lag1")
        engine_ops.unregister_op("noisy")


def test_finiteness_is_judged_at_the_initial_weights_and_nan_from_random_weights_is_no_verdict():
    """A positive-initialised scale under a square root gives NaN only at the probe's random (negative)
    weights: it is accepted; so is a causal running sum by a lower-triangular matmul, where random
    weights' NaN at later positions would reach the earlier rows (0 * NaN), and it reads other positions.
    NaN on any input the probe feeds an op (not only its first) refuses it, with weights or without."""
    from evo_attention import register_op
    from evo_attention.nn import components
    from evo_attention.nn.program import PerModel, unregister_op

    class LearnedScale(PerModel):  # s starts at 1
        def __init__(self, heads):
            super().__init__()
            self.s = torch.nn.Parameter(torch.ones(1, 1, heads, 1, 1))

        def forward(self, z):
            return (z.reshape(self.s.shape[0], -1, *z.shape[1:]) / self.s.sqrt()).reshape(z.shape)

    class LogRun(LearnedScale):  # log(1 + s z^2), summed over positions so far
        def forward(self, z):
            zz = z.reshape(self.s.shape[0], -1, *z.shape[1:])
            t = z.shape[-2]
            lower = (torch.arange(t)[:, None] >= torch.arange(t)).to(z.dtype)
            return (lower @ (1 + self.s * zz.square()).log()).reshape(z.shape)
    try:
        register_op("ysqrt", "H->F", "feature", apply=lambda c, z: c.module(z.abs()),  # an F: non-negative
                    build=lambda s: LearnedScale(s.n_heads))
        register_op("logrun", "H->H", "time", apply=lambda c, z: c.module(z), build=lambda s: LogRun(s.n_heads))
        assert "ysqrt" not in components.ACROSS_POSITIONS and "logrun" in components.ACROSS_POSITIONS
        with pytest.raises(programs.ProgramError, match=r"^program op 'yneg' gives NaN or inf as H->F at its initial "
                                                        r"weights on random inputs: keep its values finite$"):
            register_op("yneg", "H->F", "feature", apply=lambda c, z: c.module(-z.abs()).sqrt(),
                        build=lambda s: LearnedScale(s.n_heads))
        for build in (lambda s: LearnedScale(s.n_heads), None):  # NaN only where an input, as moved (+3), exceeds 5
            with pytest.raises(programs.ProgramError, match=r"^program op 'ymoved' gives NaN or inf as H->F at "
                                                            r"its initial weights on random inputs: keep its values"):
                register_op("ymoved", "H->F", "feature", build=build, apply=lambda c, z: (c.module or (lambda v: v))(
                    torch.where(z > 5, float("nan"), z.abs())))
    finally:
        unregister_op("ysqrt")
        unregister_op("logrun")


@pytest.mark.parametrize("broken, says", [
    (lambda x, y: (x[:, :-3], y[:, :-3]), "not int64 (16, 12)"),
    (lambda x, y: (x, y.masked_fill(y >= 0, 99)), "ids or targets outside [0, 8)"),
    (lambda x, y: (x, torch.full_like(y, IGNORE_INDEX)), "rows without exactly 10 scored target(s)"),
    (lambda x, y: (x, y.masked_fill(y >= 0, 0)), "scored targets equal to the pad id 0"),  # <pad> is never scored
    (lambda x, y: None, "not a pair (x, y) of tensors"),
])
def test_a_task_whose_generate_breaks_the_contract_is_one_line_naming_it(plugin, broken, says):
    """Caught when the data is built, before any training could record it against a gene."""
    from evo_attention.data.synthetic import TASKS, SyntheticData, register_task, unregister_task

    class Broken(type(TASKS["shifted_copy"])):
        def generate(self, n, k, generator, seed):
            return broken(*super().generate(n, k, generator, seed))

    register_task("broken_copy", Broken)
    try:
        with pytest.raises(UserError, match=r"^task broken_copy: generate\(16, \.\.\.\) returned ") as info:
            SyntheticData("broken_copy", seq_len=12, train_examples=16, eval_examples=16)
        assert says in str(info.value) and "\n" not in str(info.value)
    finally:
        unregister_task("broken_copy")


def test_a_program_search_uses_the_op(plugin, tmp_path):
    (tmp_path / "space.yaml").write_text(
        "search_space:\n  program: {max_nodes: 7, ops: [o, mix, w.softmax, s.dot, t.fixed, hgate, shift]}\n")
    run = tmp_path / "run"
    assert main(["search", "--preset", "quick", "--steps", "3", "--population", "4", "--generations", "2",
                 "--elite", "1", "--d-model", "16", "--heads", "2", "--layers", "1", "--quiet",
                 "--plugin", "example_plugin", "--config", str(tmp_path / "space.yaml"), "--out", str(run)]) == 0
    with sqlite3.connect(run / "run.db") as conn:
        rows = conn.execute("SELECT gene, status FROM evaluations WHERE role = 'search'").fetchall()
    assert rows and all(status == "ok" for _, status in rows)
    assert any("hgate(" in gene for gene, _ in rows)


def test_the_op_folded_equals_it_alone(plugin):
    config = Config(data="recall", vocab_size=32, max_seq_len=16, recall={"num_pairs": 4, "train_examples": 500,
                                                                         "eval_examples": 100},
                    d_model=16, n_heads=2, n_layers=1, batch_size=8, eval_batch_size=50, eval_steps=None,
                    train_steps=6, log_every=3, precision="fp32")
    data = data_from_config(config)
    gene = "prog=o(hgate(mix(w.softmax(t.fixed(s.dot(q,hgate(k)))),v)))"
    trials = [Trial.from_config(gene, config.replace(seed=s, learning_rate=lr), data=data)
              for s, lr in ((0, 3e-2), (1, 1e-2))]
    batch, alone = run_batched(trials, data), [run_training(t, data) for t in trials]
    for b, a in zip(batch, alone):
        assert b.record.extra["batched"] == 2 and "batch_fallback" not in b.record.extra
        assert abs(b.record.val_loss - a.record.val_loss) <= engine.SAME_RESULT_RTOL["fp32"] * a.record.val_loss
        logits = [dict(r.trainer.model.named_parameters()) for r in (b, a)]
        assert any("logit" in name for name in logits[0])


def test_an_op_with_a_buffer_drawn_per_seed_folds_each_model_with_its_own():
    """A PerModel op's buffer with a leading dimension of 1 folds as its parameters do: each model
    its own (here features drawn per seed at build), so each seed folded gives what it gives alone;
    a model leaving the batch takes its buffer along. A buffer of another shape that differs between
    the models refuses the fold: those trials train alone and say why."""
    from evo_attention import register_op
    from evo_attention.nn.fold import Rows, fold_models
    from evo_attention.nn.program import PerModel, unregister_op

    class RandFeat(PerModel):
        def __init__(self, h, d, leading=(1,)):
            super().__init__()
            self.register_buffer("proj", torch.randn(*leading, h, d, d))
            self.s = torch.nn.Parameter(torch.ones(1, 1, h, 1, 1))

        def forward(self, z):
            s = self.p("s")
            zm = z.reshape(s.shape[0], -1, *z.shape[1:])
            return (torch.relu(zm @ self.proj) * s).reshape(z.shape)

    config = Config(data="recall", vocab_size=32, max_seq_len=16, recall={"num_pairs": 4, "train_examples": 500,
                                                                         "eval_examples": 100},
                    d_model=16, n_heads=2, n_layers=1, batch_size=8, eval_batch_size=50, eval_steps=None,
                    train_steps=6, log_every=3, precision="fp32")
    data = data_from_config(config)
    try:
        register_op("rfeat", "H->F", "feature", apply=lambda c, z: c.module(z),
                    build=lambda s: RandFeat(s.n_heads, s.d_head))
        register_op("rfeat2", "H->F", "feature", apply=lambda c, z: c.module(z),
                    build=lambda s: RandFeat(s.n_heads, s.d_head, leading=()))
        trials = [Trial.from_config("prog=o(kmix(rfeat(q),rfeat(k),v))", config.replace(seed=s), data=data)
                  for s in (43, 44, 45)]
        batch, alone = run_batched(trials, data), [run_training(t, data) for t in trials]
        for b, a in zip(batch, alone):
            assert b.record.extra["batched"] == 3 and "batch_fallback" not in b.record.extra
            assert b.record.val_loss == a.record.val_loss and b.record.curve == a.record.curve  # model 0's: 1e-4 off
        parts = [torch.nn.Sequential(RandFeat(2, 4)) for _ in range(3)]
        fold = fold_models(parts, Rows())
        fold.keep([0, 2])
        assert torch.equal(fold.model[0].p("proj"), torch.cat([parts[0][0].proj, parts[2][0].proj]))
        shared = [Trial.from_config("prog=o(kmix(rfeat2(q),rfeat2(k),v))", config.replace(seed=s), data=data)
                  for s in (43, 44)]
        for b, a in zip(run_batched(shared, data), [run_training(t, data) for t in shared]):
            assert "has a buffer 'proj' that differs between the models" in b.record.extra["batch_fallback"]
            assert b.record.val_loss == a.record.val_loss
    finally:
        unregister_op("rfeat")
        unregister_op("rfeat2")


def test_the_task_is_a_suite_point_and_a_curve_task(plugin, tmp_path):
    suite = parse_suite({"suite": "mine", "points": [{"task": "shifted_copy", "knobs": {"seq_len": 16, "vocab": 8}}]})
    assert suite.points[0].task == "shifted_copy"
    out = tmp_path / "curve"
    assert main(["curve", "--genes", "baseline", "--data", "shifted_copy:seq_len=16", "--knob", "delay=1,2",
                 "--plugin", "example_plugin", "--out", str(out), "--quiet", "--d-model", "16", "--heads", "2",
                 "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4", "--eval-batch-size", "16"]) == 0
    written = json.loads((out / CURVE_RESULTS).read_text())
    assert [p["knobs"]["delay"] for p in written["points"]] == [1, 2]


def test_an_op_registered_again_is_harmless_as_the_same_code_and_refused_as_other_code():
    from evo_attention import register_op
    from evo_attention.nn import program as engine_ops

    def plugin():  # a plugin's functions, made again as its second import makes them
        return dict(apply=lambda call, z: z * 2.0, fold=lambda v: v * 2.0)
    register_op("dbl", "H->H", "elementwise", **plugin())
    try:
        register_op("dbl", "H->H", "elementwise", **plugin())  # equal code: harmless
        first = engine_ops.IMPLEMENTATIONS["dbl"].apply
        with pytest.raises(programs.ProgramError, match=REMOVE_FIRST):
            register_op("dbl", "H->H", "elementwise", apply=lambda call, z: z * 3.0)
        assert engine_ops.IMPLEMENTATIONS["dbl"].apply is first
        other = types.ModuleType("other_plugin")  # the same code in another plugin reads other globals
        exec(compile("SCALE = 3.0\ndef apply(call, z):\n    return z * SCALE\n", "<other>", "exec"), other.__dict__)
        mine = types.ModuleType("my_plugin")
        exec(compile("SCALE = 2.0\ndef apply(call, z):\n    return z * SCALE\n", "<other>", "exec"), mine.__dict__)
        register_op("scaled", "H->H", "elementwise", apply=mine.apply)
        with pytest.raises(programs.ProgramError, match="exists already with another implementation"):
            register_op("scaled", "H->H", "elementwise", apply=other.apply)
    finally:
        engine_ops.unregister_op("dbl")
        engine_ops.unregister_op("scaled")


OP_PLUGIN = ("import torch\nfrom evo_attention import register_op\n"
             "register_op('vsoftplus', 'H->H', 'elementwise', apply=lambda call, z: torch.nn.functional.softplus(z))\n")
TINY = ["--d-model", "16", "--heads", "2", "--layers", "1", "--quiet"]
SMALL = ["--steps", "1", "--vocab-size", "32", "--batch-size", "4", "--eval-steps", "1", *TINY]


def _forget_the_op():  # as in a new process: neither the op nor the plugin's module is known
    from evo_attention.nn.program import unregister_op

    unregister_op("vsoftplus")
    sys.modules.pop("evo_attention_plugin_softplus_op", None)


@pytest.fixture(scope="module")
def op_run(tmp_path_factory):
    """A tiny program search whose best gene uses the op of a plugin file; the op forgotten afterwards."""
    folder = tmp_path_factory.mktemp("op_run")
    (folder / "softplus_op.py").write_text(OP_PLUGIN)
    (folder / "space.yaml").write_text(
        "search_space:\n  attention_dropout: [0.1]\n  use_bias: [true]\n"  # the best gene differs in its program only
        "  program: {max_nodes: 7, ops: [o, mix, w.softmax, s.dot, t.fixed, vsoftplus]}\n")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(folder)  # the run stores the relative path: it names the file from this folder only
            assert main(["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
                         "--elite", "1", "--no-baseline", "--seed", "3", *TINY, "--plugin", "softplus_op.py",
                         "--config", "space.yaml", "--out", "run"]) == 0
        assert "vsoftplus(" in load_run(folder / "run").best_gene
    finally:
        _forget_the_op()
    yield folder
    _forget_the_op()


@pytest.mark.parametrize("command", [
    ["ablate", "--seeds", "2", *SMALL],
    ["compare", "--configs", "baseline", "--seeds", "1", "--data", "recall", *SMALL]])
def test_ablate_and_compare_from_the_run_import_its_plugins_before_its_best_gene(op_run, command, monkeypatch):
    monkeypatch.chdir(op_run)
    _forget_the_op()
    out = op_run / command[0]
    assert main([*command, "--from-run", str(op_run / "run"), "--out", str(out)]) == 0
    written = (out / ("ablation.json" if command[0] == "ablate" else "compare_results.json")).read_text()
    assert "vsoftplus(" in written


@pytest.mark.parametrize("command, written", [
    (["validate", "--seeds", "2", *SMALL], "validation.json"),
    (["transfer", "--seeds", "2", "--sizes", "16x1,32x1", "--top", "1", *SMALL], "transfer.json"),
    (["attention-maps", "--quiet"], "attention_maps.json")])
def test_a_study_from_the_run_with_another_plugin_imports_the_run_s_too(op_run, command, written, monkeypatch):
    monkeypatch.chdir(op_run)
    (op_run / "unrelated.py").write_text("")
    _forget_the_op()
    out = op_run / f"with_{command[0]}"
    assert main([*command, "--from-run", "run", "--plugin", "unrelated.py", "--out", str(out)]) == 0
    assert "vsoftplus(" in (out / written).read_text()


def test_report_imports_the_run_s_plugins_and_names_a_missing_one(op_run, monkeypatch, capsys):
    (op_run / "elsewhere").mkdir()
    monkeypatch.chdir(op_run / "elsewhere")  # the stored softplus_op.py names nothing here
    _forget_the_op()
    assert main(["report", "../run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plugin file softplus_op.py does not exist in" in err and "--plugin PATH" in err and "\n" not in err
    for command in (["report", "../run", "--plugin", "../softplus_op.py"], ["status", "../run"]):
        _forget_the_op()
        assert main(command) == 0
    (op_run / "run" / "best_program.png").unlink()
    monkeypatch.chdir(op_run)  # where the run started, the stored path names the file
    _forget_the_op()
    assert main(["report", "run"]) == 0
    assert "## The best gene's program" in (op_run / "run" / "report.md").read_text()
    assert (op_run / "run" / "best_program.png").is_file()


def _forget_the_modules():  # as in a new process: the op and the modules module_run stored are not imported
    _forget_the_op()
    for name in ("softplus_mod", "noop_mod"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def module_run(tmp_path_factory):
    """A tiny program search storing two plugin modules: softplus_mod, whose op its genes use, and noop_mod,
    which no gene uses."""
    folder = tmp_path_factory.mktemp("module_run")
    (folder / "softplus_mod.py").write_text(OP_PLUGIN)
    (folder / "noop_mod.py").write_text('"""nothing genes use"""\n')
    (folder / "space.yaml").write_text(
        "search_space:\n  attention_dropout: [0.1]\n  use_bias: [true]\n"
        "  program: {max_nodes: 7, ops: [o, mix, w.softmax, s.dot, t.fixed, vsoftplus]}\n")
    _forget_the_modules()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(folder)  # the modules are imported from this folder only
            patch.setattr(sys, "path", list(sys.path))
            assert main(["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
                         "--elite", "1", "--no-baseline", "--seed", "3", *TINY, "--plugin", "softplus_mod",
                         "--plugin", "noop_mod", "--config", "space.yaml", "--out", "run"]) == 0
        assert "vsoftplus(" in load_run(folder / "run").best_gene
    finally:
        _forget_the_modules()
    yield folder
    _forget_the_modules()


def test_report_refuses_a_plugin_that_cannot_be_imported_only_where_a_gene_needs_it(module_run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (module_run / "empty").mkdir()
    monkeypatch.chdir(module_run / "empty")  # neither module can be imported here
    _forget_the_modules()
    assert main(["report", "../run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plugin softplus_mod could not be imported (ModuleNotFoundError" in err and "\n" not in err
    (module_run / "with_op").mkdir()
    (module_run / "with_op" / "softplus_mod.py").write_text(OP_PLUGIN)
    monkeypatch.chdir(module_run / "with_op")  # the op's module is here, noop_mod (no gene uses it) is not
    _forget_the_modules()
    (module_run / "run" / "best_program.png").unlink(missing_ok=True)
    assert main(["report", "../run"]) == 0
    assert (module_run / "run" / "best_program.png").is_file()


def test_a_file_stands_in_for_a_stored_module_of_its_stem(module_run, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (module_run / "files").mkdir()
    monkeypatch.chdir(module_run / "files")  # neither module can be imported here: the files stand in
    _forget_the_modules()
    given = ["--plugin", "../softplus_mod.py", "--plugin", "../noop_mod.py"]
    assert main(["ablate", "--seeds", "2", *SMALL, "--from-run", "../run", "--out", "ablate", *given]) == 0
    assert "vsoftplus(" in (module_run / "files" / "ablate" / "ablation.json").read_text()
