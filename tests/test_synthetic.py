"""Tests for the generated tasks that separate mechanisms (data/synthetic.py) and the suites
(data/suites.py): determinism, scored positions, knob effects, errors, suites, learnability."""

import math

import pytest
import torch
import yaml

from evo_attention import Config
from evo_attention.data import (IGNORE_INDEX, check_data_name, data_from_config, load_data, register_dataset,
                                takes_options)
from evo_attention.data.suites import load_suite, parse_suite, shipped_suites
from evo_attention.data.synthetic import (TASKS, SyntheticData, data_name, is_synthetic, no_lookup_accuracy,
                                          parse_data_name)
from evo_attention.util.errors import UserError

SMALL = {"train_examples": 300, "eval_examples": 200}
# one small, valid point per task (with its vocab and window)
POINTS = {
    "mqar": {"seq_len": 40, "vocab": 32, "pairs": 6, "queries": 4},
    "mad:in_context_recall": {"seq_len": 32, "vocab": 16, "pairs": 4},
    "mad:noisy_recall": {"seq_len": 48, "vocab": 16, "pairs": 4, "noise": 0.25, "noise_vocab": 3},
    "mad:fuzzy_recall": {"seq_len": 48, "vocab": 16, "pairs": 5, "key_len": 2, "value_len": 2},
    "mad:selective_copy": {"seq_len": 40, "vocab": 16, "copy": 8},
    "mad:compression": {"seq_len": 32, "vocab": 16, "tokens": 10},
    "mad:memorization": {"seq_len": 32, "vocab": 64, "pairs": 12},
}


def build(task, seed=0, **changes):
    return SyntheticData(task, seed=seed, **{**SMALL, **POINTS[task], **changes})


def user_error(fn, *needles) -> str:
    """Run fn, expect a one-line UserError containing every needle; return the message."""
    with pytest.raises(UserError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert str(needle) in message, (needle, message)
    return message


def scored(data, split="valid"):
    x, y = data.data[split]
    return x, y, y != IGNORE_INDEX


def sym(data, ids):
    return [data.vocab.itos[i] for i in ids.tolist()]


# --- determinism and the dataset contract ---------------------------------------------------------

@pytest.mark.parametrize("task", list(TASKS))
def test_deterministic_and_seeded(task):
    a, b, c = build(task), build(task), build(task, seed=1)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    for split in ("train", "valid", "test"):
        assert all(torch.equal(p, q) for p, q in zip(a.data[split], b.data[split]))
        assert not torch.equal(a.data[split][0], c.data[split][0])
    assert not torch.equal(a.data["valid"][0], a.data["test"][0])  # splits are independent draws
    g0, g1 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(next(a.train_batches(16, g0))[0], next(b.train_batches(16, g1))[0])


@pytest.mark.parametrize("task", list(TASKS))
def test_contract_and_scored_count(task):
    data = build(task)
    for split in ("train", "valid", "test"):
        x, y, keep = scored(data, split)
        n = data.num_eval_items(split)
        assert x.shape == y.shape == (n, data.seq_len) and x.dtype == y.dtype == torch.int64
        assert x.min() >= 0 and x.max() < data.vocab_size and y[keep].max() < data.vocab_size
        assert (keep.sum(1) == data.answers_per_example).all()  # every example: the same answers
        assert data.scored_tokens(split) == n * data.answers_per_example
    assert sum(int((y != IGNORE_INDEX).sum()) for _, y in data.eval_batches("valid", 64)) == data.scored_tokens("valid")
    described = data.describe()
    assert described["scored_tokens"]["valid"] == 200 * data.answers_per_example
    assert 0 < described["chance_accuracy"] < 1 and described["settings"]["seed"] == 0


def test_fingerprint_depends_on_every_knob_and_seed():
    for task in TASKS:
        base = build(task)
        seen = {base.fingerprint}
        for knob in TASKS[task].all_knobs:
            value = base.knobs[knob.name]
            if knob.kind == "choice":
                changed = next(c for c in knob.choices if c != value)
            else:
                changed = value + 1 if knob.kind == "int" else (value / 2 if value else 0.1)
            try:
                other = build(task, **{knob.name: changed})
            except UserError:  # + 1 breaks a check between knobs: try - 1
                other = build(task, **{knob.name: value - 1})
            assert other.fingerprint not in seen, (task, knob.name)
            seen.add(other.fingerprint)
        assert build(task, seed=7).fingerprint not in seen
    # the spelling of the name does not matter: inline knobs and options give the same data
    a = load_data("mqar:pairs=4,vocab=32", seq_len=32, train_examples=50, eval_examples=20)
    b = load_data("mqar", seq_len=32, vocab_size=32, pairs=4, train_examples=50, eval_examples=20)
    assert a.fingerprint == b.fingerprint and torch.equal(a.data["valid"][0], b.data["valid"][0])
    assert a.name == "mqar:pairs=4,vocab=32" and b.name == "mqar"


@pytest.mark.parametrize("task", ["mqar", "mad:memorization", "mad:selective_copy"])
def test_train_examples_zero_is_a_fresh_stream(task):
    stream, fixed = build(task, train_examples=0), build(task, train_examples=64)
    assert stream.fingerprint != fixed.fingerprint and stream.describe()["train_stream"] is True
    assert stream.num_train_items() == 0 and stream.scored_tokens("train") == 0
    assert "train_stream" not in fixed.describe()
    for split in ("valid", "test"):  # the evaluation splits do not depend on the train split
        assert all(torch.equal(a, b) for a, b in zip(stream.data[split], fixed.data[split]))
    take = lambda data, seed, n: [b for _, b in zip(range(n), data.train_batches(16, torch.Generator().manual_seed(seed)))]
    first, again, other = take(stream, 1, 12), take(stream, 1, 12), take(stream, 2, 12)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))  # repeatable
    assert not torch.equal(first[0][0], other[0][0])  # each training seed its own stream
    rows = {tuple(r) for x, _ in first for r in x.tolist()}
    assert len(rows) == 12 * 16  # 192 fresh examples: more than a 64-example split would hold
    assert not torch.equal(take(build(task, seed=3, train_examples=0), 1, 1)[0][0], first[0][0])  # the data seed
    for x, y in first:  # the task's own format
        assert x.shape == y.shape == (16, stream.seq_len) and ((y != IGNORE_INDEX).sum(1) == stream.answers_per_example).all()
    if task == "mad:memorization":  # one table for the stream and the evaluation splits
        table = {}
        for x, y in [*first, stream.data["valid"]]:
            keep = y != IGNORE_INDEX
            for key, value in zip(x[keep].tolist(), y[keep].tolist()):
                assert table.setdefault(key, value) == value
    user_error(lambda: build(task, train_examples=-1), "train_examples", "an integer >= 0")
    user_error(lambda: build(task, eval_examples=0), "eval_examples", "an integer >= 1")


