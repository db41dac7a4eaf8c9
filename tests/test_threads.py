"""How OpenMP threads wait (util/threads.py): they follow the other processes' load, never over the
user's choice, and never change a result."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from evo_attention.util import threads


def test_configure_watches_the_load_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr(threads, "_state", threads._state)  # restored after the test
    monkeypatch.setattr(threads, "_mode", threads._mode)
    env = {}
    assert threads.configure(env).startswith("OpenMP's defaults, short waits while other processes use the cores")
    assert env == {}  # the watch needs no setting before torch loads
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    assert "the user's settings (OMP_WAIT_POLICY=PASSIVE)" == threads.configure(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {threads.OFF: "off"}
    assert threads.configure(env).startswith("OpenMP's defaults") and env == {threads.OFF: "off"}
    monkeypatch.setattr(threads, "PROC_STAT", "/nonexistent/stat")  # no load to read: a fixed short spin
    env = {}
    assert threads.configure(env) == "GOMP_SPINCOUNT=1000" and env == threads.FALLBACK


def test_importing_the_library_leaves_the_waits_to_the_watch():
    code = ("import os, sys; import evo_attention; from evo_attention.util import threads; "
            "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules, threads.watch(), threads.state())")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    # the front door imports torch only when a name needs it; the watch starts when asked (a trainer)
    assert out.stdout.split()[:3] == ["None", "False", "True"], out.stderr
    assert " waits, others used " in out.stdout  # long or short: whatever else this machine runs
    user = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "GOMP_SPINCOUNT": "5000"}, timeout=120)
    assert user.stdout.split()[:3] == ["5000", "False", "False"], user.stderr  # the user's choice: no watch
    one = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert one.stdout.split()[2] == "False", one.stderr  # one torch thread: no parallel region to wait in


def test_others_cores_is_the_busy_time_this_process_did_not_use():
    assert threads.others_cores((0.0, 10.0, 1.0), (0.5, 11.5, 1.5)) == pytest.approx(2.0)  # 1.5 s busy, 0.5 ours
    assert threads.others_cores((0.0, 10.0, 1.0), (0.5, 10.5, 1.6)) == 0.0  # tick rounding never goes below 0
    assert threads.others_cores((1.0, 0.0, 0.0), (1.0, 5.0, 0.0)) == 0.0
    before = threads.sample()
    assert len(before) == 3 and before[1] > 0


def test_the_hysteresis_goes_busy_at_once_and_idle_after_quiet_samples():
    h = threads.Hysteresis()
    assert [h.update(x) for x in (0.1, 0.49, 0.6, 0.3, 0.2, 0.6, 0.1, 0.1, 0.1)] == \
        [False, False, True, True, True, True, True, False, False]
    # 0.3 is not quiet (above IDLE_CORES): it restarts the count
    h = threads.Hysteresis()
    assert [h.update(x) for x in (0.9, 0.1, 0.3, 0.1, 0.1)] == [True, True, True, True, False]


def _train_and_sum(throttled: bool) -> list[torch.Tensor]:
    from evo_attention.genes import AttentionGene
    from evo_attention.train.presets import build_config
    from evo_attention.data import data_from_config
    from evo_attention.train.trainer import Trainer

    config = build_config("quick", overrides={"train_steps": 12, "log_every": 4, "precision": "fp32",
                                              "compile": "off", "d_model": 32, "batch_size": 8})
    throttle = threads.Throttle()
    if throttled:
        throttle.engage()
    try:
        trainer = Trainer.from_config(AttentionGene.vanilla(), config, data_from_config(config), device="cpu")
        trainer.train()
    finally:
        throttle.release()
    return [p.detach().clone() for p in trainer.model.parameters()]


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not threads.libgomp_loaded() or torch.get_num_threads() < 2,
                    reason="the throttle is GNU OpenMP's, with more than one thread")
def test_the_throttle_holds_a_team_of_threads_while_on():
    throttle = threads.Throttle()
    before = _os_threads()
    throttle.engage()
    try:
        assert throttle.on and _os_threads() >= before + torch.get_num_threads()  # the helper and its team
    finally:
        throttle.release()
    deadline = time.monotonic() + 5  # the team's threads end a moment after the helper
    while _os_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not throttle.on and _os_threads() == before  # libgomp freed the team with its thread


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one torch thread: no parallel region to wait in")
def test_short_waits_change_no_result():
    plain, short = _train_and_sum(False), _train_and_sum(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, short))


class FakeLoad:
    """A ``Watch``'s sampler with the other processes' load given, one value per sample."""

    def __init__(self, loads):
        self.loads, self.t, self.busy = list(loads), 0.0, 0.0

    def __call__(self):
        others = self.loads.pop(0) if self.loads else 0.0
        self.t += 1.0
        self.busy += others
        return (self.t, self.busy, 0.0)


@pytest.mark.skipif(not threads.libgomp_loaded() or torch.get_num_threads() < 2,
                    reason="the throttle is GNU OpenMP's, with more than one thread")
def test_the_watch_follows_the_load(monkeypatch):
    fake = FakeLoad([0.0, 0.1, 0.9, 1.0, 0.6, 0.1, 0.1, 0.0])  # before, then one value per decision
    monkeypatch.setattr(threads, "INTERVAL", 0.05)
    monkeypatch.setattr(threads, "FIRST_SAMPLE", 0.0)
    seen = []
    watch = threads.Watch(sampler=fake)  # its first decision (0.1 cores) before it returns; the
    # process's own watch, if a trainer started one, keeps reading the real load
    try:
        seen.append(watch.throttle.on)
        deadline = time.monotonic() + 10
        while fake.loads and time.monotonic() < deadline:
            time.sleep(0.01)
            if not seen or seen[-1] != watch.throttle.on:
                seen.append(watch.throttle.on)
        time.sleep(0.2)
    finally:
        watch.stop()
    # idle, then short waits from 0.9 cores on, long again after two samples below 0.25
    assert seen == [False, True, False] and watch.switches == 2, (seen, watch.summary())
    assert not watch.alive and not watch.throttle.on


BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


@pytest.mark.skipif(not threads.libgomp_loaded() or torch.get_num_threads() < 2,
                    reason="the throttle is GNU OpenMP's, with more than one thread")
def test_a_competing_process_turns_short_waits_on(monkeypatch):
    monkeypatch.setattr(threads, "INTERVAL", 0.2)
    watch = threads.Watch()
    try:
        if watch.throttle.on:
            pytest.skip(f"this machine is busy already ({watch.summary()})")
        job = subprocess.Popen([sys.executable, "-c", BUSY])
        try:
            deadline = time.monotonic() + 10
            while not watch.throttle.on and time.monotonic() < deadline:
                time.sleep(0.1)
            assert watch.throttle.on, watch.summary()  # a busy core beside this process
        finally:
            job.kill()
            job.wait()
    finally:
        watch.stop()
    assert not watch.alive and not watch.throttle.on


class BusyWatch:
    """A stand-in for the process's watch, having seen ``others`` cores of other processes' load."""

    alive = True

    def __init__(self, others: float, busy: bool = True):
        self.last_others, self.hysteresis = others, SimpleNamespace(busy=busy)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one torch thread: nothing to share")
def test_a_training_that_starts_beside_busy_processes_takes_the_cores_they_leave(monkeypatch):
    from evo_attention import Config
    from evo_attention.data import data_from_config
    from evo_attention.train.spec import Trial
    from evo_attention.train.trainer import run_training

    monkeypatch.delenv(threads.SHARE, raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads, "watch", lambda: True)
    config = Config(data="recall", vocab_size=16, max_seq_len=16, d_model=16, n_heads=2, n_layers=1, train_steps=3,
                    recall={"num_pairs": 2, "num_queries": 2, "train_examples": 64, "eval_examples": 32},
                    batch_size=4, eval_batch_size=16, eval_steps=1, precision="fp32")
    trial = Trial.from_config("dot|softmax|none|fixed", config, data=data_from_config(config))
    for others, busy in ((0.3, False), (0.4, True)):  # idle, or the others leave both cores: torch's count
        monkeypatch.setattr(threads, "_watch", BusyWatch(others, busy))
        assert threads.shared_threads() is None
    monkeypatch.setattr(threads, "_watch", BusyWatch(1.9))  # a 2-thread job beside it: one core is its share
    assert threads.shared_threads()[0] == 1
    before = torch.get_num_threads()
    record = run_training(trial, data_from_config(config)).record
    assert record.ok and record.extra["threads"] == (f"1 of {before} threads: other processes used 1.9 of 2 cores "
                                                     "when it started")
    assert torch.get_num_threads() == before  # torch's count again after the training
    monkeypatch.setenv(threads.SHARE, "off")
    assert threads.shared_threads() is None


def test_the_docs_promise_identical_results_only_where_the_thread_count_cannot_follow_the_load():
    """docs/scaling.md said results never depend on where evaluations run, while a training started
    beside other work takes fewer threads (``shared_threads``) and rounds otherwise."""
    from pathlib import Path

    scaling = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    assert "Results never depend on where evaluations run" not in scaling
    assert scaling.count(f"`{threads.SHARE}=off`") >= 2  # beside both promises of bit-identical results
