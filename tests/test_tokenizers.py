"""Tokenizers, bits per byte, a second real corpus and Hugging Face datasets (docs/data.md)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evo_attention import Config, Status, train_and_evaluate
from evo_attention.cli import main
from evo_attention.data import data_from_config, load_data
from evo_attention.data.base import fingerprint_of
from evo_attention.data.cache import FORMAT_VERSION, cache_key
from evo_attention.data.tokenizers import (BPETokenizer, ByteTokenizer, CharTokenizer, WordTokenizer,
                                           parse_tokenizer, tokenizer_from_json, train_tokenizer)
from evo_attention.util.errors import UserError

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "shakespeare"
TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler — in the mind\n\nto suffer — ß ü 🙂\n"
TINY = dict(max_seq_len=16, d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=4, eval_batch_size=8,
            eval_steps=None, train_steps=2, log_every=1, learning_rate=1e-3)


@pytest.fixture
def shakespeare():
    if not (SHAKESPEARE / "valid.txt").exists():
        pytest.skip(f"shared Shakespeare corpus not found at {SHAKESPEARE}")
    return SHAKESPEARE


@pytest.fixture
def corpus_dir(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text(TEXT * 8, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("spec, fragment", [("chars", "unknown tokenizer 'chars'"), ("bpe", "bpe:N"),
                                            ("bpe:0", "too small"), ("bpe:-5", "too small"), (7, "unknown tokenizer")])
def test_bad_tokenizers_are_one_line_errors(spec, fragment):
    with pytest.raises(UserError, match=fragment) as info:
        parse_tokenizer(spec)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match=fragment):
        Config(tokenizer=spec)


@pytest.mark.parametrize("spec", ["word", "char", "byte", "bpe:300"])
def test_every_tokenizer_counts_the_bytes_and_characters_of_its_text(spec):
    tok = train_tokenizer(spec, TEXT * 4, vocab_size=None)
    encoded = tok.encode(TEXT)
    assert encoded.ids.dtype == torch.long and len(encoded.ids) == len(encoded.nbytes) == len(encoded.nchars)
    assert int(encoded.nbytes.sum()) == len(TEXT.encode("utf-8"))  # TEXT has single spaces: the word recipe's form
    assert int(encoded.nchars.sum()) == len(TEXT)
    assert int(encoded.ids.max()) < tok.vocab_size
    again = tokenizer_from_json(tok.to_json())
    assert torch.equal(again.encode(TEXT).ids, encoded.ids)
    if spec != "word":
        assert again.decode(encoded.ids.tolist()) == TEXT


def test_unknown_symbols():
    chars = CharTokenizer.train("abc")
    assert chars.encode("abz").ids.tolist() == [1, 2, 0]  # z is <unk>, still one byte of text
    assert ByteTokenizer().encode("é").ids.tolist() == [0xC3, 0xA9]
    assert ByteTokenizer().encode("é").nchars.tolist() == [1, 0]  # one character, counted at its first byte


@pytest.mark.parametrize("spec", ["word", "char", "byte", "bpe:300"])
def test_every_tokenizer_encodes_an_empty_text_as_no_tokens(spec):
    encoded = train_tokenizer(spec, TEXT * 4, vocab_size=None).encode("")
    assert encoded.ids.dtype == torch.long and len(encoded.ids) == len(encoded.nbytes) == len(encoded.nchars) == 0


HUGE_BPE = """
import sys
from evo_attention.data.tokenizers import train_tokenizer
from evo_attention.util import memory
from evo_attention.util.errors import UserError
text = sys.argv[1]
assert train_tokenizer("bpe:4294967296", text).to_json() == train_tokenizer("bpe:1000", text).to_json()
memory.available_memory = lambda: 10**5
try:
    train_tokenizer("bpe:99999999999999", text)
except UserError as e:
    print(e.setting, e)
