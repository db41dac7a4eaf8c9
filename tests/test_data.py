"""Tests for the data pipeline: corpora, vocabulary, cache, recall task, loaders and utils."""

import json
import random
import socket
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from evo_attention.data import ENV_CACHE_DIR, ENV_DATA_DIR, IGNORE_INDEX, LoaderData, RecallData, Vocab, load_data
from evo_attention.data.base import SPLITS
from evo_attention.data.words import EOS, corpus_words, prompt_words, text_lines
from evo_attention.util.errors import UserError
from evo_attention.utils import get_dataloaders, get_device, set_seed

WT2 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2"
needs_wt2 = pytest.mark.skipif(not WT2.is_dir(), reason=f"shared WikiText-2 corpus not found at {WT2}")


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path):
    """Every test gets its own cache dir and no data-dir override from the environment."""
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_DATA_DIR, raising=False)


@pytest.fixture(scope="session")
def wt2_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("wt2-cache")


@pytest.fixture(scope="session")
def wt2(wt2_cache):
    """WikiText-2 with the full vocabulary, tokenized cold once per session."""
    if not WT2.is_dir():
        pytest.skip(f"shared WikiText-2 corpus not found at {WT2}")
    return load_data("wikitext2", data_dir=WT2, seq_len=128, cache_dir=wt2_cache)


def write_corpus(directory: Path, train="the cat sat\nthe dog\n\nthe cat ran away\n",
                 valid="the bird sat\n", test="a cat\n") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("train.txt", train), ("valid.txt", valid), ("test.txt", test)):
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def user_error(fn, *needles) -> str:
    """Run fn, expect a one-line UserError containing every needle; return the message."""
    with pytest.raises(UserError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert str(needle) in message, (needle, message)
    return message


def scored_stream(task, split, batch_size=64):
    """Scored targets in order, their inputs, and the count of scored positions."""
    targets, inputs = [], []
    for x, y in task.eval_batches(split, batch_size):
        keep = y != IGNORE_INDEX
        targets.append(y[keep])
        inputs.append(x[keep])
        if task.eval_stride is None:  # without a stride, only padding is unscored
            assert (x[~keep] == task.pad_id).all()
    return torch.cat(targets), torch.cat(inputs)


# --- WikiText-2 ------------------------------------------------------------------------------

@needs_wt2
def test_wikitext2_token_counts(wt2):
    assert {s: len(t) for s, t in wt2.streams.items()} == {"train": 2_074_903, "valid": 217_646, "test": 245_569}
    assert wt2.scored_tokens("valid") == 217_645
    assert wt2.vocab_size == len(wt2.vocab) and wt2.vocab_size > 30_000
    info = wt2.describe()
    assert info["tokens"]["test"] == 245_569 and info["fingerprint"] == wt2.fingerprint
    assert len(wt2.fingerprint) == 64


@needs_wt2
@pytest.mark.parametrize("split", ["valid", "test"])
def test_eval_scores_every_target_exactly_once(wt2, split):
    stream = wt2.streams[split]
    targets, inputs = scored_stream(wt2, split)
    assert torch.equal(targets, stream[1:])  # every target once, in order
    assert torch.equal(inputs, stream[:-1])  # each scored after the right input
    assert len(targets) == wt2.scored_tokens(split) == len(stream) - 1
    *_, (x_last, y_last) = wt2.eval_batches(split, 64)
    tail = (len(stream) - 1) % wt2.seq_len  # the last window is partial: padded, never scored
    assert tail and (y_last[-1, tail:] == IGNORE_INDEX).all() and (x_last[-1, tail:] == wt2.pad_id).all()
    assert (y_last[-1, :tail] != IGNORE_INDEX).all()


@needs_wt2
def test_eval_max_batches_and_batch_size_independence(wt2):
    assert len(list(wt2.eval_batches("valid", 16, max_batches=3))) == 3
    small = sum(int((y != IGNORE_INDEX).sum()) for _, y in wt2.eval_batches("test", 7))
    assert small == wt2.scored_tokens("test")


@needs_wt2
def test_strided_eval_scores_every_target_once(wt2, wt2_cache):
    task = load_data("wikitext2", data_dir=WT2, seq_len=128, eval_stride=48, cache_dir=wt2_cache)
    stream = task.streams["valid"]
    targets, inputs = scored_stream(task, "valid", batch_size=256)
    assert torch.equal(targets, stream[1:]) and torch.equal(inputs, stream[:-1])
    x, y = next(task.eval_batches("valid", 4))
    assert (y[0] != IGNORE_INDEX).all()  # first window scores everything
    assert (y[1:, :80] == IGNORE_INDEX).all() and (y[1:, 80:] != IGNORE_INDEX).all()
    assert torch.equal(x[2], stream[96:224])  # window i starts at i * stride
    assert task.scored_tokens("valid") == len(stream) - 1


@needs_wt2
def test_train_batches_deterministic_windows(wt2):
    def first(seed, n=3):
        batches = wt2.train_batches(8, torch.Generator().manual_seed(seed))
        return [next(batches) for _ in range(n)]

    a, b, c = first(0), first(0), first(1)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])
    x, y = a[0]
    assert x.shape == y.shape == (8, 128) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and (y != IGNORE_INDEX).all()


