"""register_task: a generated task defined outside the package (one Task subclass, registered) is
usable wherever a built-in one is -- a data name with inline knobs, a suite point, a curve's swept
knob, the memory check, describe() -- and joins no shipped suite; unregistering removes it."""

import json

import pytest
import torch

import evo_attention
from evo_attention import Config
from evo_attention.cli import main
from evo_attention.data import (IGNORE_INDEX, check_data_name, load_data, register_dataset, register_task,
                                takes_options, unregister_task)
from evo_attention.data.suites import load_suite, parse_suite, shipped_suites
from evo_attention.data.synthetic import TASKS, Knob, Task, is_synthetic
from evo_attention.report.attachments import CURVE_RESULTS
from evo_attention.studies.curves import plan_points
from evo_attention.util import memory
from evo_attention.util.errors import UserError

NAME = "delayed_copy"
DATA = f"{NAME}:delay=2,seq_len=16,vocab=8"
COUNTS = {"train_examples": 64, "eval_examples": 16}


class DelayedCopy(Task):
    """Copy the token seen ``delay`` positions earlier: the first ``delay`` tokens are random content,
    every later one repeats the token ``delay`` before it; scored wherever the answer is a repeat."""

    capability = "copying at a fixed offset"
    knobs = (Knob("delay", "int", "how many positions back the copied token is"),)
    defaults = {"vocab": 8, "delay": 2}

    def resolve(self, k):
        if k["delay"] >= k["seq_len"]:
            raise UserError(f"{self.name}: delay {k['delay']} leaves no answer in seq_len {k['seq_len']}; lower delay",
                            setting="data")
        return k

    def symbols(self, k):
        return ["<pad>"] + [f"c{i}" for i in range(k["vocab"] - 1)]

    def answers_per_example(self, k):
        return k["seq_len"] + 1 - k["delay"]

    def chance(self, k):
        return 1 / (k["vocab"] - 1)

    def generate(self, n, k, generator, seed):
        T, D = k["seq_len"], k["delay"]
        first = torch.randint(k["vocab"] - 1, (n, D), generator=generator) + 1
        full = first.repeat(1, (T + 1) // D + 1)[:, : T + 1]
        y = torch.full((n, T), IGNORE_INDEX, dtype=torch.long)
        y[:, D - 1:] = full[:, D:]
        return full[:, :-1].contiguous(), y


@pytest.fixture
def delayed_copy():
    assert evo_attention.register_task is register_task  # the front door's is the same function
    assert register_task(NAME)(DelayedCopy) is DelayedCopy
    try:
        yield DelayedCopy
    finally:
        unregister_task(NAME)


def user_error(fn, *needles):
    with pytest.raises(UserError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in needles), message


def test_a_registered_task_is_a_data_name(delayed_copy, monkeypatch):
    assert DelayedCopy.name == NAME and TASKS[NAME].name == NAME
    assert is_synthetic(DATA) and takes_options(NAME)
    check_data_name(DATA)
    Config(data=DATA)  # the config accepts it
    a, b = load_data(DATA, **COUNTS), load_data(DATA, **COUNTS)
    assert a.name == DATA and a.fingerprint == b.fingerprint  # deterministic
    for split in ("train", "valid", "test"):
        assert all(torch.equal(s, t) for s, t in zip(a.data[split], b.data[split]))
    x, y = a.data["valid"]
    assert x.shape == (16, 16) and torch.equal(x[:, 2:], x[:, :-2])  # every token repeats the one 2 before
    scored = y != IGNORE_INDEX
    assert int(scored.sum()) == a.scored_tokens("valid") == 16 * 15 and torch.equal(y[:, 1:-1], x[:, 2:])
    info = a.describe()
    assert info["task"] == NAME and info["chance_accuracy"] == pytest.approx(1 / 7) and info["settings"]["delay"] == 2
    # the knobs by another path are the same data; another seed or knob is other data
    assert load_data(NAME, seq_len=16, vocab_size=8, delay=2, **COUNTS).fingerprint == a.fingerprint
    assert load_data(DATA, seed=1, **COUNTS).fingerprint != a.fingerprint
    assert load_data(f"{NAME}:delay=3,seq_len=16,vocab=8", **COUNTS).fingerprint != a.fingerprint
    # its knobs' checks, the task's own check and the memory check, as one line each
    user_error(lambda: check_data_name(f"{NAME}:delai=2"), "'delai'", "delay")
    user_error(lambda: check_data_name(f"{NAME}:delay=0"), "delay", "an integer >= 1")
    user_error(lambda: load_data(f"{NAME}:delay=16,seq_len=16"), "delay 16", "seq_len 16")
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 2**30)  # the memory estimate, before any tensor
    user_error(lambda: load_data(f"{NAME}:seq_len=2000000"), "2,000,001 tokens", f"{NAME}:seq_len=N")


