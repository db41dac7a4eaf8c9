"""Tokenizers of a text corpus: word, character, byte and byte-level BPE, behind one interface.

``word`` is the standard word-level recipe (``words.corpus_words``: whitespace-separated words,
``<eos>`` after every line, the train split's most frequent ``vocab_size`` words plus ``<unk>``);
``char`` the train split's characters plus ``<unk>``; ``byte`` the 256 UTF-8 byte values (no
unknowns); ``bpe:N`` a byte-level BPE vocabulary of N tokens trained on the train split with Hugging
Face ``tokenizers`` (cached on disk with the token streams).

Every tokenizer turns a text into token ids *and* says how many UTF-8 bytes and characters of the
text each token stands for (``Encoded``), for bits per byte and per character, which compare across
tokenizations (word level: of the text as the recipe reads it, one space between words, a newline
after each line). ``Tokenizer.token_texts(ids)`` gives the text of every token, for display.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from evo_attention.data.vocab import UNK, Vocab
from evo_attention.data.words import EOS, corpus_words, line_words, prompt_words, text_lines
from evo_attention.util.errors import UserError
from evo_attention.util.memory import check_memory

KINDS = ("word", "char", "byte", "bpe")
# memory the BPE trainer reserves up front per token of the size asked for (its id table and map):
# measured 67 bytes, up to 100 where its hash table's size rounds up to the next power of two
BPE_BYTES_PER_TOKEN = 100
_SPEC = re.compile(r"^(word|char|byte|bpe(?::(-?\d+))?)$")


def parse_tokenizer(spec) -> tuple[str, int | None]:
    """``("bpe", 2000)`` for ``"bpe:2000"``, ``("char", None)`` for ``"char"``; UserError if invalid."""
    match = _SPEC.match(str(spec).strip().lower()) if isinstance(spec, str) else None
    if match is None:
        raise UserError(f"unknown tokenizer {spec!r}: valid tokenizers are word, char, byte, bpe:N (e.g. bpe:2000)",
                        setting="tokenizer")
    kind = match.group(1).split(":")[0]
    if kind == "bpe":
        if match.group(2) is None:
            raise UserError("tokenizer bpe needs a vocabulary size: write bpe:N, e.g. bpe:2000", setting="tokenizer")
        size = int(match.group(2))
        if size < 257:
            raise UserError(f"tokenizer bpe:{size} is too small: a byte-level BPE vocabulary holds the 256 bytes and "
                            "at least one merge, so use N >= 257 (e.g. bpe:2000)", setting="tokenizer")
        return kind, size
    return kind, None


@dataclass
class Encoded:
    """A tokenized text: ids and, per token, the UTF-8 bytes and characters it stands for."""

    ids: torch.Tensor  # int64 [n]
    nbytes: torch.Tensor  # int32 [n]
    nchars: torch.Tensor  # int32 [n]


class Tokenizer:
    """Interface: ``encode(text)``, ``decode(ids)``, ``token_texts(ids)``, ``vocab_size``, ``pad_id``,
    ``to_json``."""

    kind = ""
    pad_id = 0  # input id used for padding (its targets are never scored)

    @property
    def spec(self) -> str:
        return self.kind

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> Encoded:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def token_texts(self, ids) -> list[str]:
        """One display string per token of ``ids``: its own text (``readable``), ``<unk>`` for the
        unknown token. Unlike ``decode``, tokens that split a character keep their bytes apart."""
        return [readable(self._token_bytes(int(i))) for i in ids]

    def _token_bytes(self, token_id: int) -> bytes | None:
        """The UTF-8 bytes token ``token_id`` stands for; None for the unknown token."""
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError


def readable(raw: bytes | None) -> str:
    """``raw`` as a label: its text, with ``\\xNN`` for bytes that are not whole UTF-8 characters
    and escapes (``\\n``) for unprintable characters, so every label shows on one line."""
    if raw is None:
        return UNK
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"\\x{b:02x}" for b in raw)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class WordTokenizer(Tokenizer):
    """The word-level recipe over a ``Vocab`` (``words.corpus_words``)."""

    kind = "word"

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.pad_id = vocab.eos_id if vocab.eos_id is not None else 0

    @classmethod
    def train(cls, text: str, vocab_size: int | None) -> "WordTokenizer":
        return cls(Vocab.from_counts(Counter(corpus_words(text)), vocab_size))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> Encoded:
        # the tokens are corpus_words(text); each stands for its word plus the space after it, and
        # <eos> for the newline, in the canonical text (one space between words, "\n" per line)
        words, pieces = [], []
        for line in text_lines(text):
            parts = line_words(line)
            words += parts + [EOS]
            pieces += [w + " " for w in parts[:-1]] + parts[-1:] + ["\n"]
        return Encoded(torch.tensor(self.vocab.encode(words), dtype=torch.long),
                       torch.tensor([len(p.encode("utf-8")) for p in pieces], dtype=torch.int32),
                       torch.tensor([len(p) for p in pieces], dtype=torch.int32))

    def decode(self, ids) -> str:
        return " ".join(self.vocab.decode(list(ids))).replace(f" {EOS} ", "\n").replace(EOS, "\n")

    def token_texts(self, ids) -> list[str]:
        return self.vocab.decode([int(i) for i in ids])  # the words themselves, <eos> and <unk> included

    def to_json(self) -> str:
        return json.dumps({"tokenizer": "word", "vocab": json.loads(self.vocab.to_json())})


class CharTokenizer(Tokenizer):
    """The train split's characters (sorted) after ``<unk>`` (id 0)."""

    kind = "char"

    def __init__(self, chars: list[str]):
        chars = sorted(set(chars))
        self.itos = [UNK] + chars
        self._codes = torch.tensor([ord(c) for c in chars], dtype=torch.long)  # sorted: id = position + 1

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> Encoded:
        # code points as one tensor (no Python list per character): look each up in the sorted alphabet
        points = torch.from_numpy(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64))
        pos = torch.searchsorted(self._codes, points)
        found = (pos < len(self._codes)) & (self._codes[pos.clamp(max=max(len(self._codes) - 1, 0))] == points)
        ids = torch.where(found, pos + 1, 0)
        nbytes = 1 + (points >= 0x80).int() + (points >= 0x800).int() + (points >= 0x10000).int()
        return Encoded(ids, nbytes.to(torch.int32), torch.ones(len(ids), dtype=torch.int32))

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] if int(i) else "\ufffd" for i in ids)

    def _token_bytes(self, token_id: int) -> bytes | None:
        return self.itos[token_id].encode("utf-8") if token_id else None

    def to_json(self) -> str:
        return json.dumps({"tokenizer": "char", "chars": self.itos[1:]})