@needs_wt2
def test_train_windows_are_aligned(wt2):
    T = wt2.seq_len
    gen = torch.Generator().manual_seed(3)
    n = wt2.num_train_items()
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3))[:4]
    x, y = next(wt2.train_batches(4, gen))
    stream = wt2.streams["train"]
    for row_x, row_y, i in zip(x, y, perm.tolist()):
        assert torch.equal(row_x, stream[i * T:(i + 1) * T]) and torch.equal(row_y, stream[i * T + 1:(i + 1) * T + 1])


@needs_wt2
def test_cache_hit_is_identical_and_does_not_tokenize(wt2, wt2_cache, monkeypatch):
    from evo_attention.data import corpus

    def tokenize(*args, **kwargs):
        raise AssertionError("a cache hit tokenized the corpus again")

    monkeypatch.setattr(corpus, "_tokenize_splits", tokenize)
    again = load_data("wikitext2", data_dir=WT2, seq_len=128, cache_dir=wt2_cache)
    assert all(torch.equal(again.streams[s], wt2.streams[s]) and again.streams[s].dtype == torch.int64
               for s in ("train", "valid", "test"))
    assert again.vocab == wt2.vocab and again.fingerprint == wt2.fingerprint
    assert not list(wt2_cache.glob("*.tmp"))


@needs_wt2
def test_wikitext2_vocab_size_n(wt2, wt2_cache):
    task = load_data("wikitext2", data_dir=WT2, vocab_size=10_000, seq_len=64, cache_dir=wt2_cache)
    assert task.vocab_size == len(task.vocab) == 10_000
    assert task.fingerprint != wt2.fingerprint
    assert int(task.streams["train"].max()) < 10_000
    # same words as the full vocabulary, rare ones folded into <unk>
    words = wt2.vocab.decode(wt2.streams["valid"])
    assert task.vocab.encode(words) == task.streams["valid"].tolist()
    assert (task.streams["valid"] == task.vocab.unk_id).sum() > (wt2.streams["valid"] == wt2.vocab.unk_id).sum()


@needs_wt2
def test_wikitext2_from_env_var(monkeypatch, wt2, wt2_cache):
    monkeypatch.setenv(ENV_DATA_DIR, str(WT2))
    task = load_data("wikitext2", seq_len=128, cache_dir=wt2_cache)
    assert task.fingerprint == wt2.fingerprint


# --- text corpora ----------------------------------------------------------------------------

def test_tokenize_recipe():
    assert corpus_words("a b\n\n c \n") == ["a", "b", "<eos>", "<eos>", "c", "<eos>"]
    assert corpus_words("a b") == ["a", "b", "<eos>"]  # last line without newline
    assert corpus_words("a\r\nb\r") == ["a", "<eos>", "b", "<eos>"]
    assert corpus_words("") == []
    assert corpus_words("x\u2028y\x0cz\n") == ["x", "y", "z", EOS]  # other separators are whitespace in a line
    assert text_lines("a\r\n\rb") == ["a", "", "b"] and text_lines("a\n") == ["a"] and text_lines("") == []