def test_the_data_help_names_every_generated_task(delayed_copy):
    """--data's help named wikitext2, text, recall and hf: only, while curve takes generated tasks alone."""
    from evo_attention.cli import build_parser

    subparsers = next(a for a in build_parser()._actions if a.choices and "curve" in a.choices)
    for command in ("curve", "baseline"):
        text = " ".join(subparsers.choices[command].format_help().split())
        assert f"a generated task (mqar, mad:TASK, {NAME})" in text, text


def test_a_registered_task_is_a_suite_point(delayed_copy, tmp_path):
    raw = {"suite": "mine", "defaults": {"vocab": 8, **COUNTS},
           "points": [{"task": NAME, "knobs": {"seq_len": 16, "delay": 2}},
                      {"task": "mqar", "knobs": {"seq_len": 16, "pairs": 2}}]}
    suite = parse_suite(raw)
    point = suite.points[0]
    assert suite.labels == (NAME, "mqar") and point.task == NAME
    assert point.data == f"{NAME}:delay=2,eval_examples=16,seq_len=16,train_examples=64,vocab=8"
    assert point.load().fingerprint == load_data(DATA, **COUNTS).fingerprint
    path = tmp_path / "mine.yaml"
    path.write_text(json.dumps(raw), encoding="utf-8")  # JSON is YAML
    assert load_suite(path).points == suite.points
    bad = {**raw, "points": [{"task": NAME, "knobs": {"seq_len": 16, "delay": 16}}]}
    user_error(lambda: parse_suite(bad), "point 1", "delay 16")


def test_a_registered_task_is_swept_by_a_curve(delayed_copy, tmp_path):
    base = f"{NAME}:seq_len=16,vocab=8,train_examples=64,eval_examples=16"
    config = Config(data=base, vocab_size=None, max_seq_len=16)
    task, points = plan_points(config, "delay", "1,2,4")
    assert task == NAME and [p.value for p in points] == [1, 2, 4]
    assert points[1].data == f"{NAME}:delay=2,eval_examples=16,seq_len=16,train_examples=64,vocab=8"
    assert points[0].chance_accuracy == pytest.approx(1 / 7) and points[2].knobs["delay"] == 4
    user_error(lambda: plan_points(config, "delay", "2,16"), "delay=16", "seq_len 16")
    user_error(lambda: plan_points(config, "pairs", "2,4"), "'pairs'", "its knobs", "delay")
    # end to end: the command, on the registered task
    out = tmp_path / "curve"
    assert main(["curve", "--genes", "baseline", "--data", base, "--knob", "delay=1,2", "--out", str(out), "--quiet",
                 "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4",
                 "--eval-batch-size", "16"]) == 0
    written = json.loads((out / CURVE_RESULTS).read_text())
    assert written["knob"] == "delay" and [p["knobs"]["delay"] for p in written["points"]] == [1, 2]
    assert written["config"]["vocab_size"] is None  # the task's own vocabulary, as for a built-in task


def test_registering_changes_no_shipped_suite(delayed_copy):
    def points():
        return {name: [(p.label, p.data, p.steps) for p in load_suite(name).points] for name in shipped_suites()}

    unregister_task(NAME)
    before = points()
    register_task(NAME, DelayedCopy)
    after = points()
    assert after == before and not any(NAME in data for suite in after.values() for _, data, _ in suite)


def test_registration_errors_are_one_line(delayed_copy):
    assert register_task(NAME, DelayedCopy) is DelayedCopy  # the same class again: nothing happens

    class Other(DelayedCopy):
        pass

    user_error(lambda: register_task(NAME, Other), repr(NAME), "registered already", "DelayedCopy")
    user_error(lambda: register_task("another_name", DelayedCopy), "DelayedCopy", repr(NAME))
    for taken in ("recall", "wikitext2", "hf", "mad", "mqar:mine"):
        user_error(lambda: register_task(taken, Other), repr(taken.split(":")[0]))
    for malformed in ("", "Two Words", "a:b:c", "x=1", 3):
        user_error(lambda: register_task(malformed, Other), "lower-case word")
    user_error(lambda: register_task("not_a_task", dict), "not a subclass", "Task")

    class NoGenerator(Task):
        defaults = {"vocab": 8}

    user_error(lambda: register_task("no_generator", NoGenerator), "NoGenerator", "generate")

    class NoDefault(DelayedCopy):
        defaults = {"delay": 2}

    user_error(lambda: register_task("no_default", NoDefault), "'vocab'", "defaults")
    for default, says in ({"delay": 0}, "an integer >= 1"), ({"delay": 1.5}, "an integer >= 1"), ({"vocab": 2}, ">= 4"):
        class BadDefault(DelayedCopy):  # a default passes the checks an inline knob passes (delay=0 is refused)
            defaults = {**DelayedCopy.defaults, **default}

        user_error(lambda: register_task("bad_default", BadDefault), "register_task('bad_default')",
                   "default {}={!r} of BadDefault".format(*next(iter(default.items()))), says)
    user_error(lambda: register_dataset(NAME), repr(NAME), "taken")  # a plugin dataset cannot shadow it
    assert NAME in TASKS and not {"another_name", "no_default", "bad_default"} & set(TASKS)