"""


def test_a_bpe_size_past_what_the_text_can_merge_trains_the_same_tokenizer_or_is_refused():
    """The BPE trainer reserves its tables for the size asked before it trains: bpe:4294967296 was a
    Rust out-of-memory abort (a separate process, so that an abort fails this test, not the run)."""
    done = subprocess.run([sys.executable, "-c", HUGE_BPE, TEXT * 8], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("tokenizer a BPE vocabulary of") and "use a smaller N in bpe:N" in done.stdout


def test_the_word_recipe_keeps_its_fingerprint():
    hashes = {"train": "a", "valid": "b", "test": "c"}
    old = fingerprint_of({"files": hashes, "vocab_size": 100, "recipe": 1, "cache_format": FORMAT_VERSION})
    assert cache_key(hashes, 100, 1) == old != cache_key(hashes, 100, 1, tokenizer="char")


def test_bits_per_byte_is_the_nll_in_bits_over_the_scored_bytes(corpus_dir):
    config = Config(**TINY, data="text", data_dir=str(corpus_dir), tokenizer="char")
    data = data_from_config(config)
    record = train_and_evaluate("dot|softmax|none|fixed", config, data)
    assert record.status is Status.OK
    text = (corpus_dir / "valid.txt").read_text(encoding="utf-8")
    assert record.eval_tokens == len(text) - 1  # every character but the first has a context
    assert record.eval_chars == len(text) - 1 and record.eval_bytes == len(text.encode()) - 1  # the first is "T"
    nll_bits = record.val_loss * record.eval_tokens / math.log(2)
    assert record.bits_per_byte == pytest.approx(nll_bits / record.eval_bytes, rel=1e-9)
    assert record.bits_per_char == pytest.approx(nll_bits / record.eval_chars, rel=1e-9)


def test_two_tokenizations_score_the_same_text(corpus_dir):
    sizes = {}
    for spec in ("char", "byte", "bpe:300"):
        data = load_data("text", data_dir=corpus_dir, seq_len=16, tokenizer=spec)
        first = data.text_sizes["valid"][0][0]
        sizes[spec] = data.scored_text("valid", 8)["bytes"] + int(first)
    assert len(set(sizes.values())) == 1 == len({len((corpus_dir / "valid.txt").read_bytes())} | set(sizes.values()))


def test_a_capped_evaluation_counts_only_its_windows(corpus_dir):
    data = load_data("text", data_dir=corpus_dir, seq_len=16, tokenizer="byte")
    full, capped = data.scored_text("valid", 2), data.scored_text("valid", 2, max_batches=1)
    y_scored = sum(int((y != -100).sum()) for _, y in data.eval_batches("valid", 2, 1))
    assert capped["bytes"] == y_scored < full["bytes"]  # one byte per token: the scored targets themselves


@pytest.mark.parametrize("tokenizer", ["char", "bpe:2000"])
def test_shakespeare_baseline_reports_bits_per_byte_over_the_whole_split(shakespeare, tokenizer, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["baseline", "--preset", "shakespeare-char", "--data-dir", str(shakespeare), "--tokenizer", tokenizer,
                 "--steps", "2", "--warmup-steps", "1", "--d-model", "16", "--layers", "1", "--out", str(out), "--quiet"]) == 0
    import json

    result = json.loads((out / "result.json").read_text())
    assert result["eval_complete"] and result["eval_tokens"] == result["eval_tokens_total"]
    first = {"char": 1, "bpe:2000": 1}[tokenizer]  # "J": one byte either way
    assert result["eval_bytes"] == (shakespeare / "valid.txt").stat().st_size - first
    assert result["bits_per_byte"] == pytest.approx(result["val_loss"] * result["eval_tokens"] /
                                                    (math.log(2) * result["eval_bytes"]))
    assert "bits per byte" in capsys.readouterr().err


@pytest.mark.parametrize("files, fragment", [
    ({"train.txt": b"", "valid.txt": b"x", "test.txt": b"x"}, "train.txt is empty"),
    ({"train.txt": b"abc \xff def" * 9, "valid.txt": b"x", "test.txt": b"x"}, "byte 0xff at offset 4"),
    ({"train.txt": b"abc", "valid.txt": b"abc"}, "no test split"),
    ({"train.txt": b"ab", "valid.txt": b"abc", "test.txt": b"abc"}, r"fewer than seq_len \+ 1"),
])
def test_bad_corpora_are_one_line_errors(files, fragment, tmp_path):
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError, match=fragment):
        load_data("text", data_dir=tmp_path, seq_len=16, tokenizer="char")


def test_recall_refuses_a_tokenizer():
    with pytest.raises(UserError, match="applies to text corpora"):
        data_from_config(Config(data="recall", vocab_size=32, max_seq_len=32, tokenizer="byte"))


def test_a_corpus_refuses_the_settings_it_would_ignore():
    # a word vocabulary size with another tokenizer, and task options, would be dropped (yet keyed)
    with pytest.raises(UserError, match=r"task options \(pairs\) apply to a generated task"):
        Config(data="text", recall={"pairs": 4})
    assert Config(data="recall", recall={"num_pairs": 4}).recall == {"num_pairs": 4}


def test_vocab_size_beside_another_tokenizer_is_refused(corpus_dir, tmp_path, capsys):
    flags = ["--data", "text", "--data-dir", str(corpus_dir), "--seq-len", "16", "--d-model", "16", "--heads", "2",
             "--layers", "1", "--steps", "1", "--batch-size", "4", "--quiet"]
    assert main(["baseline", *flags, "--tokenizer", "byte", "--vocab-size", "50", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--vocab-size 50 is the size of a word vocabulary; --tokenizer byte makes its own" in err
    assert "\n" not in err and not (tmp_path / "b").exists()
    (tmp_path / "c.yaml").write_text("vocab_size: 50\ntokenizer: char\n")  # a config file's, said as its key
    assert main(["baseline", *flags, "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "vocab_size 50 is the size of a word vocabulary; tokenizer char makes its own" in err
    assert "vocab_size is set in config file" in err and "\n" not in err


# -- Hugging Face datasets -------------------------------------------------------------------------
@pytest.fixture
def saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {split: {"content": [line for line in (TEXT * n).splitlines()], "id": list(range(4 * n))}
            for split, n in (("train", 8), ("validation", 2), ("test", 2))}
    path = tmp_path / "saved"
    datasets.DatasetDict({k: datasets.Dataset.from_dict(v) for k, v in rows.items()}).save_to_disk(str(path))
    return path


def test_a_locally_saved_hf_dataset_is_a_corpus(saved_dataset, tmp_path):
    config = Config(**TINY, data=f"hf:{saved_dataset}", text_field="content", tokenizer="byte")
    data = data_from_config(config)
    assert data.name == f"hf:{saved_dataset}" and data.vocab_size == 256
    assert data.scored_text("valid", 8)["bytes"] == len((TEXT * 2).encode()) - 1
    record = train_and_evaluate("dot|softmax|none|fixed", config, data)
    assert record.status is Status.OK and record.bits_per_byte > 0


def test_hf_errors_name_the_split_and_the_field(saved_dataset, tmp_path):
    import datasets

    with pytest.raises(UserError, match="no text field 'text'.*content, id"):
        load_data(f"hf:{saved_dataset}", seq_len=16, tokenizer="char")
    partial = tmp_path / "partial"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c"] * 50})}).save_to_disk(str(partial))
    with pytest.raises(UserError, match="has no valid split .*it has train"):
        load_data(f"hf:{partial}", seq_len=4)
    with pytest.raises(UserError, match="no saved dataset at"):
        load_data(f"hf:{tmp_path / 'missing'}", seq_len=4)


def test_hf_rows_are_one_line_each_and_text(tmp_path):
    datasets = pytest.importorskip("datasets")

    def saved(name, rows):
        path = tmp_path / name
        datasets.DatasetDict({split: datasets.Dataset.from_dict({"text": rows, "n": list(range(len(rows)))})
                              for split in ("train", "validation", "test")}).save_to_disk(str(path))
        return f"hf:{path}"

    # a row that ends its line (as the hub's WikiText rows do) is one line, not a line and an empty one
    ended, bare = load_data(saved("ended", ["a b\n", "c d\n"] * 4), seq_len=4), load_data(
        saved("bare", ["a b", "c d"] * 4), seq_len=4)
    assert ended.fingerprint == bare.fingerprint and ended.streams["valid"].tolist() == bare.streams["valid"].tolist()
    for name, rows, column in (("none", ["a b", None, "c d"], "text"), ("ints", ["a b"] * 3, "n")):
        with pytest.raises(UserError, match=r"split train row \d: .* not text"):
            load_data(saved(name, rows), seq_len=4, text_field=column)


def test_a_run_is_validated_on_another_corpus_and_tokenizer(shakespeare, tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
             "--layers", "1", "--batch-size", "8", "--steps", "2", "--population", "2", "--generations", "1",
             "--elite", "1", "--quiet"]
    assert main(["search", *flags, "--out", str(run)]) == 0
    out = tmp_path / "cross"
    assert main(["validate", "--from-run", str(run), "--top", "1", "--seeds", "2", "--data", "text", "--data-dir",
                 str(shakespeare), "--tokenizer", "byte", "--metric", "bits_per_byte", "--out", str(out),
                 "--quiet"]) == 0
    import json

    result = json.loads((out / "validation.json").read_text())
    assert result["metric"] == "bits_per_byte" and result["data"]["name"] == "text"
    assert all(v is not None and v > 0 for v in result["baseline"]["values"])


def test_a_saved_model_keeps_its_tokenizer(corpus_dir, tmp_path):
    from evo_attention.train.saving import load_tokenizer

    out = tmp_path / "b"
    assert main(["baseline", "--data", "text", "--data-dir", str(corpus_dir), "--tokenizer", "bpe:300", "--seq-len", "16",
                 "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "1", "--batch-size", "4",
                 "--save-model", "--out", str(out), "--quiet"]) == 0
    tok = load_tokenizer(out / "model")
    assert isinstance(tok, BPETokenizer) and tok.decode(tok.encode(TEXT).ids.tolist()) == TEXT
    word = tmp_path / "w"
    assert main(["baseline", "--data", "text", "--data-dir", str(corpus_dir), "--seq-len", "16", "--d-model", "16",
                 "--heads", "2", "--layers", "1", "--steps", "1", "--batch-size", "4", "--save-model",
                 "--out", str(word), "--quiet"]) == 0
    assert isinstance(load_tokenizer(word / "model"), WordTokenizer)


# -- a token's own text, and the attention maps of a character-level model ------------------------
def test_every_token_shows_its_own_text():
    chars = CharTokenizer.train("ab\n")
    assert chars.token_texts(chars.encode("ab\nz").ids) == ["a", "b", "\\n", "<unk>"]  # one line per label
    assert ByteTokenizer().token_texts(ByteTokenizer().encode("aé").ids) == ["a", "\\xc3", "\\xa9"]
    word = train_tokenizer("word", "the cat\n", None)
    assert word.token_texts(word.encode("the dog").ids) == ["the", "<unk>", "<eos>"]
    bpe = train_tokenizer("bpe:300", TEXT * 4)
    line = "To be, or not to be: that is the question."
    assert "".join(bpe.token_texts(bpe.encode(line).ids)) == line


def test_attention_maps_read_text_with_a_char_models_own_tokenizer(corpus_dir, tmp_path):
    import json

    from evo_attention import TinyTransformer
    from evo_attention.studies import maps
    from evo_attention.train.saving import save_model

    config = Config(**TINY, data="text", data_dir=str(corpus_dir), tokenizer="char")
    data = data_from_config(config)
    torch.manual_seed(0)
    model = TinyTransformer(config.replace(vocab_size=data.vocab_size), "dot|softmax|none|fixed")
    save_model(model, tmp_path / "model", tokenizer=data.tokenizer)
    text, out = "To be, or ß?", tmp_path / "maps"  # '?' is not a character of the train split
    assert main(["attention-maps", "--model", str(tmp_path / "model"), "--text", text, "--out", str(out),
                 "--quiet"]) == 0
    saved = json.loads((out / "attention_maps.json").read_text())
    assert saved["tokens"] == list(text[:-1]) + ["<unk>"]  # one label per character, not per word
    assert saved["token_ids"] == data.tokenizer.encode(text).ids.tolist()
    assert len(saved["layers"]) == 1 and (out / "attention_layer0.png").is_file()

    assert main(["attention-maps", "--model", str(tmp_path / "model"), "--length", "8", "--out", str(out),
                 "--quiet"]) == 0  # a validation example: labelled with its characters too
    saved = json.loads((out / "attention_maps.json").read_text())
    assert saved["tokens"] == data.tokenizer.token_texts(saved["token_ids"]) and saved["tokens"][:2] == ["T", "o"]
    with pytest.raises(UserError, match="17 tokens, more than the model's context of 16"):
        maps.encode_text("x" * 17, data.tokenizer, 16)  # one word, 17 characters
    assert maps.encode_text(" \n", data.tokenizer, 16) == data.tokenizer.encode(" \n").ids.tolist()  # two tokens