@pytest.mark.parametrize("text, words", [("a b", ["a", "b"]), ("a\n", ["a", EOS]), ("a\n\n", ["a", EOS, EOS]),
                                         ("a\r\nb\r", ["a", EOS, "b", EOS]), ("a\rb", ["a", EOS, "b"]),
                                         (" a \n b ", ["a", EOS, "b"]), ("", [])])
def test_a_prompt_ends_in_eos_only_after_a_final_newline(text, words):
    assert prompt_words(text) == words
    assert Vocab(["<unk>", EOS, "a", "b"]).encode(text) == [{"a": 2, "b": 3, EOS: 1}[w] for w in words]


def test_text_corpus_streams_and_vocab(tmp_path):
    task = load_data("text", data_dir=write_corpus(tmp_path / "c"), seq_len=2)
    v = task.vocab
    assert v.itos == ["<unk>", "<eos>", "the", "cat", "away", "dog", "ran", "sat"]  # count desc, word asc
    assert v.decode(task.streams["train"]) == "the cat sat <eos> the dog <eos> <eos> the cat ran away <eos>".split()
    assert task.streams["valid"].tolist() == [2, 0, 7, 1]  # 'bird' is not a train word
    assert task.pad_id == v.eos_id and task.vocab_size == 8


def test_vocab_size_n_exact_and_unk(tmp_path):
    corpus = write_corpus(tmp_path / "c")
    task = load_data("text", data_dir=corpus, vocab_size=4, seq_len=2)
    assert task.vocab.itos == ["<unk>", "<eos>", "the", "cat"] and task.vocab_size == 4
    assert task.vocab.decode(task.streams["train"][:4]) == ["the", "cat", "<unk>", "<eos>"]
    big = load_data("text", data_dir=corpus, vocab_size=20, seq_len=2)
    assert len(big.vocab) == big.vocab_size == 20  # spare ids get placeholder names
    assert int(big.streams["train"].max()) < 8
    assert load_data("text", data_dir=corpus, vocab_size=2, seq_len=2).vocab.itos == ["<unk>", "<eos>"]


def test_vocab_json_round_trip():
    v = Vocab.from_counts({"b": 2, "a": 2, "c": 5, "<eos>": 9})
    assert v.itos == ["<unk>", "<eos>", "c", "a", "b"]
    assert Vocab.from_json(v.to_json()) == v
    assert Vocab.from_json(json.loads(v.to_json())) == v
    assert v.encode("c zzz a") == [2, 0, 3] and len(v) == 5
    # without <unk>, an unknown word is one line naming it, whether the words come as a list or a generator
    for words in (["a", "zz"], (w for w in ["a", "zz"])):
        user_error(lambda: Vocab(["a", "b"]).encode(words), "word 'zz' is not in the vocabulary")
    user_error(lambda: Vocab.from_json('{"itos": 3}'), "vocabulary")


def test_an_eval_split_with_nothing_to_score_is_refused_when_loaded(tmp_path):
    corpus = write_corpus(tmp_path / "c", valid="a")  # one character: no token has one before it
    user_error(lambda: load_data("text", data_dir=corpus, seq_len=4, tokenizer="char"),
               "the valid split of", "has no token to score", "use a bigger valid file")


def test_eval_padding_and_coverage_small(tmp_path):
    corpus = write_corpus(tmp_path / "c", valid="a b c d e f g\n")  # 8 tokens, 7 targets
    for stride in (None, 1, 2, 3):
        task = load_data("text", data_dir=corpus, seq_len=3, eval_stride=stride)
        stream = task.streams["valid"]
        targets, inputs = scored_stream(task, "valid", batch_size=2)
        assert torch.equal(targets, stream[1:]) and torch.equal(inputs, stream[:-1])
        assert task.scored_tokens("valid") == 7
    x, y = list(load_data("text", data_dir=corpus, seq_len=3).eval_batches("valid", 10))[0]
    assert y[-1].tolist() == [stream[7].item(), IGNORE_INDEX, IGNORE_INDEX]  # 7 = 3 + 3 + 1
    assert x[-1, 1:].tolist() == [task.pad_id] * 2