def test_a_training_runs_on_a_stream():
    from evo_attention.train.trainer import train_and_evaluate

    name = "mqar:seq_len=16,vocab=16,pairs=2,train_examples=0,eval_examples=20"
    config = Config(data=name, vocab_size=None, d_model=16, n_heads=2, n_layers=1, max_seq_len=16, dropout=0.0,
                    batch_size=8, eval_batch_size=20, eval_steps=None, train_steps=3, precision="fp32",
                    compile="off", device="cpu")
    record = train_and_evaluate("dot|softmax|none|fixed|bias|0.00", config, load_data(name), seed=1)
    assert record.status == "ok" and record.eval_tokens == 20 * 2


# --- the formats: only answers are scored, and they are right ---------------------------------------

def test_mqar_format():
    data = build("mqar")
    P, Q = 6, 4
    x, y, keep = scored(data)
    rows, pos = keep.nonzero(as_tuple=True)
    keys, answers = x[rows, pos], y[rows, pos]
    K = (data.knobs["vocab"] - 1) // 2
    assert (pos >= 2 * P).all() and (pos % 2 == 0).all()
    assert ((keys >= 1) & (keys <= K)).all() and (answers > K).all()
    pair_keys = x[rows, : 2 * P: 2]
    j = (pair_keys == keys[:, None]).float().argmax(1)
    assert (pair_keys[torch.arange(len(j)), j] == keys).all()  # the queried key was given ...
    assert torch.equal(x[rows, 2 * j + 1], answers)  # ... and the answer is its value
    assert torch.equal(x[rows, pos + 1], answers)  # teacher forcing: the value follows the query key
    per_row = x[:, : 2 * P: 2].sort(1).values
    assert (per_row.diff(1) != 0).all()  # distinct keys
    queried = torch.stack([x[r, pos[rows == r]] for r in range(3)])
    assert all(len(set(q.tolist())) == Q for q in queried)  # each pair asked at most once
    assert (x[:, 2 * P:][~keep[:, 2 * P:] & ~keep[:, 2 * P - 1: -1]] == data.pad_id).all()  # the rest is <fill>


def test_mqar_power_moves_queries_to_the_front():
    near = build("mqar", seq_len=128, pairs=4, queries=2, power=0.01, eval_examples=500)
    flat = build("mqar", seq_len=128, pairs=4, queries=2, power=1.0, eval_examples=500)
    mean_pos = [scored(d)[2].nonzero()[:, 1].float().mean() for d in (near, flat)]
    assert mean_pos[0] + 20 < mean_pos[1]


def test_mqar_kv_layout_keeps_its_data_and_fingerprint():
    """The layout and filler knobs came later: the default layout's tensors and fingerprint (and so
    every cache key of a training on it) are the ones they were before."""
    data = build("mqar")
    assert data.fingerprint == "c5897a4f48113374ecf98adb3cfe3b1c2af6f9dc98e18fae35ccc97aac047fa5"
    x, y = data.data["valid"]
    assert int(x.sum()) == 62651 and int(y[y != IGNORE_INDEX].sum()) == 18656
    assert "layout" not in data.settings and "filler" not in data.settings
    assert build("mqar", layout="kv", filler="zero").fingerprint == data.fingerprint  # spelled out: the same
    assert data.knobs["layout"] == "kv" and data.knobs["filler"] == "zero"


