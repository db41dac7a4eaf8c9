"""Language-modelling corpora: WikiText-2 ('wikitext2') and any plain-text corpus ('text').

A corpus is a directory holding ``train.txt``, ``valid.txt`` and ``test.txt`` (for WikiText-2 also
``wiki.train.tokens``, ...). Each split becomes one int64 token stream (``tokenizers.py``; by default
the word recipe, ``words.corpus_words``), with the UTF-8 bytes and characters of every token beside
it; the vocabulary comes from the train split only. WikiText-2 comes from ``data_dir``, else
``$EVO_ATTENTION_DATA_DIR``, else Hugging Face ``datasets``; otherwise a UserError says how to point
at the files: there is never a substitute dataset.

Batches, for a stream s with targets s[1:] after inputs s[:-1] (N = len(s) - 1 targets): training
takes the ``N // T`` non-overlapping windows starting at 0, T, 2T, ..., shuffled per epoch.
Evaluation window i starts at ``i * S`` (S = ``eval_stride``, default T): the first scores all its
T targets, every later one only its last S, so each target is scored exactly once, with at least
T - S tokens of context; positions past the end are padded (input ``<eos>``, target -100).
"""

import hashlib
import os
import warnings
from pathlib import Path

import torch

from evo_attention.util.errors import UserError
from evo_attention.data import cache, hf
from evo_attention.data.base import IGNORE_INDEX, SPLITS, TaskData, check_positive
from evo_attention.data.tokenizers import (Tokenizer, WordTokenizer, as_tokenizer, parse_tokenizer, tokenizer_from_json,
                                           train_tokenizer)
from evo_attention.data.vocab import Vocab, check_vocab_size
from evo_attention.data.words import line_words

ENV_DATA_DIR = "EVO_ATTENTION_DATA_DIR"
RECIPE_VERSION = 1  # bump whenever tokenization changes: it is part of the cache key
HF_SOURCE = "huggingface:wikitext/wikitext-2-v1"

FILE_NAMES = {
    "wikitext2": {s: (f"{s}.txt", f"wiki.{s}.tokens") for s in SPLITS},
    "text": {s: (f"{s}.txt",) for s in SPLITS},
}


class CorpusData(TaskData):
    """A tokenized corpus: one int64 stream per split, a train-split Vocab, and window batching."""

    def __init__(self, name: str, streams: dict[str, torch.Tensor], tokenizer: Tokenizer | Vocab, *, seq_len: int,
                 fingerprint: str, eval_stride: int | None = None, source: str = "",
                 text_sizes: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None):
        check_settings(seq_len, eval_stride)
        tokenizer = as_tokenizer(tokenizer)
        self.name, self.tokenizer, self.streams, self.source = name, tokenizer, streams, source
        self.vocab = tokenizer.vocab if isinstance(tokenizer, WordTokenizer) else None
        self.vocab_size = tokenizer.vocab_size
        self.seq_len = seq_len
        self.eval_stride = eval_stride
        self.stride = eval_stride or seq_len
        self.fingerprint = fingerprint
        self.pad_id = tokenizer.pad_id
        self.text_sizes = text_sizes or {}  # split -> (UTF-8 bytes, characters) of each token
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

    def scored_text(self, split: str, batch_size: int, max_batches: int | None = None) -> dict | None:
        """UTF-8 bytes and characters of the targets that ``eval_batches`` with these arguments
        scores. Windows cover the targets in order, so the first k windows score exactly the
        targets 1 .. min(n, (k - 1) * stride + seq_len) of the stream."""
        sizes = self.text_sizes.get(self.check_split(split))
        if sizes is None:
            return None
        n = len(self.streams[split]) - 1
        windows = self.num_eval_items(split)
        if max_batches is not None:
            windows = min(windows, batch_size * max_batches)
        last = min(n, (windows - 1) * self.stride + self.seq_len) if windows else 0
        nbytes, nchars = sizes
        return {"bytes": int(nbytes[1:last + 1].sum()), "chars": int(nchars[1:last + 1].sum())}

    def describe(self) -> dict:
        return {**super().describe(), "tokens": {s: len(t) for s, t in self.streams.items()},
                "scored_tokens": {s: self.scored_tokens(s) for s in SPLITS},
                "settings": {"eval_stride": self.eval_stride, "recipe_version": RECIPE_VERSION, "source": self.source,
                             "tokenizer": self.tokenizer.spec,
                             **({"unk_id": self.vocab.unk_id, "eos_id": self.vocab.eos_id} if self.vocab else {})}}


def check_settings(seq_len, eval_stride) -> None:
    check_positive("seq_len", seq_len)
    if eval_stride is not None:
        check_positive("eval_stride", eval_stride)
        if eval_stride > seq_len:
            raise UserError(f"eval_stride {eval_stride} is larger than seq_len {seq_len}; use a stride between 1 and seq_len")