def test_epochs_carry_over_and_permute(tmp_path):
    task = RecallData(train_examples=50, eval_examples=5, seq_len=32, num_pairs=4)
    rows = {tuple(r.tolist()): i for i, r in enumerate(task.data["train"][0])}
    assert len(rows) == 50
    batches = task.train_batches(7, torch.Generator().manual_seed(0))
    seen = [rows[tuple(r.tolist())] for _ in range(8) for r in next(batches)[0]]
    assert sorted(seen[:50]) == list(range(50))  # first epoch is a permutation
    assert len(set(seen[50:])) == 6  # then the next epoch starts, inside the same batch


def test_cache_uses_env_dir_and_rebuilds_damaged_file(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c")
    cache_dir = tmp_path / "env-cache"
    monkeypatch.setenv(ENV_CACHE_DIR, str(cache_dir))
    first = load_data("text", data_dir=corpus, seq_len=2)
    files = list(cache_dir.glob("tokens-*.pt"))
    assert [f.name for f in files] == [f"tokens-{first.fingerprint}.pt"]
    files[0].write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="unreadable cache"):
        second = load_data("text", data_dir=corpus, seq_len=2)
    assert all(torch.equal(first.streams[s], second.streams[s]) for s in first.streams)
    (corpus / "test.txt").write_text("a dog\n", encoding="utf-8")
    assert load_data("text", data_dir=corpus, seq_len=2).fingerprint != first.fingerprint


def test_a_damaged_cache_entry_is_rebuilt_not_trusted(tmp_path):
    """torch's zip reader checks no CRC: a byte flipped in a stored tensor loaded as other data."""
    import zipfile

    corpus, cache_dir = write_corpus(tmp_path / "c"), tmp_path / "cache"
    first = load_data("text", data_dir=corpus, seq_len=2, cache_dir=cache_dir)
    path = cache_dir / f"tokens-{first.fingerprint}.pt"

    def reloaded_is_first():
        data = load_data("text", data_dir=corpus, seq_len=2, cache_dir=cache_dir)
        sizes = [(a, b) for s in SPLITS for a, b in zip(first.text_sizes[s], data.text_sizes[s])]
        return (data.vocab.itos == first.vocab.itos and all(torch.equal(a, b) for a, b in sizes)
                and all(torch.equal(first.streams[s], data.streams[s]) for s in SPLITS))

    with zipfile.ZipFile(path) as z:  # the tensors: three streams, their bytes and characters per token
        tensors = sorted(i.filename for i in z.infolist() if "/data/" in i.filename)
    assert len(tensors) == 9
    for name in tensors:
        raw = bytearray(path.read_bytes())
        with zipfile.ZipFile(path) as z:
            header = z.getinfo(name).header_offset
        start = header + 30 + int.from_bytes(raw[header + 26:header + 28], "little") + \
            int.from_bytes(raw[header + 28:header + 30], "little")  # past the local header, name and extra
        raw[start] ^= 1
        path.write_bytes(bytes(raw))
        with pytest.warns(UserWarning, match="unreadable cache"):
            assert reloaded_is_first(), name
    for damage in (lambda p: p.update(vocab=p["vocab"].replace("{", "x", 1)), lambda p: p["streams"].pop("test")):
        payload = torch.load(path, weights_only=True)
        damage(payload)
        torch.save(payload, path)
        with pytest.warns(UserWarning, match="unreadable cache"):
            assert reloaded_is_first()
    payload = torch.load(path, weights_only=True)
    del payload["checksum"]  # an entry of an older version: rebuilt once, then checked
    torch.save(payload, path)
    assert reloaded_is_first() and "checksum" in torch.load(path, weights_only=True)


