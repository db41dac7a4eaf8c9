"""Word-level language-modelling corpora: WikiText-2 ('wikitext2') and any plain-text corpus ('text').

A corpus is a directory holding ``train.txt``, ``valid.txt`` and ``test.txt`` (for WikiText-2 the
original names ``wiki.train.tokens``, ``wiki.valid.tokens``, ``wiki.test.tokens`` work too).
Tokenization is the standard word-level recipe: for every line of a file (empty lines included),
``line.split()`` followed by ``<eos>``. Each split becomes one contiguous int64 token stream.
The vocabulary comes from the train split only (see ``vocab.py``); other words map to ``<unk>``.

Where WikiText-2 comes from: the ``data_dir`` argument, else ``$EVO_ATTENTION_DATA_DIR``, else the
Hugging Face ``datasets`` loader (``wikitext``/``wikitext-2-v1``, the same tokenized text) when that
package is installed and can reach its hub. Otherwise a UserError says how to point at the files;
there is never a substitute dataset.

Batches, for a stream s with targets s[1:] after inputs s[:-1] (N = len(s) - 1 targets):

* training: the full, non-overlapping windows starting at 0, T, 2T, ... (``N // T`` of them),
  shuffled per epoch; every target scored.
* evaluation: window i starts at ``i * S`` (S = ``eval_stride``, default T). The first window
  scores all its T targets, every later one only its last S (those no earlier window scored), so
  each of the N targets is scored exactly once. Positions past the end of the stream are padded:
  input ``<eos>``, target -100. With S = T this is the usual non-overlapping evaluation; a smaller
  S gives every scored token at least T - S tokens of context, at T / S times the cost.
"""

import hashlib
import os
from collections import Counter
from pathlib import Path

import torch

from evo_attention.util.errors import UserError
from evo_attention.data import cache
from evo_attention.data.base import IGNORE_INDEX, SPLITS, TaskData, check_positive
from evo_attention.data.vocab import EOS, Vocab, check_vocab_size

ENV_DATA_DIR = "EVO_ATTENTION_DATA_DIR"
RECIPE_VERSION = 1  # bump whenever tokenization changes: it is part of the cache key
HF_SOURCE = "huggingface:wikitext/wikitext-2-v1"

FILE_NAMES = {
    "wikitext2": {s: (f"{s}.txt", f"wiki.{s}.tokens") for s in SPLITS},
    "text": {s: (f"{s}.txt",) for s in SPLITS},
}


def tokenize(text: str) -> list[str]:
    """``line.split() + ['<eos>']`` for every line of ``text``, flattened (universal newlines)."""
    if not text:
        return []
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.endswith("\n"):
        text += "\n"
    return text.replace("\n", f" {EOS} ").split()


class CorpusData(TaskData):
    """A tokenized corpus: one int64 stream per split, a train-split Vocab, and window batching."""

    def __init__(self, name: str, streams: dict[str, torch.Tensor], vocab: Vocab, *, seq_len: int,
                 fingerprint: str, eval_stride: int | None = None, source: str = ""):
        check_settings(seq_len, eval_stride)
        self.name, self.vocab, self.streams, self.source = name, vocab, streams, source
        self.vocab_size = len(vocab)
        self.seq_len = seq_len
        self.eval_stride = eval_stride
        self.stride = eval_stride or seq_len
        self.fingerprint = fingerprint
        self.pad_id = vocab.eos_id
        n_train = len(streams["train"])
        if n_train < seq_len + 1:
            raise UserError(f"the train split of {source} has {n_train} tokens, fewer than seq_len + 1 = "
                            f"{seq_len + 1}; lower seq_len or use a bigger train file")

    def num_train_items(self) -> int:
        return (len(self.streams["train"]) - 1) // self.seq_len

    def train_items(self, idx: torch.Tensor):
        s = self.streams["train"]
        pos = idx[:, None] * self.seq_len + torch.arange(self.seq_len)
        return s[pos], s[pos + 1]

    def num_eval_items(self, split: str) -> int:
        n, T, S = len(self.streams[split]) - 1, self.seq_len, self.stride
        return 1 + max(0, n - T + S - 1) // S

    def eval_items(self, split: str, idx: torch.Tensor):
        s = self.streams[split]
        n, T, S = len(s) - 1, self.seq_len, self.stride
        pos = idx[:, None] * S + torch.arange(T)  # target positions covered by each window
        inside = pos < n
        pos = pos.clamp(max=n - 1)
        x = torch.where(inside, s[pos], self.pad_id)
        y = torch.where(inside, s[pos + 1], IGNORE_INDEX)
        if S < T:  # later windows score only the targets no earlier window scored
            y[idx > 0, : T - S] = IGNORE_INDEX
        return x, y

    def scored_tokens(self, split: str) -> int:
        return len(self.streams[self.check_split(split)]) - 1

    def describe(self) -> dict:
        return {
            **super().describe(),
            "tokens": {s: len(t) for s, t in self.streams.items()},
            "scored_tokens": {s: self.scored_tokens(s) for s in SPLITS},
            "settings": {"eval_stride": self.eval_stride, "recipe_version": RECIPE_VERSION,
                         "source": self.source, "unk_id": self.vocab.unk_id, "eos_id": self.vocab.eos_id},
        }