class ByteTokenizer(Tokenizer):
    """The 256 byte values of the UTF-8 text: id = byte."""

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> Encoded:
        # through numpy: torch.frombuffer refuses an empty buffer
        raw = torch.from_numpy(np.frombuffer(bytearray(text.encode("utf-8")), dtype=np.uint8))
        ids = raw.long()
        starts = ((raw & 0xC0) != 0x80).to(torch.int32)  # a character begins at every non-continuation byte
        return Encoded(ids, torch.ones(len(ids), dtype=torch.int32), starts)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def _token_bytes(self, token_id: int) -> bytes | None:
        return bytes([token_id])

    def to_json(self) -> str:
        return json.dumps({"tokenizer": "byte"})


def byte_alphabet() -> dict[str, int]:
    """Byte-level BPE writes byte b as one printable character: the inverse map, character -> byte.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) are shifted to
    code points 256 and up, in byte order. This is the convention of the ``ByteLevel`` pre-tokenizer.
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    shifted = iter(range(256, 512))  # the next code point for a byte that is not printable
    return {chr(b if b in printable else next(shifted)): b for b in range(256)}


class BPETokenizer(Tokenizer):
    """Byte-level BPE (Hugging Face ``tokenizers``), trained on the train split only."""

    kind = "bpe"

    def __init__(self, model):
        self.model = model
        alphabet = byte_alphabet()
        vocab = model.get_vocab()
        size = max(vocab.values()) + 1
        nbytes = torch.zeros(size, dtype=torch.int32)
        nchars = torch.zeros(size, dtype=torch.int32)
        self._bytes = [b""] * size  # an id the model's vocabulary skips stands for no text
        for token, i in vocab.items():
            raw = bytes(alphabet[c] for c in token if c in alphabet)
            self._bytes[i] = raw
            nbytes[i] = len(raw)
            nchars[i] = sum(1 for b in raw if b & 0xC0 != 0x80)  # a character counts where its first byte is
        self._nbytes, self._nchars = nbytes, nchars

    @staticmethod
    def _library():
        try:
            import tokenizers
        except ImportError:
            raise UserError("tokenizer bpe needs Hugging Face tokenizers: pip install tokenizers",
                            setting="tokenizer") from None
        return tokenizers

    @classmethod
    def train(cls, text: str, size: int) -> "BPETokenizer":
        tk = cls._library()
        # each merge joins a pair the text holds, so no vocabulary passes 256 + the text's bytes:
        # asking for more trains the same tokenizer (the trainer's reservation alone would not fit)
        size = min(size, 256 + len(text.encode("utf-8")))
        check_memory(BPE_BYTES_PER_TOKEN * size, f"a BPE vocabulary of {size:,} tokens", "use a smaller N in bpe:N",
                     setting="tokenizer")
        model = tk.Tokenizer(tk.models.BPE())
        model.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        model.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                         initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
        model.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
        return cls(model)

    @property
    def spec(self) -> str:
        return f"bpe:{self.vocab_size}"

    @property
    def vocab_size(self) -> int:
        return len(self._nbytes)

    def encode(self, text: str) -> Encoded:
        ids = torch.tensor(self.model.encode(text).ids, dtype=torch.long)
        return Encoded(ids, self._nbytes[ids], self._nchars[ids])

    def decode(self, ids) -> str:
        return self.model.decode([int(i) for i in ids])

    def _token_bytes(self, token_id: int) -> bytes | None:
        return self._bytes[token_id]

    def to_json(self) -> str:
        return json.dumps({"tokenizer": "bpe", "model": self.model.to_str()})


def as_tokenizer(tokenizer: Tokenizer | Vocab | None) -> Tokenizer | None:
    """``tokenizer`` itself, a bare ``Vocab`` as its word tokenizer, or None."""
    return WordTokenizer(tokenizer) if isinstance(tokenizer, Vocab) else tokenizer


def encode_prompt(tokenizer: Tokenizer, text: str, *, setting: str = "prompt") -> tuple[list[int], int]:
    """``(ids, unknown)``: the ids of a prompt and how many of them are the unknown token.

    Unlike ``encode`` (a corpus, where every line ends in ``<eos>``), a word-level prompt gets
    ``<eos>`` only between its lines and after a final newline (``words.prompt_words``), so
    generation continues its last line. Words outside the vocabulary become ``<unk>`` (UserError if
    the vocabulary has none). ``setting`` names the argument the text came from in errors; a text of
    no tokens (word level: only spaces) is refused as empty.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes of a command line that are not UTF-8 arrive as lone surrogates
        raise UserError(f"the {setting} holds bytes that are not UTF-8: give it in UTF-8", setting=setting) from None
    if isinstance(tokenizer, WordTokenizer):
        vocab = tokenizer.vocab
        words = prompt_words(text)
        unknown = sum(1 for w in words if w not in vocab.stoi)
        if unknown and vocab.unk_id is None:
            bad = next(w for w in words if w not in vocab.stoi)
            raise UserError(f"word {bad!r} is not in the model's vocabulary, which has no <unk>: use words such as "
                            f"{', '.join(vocab.itos[1:6])}", setting=setting)
        ids = vocab.encode(words)
    else:
        ids = tokenizer.encode(text).ids.tolist()
        unk = 0 if isinstance(tokenizer, CharTokenizer) else None  # byte and BPE tokenizers have no unknowns
        unknown = sum(1 for i in ids if i == unk)
    if not ids:
        raise UserError(f"the {setting} is empty: give some text", setting=setting)
    return ids, unknown


def train_tokenizer(spec: str, train_text: str, vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer ``spec`` fitted to the train split (``vocab_size`` applies to ``word`` only)."""
    kind, size = parse_tokenizer(spec)
    if kind == "word":
        return WordTokenizer.train(train_text, vocab_size)
    if kind == "char":
        return CharTokenizer.train(train_text)
    if kind == "byte":
        return ByteTokenizer()
    return BPETokenizer.train(train_text, size)


def tokenizer_from_json(text: str | dict) -> Tokenizer:
    """Inverse of ``Tokenizer.to_json`` (a bare Vocab JSON is a word tokenizer)."""
    data = json.loads(text) if isinstance(text, str) else dict(text)
    kind = data.get("tokenizer", "word")
    if kind == "word":
        return WordTokenizer(Vocab.from_json(data.get("vocab", data)))
    if kind == "char":
        return CharTokenizer(data["chars"])
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer(BPETokenizer._library().Tokenizer.from_str(data["model"]))
    raise UserError(f"unknown tokenizer {kind!r} in a saved tokenizer: valid ones are {', '.join(KINDS)}")