def test_wikitext2_accepts_original_file_names(tmp_path):
    d = tmp_path / "wt"
    d.mkdir()
    for split in ("train", "valid", "test"):
        (d / f"wiki.{split}.tokens").write_text(" = Title = \n\n words here \n", encoding="utf-8")
    task = load_data("wikitext2", data_dir=d, seq_len=4)
    assert task.vocab.decode(task.streams["valid"]) == "= Title = <eos> <eos> words here <eos>".split()


def test_hf_fallback_with_stub_module(monkeypatch):
    lines = [""," = A = \n", "", " the cat sat \n"]
    stub = types.ModuleType("datasets")
    stub.load_dataset = lambda *a: {s: {"text": lines} for s in ("train", "validation", "test")}
    stub.config = types.SimpleNamespace(HF_HUB_OFFLINE=True)  # offline: the hub's reachability is not asked
    monkeypatch.setitem(sys.modules, "datasets", stub)
    task = load_data("wikitext2", seq_len=4)
    assert task.vocab.decode(task.streams["test"]) == "<eos> = A = <eos> <eos> the cat sat <eos>".split()
    assert task.describe()["settings"]["source"].startswith("huggingface:")


# --- errors ----------------------------------------------------------------------------------

def test_errors_for_bad_directories_and_files(tmp_path, monkeypatch):
    missing = tmp_path / "nope"
    user_error(lambda: load_data("text", data_dir=missing), missing)
    user_error(lambda: load_data("text"), "data_dir")
    monkeypatch.setenv(ENV_DATA_DIR, str(missing))
    user_error(lambda: load_data("wikitext2"), missing)

    corpus = write_corpus(tmp_path / "c")
    (corpus / "test.txt").unlink()
    user_error(lambda: load_data("text", data_dir=corpus), corpus, "test.txt")
    user_error(lambda: load_data("wikitext2", data_dir=corpus), "test.txt", "wiki.test.tokens")

    for name, content in (("empty", b""), ("blank", b"\n  \n\n"), ("latin1", "café\n".encode("latin-1"))):
        bad = write_corpus(tmp_path / name)
        (bad / "valid.txt").write_bytes(content)
        user_error(lambda: load_data("text", data_dir=bad), bad / "valid.txt")
    unicode_blank = write_corpus(tmp_path / "ublank")
    (unicode_blank / "train.txt").write_text("\u2003\n\u3000\n", encoding="utf-8")
    user_error(lambda: load_data("text", data_dir=unicode_blank), unicode_blank / "train.txt", "no tokens")


def test_errors_for_bad_settings(tmp_path):
    corpus = write_corpus(tmp_path / "c")
    user_error(lambda: load_data("text", data_dir=corpus, vocab_size=1), "vocab_size", "1")
    user_error(lambda: load_data("text", data_dir=corpus, seq_len=0), "seq_len", "0")
    user_error(lambda: load_data("text", data_dir=corpus, seq_len=4, eval_stride=5), "eval_stride 5")
    user_error(lambda: load_data("text", data_dir=corpus, seq_len=1000), "1001", corpus.resolve())
    user_error(lambda: load_data("wikitext3"), "'wikitext3'", "recall")
    user_error(lambda: load_data("recall", seq_len=16, num_pairs=8), "seq_len 16", "num_pairs 8")
    user_error(lambda: load_data("recall", vocab_size=10, num_pairs=8), "vocab_size 10")
    user_error(lambda: load_data("recall", num_queries=9), "num_queries 9")
    user_error(lambda: load_data("recall", nmu_pairs=3), "nmu_pairs")
    user_error(lambda: load_data("text", data_dir=corpus, num_pairs=3), "num_pairs")
    task = load_data("text", data_dir=corpus, seq_len=2)
    user_error(lambda: task.eval_batches("validation", 4), "'validation'")
    user_error(lambda: task.train_batches(0, torch.Generator()), "batch_size")


def test_error_when_hf_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    user_error(lambda: load_data("wikitext2"), ENV_DATA_DIR, "data_dir")
    failing = types.ModuleType("datasets")

    def offline(*args):
        raise ConnectionError("no network\nat all")

    failing.load_dataset = offline
    failing.config = types.SimpleNamespace(HF_HUB_OFFLINE=True)
    monkeypatch.setitem(sys.modules, "datasets", failing)
    user_error(lambda: load_data("wikitext2"), ENV_DATA_DIR, "ConnectionError")


