"""A generated multi-query associative recall (MQAR) task: fast, offline, deterministic from a seed.

The model reads key-value pairs, then must recall the value of each queried key: only a model that
looks up earlier context by content beats chance (1 / number of values). Token ids, for vocab_size
V: 0 is <fill>, 1 .. K the keys k0 .. k{K-1} (K = (V - 1) // 2), K+1 .. V-1 the values.

Each example is seq_len + 1 tokens (x = example[:-1], y = example[1:]): first P = num_pairs pairs
``k v`` (distinct keys, uniform values), then two-token slots; Q = num_queries slots, chosen
uniformly, hold ``k v`` for Q distinct keys of the pairs, all else is <fill>. For example with
P = 2, Q = 2, seq_len = 9: ``k3 v7 k1 v2 <fill> <fill> k1 v2 k3 v7``. Only the value after a
queried key is scored (y is -100 elsewhere), so scored_tokens = examples * Q, and an example must
fit: 2P + 2Q <= seq_len + 1. Each split draws from a generator seeded from (seed, split).
"""

import torch

from evo_attention.util.errors import UserError
from evo_attention.data.base import (IGNORE_INDEX, SPLITS, ExampleData, check_generated_memory, check_positive,
                                     fingerprint_of, seeded_generator)
from evo_attention.data.vocab import Vocab
from evo_attention.util.memory import refuse_failed_allocation

FORMAT_VERSION = 1  # bump when the generated data changes: it is part of the fingerprint
FILL_ID = 0


def split_generator(seed: int, split: str) -> torch.Generator:
    """A CPU generator seeded from (seed, split) by sha256: independent streams per split."""
    return seeded_generator(f"evo-attention/recall/v{FORMAT_VERSION}/{seed}/{split}")


def random_subsets(rows: int, n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """[rows, k] tensor: per row, k distinct values from range(n) in random order."""
    if n > 4 * k * k:  # repeats are rare: draw freely, redraw the rows that repeat a value
        out = torch.randint(n, (rows, k), generator=generator)
        while len(bad := (out.sort(1).values.diff(1) == 0).any(1).nonzero().flatten()):
            out[bad] = torch.randint(n, (len(bad), k), generator=generator)
        return out
    chunk = max(1, 2**22 // n)  # bound the [chunk, n] scratch tensor for large n
    return torch.cat([torch.rand(min(chunk, rows - r), n, generator=generator).topk(k, dim=1).indices
                      for r in range(0, rows, chunk)])


def generate(examples: int, *, vocab_size: int, seq_len: int, num_pairs: int, num_queries: int,
             generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) for ``examples`` MQAR examples, both [examples, seq_len] int64 (format above)."""
    num_keys = (vocab_size - 1) // 2
    num_values = vocab_size - 1 - num_keys
    B, P, Q = examples, num_pairs, num_queries
    keys = random_subsets(B, num_keys, P, generator) + 1
    values = torch.randint(num_values, (B, P), generator=generator) + 1 + num_keys
    asked = random_subsets(B, P, Q, generator)  # which pairs are queried
    slots = random_subsets(B, (seq_len + 1 - 2 * P) // 2, Q, generator)  # where the queries go
    pos = 2 * P + 2 * slots  # position of each query key in the example

    seq = torch.full((B, seq_len + 1), FILL_ID, dtype=torch.long)
    seq[:, 0 : 2 * P : 2] = keys
    seq[:, 1 : 2 * P : 2] = values
    seq.scatter_(1, pos, keys.gather(1, asked))
    seq.scatter_(1, pos + 1, values.gather(1, asked))
    y = torch.full((B, seq_len), IGNORE_INDEX, dtype=torch.long)
    y.scatter_(1, pos, values.gather(1, asked))  # y[t] = seq[t + 1]: the value after the query key
    return seq[:, :-1].contiguous(), y


# bytes per token while a split is generated: the example, its targets and the input copy (int64 each)
GENERATION_BYTES_PER_TOKEN = 3 * 8


class RecallData(ExampleData):
    """The MQAR task as a TaskData; all splits are generated on construction (well under a second)."""

    def __init__(self, vocab_size: int = 64, seq_len: int = 64, num_pairs: int = 8,
                 num_queries: int | None = None, train_examples: int = 20_000,
                 eval_examples: int = 1_000, seed: int = 0):
        num_queries = num_pairs if num_queries is None else num_queries
        for name, value in (("seq_len", seq_len), ("num_pairs", num_pairs), ("num_queries", num_queries),
                            ("train_examples", train_examples), ("eval_examples", eval_examples)):
            check_positive(name, value)
        check_positive("vocab_size", vocab_size, minimum=4)  # <fill>, a key, two values
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise UserError(f"seed must be an integer, got {seed!r}")
        num_keys = (vocab_size - 1) // 2
        if num_queries > num_pairs:
            raise UserError(f"num_queries {num_queries} exceeds num_pairs {num_pairs}; each query asks about a different pair")
        if num_keys < num_pairs:
            raise UserError(f"recall vocab_size {vocab_size} has only {num_keys} keys for num_pairs {num_pairs}; "
                            f"raise vocab_size to at least {2 * num_pairs + 1} or lower num_pairs")
        if 2 * num_pairs + 2 * num_queries > seq_len + 1:
            raise UserError(f"recall seq_len {seq_len} is too short for num_pairs {num_pairs} and num_queries {num_queries}; "
                            f"raise seq_len to at least {2 * num_pairs + 2 * num_queries - 1} or lower num_pairs")

        refused = check_generated_memory(  # before the vocabulary or any split is built
            "the recall task", examples=train_examples + 2 * eval_examples, seq_len=seq_len, vocab=vocab_size,
            bytes_per_token=GENERATION_BYTES_PER_TOKEN, vocab_fix=("lower vocab_size", "vocab_size"),
            length_fix=("lower max_seq_len or the recall example counts (train_examples, eval_examples)",
                        "max_seq_len"))
        self.name = "recall"
        self.vocab_size, self.seq_len, self.pad_id = vocab_size, seq_len, FILL_ID
        self.settings = {"vocab_size": vocab_size, "seq_len": seq_len, "num_pairs": num_pairs,
                         "num_queries": num_queries, "train_examples": train_examples,
                         "eval_examples": eval_examples, "seed": seed, "format_version": FORMAT_VERSION}
        self.fingerprint = fingerprint_of({"name": "recall", **self.settings})
        self.num_keys, self.num_values = num_keys, vocab_size - 1 - num_keys
        self.num_queries = num_queries
        with refuse_failed_allocation(*refused):
            self.vocab = Vocab(["<fill>"] + [f"k{i}" for i in range(self.num_keys)]
                               + [f"v{i}" for i in range(self.num_values)])
            self.data = {split: generate(train_examples if split == "train" else eval_examples, vocab_size=vocab_size,
                                         seq_len=seq_len, num_pairs=num_pairs, num_queries=num_queries,
                                         generator=split_generator(seed, split))
                         for split in SPLITS}

    def scored_tokens(self, split: str) -> int:
        return self.num_eval_items(self.check_split(split)) * self.num_queries

    def describe(self) -> dict:
        return {**super().describe(), "examples": {s: self.num_eval_items(s) for s in SPLITS},
                "scored_tokens": {s: self.scored_tokens(s) for s in SPLITS}, "chance_accuracy": 1 / self.num_values,
                "settings": self.settings}