@pytest.mark.parametrize("filler", ["zero", "random"])
def test_mqar_zoology_layout(filler):
    data = build("mqar", layout="zoology", filler=filler, eval_examples=300)
    P, Q, V = 6, 4, 32
    K = (V - 1) // 2
    x, y, keep = scored(data)
    n = len(x)
    pair_keys, pair_values = x[:, : 2 * P: 2], x[:, 1: 2 * P: 2]
    assert ((pair_keys >= 1) & (pair_keys <= K)).all() and (pair_values > K).all()  # disjoint halves
    assert (pair_keys.sort(1).values.diff(1) != 0).all() and (pair_values.sort(1).values.diff(1) != 0).all()
    rows, pos = keep.nonzero(as_tuple=True)
    assert (keep.sum(1) == Q).all() and (pos >= 2 * P).all() and ((pos - 2 * P) % 2 == 0).all()
    keys, answers = x[rows, pos], y[rows, pos]
    j = (pair_keys[rows] == keys[:, None]).float().argmax(1)
    assert (pair_keys[rows, j] == keys).all()  # the query shows a key of the pairs ...
    assert torch.equal(pair_values[rows, j], answers)  # ... scored at its own position: the key's value
    assert (keys <= K).all() and (answers > K).all()
    # causal: the answer is in the input before the query position, never at or after it in a slot
    # of its own (the value is not shown after the query key)
    is_query = torch.zeros_like(keep)
    is_query[:, 2 * P:] = keep[:, 2 * P:]
    rest = torch.ones_like(keep)
    rest[:, : 2 * P] = False
    rest &= ~is_query
    if filler == "zero":
        assert (x[rest] == data.pad_id).all()  # everything but the pairs and the query keys is <fill>
    else:
        assert (x[rest] != data.pad_id).float().mean() > 0.9  # random ids, <fill> among them
        assert len(set(x[rest].tolist())) > V // 2
        zero = build("mqar", layout="zoology", filler="zero", eval_examples=300)
        assert torch.equal(torch.where(rest, data.pad_id, x), zero.data["valid"][0])  # same pairs and queries
        assert torch.equal(y, zero.data["valid"][1])
    described = data.describe()
    assert described["chance_accuracy"] == 1 / (V - 1 - K) and described["no_recall_accuracy"] == 1 / P
    assert data.knobs["filler"] == filler and data.settings["layout"] == "zoology"
    assert n == 300


@pytest.mark.parametrize("pairs,values", [(1, 5), (2, 2), (3, 4), (4, 8), (5, 3), (6, 7)])
def test_no_lookup_accuracy_is_the_mode_guess(pairs, values):
    """Against every draw of the example's values: the most frequent value's count over pairs."""
    import itertools
    from collections import Counter

    draws = list(itertools.product(range(values), repeat=pairs))
    exact = sum(max(Counter(d).values()) for d in draws) / len(draws) / pairs
    assert no_lookup_accuracy(pairs, values) == pytest.approx(exact, rel=1e-9)


def test_no_lookup_accuracy_at_large_sizes():
    assert no_lookup_accuracy(8, 4096) == pytest.approx(0.12586, abs=1e-4)  # Zoology's vocabulary: about 1/pairs
    assert 1 / 64 < no_lookup_accuracy(64, 4096) < 1 / 32
    assert no_lookup_accuracy(64, 1) == pytest.approx(1.0)
    assert 2 / 300 < no_lookup_accuracy(300, 8192) < 2.2 / 300  # many pairs: no overflow (max count 2, at times 3)


def test_mqar_levels_and_layout_defaults():
    kv, zoo = build("mqar"), build("mqar", layout="zoology")
    assert zoo.knobs["filler"] == "random"  # Zoology's own default
    # the no-recall level: the example's most frequent value; values repeat in kv (6 of 16 here)
    assert kv.describe()["no_recall_accuracy"] == pytest.approx(no_lookup_accuracy(6, 16))
    assert zoo.fingerprint != build("mqar", layout="zoology", filler="zero").fingerprint != kv.fingerprint
    noisy = build("mqar", filler="random")  # the kv layout with random filler: the same pairs and queries
    x, x0 = noisy.data["valid"][0], kv.data["valid"][0]
    assert torch.equal(x[x0 != 0], x0[x0 != 0]) and torch.equal(noisy.data["valid"][1], kv.data["valid"][1])
    assert (x[x0 == 0] != 0).float().mean() > 0.9
    assert "no_recall_accuracy" not in build("mad:selective_copy").describe()
    recall = build("mad:in_context_recall")  # 4 pairs, one-token values (8 of them) drawn with replacement
    assert recall.describe()["no_recall_accuracy"] == pytest.approx(no_lookup_accuracy(4, 8))
    assert "no_recall_accuracy" not in build("mad:fuzzy_recall").describe()  # value_len 2: no such level
    # zoology's power law: queries crowd toward the pairs as in the kv layout
    near = build("mqar", layout="zoology", seq_len=128, pairs=4, queries=2, power=0.01, eval_examples=500)
    flat = build("mqar", layout="zoology", seq_len=128, pairs=4, queries=2, power=1.0, eval_examples=500)
    assert scored(near)[2].nonzero()[:, 1].float().mean() + 20 < scored(flat)[2].nonzero()[:, 1].float().mean()
    assert load_data("mqar:layout=zoology,filler=zero,vocab=32", seq_len=40, train_examples=5,
                     eval_examples=5).knobs["layout"] == "zoology"