def test_unreachable_hub_fails_at_once(monkeypatch, tmp_path):
    """Without the cached dataset, an unreachable hub gives the one-line error before datasets is asked
    (which would log ~40 s of retries first); a cached dataset is still read."""
    calls = []
    stub = types.ModuleType("datasets")
    stub.config = types.SimpleNamespace(HF_HUB_OFFLINE=False, HF_DATASETS_CACHE=str(tmp_path))
    stub.load_dataset = lambda *a: calls.append(a) or {s: {"text": [" a b \n"]}
                                                       for s in ("train", "validation", "test")}
    monkeypatch.setitem(sys.modules, "datasets", stub)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    user_error(lambda: load_data("wikitext2"), f"127.0.0.1:{port} cannot be reached", ENV_DATA_DIR)
    user_error(lambda: load_data("hf:some/name"), "hf:some/name", f"127.0.0.1:{port} cannot be reached")
    assert calls == []
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # behind a proxy datasets is asked: no direct connect
    from evo_attention.data.hf import hub_unreachable
    assert hub_unreachable(stub, "some___name") is None
    monkeypatch.delenv("HTTPS_PROXY")
    (tmp_path / "wikitext" / "wikitext-2-v1").mkdir(parents=True)
    assert load_data("wikitext2", seq_len=2).vocab_size > 0 and len(calls) == 1


# --- recall ----------------------------------------------------------------------------------

def test_recall_deterministic():
    a = RecallData()
    b, c = RecallData(), RecallData(seed=1)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    for split in ("train", "valid", "test"):
        assert all(torch.equal(p, q) for p, q in zip(a.data[split], b.data[split]))
    assert not torch.equal(a.data["valid"][0], c.data["valid"][0])
    g0, g1 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(next(a.train_batches(16, g0))[0], next(b.train_batches(16, g1))[0])


def test_recall_scores_only_correct_answers():
    task = RecallData(vocab_size=40, seq_len=48, num_pairs=6, num_queries=4, train_examples=500, eval_examples=300)
    P, Q, K = 6, 4, task.num_keys
    for split in ("train", "valid"):
        x, y = task.data[split]
        assert x.shape == y.shape == (task.num_eval_items(split), 48)
        scored = y != IGNORE_INDEX
        assert (scored.sum(1) == Q).all()
        rows, pos = scored.nonzero(as_tuple=True)
        keys, answers = x[rows, pos], y[rows, pos]
        assert (pos >= 2 * P).all() and ((keys >= 1) & (keys <= K)).all() and (answers > K).all()
        pair_keys = x[rows, : 2 * P : 2]  # [n, P]
        j = (pair_keys == keys[:, None]).float().argmax(1)
        assert (pair_keys[torch.arange(len(j)), j] == keys).all()  # the queried key was given
        assert torch.equal(x[rows, 2 * j + 1], answers)  # and the answer is its value
        assert (pair_keys.sort(1).values.diff(1) != 0).all()  # keys are distinct
    assert task.scored_tokens("valid") == 300 * Q
    assert sum(int((y != IGNORE_INDEX).sum()) for _, y in task.eval_batches("valid", 64)) == 300 * Q


def test_recall_splits_disjoint():
    task = RecallData()
    rows = {s: {tuple(r.tolist()) for r in task.data[s][0]} for s in ("train", "valid", "test")}
    assert len(rows["valid"]) == 1000 and len(rows["train"]) == 20_000
    assert not rows["train"] & rows["valid"] and not rows["train"] & rows["test"] and not rows["valid"] & rows["test"]


# --- loaders and utils ------------------------------------------------------------------------

