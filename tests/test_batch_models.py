"""batch_models: the executors train the trials that can share a batch together (train/batching.py),
every record under its own key; auto is measured per shape (mocked here: no test depends on timing)."""

import json

import pytest
import torch

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.search.executors import EvalTask, LocalExecutor, ProcessExecutor, base, make_executor
from evo_attention.search.executors.base import plan_batches
from evo_attention.search.runner import Runner
from evo_attention.search.store import RunStore
from evo_attention.studies import validate as val
from evo_attention.train import batching, environment
from evo_attention.train import trainer as engine
from evo_attention.train.spec import Trial
from evo_attention.util.errors import UserError

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, precision="fp32", seed=7)
VANILLA = "dot|softmax|none|fixed"


@pytest.fixture
def unfoldable(unfoldable_similarity):
    """A gene with a plugin similarity that holds weights and declares no folded form."""
    return f"{unfoldable_similarity}|softmax|none|fixed"


@pytest.fixture(scope="module")
def setup():
    config = Config(**TINY)
    return config, data_from_config(config)


def tasks_of(config, data, gene=VANILLA, n=4, **task_fields):
    return [EvalTask(Trial.from_config(gene, config.replace(seed=s, learning_rate=3e-3 * (1 + s % 2)), data=data),
                     label=f"seed {s}", **task_fields) for s in range(n)]


@pytest.fixture
def batches(monkeypatch):
    """Counts the batches the executors train (the sizes of the run_batched calls in this process)."""
    sizes = []
    run = base.run_batched

    def counting(trials, data, **kwargs):
        sizes.append(len(trials))
        return run(trials, data, **kwargs)

    monkeypatch.setattr(base, "run_batched", counting)
    return sizes


def run_all(executor, tasks, store=None):
    started, stepped = [], []

    def on_start(task):
        started.append(task)

    def on_step(task, step, total, loss):
        stepped.append((task, step))

    records = {}
    with executor:
        for task, record in executor.run(tasks, on_start=on_start, on_step=on_step):
            records[task] = record
            if store is not None:
                store.record(record, role=task.role)
    return records, started, stepped


@pytest.mark.parametrize("kind", ["local", "process"])
def test_four_same_gene_tasks_train_as_two_batches_each_under_its_own_key(setup, batches, tmp_path, kind):
    config, data = setup
    tasks = tasks_of(config, data)
    executor = (LocalExecutor(batch_models=2) if kind == "local"
                else ProcessExecutor(1, threads=1, batch_models=2))
    store = RunStore.create(tmp_path / "run", config.to_dict())
    records, started, stepped = run_all(executor, tasks, store)
    if kind == "local":
        assert batches == [2, 2]
    assert set(records) == set(tasks) and all(records[t].extra["batched"] == 2 for t in tasks)
    assert all(records[t].ok and records[t].key == t.trial.key() for t in tasks)
    # each task its own start, progress and worker name, as if trained alone
    assert len(started) == 4 and set(started) == set(tasks)
    assert {t.worker for t in started} == ({"local#1", "local#2"} if kind == "local" else {"w0#1", "w0#2"})
    assert {(t, s) for t, s in stepped} == {(t, s) for t in tasks for s, _ in records[t].curve}  # each log point
    assert all(len(records[t].curve) >= 3 for t in tasks)  # a short budget logs at least 3 points
    assert all(store.lookup(*t.trial.key()).extra["batched"] == 2 for t in tasks) and len(store.evaluations()) == 4
    store.close()
    # the vanilla gene batched is bitwise the gene trained alone (with the same threads: a sum over
    # another number of threads adds in another order)
    alone, _, _ = run_all(LocalExecutor(batch_models="off") if kind == "local"
                          else ProcessExecutor(1, threads=1, batch_models="off"), tasks)
    assert all(records[t].val_loss == alone[t].val_loss and records[t].curve == alone[t].curve for t in tasks)
    assert all("batched" not in alone[t].extra for t in tasks)


def test_the_runner_stores_batched_records_under_their_keys(setup, batches, tmp_path):
    config, data = setup
    tasks = tasks_of(config, data, n=3)
    store = RunStore.create(tmp_path / "run", config.to_dict())
    records = Runner(LocalExecutor(batch_models=4), store=store, data={config.task: data}).evaluate(tasks)
    assert batches == [3] and all(records[t].extra["batched"] == 3 for t in tasks)
    again = Runner(LocalExecutor(batch_models=4), store=store).evaluate(tasks)  # every one a cache hit
    assert batches == [3] and [again[t].key for t in tasks] == [records[t].key for t in tasks]
    store.close()


