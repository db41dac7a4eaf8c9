"""The TaskData interface that every dataset implements, and the shared batching loops.

A TaskData turns a dataset into next-token-prediction batches ``(x, y)``: two int64 CPU tensors of
shape ``[batch, seq_len]`` where ``y[b, t]`` is the token that should follow ``x[b, :t+1]``, or
``IGNORE_INDEX`` (-100) where nothing is scored. Fitness is the exact perplexity over the scored
targets, so ``scored_tokens(split)`` says how many targets a full evaluation pass scores.

Datasets made of fixed-size *items* (windows of a token stream, generated examples) implement four
hooks (``num_train_items``, ``train_items``, ``num_eval_items``, ``eval_items``) and inherit the
batching: training takes per epoch a ``torch.randperm`` (from the caller's generator) of the items
in batches of exactly ``batch_size``, carrying the leftover into the next epoch, so the stream is
infinite and determined by the generator's state; evaluation takes the items in order, the last
batch possibly smaller. ``LoaderData`` adapts a user's own torch DataLoaders.

Data names: ``DATASETS`` are built by ``load_data`` itself (``hf:`` names Hugging Face data),
``DATASET_FACTORIES`` by plugins (``data.register_dataset``), the generated tasks are
``data.synthetic.TASKS``; ``name_taken`` keeps the three apart.
"""

import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping

import torch

from evo_attention.data.vocab import BYTES_PER_SYMBOL
from evo_attention.util.errors import UserError
from evo_attention.util.memory import check_memory

IGNORE_INDEX = -100  # target value that is never scored (torch's cross_entropy default)
SPLITS = ("train", "valid", "test")

Batch = tuple[torch.Tensor, torch.Tensor]

DATASETS = ("wikitext2", "text", "recall")  # built by load_data itself; generated tasks: synthetic.TASKS
# datasets added by plugins: name -> factory(settings) -> TaskData, where settings holds data_dir,
# vocab_size, seq_len, eval_stride, cache_dir, tokenizer, text_field, seed and the options
DATASET_FACTORIES: dict = {}


def name_taken(name: str) -> bool:
    """Whether ``name`` (or the ``hf:`` prefix) names a built-in or plugin dataset (not a generated task)."""
    return name in DATASETS or name in DATASET_FACTORIES or name == "hf" or name.startswith("hf:")


def check_generated_memory(task: str, *, examples: int, seq_len: int, vocab: int, bytes_per_token: int,
                           length_fix: tuple, vocab_fix: tuple) -> tuple:
    """The memory check of a generated task (the recall task, MQAR, the MAD tasks), made before its
    vocabulary or any split is built: ``examples`` examples of ``seq_len + 1`` tokens, each token
    taking ``bytes_per_token`` while the splits are generated, and a vocabulary of ``vocab`` symbol
    names (``BYTES_PER_SYMBOL`` each). UserError when the sum is beyond the memory available
    (``util.memory``), naming the larger part: ``length_fix`` / ``vocab_fix`` are (what to do, the
    setting(s) named) for the splits and for the vocabulary. Returns (what, fix, setting) of the
    larger part, for ``util.memory.refuse_failed_allocation`` around the building."""
    tokens = bytes_per_token * examples * (seq_len + 1)
    symbols = BYTES_PER_SYMBOL * vocab
    if symbols > tokens:
        what, (fix, setting) = f"{task} with a vocabulary of {vocab:,} symbols", vocab_fix
    else:
        what, (fix, setting) = f"{task} of {examples:,} examples x {seq_len + 1:,} tokens", length_fix
    check_memory(tokens + symbols, what, fix, setting=setting)
    return what, fix, setting