def test_loader_data_adapter():
    x = torch.arange(12).view(2, 6)
    train = [(x, x + 1)]
    valid = [{"input_ids": x, "labels": torch.where(x % 2 == 0, x + 1, IGNORE_INDEX)}]
    task = LoaderData(train, valid, vocab_size=20, seq_len=6)
    batches = task.train_batches(99, torch.Generator())
    assert all(torch.equal(next(batches)[1], x + 1) for _ in range(3))  # cycles forever
    assert task.scored_tokens("valid") == 6 and len(list(task.eval_batches("valid"))) == 1
    assert len(task.fingerprint) == 64
    user_error(lambda: task.eval_batches("test"), "test_loader")
    bad = LoaderData([(x, x)], valid, vocab_size=20, seq_len=6)
    user_error(lambda: next(bad.train_batches(1, None)), "labels")
    # a negative label other than -100 would be scored as token 0; an id past the vocabulary fails later
    for inputs, labels, needles in ((x, torch.where(x > 8, -1, x + 1), ("labels hold -1", "-100 where")),
                                    (x, x + 8, ("labels hold 19", "0 to 18")), (x + 8, x, ("input_ids hold 19",))):
        bad = LoaderData([(inputs, labels)], valid, vocab_size=19, seq_len=6)
        user_error(lambda: next(bad.train_batches(1, None)), *needles)


def test_loader_data_opens_a_loader_only_when_its_batches_are_read():
    """Iterating a DataLoader draws from torch's global generator: asking for the batches without
    reading them must leave that generator where it was (the same seed, the same later draws)."""
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.arange(24).view(4, 6)
    loader = DataLoader(TensorDataset(x, x + 1), batch_size=2)
    task = LoaderData(loader, loader, vocab_size=30, seq_len=6)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    batches = task.eval_batches("valid")
    assert torch.equal(torch.rand(3), expected)
    assert [b[0].tolist() for b in batches] == [x[:2].tolist(), x[2:].tolist()]


@needs_wt2
def test_get_dataloaders_wikitext(monkeypatch, wt2_cache):
    monkeypatch.setenv(ENV_CACHE_DIR, str(wt2_cache))
    set_seed(0)
    train, valid = get_dataloaders(10_000, 64, 8, 32, data_dir=WT2)
    x, y = next(iter(train))
    assert x.shape == y.shape == (8, 64) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    assert train.task_data is valid.task_data and train.task_data.vocab_size == 10_000
    assert sum(int((y != IGNORE_INDEX).sum()) for _, y in valid) == 217_645
    set_seed(0)
    assert torch.equal(next(iter(train))[0], x)


def test_get_dataloaders_recall_and_missing_data(monkeypatch, tmp_path):
    train, valid = get_dataloaders(64, 32, 4, 16, use_wikitext=False)
    x, y = next(iter(train))
    assert x.shape == y.shape == (4, 32) and train.task_data.name == "recall"
    assert next(iter(valid))[0].shape == (16, 32)
    monkeypatch.setenv(ENV_DATA_DIR, str(tmp_path / "missing"))
    user_error(lambda: get_dataloaders(100, 32, 4, 4), tmp_path / "missing")
    monkeypatch.delenv(ENV_DATA_DIR)
    monkeypatch.setitem(sys.modules, "datasets", None)
    user_error(lambda: get_dataloaders(100, 32, 4, 4), ENV_DATA_DIR)


def test_set_seed_and_get_device():
    set_seed(7)
    first = (random.random(), float(np.random.rand()), torch.rand(2))
    set_seed(7)
    assert first[:2] == (random.random(), float(np.random.rand())) and torch.equal(first[2], torch.rand(2))
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert get_device() == torch.device(expected)


def test_a_plugin_dataset_that_is_no_function_or_gives_no_task_data_is_refused():
    from evo_attention.data import register_dataset
    from evo_attention.data.base import DATASET_FACTORIES

    with pytest.raises(TypeError, match=r"^register_dataset\('x'\) decorates a function settings -> TaskData, not"):
        register_dataset("x")("not a function")
    register_dataset("gives_none")(lambda settings: None)
    try:
        with pytest.raises(UserError, match=r"^dataset 'gives_none' gave NoneType, not a TaskData: its plugin's"):
            load_data("gives_none")
    finally:
        DATASET_FACTORIES.pop("gives_none")
    assert "x" not in DATASET_FACTORIES