def test_what_a_batch_cannot_give_trains_alone(setup, batches, tmp_path, unfoldable):
    config, data = setup
    assert engine.batch_problem(tasks_of(config, data, gene=unfoldable)[0].trial)
    records, _, _ = run_all(LocalExecutor(batch_models=4), tasks_of(config, data, gene=unfoldable, n=2))
    assert batches == [] and all("batched" not in r.extra and r.ok for r in records.values())
    # checkpoints, kept models and audits need a task of their own; other shapes never share a batch
    for fields in ({"save_to": str(tmp_path / "s")}, {"resume_from": str(tmp_path / "r")},
                   {"keep_model": str(tmp_path / "m")}, {"audit": True}):
        assert [len(g) for g in plan_batches(tasks_of(config, data, **fields), 4)] == [1, 1, 1, 1]
    mixed = tasks_of(config, data, n=3) + tasks_of(config.replace(d_model=32), data, n=2)
    mixed.insert(1, tasks_of(config, data, gene="dot|sigmoid|none|fixed", n=1)[0])  # another attention: it joins
    mixed.insert(2, tasks_of(config, data, gene="dot|softmax|none|fixed|pos=rope", n=1)[0])  # no position table
    plan = plan_batches(mixed, 4)
    assert [[t.seed for t in g] for g in plan] == [[0, 0, 1, 2], [0], [0, 1]]
    assert plan[0][1].trial.gene.normalization == "sigmoid" and plan[1][0].trial.gene.position == "rope"
    assert [len(g) for g in plan_batches(tasks_of(config, data, n=5), 4)] == [3, 2]  # even sizes
    assert [len(g) for g in plan_batches(tasks_of(config, data, n=4), 4, workers=2)] == [2, 2]  # no idle worker


def test_batch_models_off_never_batches(setup, batches):
    config, data = setup
    for executor in (LocalExecutor(batch_models="off"), LocalExecutor(batch_models=1), LocalExecutor()):
        records, _, _ = run_all(executor, tasks_of(config, data, n=2))  # auto: off in tests (conftest)
        assert all("batched" not in r.extra for r in records.values())
    assert batches == []
    assert make_executor(batch_models="off").describe()["batch_models"] == "off"
    assert make_executor("local", workers=2, batch_models=3).batch_models == 3


def test_validate_gives_the_same_verdicts_batched(setup, batches):
    config, data = setup
    genes = ["dot|sigmoid|none|fixed", "dot|softmax|output_gate|fixed"]
    results = {k: val.validate_genes(genes, config, data, n_seeds=3, executor=LocalExecutor(batch_models=k))
               for k in (3, "off")}
    assert batches == [3, 3, 3]  # the baseline and each gene: three seeds in one batch
    on, off = results[3], results["off"]
    assert on["baseline"]["values"] == off["baseline"]["values"]  # the vanilla gene: bitwise
    assert [g["verdict"] for g in on["genes"]] == [g["verdict"] for g in off["genes"]]
    for a, b in zip(on["genes"], off["genes"]):
        assert a["values"] == pytest.approx(b["values"], rel=engine.SAME_RESULT_RTOL["fp32"])


