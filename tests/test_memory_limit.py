"""A process memory limit (ulimit -v / -d) counts as the memory available (util/memory.py): a generated
task's vocabulary or splits, or a corpus's vocabulary, beyond it are refused in one line before they
are built, and an allocation that still fails while a task is built is one line too."""

import contextlib
import os
import resource
import subprocess
import sys
import time

import pytest

from evo_attention.data.recall import RecallData
from evo_attention.data.synthetic import TASKS, SyntheticData
from evo_attention.data.vocab import Vocab
from evo_attention.util import memory
from evo_attention.util.errors import UserError

GB = 2**30


@contextlib.contextmanager
def address_space_limit(extra: int):
    """This process limited (RLIMIT_AS, soft) to ``extra`` bytes above its current size; restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (memory.process_status()["VmSize"] + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_process_limit_lowers_the_available_memory_to_what_it_leaves():
    unlimited = memory.available_memory()
    with address_space_limit(GB):
        limited = memory.available_memory()
        assert memory.limit_headroom() == limited
    assert 0.9 * GB < limited <= GB and (unlimited is None or limited <= unlimited)
    assert memory.limit_headroom() is None or memory.limit_headroom() > limited


@pytest.mark.parametrize("build, fragment", [
    (lambda: SyntheticData("mqar", vocab=99_999_999), "99,999,999 symbols"),
    (lambda: SyntheticData("mad:in_context_recall", vocab=99_999_999), "99,999,999 symbols"),
    (lambda: SyntheticData("mad:memorization", vocab=99_999_999), "99,999,999 symbols"),
    (lambda: SyntheticData("mad:selective_copy", seq_len=20_000), "20,001 tokens"),
    (lambda: RecallData(vocab_size=99_999_999), "99,999,999 symbols"),
    (lambda: Vocab.from_counts({"a": 1}, 99_999_999), "99,999,999 words"),  # a corpus's, padded to vocab_size
], ids=["mqar-vocab", "in_context_recall-vocab", "memorization-vocab", "selective_copy-seq_len", "recall-vocab",
        "corpus-vocab"])
def test_a_dataset_beyond_the_process_limit_is_refused_before_it_is_built(build, fragment):
    # each needs several GB: within many machines' free memory, beyond the 1 GB the limit leaves
    start = time.monotonic()
    with address_space_limit(GB), pytest.raises(UserError) as refused:
        build()
    assert time.monotonic() - start < 5
    message = str(refused.value)
    assert fragment in message and "this process (under its memory limit, ulimit) has" in message, message


def test_the_command_under_a_ulimit_is_one_line_and_quick(tmp_path):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, resource.getrlimit(resource.RLIMIT_AS)[1]))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "evo_attention.cli", "baseline", "--preset", "quick", "--data",
                           "mqar:vocab=99999999", "--steps", "1", "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, env=env, preexec_fn=limit, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and lines[-1].startswith("evo-attention: error:"), done.stderr
    assert "99,999,999 symbols" in lines[-1] and "mqar:vocab=N" in lines[-1], lines[-1]
    assert time.monotonic() - start < 120
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())  # nothing written


def test_an_allocation_that_fails_while_a_generated_task_is_built_is_one_line(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: None)  # unknown: the estimate refuses nothing

    def no_memory(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(type(TASKS["mad:selective_copy"]), "generate", no_memory)
    with pytest.raises(UserError, match="could not be built \\(the allocation failed\\): lower its seq_len"):
        SyntheticData("mad:selective_copy", seq_len=64)


def test_the_activations_of_a_training_or_evaluation_batch_beyond_the_memory_are_refused(monkeypatch):
    """A hostile `baseline --d-model 64 --batch-size 100000` was killed by the OOM killer (23.7 GB):
    the estimate counted the weights, gradients and moments, not the batches' activations."""
    import torch

    from evo_attention.data import data_from_config
    from evo_attention.train import trainer
    from evo_attention.train.presets import build_config
    from evo_attention.train.spec import Trial

    monkeypatch.setattr(trainer, "available_memory_mb", lambda device: 4096)  # 4 GB
    seed = build_config("seed")  # its batches fit, 8 models at once too
    trainer.check_training_memory(seed.model.with_data(10_000, seed.max_seq_len), seed.resolved_baseline(), 8,
                                  torch.device("cpu"), batch_size=seed.batch_size, eval_batch_size=seed.eval_batch_size)
    config = build_config("quick").replace(precision="fp32", eval_batch_size=10**9)  # a batch of the split's 500
    data = data_from_config(config)
    trainer.Trainer(Trial.from_config(config.resolved_baseline(), config, data=data), data, device="cpu")
    config = config.replace(d_model=16, n_heads=2, n_layers=1, batch_size=100_000)
    with pytest.raises(UserError) as refused:
        trainer.Trainer(Trial.from_config(config.resolved_baseline(), config, data=data), data, device="cpu")
    assert refused.value.settings == ("batch_size", "max_seq_len"), refused.value
    assert "lower batch_size or max_seq_len (the activations of 100,000 windows of 32 tokens)" in str(refused.value)
    with pytest.raises(UserError, match="lower eval_batch_size or max_seq_len") as refused:
        trainer.check_training_memory(config.model.with_data(32, 32), config.resolved_baseline(), 1,
                                      torch.device("cpu"), batch_size=32, eval_batch_size=400_000, seq_len=32)
    assert refused.value.settings == ("eval_batch_size", "max_seq_len")
