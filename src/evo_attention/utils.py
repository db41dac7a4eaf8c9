"""The original project's helpers: data loaders, seeding, device choice (the seed API).

New code should use ``evo_attention.data.load_data`` and ``TaskData`` directly; ``get_dataloaders``
keeps the original signature working on top of it. ``set_seed`` and ``get_device`` live in
``train.environment``.
"""

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from evo_attention.data import TaskData, load_data
from evo_attention.train.environment import get_device, set_seed

__all__ = ["get_dataloaders", "get_device", "set_seed"]


class _Items(Dataset):
    """Map-style view of a TaskData: ``dataset[list_of_indices]`` is one whole (x, y) batch."""

    def __init__(self, task: TaskData, split: str):
        self.task, self.split = task, split

    def __len__(self) -> int:
        return self.task.num_train_items() if self.split == "train" else self.task.num_eval_items(self.split)

    def __getitem__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.long)
        if self.split == "train":
            return self.task.train_items(idx)
        return self.task.eval_items(self.split, idx)


def get_dataloaders(vocab_size, max_seq_len, batch_size, eval_batch_size, use_wikitext=True, data_dir=None):
    """(train_loader, eval_loader) yielding (x, y) int64 tuples of shape [B, max_seq_len].

    With ``use_wikitext`` the data is WikiText-2 from ``data_dir``, else $EVO_ATTENTION_DATA_DIR,
    else Hugging Face ``datasets``; if none is available a UserError says how to point at the
    files. The vocabulary keeps the ``vocab_size`` most frequent train words (``<unk>`` and
    ``<eos>`` included). With ``use_wikitext=False`` the data is the generated associative-recall
    task (``evo_attention.data.recall``) with that vocab_size and sequence length -- not random
    tokens.

    The train loader yields full shuffled windows (every target scored; a final partial batch is
    dropped when there is at least one full batch); shuffling follows torch's global RNG, so call
    ``set_seed`` first for repeatable order. The eval loader yields the validation split's
    non-overlapping windows in order, covering every target once; padding has target -100.
    Each loader carries the underlying dataset as ``loader.task_data``.
    """
    if use_wikitext:
        task = load_data("wikitext2", data_dir=data_dir, vocab_size=vocab_size, seq_len=max_seq_len)
    else:
        task = load_data("recall", vocab_size=vocab_size, seq_len=max_seq_len)
    train, valid = _Items(task, "train"), _Items(task, "valid")
    train_sampler = BatchSampler(RandomSampler(range(len(train))), batch_size, drop_last=len(train) >= batch_size)
    eval_sampler = BatchSampler(SequentialSampler(range(len(valid))), eval_batch_size, drop_last=False)
    train_loader = DataLoader(train, sampler=train_sampler, batch_size=None)
    eval_loader = DataLoader(valid, sampler=eval_sampler, batch_size=None)
    train_loader.task_data = eval_loader.task_data = task
    return train_loader, eval_loader