def test_a_default_is_used_as_its_knob_reads_it():
    """A default of 2.0 for an integer knob passed the check and was used as 2.0 (a TypeError in slicing), and
    numpy's numbers, which a plugin may compute its defaults with, were refused."""
    np = pytest.importorskip("numpy")

    class Computed(DelayedCopy):
        defaults = {**DelayedCopy.defaults, "delay": 2.0, "vocab": np.int64(8)}

    register_task("computed_defaults", Computed)
    try:
        assert Computed.defaults["delay"] == 2 and type(Computed.defaults["delay"]) is int
        assert type(Computed.defaults["vocab"]) is int
        assert load_data("computed_defaults:seq_len=16", **COUNTS).vocab_size == 8
    finally:
        unregister_task("computed_defaults")


def test_symbols_that_do_not_name_every_id_are_refused_naming_the_task():
    class ShortSymbols(DelayedCopy):
        def symbols(self, k):
            return ["<pad>", "a", "b"]

    register_task("shortsym", ShortSymbols)
    try:
        user_error(lambda: load_data("shortsym:seq_len=16,vocab=8", **COUNTS), "task shortsym: symbols() named 3 ids, "
                   "not vocab 8")
    finally:
        unregister_task("shortsym")


@pytest.mark.parametrize("chance", [float("nan"), 5.0, -0.25, float("inf"), None, "0.5", True])
def test_a_chance_that_is_not_an_accuracy_is_refused_naming_the_task(chance):
    class BadChance(DelayedCopy):
        def chance(self, k):
            return chance

    register_task("badchance", BadChance)
    try:  # the data's describe() and a curve's points would record it
        user_error(lambda: load_data("badchance:seq_len=16,vocab=8", **COUNTS), "task badchance: chance() returned",
                   "[0, 1]")
        config = Config(data="badchance:seq_len=16,vocab=8", vocab_size=None, max_seq_len=16)
        user_error(lambda: plan_points(config, "delay", "1,2"), "task badchance: chance() returned")
    finally:
        unregister_task("badchance")


@pytest.mark.parametrize("level", [float("nan"), 1.5, "0.5"])
def test_a_no_recall_level_that_is_not_an_accuracy_is_refused_and_none_means_no_level(level):
    class BadFloor(DelayedCopy):
        def no_recall(self, k):
            return level

    register_task("badfloor", BadFloor)
    try:  # the data's describe() records it, the fitness check's floor reads it
        user_error(lambda: load_data("badfloor:seq_len=16,vocab=8", **COUNTS), "task badfloor: no_recall() returned",
                   "[0, 1]")
    finally:
        unregister_task("badfloor")
    assert "no_recall_accuracy" not in load_data("mad:selective_copy", **COUNTS).describe()  # None: no such level
    assert 0 < load_data("mqar", **COUNTS).describe()["no_recall_accuracy"] <= 1


def test_a_stream_batch_that_breaks_the_contract_is_refused_naming_the_task(delayed_copy):
    """train_examples=0 trains on batches no split held: each is checked as the splits are. The bug: the
    copied tokens are drawn from [0, vocab), so pad is scored now and then, which a small split can miss."""
    class PadNowAndThen(DelayedCopy):
        def generate(self, n, k, generator, seed):
            x, y = super().generate(n, k, generator, seed)
            first = torch.randint(k["vocab"], (n, 1), generator=generator)  # the off-by-one: 0 included
            return x, y.masked_fill((y >= 0) & (first == 0), 0)

    register_task("pad_now_and_then", PadNowAndThen)
    try:
        for seed in range(40):  # a data seed whose splits (2 rows of 1 example) happen not to score pad
            try:
                data = load_data("pad_now_and_then:seq_len=16,vocab=32,train_examples=0,eval_examples=1", seed=seed)
                break
            except UserError:
                continue
        batches = data.train_batches(64, torch.Generator().manual_seed(0))  # a row scores pad 1 time in 32
        user_error(lambda: [next(batches) for _ in range(20)], "task pad_now_and_then: generate(64, ...) for a "
                   "train_examples=0 stream batch returned scored targets equal to the pad id 0")
    finally:
        unregister_task("pad_now_and_then")
    stream = load_data(f"{DATA},train_examples=0", eval_examples=4).train_batches(8, torch.Generator())
    x, y = next(stream)  # a task that keeps the contract streams as before
    assert x.shape == y.shape == (8, 16) and int((y >= 0).sum(1).min()) == 15


def test_unregistering_removes_it(delayed_copy):
    unregister_task(NAME)
    assert NAME not in TASKS and not is_synthetic(DATA)
    user_error(lambda: load_data(DATA), "unknown dataset", repr(DATA))
    user_error(lambda: Config(data=DATA), "unknown data", repr(DATA))
    user_error(lambda: parse_suite({"suite": "x", "points": [{"task": NAME, "knobs": {"seq_len": 16, "vocab": 8}}]}),
               "point 1", repr(NAME), "mqar")
    register_task(NAME, DelayedCopy)  # the fixture's teardown unregisters it again
    assert NAME in TASKS
