"""Datasets for fitness evaluation, all behind one interface (``TaskData``, see ``base.py``).

    from evo_attention.data import load_data
    task = load_data("wikitext2", data_dir="../shared/data/wikitext-2", seq_len=128)
    x, y = next(task.train_batches(32, torch.Generator().manual_seed(0)))
    for x, y in task.eval_batches("valid", 64): ...

* ``wikitext2`` / ``text``: word-level corpora (``corpus.py``), tokenization cached on disk (``cache.py``)
* ``recall``: a generated associative-recall task (``recall.py``)
* ``mqar[:knobs]``, ``mad:TASK[:knobs]``, ``NAME[:knobs]``: generated tasks (``synthetic.py``): the
  built-in ones separate mechanisms; a plugin adds one with ``register_task`` (one ``Task`` subclass)
* ``LoaderData``: a user's own DataLoaders (``base.py``)
"""

import os

from evo_attention.util.errors import UserError
from evo_attention.data.base import (DATASET_FACTORIES, DATASETS, IGNORE_INDEX, SPLITS, LoaderData, TaskData,
                                     name_taken)
from evo_attention.data.corpus import ENV_DATA_DIR, CorpusData, corpus_from_texts, load_corpus
from evo_attention.data.cache import ENV_CACHE_DIR
from evo_attention.data.recall import RecallData
from evo_attention.data.synthetic import (SyntheticData, Task, check_synthetic_name, is_synthetic, register_task,
                                          synthetic_data, task_names, unregister_task)
from evo_attention.data.hf import is_hf, read_hf
from evo_attention.data.tokenizers import parse_tokenizer
from evo_attention.data.vocab import Vocab


def register_dataset(name: str):
    """Decorator: make ``factory(settings: dict) -> TaskData`` available as ``data: name``. A
    generated task is better a ``Task`` registered with ``register_task``: that also makes it a suite
    point and a curve's task."""
    if (not isinstance(name, str) or not name or is_synthetic(name)
            or (name_taken(name) and name not in DATASET_FACTORIES)):  # a plugin's own name: below
        raise UserError(f"dataset name {name!r} is empty or taken by a built-in dataset or a generated task: choose "
                        "another name")

    def decorator(factory):
        if not callable(factory):
            raise TypeError(f"register_dataset({name!r}) decorates a function settings -> TaskData, not {factory!r} "
                            f"({type(factory).__name__})")
        if name in DATASET_FACTORIES and DATASET_FACTORIES[name] is not factory:
            raise UserError(f"dataset {name!r} is registered already: choose another name")
        DATASET_FACTORIES[name] = factory
        return factory

    return decorator


RECALL_OPTIONS = ("num_pairs", "num_queries", "train_examples", "eval_examples")

__all__ = ["data_from_config", "DATASETS", "ENV_CACHE_DIR", "ENV_DATA_DIR", "IGNORE_INDEX", "SPLITS", "CorpusData",
           "LoaderData", "RecallData", "SyntheticData", "Task", "TaskData", "Vocab", "load_corpus", "load_data",
           "register_dataset", "register_task", "takes_options", "unregister_task"]


def takes_options(name) -> bool:
    """Whether dataset ``name`` reads the task options mapping (Config ``recall``, ``TaskSpec.options``):
    the recall task, the generated tasks (``mqar``, ``mad:TASK``, registered ones) and plugin datasets."""
    return name == "recall" or is_synthetic(name) or name in DATASET_FACTORIES