def check_settings(seq_len, eval_stride) -> None:
    check_positive("seq_len", seq_len)
    if eval_stride is not None:
        check_positive("eval_stride", eval_stride)
        if eval_stride > seq_len:
            raise UserError(f"eval_stride {eval_stride} is larger than seq_len {seq_len}; use a stride between 1 and seq_len")


def load_corpus(name: str = "wikitext2", data_dir: str | os.PathLike | None = None, *,
                vocab_size: int | None = None, seq_len: int = 128, eval_stride: int | None = None,
                cache_dir: str | os.PathLike | None = None) -> CorpusData:
    """Load (tokenizing, or from the cache) corpus ``name`` ('wikitext2' or 'text')."""
    if name not in FILE_NAMES:
        raise UserError(f"unknown corpus {name!r}; use one of {', '.join(FILE_NAMES)}")
    check_settings(seq_len, eval_stride)
    check_vocab_size(vocab_size)

    origin = "data directory"
    if data_dir is None and name == "wikitext2" and os.environ.get(ENV_DATA_DIR):
        data_dir, origin = os.environ[ENV_DATA_DIR], f"{ENV_DATA_DIR} directory"
    if data_dir is None and name == "text":
        raise UserError("dataset 'text' needs a directory holding train.txt, valid.txt, test.txt; pass data_dir DIR",
                        setting="data_dir")
    if data_dir is not None:
        source, texts = _read_dir(Path(data_dir).expanduser(), FILE_NAMES[name], origin)
    else:
        source, texts = HF_SOURCE, _read_hf_wikitext2()

    directory = cache.resolve_cache_dir(cache_dir)
    key = cache.cache_key({s: h for s, (_, h, _) in texts.items()}, vocab_size, RECIPE_VERSION)
    hit = cache.load(directory, key)
    if hit is not None:
        streams, vocab = hit[0], Vocab.from_json(hit[1])
    else:
        streams, vocab = _tokenize_splits(texts, vocab_size)
        cache.save(directory, key, streams, vocab.to_json())
    return CorpusData(name, streams, vocab, seq_len=seq_len, fingerprint=key,
                      eval_stride=eval_stride, source=source)


def _tokenize_splits(texts: dict, vocab_size: int | None) -> tuple[dict[str, torch.Tensor], Vocab]:
    words = {}
    for split, (text, _, where) in texts.items():
        words[split] = tokenize(text)
        if all(w == EOS for w in words[split]):
            raise UserError(f"{where} has no tokens (only blank lines); fill it with whitespace-separated text, one paragraph per line")
    vocab = Vocab.from_counts(Counter(words["train"]), vocab_size)
    streams = {split: torch.tensor(vocab.encode(w), dtype=torch.long) for split, w in words.items()}
    return streams, vocab


def _read_dir(directory: Path, names: dict[str, tuple[str, ...]], origin: str) -> tuple[str, dict]:
    """(source description, {split: (text, sha256 of the bytes, path)}) for a corpus directory."""
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise UserError(f"{origin} {directory} {what}; pass data_dir DIR or set "
                        f"{ENV_DATA_DIR} to a directory holding train.txt, valid.txt, test.txt", setting="data_dir")
    texts = {}
    for split, candidates in names.items():
        path = next((directory / c for c in candidates if (directory / c).is_file()), None)
        if path is None:
            accepted = " or ".join(candidates)
            raise UserError(f"{directory} has no {split} split: expected a file named {accepted}; add it there")
        texts[split] = _read_text(path)
    return str(directory.resolve()), texts


def _read_text(path: Path) -> tuple[str, str, str]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or type(e).__name__}); check that it is a readable file") from None
    if not raw.strip():
        raise UserError(f"{path} is empty; fill it with whitespace-separated text, one paragraph per line")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not valid UTF-8 (byte {raw[e.start]:#04x} at offset {e.start}); re-save it as UTF-8") from None
    return text, hashlib.sha256(raw).hexdigest(), str(path)


def _read_hf_wikitext2() -> dict:
    """WikiText-2 through Hugging Face ``datasets``, in the same form as _read_dir's result."""
    fix = f"pass data_dir DIR or set {ENV_DATA_DIR} to a directory holding WikiText-2"
    try:
        import datasets  # optional dependency, imported only when needed
    except ImportError:
        raise UserError(f"WikiText-2 not found and the Hugging Face 'datasets' package is not installed; {fix}", setting="data_dir") from None
    try:
        ds = datasets.load_dataset("wikitext", "wikitext-2-v1")
        rows = {split: ds[hf_split]["text"] for split, hf_split in
                (("train", "train"), ("valid", "validation"), ("test", "test"))}
    except Exception as e:  # no network, hub changes, ...: never substitute other data
        reason = (str(e).strip().splitlines() or [""])[0][:160]
        raise UserError(f"could not load WikiText-2 with Hugging Face datasets ({type(e).__name__}: {reason}); {fix}", setting="data_dir") from None
    texts = {}
    for split, lines in rows.items():
        # one row per line of the original file: rebuild that file's text canonically
        text = "".join(" ".join(line.split()) + "\n" for line in lines)
        texts[split] = (text, hashlib.sha256(text.encode("utf-8")).hexdigest(), f"{HF_SOURCE} {split}")
    return texts