def recall_check(data):
    """Parse examples back into dictionary and query items: every scored target is a value token that
    the query's key got in the dictionary, and nothing else is scored."""
    k = data.knobs
    kl, vl, P = k.get("key_len", 1), k.get("value_len", 1), k["pairs"]
    x, y = data.data["valid"]
    for r in range(30):
        full = x[r].tolist() + [int(y[r, -1])]  # the example's last token: y's last target if scored
        names = [data.vocab.itos[t] if t >= 0 else "?" for t in full]
        expected, dictionary, items, i = [IGNORE_INDEX] * data.seq_len, {}, 0, 0
        while i < len(full):
            if not names[i].startswith("k"):
                assert names[i].startswith("<") or (names[i] == "?" and i == len(full) - 1), names
                i += 1
                continue
            assert all(n.startswith("k") for n in names[i: i + kl]) and all(n.startswith("v") for n in names[i + kl: i + kl + vl])
            key, value = tuple(full[i: i + kl]), full[i + kl: i + kl + vl]
            if items < P:
                assert key not in dictionary  # distinct dictionary keys
                dictionary[key] = value
            else:
                assert dictionary[key] == value  # a query repeats a dictionary key with its value
                for t in range(vl):
                    expected[i + kl - 1 + t] = value[t]
            items, i = items + 1, i + kl + vl
        assert items - P == data.answers_per_example // vl
        assert y[r].tolist() == expected


@pytest.mark.parametrize("task", ["mad:in_context_recall", "mad:noisy_recall", "mad:fuzzy_recall"])
def test_recall_family_format(task):
    recall_check(build(task))


def test_selective_copy_format():
    data = build("mad:selective_copy")
    T, c = 40, 8
    x, y, keep = scored(data)
    assert keep[:, T - c:].all() and not keep[:, : T - c].any()  # the copy positions, only
    assert (x[:, T - c:] == data.vocab.stoi["<copy>"]).all()
    region = x[:, : T - c]
    content = region >= 3
    assert (content.sum(1) == c).all()  # copy content tokens, the rest noise
    assert ((region == data.vocab.stoi["<noise>"]) | content).all()
    assert torch.equal(region[content].view(-1, c), y[:, T - c:])  # in order


def test_compression_format():
    data = build("mad:compression")
    m = 10
    x, y, keep = scored(data)
    assert keep[:, m: 2 * m].all() and keep.sum() == keep[:, m: 2 * m].sum()
    assert torch.equal(y[:, m: 2 * m], x[:, :m]) and (x[:, :m] >= 2).all()
    assert (x[:, m: 2 * m] == data.vocab.stoi["<compress>"]).all() and (x[:, 2 * m:] == data.pad_id).all()


def test_memorization_is_one_table():
    data = build("mad:memorization")
    table = {}
    for split in ("train", "valid", "test"):
        x, y, keep = scored(data, split)
        assert keep[:, : 24: 2].all() and keep.sum() == keep[:, : 24: 2].sum()  # the 12 keys, only
        assert torch.equal(y[:, : 23: 2], x[:, 1: 24: 2])  # teacher forcing: the value follows its key
        assert (x[:, : 24: 2].sort(1).values.diff(1) != 0).all()  # keys never repeat in an example
        for key, value in zip(x[keep].tolist(), y[keep].tolist()):
            assert table.setdefault(key, value) == value  # one value per key, in every split
    assert len(table) == 31  # every key of the (64 - 1) // 2 appears
    knobs = data.knobs
    assert TASKS["mad:memorization"].table(knobs, 1).tolist() != TASKS["mad:memorization"].table(knobs, 0).tolist()


# --- knob effects -----------------------------------------------------------------------------------