def fingerprint_of(obj) -> str:
    """Hex sha256 of a JSON-able object (keys sorted), stable across processes and machines."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seeded_generator(text: str) -> torch.Generator:
    """A CPU generator seeded by the sha256 of ``text``: one independent stream per text."""
    digest = hashlib.sha256(text.encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def check_positive(name: str, value, minimum: int = 1) -> int:
    """Return ``value`` as an int, or raise UserError unless it is an integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class TaskData:
    """A dataset for causal-LM fitness evaluation (see the module docstring for the contract)."""

    name: str  # 'wikitext2' | 'text' | 'recall' | 'loaders'
    vocab_size: int  # number of token ids the model must embed
    seq_len: int  # window length T fed to the model
    fingerprint: str  # hex sha256 of the source identity + settings
    pad_id: int  # input id used for padding (its targets are always IGNORE_INDEX)
    vocab = None  # a Vocab where the ids have names, else None
    tokenizer = None  # the data.tokenizers.Tokenizer that made the ids from text, else None

    # --- hooks for item-based datasets -------------------------------------------------------
    def num_train_items(self) -> int:
        raise NotImplementedError

    def train_items(self, idx: torch.Tensor) -> Batch:
        """(x, y) for the training items with indices ``idx`` (a 1-D int64 tensor)."""
        raise NotImplementedError

    def num_eval_items(self, split: str) -> int:
        raise NotImplementedError

    def eval_items(self, split: str, idx: torch.Tensor) -> Batch:
        """(x, y) for the evaluation items of ``split`` with indices ``idx``."""
        raise NotImplementedError

    # --- the public interface ----------------------------------------------------------------
    def train_batches(self, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """Infinite iterator of (x, y), each [batch_size, seq_len], determined by ``generator``."""
        check_positive("batch_size", batch_size)
        n = self.num_train_items()

        def batches():
            pending = torch.empty(0, dtype=torch.long)
            while True:
                while len(pending) < batch_size:  # start a new epoch, keep the leftover
                    pending = torch.cat([pending, torch.randperm(n, generator=generator)])
                idx, pending = pending[:batch_size], pending[batch_size:]
                yield self.train_items(idx)

        return batches()

    def eval_batches(self, split: str, batch_size: int, max_batches: int | None = None) -> Iterator[Batch]:
        """Finite, deterministic iterator over ``split``; at most ``max_batches`` batches if given."""
        split = self.check_split(split)
        check_positive("batch_size", batch_size)
        n = self.num_eval_items(split)
        starts = range(0, n, batch_size)
        if max_batches is not None:
            starts = starts[:check_positive("max_batches", max_batches, minimum=0)]
        return (self.eval_items(split, torch.arange(s, min(s + batch_size, n))) for s in starts)

    def scored_tokens(self, split: str) -> int:
        """Targets != IGNORE_INDEX in a full pass of eval_batches(split); by counting, unless overridden."""
        return sum(int((y != IGNORE_INDEX).sum()) for _, y in self.eval_batches(split, 256))

    def scored_text(self, split: str, batch_size: int, max_batches: int | None = None) -> dict | None:
        """``{"bytes", "chars"}``: the UTF-8 bytes and characters of the text whose targets that
        ``eval_batches`` pass scores, for bits per byte; None where tokens are not text (recall)."""
        return None

    def describe(self) -> dict:
        """JSON-able summary of the dataset."""
        return {"name": self.name, "vocab_size": self.vocab_size, "seq_len": self.seq_len,
                "fingerprint": self.fingerprint, "pad_id": self.pad_id}

    def check_split(self, split: str) -> str:
        if split not in SPLITS:
            raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        return split

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, seq_len={self.seq_len})"


class ExampleData(TaskData):
    """A dataset held as whole examples in memory: ``self.data[split] = (x, y)``, one row per example
    (the generated tasks). Its items are those rows."""

    data: dict

    def num_train_items(self) -> int:
        return self.num_eval_items("train")

    def train_items(self, idx: torch.Tensor) -> Batch:
        return self.eval_items("train", idx)

    def num_eval_items(self, split: str) -> int:
        return len(self.data[split][0])

    def eval_items(self, split: str, idx: torch.Tensor) -> Batch:
        x, y = self.data[split]
        return x[idx], y[idx]