def load_data(name: str, *, data_dir: str | os.PathLike | None = None, vocab_size: int | None = None,
              seq_len: int = 128, seed: int = 0, eval_stride: int | None = None,
              cache_dir: str | os.PathLike | None = None, tokenizer: str = "word", text_field: str = "text",
              **recall_options) -> TaskData:
    """Build the dataset ``name``: a corpus, the recall task, a generated task, a plugin's or ``hf:`` data.

    Corpora: ``data_dir`` holds the split files (wikitext2 falls back to $EVO_ATTENTION_DATA_DIR, then
    Hugging Face ``datasets``); ``vocab_size=None`` keeps every train word; ``eval_stride`` gives
    strided evaluation; ``cache_dir`` overrides the token cache's location; ``seed`` is unused.
    Recall: ``vocab_size`` (None = 64), ``seq_len``, ``seed`` and ``recall_options`` go to
    ``RecallData``. Generated tasks (``TASK[:knob=value,...]``, ``synthetic.py``): knobs inline and
    from ``recall_options``; ``seq_len`` and ``vocab_size`` (None = the task's default) fill the
    ``seq_len`` and ``vocab`` knobs not given. A setting a dataset would ignore is refused.
    """
    check_applicable(name, data_dir=data_dir, text_field=text_field)
    if is_synthetic(name):
        _refuse_text_settings(f"the generated task {name!r}", tokenizer, eval_stride)
        return synthetic_data(name, seq_len=seq_len, vocab_size=vocab_size, seed=seed, options=recall_options)
    if name == "recall":
        _refuse_text_settings("the recall task", tokenizer, eval_stride)
        unknown = sorted(set(recall_options) - set(RECALL_OPTIONS))
        if unknown:
            raise UserError(f"unknown recall option(s) {unknown}; valid ones: {', '.join(RECALL_OPTIONS)}")
        return RecallData(vocab_size=64 if vocab_size is None else vocab_size, seq_len=seq_len,
                          seed=seed, **recall_options)
    if name in DATASET_FACTORIES:
        data = DATASET_FACTORIES[name]({"data_dir": data_dir, "vocab_size": vocab_size, "seq_len": seq_len,
                                        "eval_stride": eval_stride, "cache_dir": cache_dir, "tokenizer": tokenizer,
                                        "text_field": text_field, "seed": seed, **recall_options})
        if not isinstance(data, TaskData):
            raise UserError(f"dataset {name!r} gave {type(data).__name__}, not a TaskData: its plugin's factory must "
                            "return one", setting="data")
        return data
    if name in ("wikitext2", "text") or is_hf(name):
        if recall_options:
            raise UserError(f"option(s) {sorted(recall_options)} only apply to the recall task, not {name!r}")
        if not is_hf(name):
            return load_corpus(name, data_dir, vocab_size=vocab_size, seq_len=seq_len, tokenizer=tokenizer,
                               eval_stride=eval_stride, cache_dir=cache_dir)
        source, texts = read_hf(name, text_field)
        return corpus_from_texts(name, texts, source, vocab_size=vocab_size, seq_len=seq_len,
                                 eval_stride=eval_stride, cache_dir=cache_dir, tokenizer=tokenizer)
    raise UserError(f"unknown dataset {name!r}; use one of {', '.join(DATASETS)}, a generated task ({task_names()}) or "
                    "hf:NAME", setting="data")


def _refuse_text_settings(task: str, tokenizer: str, eval_stride: int | None) -> None:
    """UserError for a tokenizer or an eval_stride given to a generated ``task``."""
    if parse_tokenizer(tokenizer)[0] != "word":
        raise UserError(f"tokenizer {tokenizer!r} applies to text corpora; {task} has its own symbols: leave tokenizer "
                        "unset", setting="tokenizer")
    if eval_stride is not None:
        raise UserError(f"eval_stride {eval_stride} does not apply to {task} (its examples are independent); leave it "
                        "unset", setting="eval_stride")


# settings a built-in dataset has no use for: named, they are refused rather than silently ignored
WHY_UNUSED = {
    "data_dir": {"recall": "a generated task is not read from files",
                 "hf": "an hf: dataset is named by hf:NAME or read from hf:/path"},
    "text_field": {"recall": "a generated task has no text columns",
                   "wikitext2": "a corpus directory holds plain text files, not columns",
                   "text": "a corpus directory holds plain text files, not columns"},
}
SETTING_DEFAULTS = {"data_dir": None, "text_field": "text"}


def unused_settings(name: str) -> dict:
    """The settings (``data_dir``, ``text_field``) that dataset ``name`` does not use, with the reason."""
    kind = "hf" if is_hf(name) else "recall" if is_synthetic(name) else name  # a generated task, as recall
    return {setting: why[kind] for setting, why in WHY_UNUSED.items() if kind in why and name not in DATASET_FACTORIES}


def check_applicable(name: str, **settings) -> None:
    """UserError naming a setting given a value that dataset ``name`` would ignore."""
    for setting, why in unused_settings(name).items():
        value = settings.get(setting, SETTING_DEFAULTS[setting])
        if value != SETTING_DEFAULTS[setting]:
            raise UserError(f"{setting} {str(value)!r} does not apply to data {name!r} ({why}): leave {setting} unset",
                            setting=setting)


def check_data_name(name) -> None:
    """UserError unless ``name`` is a dataset (one of ``DATASETS``, a plugin's, a generated task
    ``TASK[:...]`` with valid inline knobs, or ``hf:...``)."""
    if is_synthetic(name):
        check_synthetic_name(name)
        return
    if not (name in DATASETS or name in DATASET_FACTORIES or is_hf(name)):
        raise UserError(f"unknown data {name!r}: valid options are {', '.join(DATASETS)}, a generated task "
                        f"({task_names()})[:knob=value,...], hf:NAME[:CONFIG] or hf:/path/to/saved", setting="data")


def data_from_config(config, data_dir: str | os.PathLike | None = None) -> TaskData:
    """The dataset a ``Config`` names (``data``, ``data_dir``, ``vocab_size``, ``max_seq_len``,
    ``eval_stride`` and the ``recall`` options); ``data_dir`` overrides the config's.

    The recall task is generated from ``config.recall["seed"]`` (default 0), not from the training
    seed: every seed of a run trains and is measured on the same data.
    """
    recall = dict(config.recall) if takes_options(config.data) else {}
    return load_data(config.data, data_dir=data_dir or config.data_dir, vocab_size=config.vocab_size,
                     seq_len=config.max_seq_len, seed=recall.pop("seed", 0), eval_stride=config.eval_stride,
                     tokenizer=config.tokenizer, text_field=config.text_field, **recall)