def test_knob_effects():
    answers = lambda task, **kw: build(task, **kw).answers_per_example
    # MQAR: answers = queries; more pairs = a longer dictionary before the queries
    assert [answers("mqar", queries=q) for q in (1, 3, 6)] == [1, 3, 6]
    first_query = lambda d: int(scored(d)[2].nonzero()[:, 1].min())
    assert first_query(build("mqar", pairs=8, queries=4)) >= 16 > first_query(build("mqar", pairs=4, queries=4)) >= 8
    # in-context recall: the dictionary takes items from the queries; the window adds queries
    assert answers("mad:in_context_recall", pairs=4) == 16 - 4 and answers("mad:in_context_recall", pairs=7) == 9
    assert answers("mad:in_context_recall", seq_len=64) == 32 - 4
    # noisy recall: round(noise * (T + 1)) noise tokens (ids 1..noise_vocab), the rest items
    counts = []
    for noise in (0.0, 0.25, 0.5):
        data = build("mad:noisy_recall", noise=noise)
        x = data.data["valid"][0]
        in_x = ((x >= 1) & (x <= 3)).sum(1)  # x holds T of the T + 1 tokens: one noise token may be past it
        expected = round(noise * 49)
        assert int(in_x.max()) == expected and (in_x >= expected - 1).all()
        assert data.answers_per_example == (49 - expected) // 2 - 4
        counts.append(expected)
    assert counts == [0, 12, 24]
    assert build("mad:noisy_recall", noise_vocab=6).vocab.itos[6] == "<noise5>"
    # fuzzy recall: longer keys, fewer items; every value token scored
    assert answers("mad:fuzzy_recall", key_len=1, value_len=2) == (49 // 3 - 5) * 2
    assert answers("mad:fuzzy_recall", key_len=3, value_len=2) == (49 // 5 - 5) * 2
    assert answers("mad:fuzzy_recall", key_len=2, value_len=1) == 49 // 3 - 5
    # selective copy and compression: the answers are the tokens to copy / compress
    assert [answers("mad:selective_copy", copy=c) for c in (2, 8, 20)] == [2, 8, 20]
    assert [answers("mad:compression", tokens=m) for m in (1, 10, 16)] == [1, 10, 16]
    assert answers("mad:compression", tokens=None) == 16  # default: half the window
    noise_tokens = lambda c: int((build("mad:selective_copy", copy=c).data["valid"][0] == 1).sum(1)[0])
    assert noise_tokens(4) == 40 - 8 and noise_tokens(16) == 40 - 32
    # memorization: pairs per example; the table grows with the vocabulary
    assert answers("mad:memorization", pairs=5) == 5
    assert len(build("mad:memorization", vocab=128).vocab) == 128
    # the vocabulary knob is the model's vocabulary
    assert all(build(task, vocab=40).vocab_size == 40 for task in TASKS)


# --- names, knobs and errors ----------------------------------------------------------------------

def test_data_names():
    assert parse_data_name("mqar") == ("mqar", {})
    assert parse_data_name("mqar:pairs=8") == ("mqar", {"pairs": "8"})
    assert parse_data_name("mad:selective_copy:seq_len=64, copy=16") == (
        "mad:selective_copy", {"seq_len": "64", "copy": "16"})
    assert all(is_synthetic(n) for n in ("mqar", "mqar:pairs=2", "mad", "mad:compression"))
    assert not any(is_synthetic(n) for n in ("recall", "wikitext2", "hf:mqar", "mqarx", 3))
    for name in ("mqar", "mqar:pairs=8", "mad:selective_copy:seq_len=64,copy=16", *(t for t in TASKS if t.startswith("mad:"))):
        check_data_name(name)
        Config(data=name)  # the config accepts it
        assert takes_options(name)
    data = load_data("mad:selective_copy:seq_len=64,copy=16", train_examples=20, eval_examples=10)
    assert (data.seq_len, data.answers_per_example, data.vocab_size) == (64, 16, 16)  # vocab_size None: the default
    data = load_data("mad:selective_copy:copy=4", seq_len=24, vocab_size=20, train_examples=20, eval_examples=10)
    assert (data.seq_len, data.vocab_size) == (24, 20)  # not given inline: load_data's seq_len and vocab_size
    assert data_name("mqar", {"pairs": 8, "power": 0.5}) == "mqar:pairs=8,power=0.5"
    assert parse_data_name(data_name("mad:noisy_recall", {"noise": 0.25}))[1] == {"noise": "0.25"}


def test_config_options_reach_the_data():
    config = Config(data="mqar:vocab=32", max_seq_len=32, recall={"pairs": 3, "train_examples": 30,
                                                                 "eval_examples": 10, "seed": 4})
    data = data_from_config(config)
    assert data.answers_per_example == 3 and data.seed == 4 and data.seq_len == 32 and data.vocab_size == 32


def test_errors_are_one_line():
    user_error(lambda: check_data_name("mqar:pairz=8"), "'pairz'", "pairs", "queries", "seq_len")
    user_error(lambda: check_data_name("mad:selective_copy:cpy=3"), "'cpy'", "copy", "vocab")
    user_error(lambda: check_data_name("mad:selective_copy:copy=x"), "copy", "an integer >= 1")
    user_error(lambda: check_data_name("mad:selective_copy:copy=0"), "copy", "an integer >= 1")
    user_error(lambda: check_data_name("mad:selective_copy:copy=2.5"), "copy", "integer")
    user_error(lambda: check_data_name("mad:noisy_recall:noise=1.5"), "noise", "[0, 1)")
    user_error(lambda: check_data_name("mqar:power=0"), "power", "(0, 1]")
    user_error(lambda: check_data_name("mqar:layout=zoo"), "layout", "one of kv, zoology")
    user_error(lambda: load_data("mqar", filler=0), "filler", "one of zero, random")
    user_error(lambda: check_data_name("mad:copying"), "'copying'", "selective_copy", "memorization")
    user_error(lambda: check_data_name("mad"), "mad:TASK", "in_context_recall")
    user_error(lambda: check_data_name("mqar:pairs"), "knob=value")
    user_error(lambda: check_data_name("mqar:pairs=2,pairs=3"), "twice")
    user_error(lambda: Config(data="mqar:pairz=8"), "pairz")
    user_error(lambda: check_data_name("mqr"), "mqar", "mad:TASK")
    # the checks between knobs, when the data is built
    user_error(lambda: load_data("mqar:seq_len=16,pairs=8"), "seq_len 16", "pairs 8")
    user_error(lambda: load_data("mqar:vocab=10,pairs=8"), "vocab 10", "pairs 8")
    user_error(lambda: load_data("mqar:pairs=4,queries=5", seq_len=64), "queries 5")
    user_error(lambda: load_data("mad:selective_copy:seq_len=20,copy=16"), "seq_len 20", "at least 32")
    user_error(lambda: load_data("mad:compression:seq_len=20,tokens=11"), "tokens 11")
    user_error(lambda: load_data("mad:in_context_recall:seq_len=8,pairs=7"), "pairs 7")
    user_error(lambda: load_data("mad:memorization:vocab=16,pairs=9", seq_len=32), "pairs 9", "keys")
    user_error(lambda: load_data("mad:noisy_recall:vocab=8,noise_vocab=6"), "vocab 8")
    user_error(lambda: load_data("mad:fuzzy_recall:vocab=6,pairs=10,key_len=1", seq_len=64), "pairs 10")
    # a fix names only knobs the task has
    assert "key_len" not in user_error(lambda: load_data("mad:in_context_recall:pairs=40"), "raise vocab or lower")
    assert "noise" not in user_error(lambda: load_data("mad:fuzzy_recall:key_len=20,value_len=20,seq_len=64"),
                                     "lower pairs (or key_len, value_len)")
    user_error(lambda: load_data("mad:noisy_recall:vocab=32,seq_len=20,pairs=8"), "lower pairs (or noise)")
    # options: unknown names, bad values, disagreement with the name
    user_error(lambda: load_data("mqar", num_pairs=3), "'num_pairs'", "task options", "pairs")
    user_error(lambda: load_data("mqar", pairs="many"), "pairs", "an integer")
    user_error(lambda: load_data("mqar:pairs=4", pairs=5), "pairs", "given twice")
    load_data("mqar:pairs=4", pairs=4, seq_len=32, train_examples=10, eval_examples=5)  # agreeing is fine
    user_error(lambda: load_data("mqar", eval_stride=4), "eval_stride")
    user_error(lambda: load_data("mqar", tokenizer="char"), "tokenizer")
    user_error(lambda: SyntheticData("mad:copy"), "mad:copy")
    user_error(lambda: register_dataset("mad:mine"), "'mad:mine'", "taken")  # plugins cannot take the names
    user_error(lambda: register_dataset("mqar"), "taken")
    user_error(lambda: SyntheticData("mqar", seed="1"), "seed")


# --- suites ---------------------------------------------------------------------------------------

# The shipped suites' points, pinned (label, data with every knob, steps): committed findings rest
# on them, so they change only by editing the YAML and this list together, never because a task
# was added (a registered task joins no suite).
E, T = "eval_examples=500", "train_examples=4000"  # mad-cpu's example counts
PE, PT = "eval_examples=1280", "train_examples=12800"  # mad-paper's (its MAD points)
SHIPPED_POINTS = {
    "mad-cpu": [
        ("mqar", f"mqar:{E},pairs=4,power=0.01,queries=4,seq_len=64,{T},vocab=32", 600),
        ("recall", f"mad:in_context_recall:{E},pairs=4,seq_len=32,{T},vocab=16", 600),
        ("noisy-recall", f"mad:noisy_recall:{E},noise=0.2,noise_vocab=4,pairs=4,seq_len=32,{T},vocab=16", 600),
        ("fuzzy-recall", f"mad:fuzzy_recall:{E},key_len=2,pairs=4,seq_len=48,{T},value_len=1,vocab=16", 900),
        ("selective-copy", f"mad:selective_copy:copy=8,{E},seq_len=48,{T},vocab=16", 600),
        ("compression", f"mad:compression:{E},seq_len=32,tokens=12,{T},vocab=16", 35),
        ("memorization", f"mad:memorization:{E},pairs=16,seq_len=32,{T},vocab=2048", 30),
    ],
    "fitness-recall": [  # measured by its committed fitness check: changing a point voids it
        ("mqar-3", "mqar:eval_examples=500,pairs=3,queries=3,seq_len=24,train_examples=20000,vocab=32", 500),
        ("mqar-4", "mqar:eval_examples=500,pairs=4,queries=4,seq_len=32,train_examples=20000,vocab=32", 600),
    ],
    "mad-paper": [
        ("mqar-128", "mqar:eval_examples=3000,pairs=8,power=0.01,seq_len=128,train_examples=100000,vocab=8192", None),
        ("mqar-256", "mqar:eval_examples=3000,pairs=16,power=0.01,seq_len=256,train_examples=100000,vocab=8192", None),
        ("recall-128", f"mad:in_context_recall:{PE},pairs=7,seq_len=128,{PT},vocab=16", None),
        ("recall-256-v32", f"mad:in_context_recall:{PE},pairs=15,seq_len=256,{PT},vocab=32", None),
        ("recall-512", f"mad:in_context_recall:{PE},pairs=7,seq_len=512,{PT},vocab=16", None),
        ("noisy-recall-0.2", f"mad:noisy_recall:{PE},noise=0.2,noise_vocab=16,pairs=7,seq_len=128,{PT},vocab=32", None),
        ("noisy-recall-0.6", f"mad:noisy_recall:{PE},noise=0.6,noise_vocab=16,pairs=7,seq_len=128,{PT},vocab=32", None),
        ("fuzzy-recall-128", f"mad:fuzzy_recall:{PE},key_len=2,pairs=16,seq_len=128,{PT},value_len=2,vocab=16", None),
        ("fuzzy-recall-256-k3", f"mad:fuzzy_recall:{PE},key_len=3,pairs=16,seq_len=256,{PT},value_len=2,vocab=16", None),
        ("selective-copy-256", f"mad:selective_copy:copy=16,{PE},seq_len=256,{PT},vocab=16", None),
        ("selective-copy-512", f"mad:selective_copy:copy=32,{PE},seq_len=512,{PT},vocab=16", None),
        ("selective-copy-1024", f"mad:selective_copy:copy=64,{PE},seq_len=1024,{PT},vocab=16", None),
        ("compression-32", f"mad:compression:{PE},seq_len=32,tokens=16,{PT},vocab=16", None),
        ("compression-64", f"mad:compression:{PE},seq_len=64,tokens=32,{PT},vocab=16", None),
        ("memorization-256", f"mad:memorization:{PE},pairs=16,seq_len=32,{PT},vocab=256", None),
        ("memorization-1024", f"mad:memorization:{PE},pairs=16,seq_len=32,{PT},vocab=1024", None),
    ],
}


def shipped_points(name: str) -> list[tuple]:
    return [(p.label, p.data, p.steps) for p in load_suite(name).points]


def test_shipped_suites_load():
    assert set(shipped_suites()) == set(SHIPPED_POINTS)
    for name, points in SHIPPED_POINTS.items():
        assert shipped_points(name) == points, name  # pinned: a new or changed point is a deliberate edit
    cpu = load_suite("mad-cpu")
    assert cpu.name == "mad-cpu" and cpu.budget and cpu.description
    for point in cpu.points:
        assert point.knobs["seq_len"] <= 64 and point.knobs["train_examples"] <= 5000 and point.steps
        check_data_name(point.data)
        data = point.load()
        assert data.fingerprint == SyntheticData(point.task, **point.knobs).fingerprint
        assert data.seq_len == point.knobs["seq_len"]
    paper = load_suite("mad-paper")
    assert paper.name == "mad-paper" and all(p.seed is None for p in cpu.points + paper.points)
    for point in paper.points:
        check_data_name(point.data)


def write_suite(tmp_path, text):
    path = tmp_path / "suite.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_suite_from_a_file_and_its_defaults(tmp_path):
    path = write_suite(tmp_path, """
suite: mine
steps: 50
defaults: {vocab: 16, seq_len: 32, train_examples: 100, eval_examples: 20, pairs: 3}
points:
  - task: mad:in_context_recall
  - task: mad:in_context_recall
    knobs: {pairs: 5}
    seed: 2
    steps: 70
  - task: mqar
    knobs: {vocab: 32}
  - task: mad:selective_copy
    knobs: {copy: 4}
""")
    suite = load_suite(path)
    assert suite.labels == ("in_context_recall", "in_context_recall-2", "mqar", "selective_copy")
    a, b, q, s = suite.points
    assert a.knobs["pairs"] == 3 and b.knobs["pairs"] == 5 and "pairs" not in s.knobs  # defaults only where they apply
    assert (a.steps, b.steps, a.seed, b.seed, b.options) == (50, 70, None, 2, {"seed": 2})
    assert q.data == "mqar:eval_examples=20,pairs=3,seq_len=32,train_examples=100,vocab=32"
    assert load_data(q.data).fingerprint == q.load().fingerprint
    assert b.load().seed == 2 and b.load().answers_per_example == 16 - 5
    assert suite.point("mqar") is q
    user_error(lambda: suite.point("nope"), "nope", "mqar")


@pytest.mark.parametrize("text, needles", [
    ("[1, 2]", ["mapping"]),
    ("suite: x\n", ["points"]),
    ("points: [{task: mqar}]\n", ["suite: my-tasks"]),
    ("suite: x\nbudgett: 3\npoints: [{task: mqar}]\n", ["'budgett'", "budget"]),
    ("suite: x\npoints: []\n", ["non-empty"]),
    ("suite: x\npoints: [{task: mad:copy, knobs: {seq_len: 32, vocab: 16}}]\n", ["point 1", "'mad:copy'", "mad:compression"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 32}}]\n", ["point 1", "vocab", "completely"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32, pairz: 2}}]\n", ["point 1", "'pairz'", "queries"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32, pairs: -2}}]\n", ["point 1", "pairs", ">= 1"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 8, vocab: 32, pairs: 8}}]\n", ["point 1", "seq_len 8"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32}, steps: 0}]\n", ["point 1 steps", ">= 1"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32}, colour: red}]\n", ["point 1", "'colour'"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32}, seed: x}]\n", ["seed", "integer"]),
    ("suite: x\ndefaults: {vocab: 32, seq_len: 32, copy: 3}\npoints: [{task: mqar}]\n", ["'copy'", "no point"]),
    ("suite: x\ndefaults: {vocab: 32, seq_len: 32}\npoints: [{task: mqar, label: a}, {task: mqar, label: a, knobs: {pairs: 2}}]\n",
     ["same label", "'a'"]),
    ("suite: x\ndefaults: {vocab: 32, seq_len: 32}\npoints: [{task: mqar}, {task: mqar, knobs: {pairs: 8}}]\n",
     ["same data"]),
    ("suite: x\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32}, label: two words}]\n", ["label"]),
    ("suite: x\npoints: {task: mqar\n", ["not valid YAML"]),
    ("suite: x\nmodel: {d_model: 8}\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32}}]\n",
     ["'d_model'", "short_conv"]),
    ("suite: x\nmodel: 3\npoints: [{task: mqar, knobs: {seq_len: 32, vocab: 32}}]\n", ["model must be a mapping"]),
])
def test_suite_validation(tmp_path, text, needles):
    user_error(lambda: load_suite(write_suite(tmp_path, text)), "suite.yaml", *needles)