# -- auto ------------------------------------------------------------------------------------------
@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A fresh cache, auto measuring, a fake probe (counting its calls) and 1000 MB available."""
    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(batching.ENV_BATCH_MODELS)
    monkeypatch.setattr(batching, "_BATCH_PROBES", {})
    monkeypatch.setattr(batching, "available_memory_mb", lambda device: 1000.0)
    calls = []

    def fake(trial, data, device, *, memory_budget_mb=None, **_):
        calls.append(memory_budget_mb)
        return {"seconds": {1: 0.010, 2: 0.012, 4: 0.016, 8: 0.040}, "step_memory_mb": 100.0}

    monkeypatch.setattr(batching, "probe_batch_times", fake)
    return calls


def test_auto_takes_the_most_trainings_per_hour_within_memory_and_keeps_the_measurement(setup, probe, tmp_path,
                                                                                      monkeypatch):
    config, data = setup
    trial = Trial.from_config(VANILLA, config, data=data)
    k, reason = batching.models_per_batch("auto", trial, data)
    assert k == 4 and "2.50x" in reason  # 4 / 16 ms against 1 / 10 ms; 8 models would be slower per model
    assert probe == [500.0]  # half the available memory
    assert batching.models_per_batch("auto", trial, data, share=2)[0] == 2  # 4 x 100 MB > 1000 / 2 / 2
    monkeypatch.setattr(batching, "_BATCH_PROBES", {})  # another process: reads the file
    assert batching.models_per_batch("auto", trial.replace(seed=3), data)[0] == 4 and len(probe) == 1
    files = list(tmp_path.glob("batch-models-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["seconds"]["8"] == 0.040
    # a gain below 10% is no gain: no batching
    assert batching.choose_models({"seconds": {"1": 0.010, "2": 0.0185}}, None)[0] == 1
    # off and K are taken as they are; the environment decides what auto means
    assert batching.models_per_batch("off", trial, data)[0] == 1 and batching.models_per_batch(3, trial, data)[0] == 3
    monkeypatch.setenv(batching.ENV_BATCH_MODELS, "3")
    assert batching.models_per_batch("auto", trial, data) == (3, f"auto: {batching.ENV_BATCH_MODELS}=3")
    monkeypatch.setenv(batching.ENV_BATCH_MODELS, "lots")
    with pytest.raises(UserError, match=batching.ENV_BATCH_MODELS):
        batching.models_per_batch("auto", trial, data)


def test_auto_batches_in_the_executor(setup, probe, batches):
    config, data = setup
    records, _, _ = run_all(LocalExecutor(), tasks_of(config, data, n=5))
    assert batches == [3, 2] and len(probe) == 1  # K = 4: five tasks in two even batches


def test_the_real_probe_is_short_and_leaves_the_rng_alone(setup):
    config, data = setup
    trial = Trial.from_config(VANILLA, config, data=data)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    measured = batching.probe_batch_times(trial, data, torch.device("cpu"), ks=(1, 2), repeats=1, steps=1)
    assert set(measured["seconds"]) == {1, 2} and all(s > 0 for s in measured["seconds"].values())
    assert measured["step_memory_mb"] is None or measured["step_memory_mb"] >= 0
    assert torch.equal(torch.get_rng_state(), before)
    assert batching.probe_batch_times(trial, data, torch.device("cpu"), ks=(1, 2), memory_budget_mb=0.0,
                                     repeats=1, steps=1)["seconds"].keys() <= {1, 2}
    assert environment.available_memory_mb(torch.device("cpu")) > 0
    # the probe's few steps time a trial whose schedule would not fit in them (a long warm-up)
    long_warmup = trial.replace(train=trial.train.replace(lr_schedule="wsd", warmup_steps=trial.steps - 1))
    assert set(batching.probe_batch_times(long_warmup, data, torch.device("cpu"), ks=(1, 2), repeats=1,
                                         steps=1)["seconds"]) == {1, 2}


# -- settings ----------------------------------------------------------------------------------------
def test_batch_models_is_a_setting_of_execution_never_of_the_trial():
    assert Config(batch_models=False).batch_models == "off"  # YAML reads off as false
    assert Config(batch_models="4").batch_models == 4 and Config(batch_models=" AUTO ").batch_models == "auto"
    for bad in (0, -2, "many", 1.5, True):
        with pytest.raises(UserError, match="batch_models must be auto, off or a whole number"):
            Config(batch_models=bad)
    trial = Trial.from_config(VANILLA, Config(**TINY), data=None)
    assert Trial.from_config(VANILLA, Config(**TINY, batch_models=8)).settings() == trial.settings()
    assert [f.name for f in Config.settings_of("execution")] == ["batch_models"]
    with pytest.raises(UserError, match="batch_models 2 applies to the local executors"):
        make_executor("ray", batch_models=2)


def test_bad_batch_models_flags_are_one_line_errors(capsys):
    for value in ("0", "many", "-1"):
        assert main(["baseline", "--preset", "quick", "--batch-models", value, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--batch-models must be auto, off or a whole number" in err
    assert main(["bench", "--preset", "quick", "--models", "0"]) == 2
    assert "--models must be a positive integer" in capsys.readouterr().err


def test_bench_times_k_models_in_one_trainer(capsys, tmp_path):
    (tmp_path / "tiny.yaml").write_text(json.dumps(TINY))
    flags = ["--config", str(tmp_path / "tiny.yaml"), "--steps", "2", "--warmup", "1", "--budget", "100"]
    assert main(["bench", "--models", "2", "--json", *flags]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["models"] == 2 and result["trainings_per_hour"] > 0 and result["auto_models"] == 1
    assert result["est_evaluation_s"] == pytest.approx(3600 / result["trainings_per_hour"])
    assert main(["bench", "--json", *flags]) == 0
    single = json.loads(capsys.readouterr().out)
    assert single["models"] == 1 and single["auto_models"] == 1 and single["trainings_per_hour"] > 0
    assert single["flops_per_step"] * 2 == result["flops_per_step"]  # a batch step is all its models'


def test_auto_probes_with_dropout_on_any_device(monkeypatch):
    """Every model draws its own dropout stream from the seeded CPU generator, alone or batched and
    on every device, so auto may batch trials with dropout anywhere: it probes."""
    import torch

    from evo_attention import Config
    from evo_attention.train import batching
    from evo_attention.train.spec import Trial

    monkeypatch.delenv(batching.ENV_BATCH_MODELS, raising=False)
    monkeypatch.setattr(batching, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(batching, "available_memory_mb", lambda device: None)
    monkeypatch.setattr(batching, "probed_batch_times",
                        lambda *a, **k: ({"seconds": {"1": 0.01, "4": 0.012}, "step_memory_mb": None}, "probe.json"))
    config = Config(vocab_size=50, d_model=16, n_heads=2, n_layers=1, max_seq_len=8, dropout=0.0)
    trial = Trial.from_config("dot|softmax|none|fixed|bias|0.10", config)  # attention dropout 0.1
    k, why = batching.models_per_batch("auto", trial, data=None, device="cuda")
    assert k == 4 and "K=4" in why


def test_cuda_memory_statistics_initialise_cuda_first(monkeypatch):
    # a fresh worker process that has not touched the GPU has no allocator statistics yet: reading or
    # resetting them before torch.cuda.init() fails with "Invalid device argument" (seen on an H100)
    calls = []
    monkeypatch.setattr(torch.cuda, "init", lambda: calls.append("init"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: calls.append("allocated") or 0)
    environment.reset_peak_memory(torch.device("cuda", 0))
    environment.memory_in_use_mb(torch.device("cuda", 0))
    assert calls == ["init", "reset", "init", "allocated"]


def test_a_probe_taken_on_a_busy_machine_is_not_kept_and_an_old_answer_is_measured_again(setup, probe, tmp_path,
                                                                                        monkeypatch):
    """Rounds more than PROBE_STABLE_SPREAD apart (other work on the cores): the answer serves this
    process and is never written; a kept answer older than MAX_AGE_DAYS is measured again."""
    import time as _time

    from evo_attention.train import probe_cache

    config, data = setup
    trial = Trial.from_config(VANILLA, config, data=data)
    busy = {"seconds": {1: 0.010, 2: 0.012}, "step_memory_mb": 100.0, "spread": 2.5}
    monkeypatch.setattr(batching, "probe_batch_times", lambda *a, **k: busy)
    assert batching.models_per_batch("auto", trial, data)[0] == 2
    assert not list(tmp_path.glob("batch-models-*.json"))  # a busy probe is never kept
    idle = {**busy, "spread": 1.05}
    monkeypatch.setattr(batching, "probe_batch_times", lambda *a, **k: idle)
    monkeypatch.setattr(batching, "_BATCH_PROBES", {})
    batching.models_per_batch("auto", trial, data)
    (path,) = tmp_path.glob("batch-models-*.json")
    entry = json.loads(path.read_text())
    assert abs(entry["measured_at"] - _time.time()) < 60 and not probe_cache.expired(entry)
    entry["measured_at"] -= (probe_cache.MAX_AGE_DAYS + 1) * 86400
    entry["seconds"] = {"1": 0.010, "2": 0.030}  # what the old answer said
    path.write_text(json.dumps(entry))
    monkeypatch.setattr(batching, "_BATCH_PROBES", {})
    assert batching.models_per_batch("auto", trial, data)[0] == 2  # measured again: the new answer
    assert json.loads(path.read_text())["seconds"]["2"] == 0.012


def test_the_probe_times_more_models_per_step_on_a_gpu():
    assert batching.probe_ks(torch.device("cpu")) == batching.BATCH_PROBE_KS
    assert batching.probe_ks(torch.device("cuda")) == batching.CUDA_BATCH_PROBE_KS
    assert max(batching.CUDA_BATCH_PROBE_KS) >= 64 and batching.CUDA_BATCH_PROBE_KS[0] == 1


def test_a_search_generation_of_different_genes_trains_as_one_batch(tmp_path):
    """A climb's first generation (the vanilla program and its one-edit neighbours: different
    attentions around one model) is one folded training."""
    space = tmp_path / "space.yaml"
    space.write_text("search_space:\n  program: {max_nodes: 8}\n")
    assert main(["search", "--preset", "quick", "--config", str(space), "--d-model", "16", "--heads", "2", "--layers",
                 "1", "--steps", "3", "--strategy", "climb", "--population", "4", "--generations", "1",
                 "--no-baseline", "--no-check", "--quiet", "--keep-models", "0", "--workers", "1",
                 "--batch-models", "4", "--out", str(tmp_path / "run")]) == 0
    with RunStore.open(tmp_path / "run", readonly=True) as store:
        records = store.evaluations(role="search")
    assert len({r.gene for r in records}) == 4
    assert all(r.extra.get("batched") == 4 and "batch_fallback" not in r.extra for r in records)