def load_corpus(name: str = "wikitext2", data_dir: str | os.PathLike | None = None, *,
                vocab_size: int | None = None, seq_len: int = 128, eval_stride: int | None = None,
                cache_dir: str | os.PathLike | None = None, tokenizer: str = "word") -> CorpusData:
    """Load (tokenizing, or from the cache) corpus ``name`` ('wikitext2' or 'text') with ``tokenizer``
    (``word``, ``char``, ``byte`` or ``bpe:N``; ``vocab_size`` applies to ``word`` only)."""
    parse_tokenizer(tokenizer)  # a bad tokenizer is refused before any file is read
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

    return corpus_from_texts(name, texts, source, vocab_size=vocab_size, seq_len=seq_len, eval_stride=eval_stride,
                             cache_dir=cache_dir, tokenizer=tokenizer)


def corpus_from_texts(name: str, texts: dict, source: str, *, vocab_size: int | None, seq_len: int,
                      eval_stride: int | None, cache_dir, tokenizer: str) -> CorpusData:
    """The corpus of ``texts`` (split -> (text, sha256, where)), from the token cache when there."""
    kind, _ = parse_tokenizer(tokenizer)
    directory = cache.resolve_cache_dir(cache_dir)
    # the word recipe keeps the key (and so the fingerprint) it always had
    key = cache.cache_key({s: h for s, (_, h, _) in texts.items()}, vocab_size if kind == "word" else None,
                          RECIPE_VERSION, tokenizer=None if kind == "word" else str(tokenizer).strip().lower())
    hit = cache.load(directory, key)
    if hit is not None:
        streams, tok_json, sizes = hit
        tok = tokenizer_from_json(tok_json)
    else:
        streams, tok, sizes = _tokenize_splits(texts, vocab_size, tokenizer)
        cache.save(directory, key, streams, tok.to_json() if kind != "word" else tok.vocab.to_json(), sizes)
    data = CorpusData(name, streams, tok, seq_len=seq_len, fingerprint=key, eval_stride=eval_stride,
                      source=source, text_sizes=sizes)
    _warn_if_small(data, tokenizer)
    return data


MIN_EVAL_TOKENS = 100  # a split scored over fewer tokens gives a perplexity that is mostly noise


def _warn_if_small(data: "CorpusData", tokenizer: str) -> None:
    """Say what the user did not get: a BPE vocabulary smaller than asked for (the text ran out of
    pairs to merge), an evaluation split too small for a perplexity that is more than noise; refuse
    one with nothing to score (before any training)."""
    kind, size = parse_tokenizer(tokenizer)
    if kind == "bpe" and size is not None and data.vocab_size < size:
        warnings.warn(f"tokenizer bpe:{size} asked for {size:,} tokens, but the train split of {data.source} supports "
                      f"only {data.vocab_size:,} (no pair of tokens is left to merge): the model uses {data.vocab_size:,}")
    for split in ("valid", "test"):
        n = data.scored_tokens(split)
        if n == 0:
            raise UserError(f"the {split} split of {data.source} has no token to score (a prediction needs one "
                            f"before it): use a bigger {split} file")
        if n < MIN_EVAL_TOKENS:
            warnings.warn(f"the {split} split of {data.source} has only {n:,} scored token{'s' if n != 1 else ''}: a "
                          f"perplexity over fewer than {MIN_EVAL_TOKENS} is mostly noise; use a bigger {split} file")


def _tokenize_splits(texts: dict, vocab_size: int | None, tokenizer: str):
    """(streams, the tokenizer fitted to the train split, split -> (bytes, chars) per token)."""
    for text, _, where in texts.values():
        if not text.strip():  # whitespace only
            raise UserError(f"{where} has no tokens (only blank lines); fill it with text")
    tok = train_tokenizer(tokenizer, texts["train"][0], vocab_size)
    streams, sizes = {}, {}
    for split, (text, _, _) in texts.items():
        encoded = tok.encode(text)
        streams[split], sizes[split] = encoded.ids, (encoded.nbytes, encoded.nchars)
    return streams, tok, sizes


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
    if reason := hf.hub_unreachable(datasets, "wikitext/wikitext-2-v1"):
        raise UserError(f"could not load WikiText-2 with Hugging Face datasets ({reason}); {fix}", setting="data_dir")
    try:
        ds = datasets.load_dataset("wikitext", "wikitext-2-v1")
        rows = {split: ds[hf_split]["text"] for split, hf_split in
                (("train", "train"), ("valid", "validation"), ("test", "test"))}
    except Exception as e:  # no network, hub changes, ...: never substitute other data
        reason = (str(e).strip().splitlines() or [""])[0][:160]
        raise UserError(f"could not load WikiText-2 with Hugging Face datasets ({type(e).__name__}: {reason}); {fix}", setting="data_dir") from None
    texts = {}
    for split, lines in rows.items():
        # one row per line of the original file: rebuild that file's text canonically (one space
        # between the words of a line), which the word recipe reads as the original rows
        text = "".join(" ".join(line_words(line)) + "\n" for line in lines)
        texts[split] = (text, hashlib.sha256(text.encode("utf-8")).hexdigest(), f"{HF_SOURCE} {split}")
    return texts