def test_a_suite_fixes_its_model_settings(tmp_path):
    from evo_attention import Config
    from evo_attention.train.suite import point_config

    suite = load_suite(write_suite(tmp_path, "suite: x\nmodel: {short_conv: 3}\n"
                                             "points: [{task: mqar, knobs: {seq_len: 32, vocab: 32}}]\n"))
    point = suite.points[0]
    assert point.settings()["short_conv"] == 3
    assert point_config(Config(short_conv=0), point).short_conv == 3  # the suite's value wins over the run's
    assert point_config(Config(), point).data == point.data
    bad = load_suite(write_suite(tmp_path, "suite: x\nmodel: {short_conv: 9}\n"
                                           "points: [{task: mqar, knobs: {seq_len: 32, vocab: 32}}]\n"))
    user_error(lambda: point_config(Config(), bad.points[0]), "suite point mqar", "short_conv 9", "2 to 8")


def test_unknown_suite():
    user_error(lambda: load_suite("mad-gpu"), "'mad-gpu'", "mad-cpu", "mad-paper")
    user_error(lambda: parse_suite(yaml.safe_load("suite: x\npoints: [3]"), "s.yaml"), "s.yaml", "point 1")


# --- learnability -----------------------------------------------------------------------------------

def test_softmax_learns_easy_recall():
    """A tiny softmax transformer solves an easy in-context recall point: the data are learnable
    and the scored positions line up with what the model can infer."""
    from evo_attention.train.trainer import train_and_evaluate

    name = "mad:in_context_recall:seq_len=16,vocab=8,pairs=2,train_examples=4000,eval_examples=500"
    data = load_data(name)
    assert data.answers_per_example == 6 and math.isclose(data.describe()["chance_accuracy"], 0.25)
    config = Config(data=name, vocab_size=None, d_model=32, n_heads=2, n_layers=2, max_seq_len=16, dropout=0.0,
                    batch_size=128, eval_batch_size=250, eval_steps=None, learning_rate=3e-3, train_steps=400,
                    precision="fp32", compile="off", device="cpu")
    record = train_and_evaluate("dot|softmax|none|fixed|bias|0.00", config, data, seed=1)
    assert record.eval_tokens == record.eval_tokens_total == 500 * 6  # answers only, all of them
    assert record.accuracy > 0.9, record.accuracy