class LoaderData(TaskData):
    """Wrap a user's torch DataLoaders as a TaskData.

    The loaders yield ``(x, y)`` tuples or dicts with ``'input_ids'`` and ``'labels'``, where the
    labels are already next-token targets aligned with the inputs (``labels[:, t]`` follows
    ``input_ids[:, t]``; -100 where not scored). Hugging Face style unshifted labels (equal to the
    inputs) are rejected, and so is any other id outside 0 .. vocab_size - 1 (checked per batch).
    ``train_batches`` cycles the train loader forever: its ``batch_size`` and ``generator`` arguments
    are ignored, the loader's own batch size and shuffling apply.
    ``eval_batches('valid')`` iterates ``eval_loader``, ``'test'`` iterates ``test_loader`` if one
    was given, and ``'train'`` makes one pass over the train loader. The fingerprint is a
    best-effort description (loader and dataset types, lengths, batch sizes), not a content hash.
    """

    def __init__(self, train_loader, eval_loader, *, vocab_size: int, seq_len: int,
                 test_loader=None, pad_id: int = 0, name: str = "loaders"):
        self.name = name
        self.vocab_size = check_positive("vocab_size", vocab_size, minimum=2)
        self.seq_len = check_positive("seq_len", seq_len)
        self.pad_id = pad_id
        self.loaders = {"train": train_loader, "valid": eval_loader, "test": test_loader}
        self._scored: dict[str, int] = {}
        self.fingerprint = fingerprint_of({
            "name": name, "vocab_size": vocab_size, "seq_len": seq_len,
            **{split: _describe_loader(loader) for split, loader in self.loaders.items()},
        })

    def _loader(self, split: str):
        loader = self.loaders[self.check_split(split)]
        if loader is None:
            raise UserError(f"no {split!r} loader was given to LoaderData; pass test_loader=... to evaluate on it")
        return loader

    def _batches(self, loader) -> Iterator[Batch]:
        # a generator function, not a generator expression: the loader is opened (which draws from
        # torch's global generator) at the first batch read, not when the batches are asked for
        for batch in loader:
            yield self._as_xy(batch)

    def _as_xy(self, batch) -> Batch:
        if isinstance(batch, Mapping):
            if "input_ids" not in batch or "labels" not in batch:
                raise UserError(f"loader batch dict has keys {sorted(batch)}; it needs 'input_ids' and 'labels'")
            x, y = batch["input_ids"], batch["labels"]
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            x, y = batch
        else:
            raise UserError(f"loader yielded a {type(batch).__name__}; yield (x, y) tuples or dicts with 'input_ids' and 'labels'")
        x, y = torch.as_tensor(x).long(), torch.as_tensor(y).long()
        if x.dim() != 2 or x.shape != y.shape or x.shape[1] > self.seq_len:
            raise UserError(f"loader batch shapes x={tuple(x.shape)} y={tuple(y.shape)}; both must be [batch, T] with T <= seq_len={self.seq_len}")
        if torch.equal(x, y):
            raise UserError("loader labels equal input_ids (unshifted labels); give next-token targets: labels[:, t] = input_ids[:, t+1], -100 where not scored")
        # an id outside the vocabulary fails in the embedding, and the loss scores a negative label as token 0
        for what, ids in (("input_ids", x), ("labels", torch.where(y == IGNORE_INDEX, 0, y))):
            low, high = ids.aminmax() if ids.numel() else (0, 0)
            if low < 0 or high >= self.vocab_size:
                unscored = f", {IGNORE_INDEX} where a position is not scored" if what == "labels" else ""
                raise UserError(f"loader {what} hold {int(low if low < 0 else high)}, not a token of vocab_size="
                                f"{self.vocab_size}: use ids 0 to {self.vocab_size - 1}{unscored}")
        return x, y

    def train_batches(self, batch_size: int = 0, generator: torch.Generator | None = None) -> Iterator[Batch]:
        loader = self._loader("train")

        def cycle():
            while True:
                empty = True
                for batch in self._batches(loader):
                    empty = False
                    yield batch
                if empty:
                    raise UserError("the train loader given to LoaderData yielded no batches; give it a non-empty dataset")

        return cycle()

    def eval_batches(self, split: str, batch_size: int = 0, max_batches: int | None = None) -> Iterator[Batch]:
        batches = self._batches(self._loader(split))
        return itertools.islice(batches, max_batches)

    def scored_tokens(self, split: str) -> int:
        if split not in self._scored:
            self._scored[split] = sum(int((y != IGNORE_INDEX).sum()) for _, y in self.eval_batches(split))
        return self._scored[split]

    def describe(self) -> dict:
        return {**super().describe(), "loaders": {s: _describe_loader(l) for s, l in self.loaders.items()}}


def _describe_loader(loader) -> dict | None:
    """What can be said about a loader without iterating it."""
    if loader is None:
        return None
    dataset = getattr(loader, "dataset", None)
    info = {"type": type(loader).__qualname__, "dataset": type(dataset).__qualname__,
            "batch_size": getattr(loader, "batch_size", None)}
    for key, obj in (("len", loader), ("dataset_len", dataset)):
        try:
            info[key] = len(obj)
        except TypeError:
            pass
    return info
