"""Word-level vocabulary: the mapping between words and token ids.

``Vocab.from_counts`` builds the vocabulary of a corpus from its train-split word counts:
``<unk>`` gets id 0, ``<eos>`` id 1, then every other word by count (descending), ties broken by
the word itself (ascending), so the result never depends on dict or file order. With a size ``N``
the list is cut to exactly ``N`` ids; words left out map to ``<unk>``. If the corpus has fewer
words than ``N``, placeholder names (``<unused-0>``, ...) fill the remaining ids, so that
``len(vocab) == N`` always matches the model's embedding size; those ids never occur in the data.

A Vocab is stored with results as JSON (``to_json`` / ``from_json``).
"""

import itertools
import json
from collections.abc import Iterable, Mapping

import torch

from evo_attention.data.words import EOS, prompt_words
from evo_attention.util.errors import UserError
from evo_attention.util.memory import check_memory, refuse_failed_allocation

UNK = "<unk>"  # the word every word outside the vocabulary becomes
FORMAT = "evo-attention-vocab"
# memory one symbol of a Vocab takes (its name, its list slot, its dict entry): measured ~156 bytes
BYTES_PER_SYMBOL = 160


def check_vocab_size(size) -> None:
    """UserError unless ``size`` is None (keep every word) or an integer >= 2."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 2):
        raise UserError(f"vocab_size must be an integer >= 2 (room for <unk> and <eos>), got {size!r}")


class Vocab:
    """A list of distinct words (``itos``) and its inverse (``stoi``)."""

    def __init__(self, itos: Iterable[str]):
        self.itos = list(itos)
        self.stoi = {word: i for i, word in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise UserError(f"vocabulary has duplicate words ({len(self.itos) - len(self.stoi)} repeats); each word must appear once")

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], size: int | None = None) -> "Vocab":
        """The vocabulary of a corpus: <unk>, <eos>, then words by (count desc, word asc), cut to ``size``."""
        check_vocab_size(size)
        symbols = max(len(counts), size or 0)
        what, fix = f"a vocabulary of {symbols:,} words", "lower vocab_size"
        check_memory(BYTES_PER_SYMBOL * symbols, what, fix, setting="vocab_size")  # before the names are made
        with refuse_failed_allocation(what, fix, setting="vocab_size"):
            itos = [UNK, EOS] + sorted((w for w in counts if w not in (UNK, EOS)), key=lambda w: (-counts[w], w))
            if size is not None:  # cut to size; fewer words than requested: name the spare ids
                itos, taken = itos[:size], set(itos[:size])
                spare = (name for name in map("<unused-{}>".format, itertools.count()) if name not in taken)
                itos += itertools.islice(spare, size - len(itos))
            return cls(itos)

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def unk_id(self) -> int | None:
        return self.stoi.get(UNK)

    @property
    def eos_id(self) -> int | None:
        return self.stoi.get(EOS)

    def encode(self, words: str | Iterable[str]) -> list[int]:
        """Ids of ``words``; unknown words become <unk>. A string is read as a prompt
        (``words.prompt_words``): its words, ``<eos>`` between its lines."""
        words = prompt_words(words) if isinstance(words, str) else list(words)  # read twice when one is unknown
        unk, get = self.unk_id, self.stoi.get
        ids = [get(w, unk) for w in words]
        if unk is None and None in ids:
            bad = next(w for w, i in zip(words, ids) if i is None)
            raise UserError(f"word {bad!r} is not in the vocabulary, which has no <unk>")
        return ids

    def decode(self, ids) -> list[str]:
        """Words for ``ids`` (ints, a list, or a tensor); join them with ' ' for display."""
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().tolist()
        elif isinstance(ids, int):
            ids = [ids]
        return [self.itos[i] for i in ids]

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": 1, "itos": self.itos}, ensure_ascii=False)

    @classmethod
    def from_json(cls, data: str | Mapping) -> "Vocab":
        """Inverse of ``to_json``; accepts the JSON text or the already parsed dict."""
        try:
            obj = json.loads(data) if isinstance(data, (str, bytes)) else data
            ok = obj.get("format") == FORMAT and isinstance(obj.get("itos"), list)
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            raise UserError(f"not a saved vocabulary (expected JSON with format {FORMAT!r} and an 'itos' list)")
        return cls(obj["itos"])

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocab({len(self)} words)"
