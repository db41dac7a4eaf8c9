"""The Trial: one training as one frozen value with one key, from the config to the store."""

import dataclasses
import hashlib
import json
import shutil
from dataclasses import field
from pathlib import Path

import pytest
import torch

from evo_attention import Config, TinyTransformer
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.interop.pretrained import from_pretrained, save_pretrained
from evo_attention.nn.spec import ModelSpec, identity
from evo_attention.search.executors import EvalTask, LocalExecutor, ProcessExecutor
from evo_attention.search.runner import Runner
from evo_attention.search.store import RunStore
from evo_attention.train.spec import TaskSpec, TrainSpec, Trial

FIXTURES = Path(__file__).parent / "fixtures"
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=32, eval_steps=None,
            learning_rate=3e-3, train_steps=4, log_every=2)

# The settings list of the release before the Trial, frozen here as the reference its stores were keyed by.
LEGACY_FIELDS = ("d_model", "n_heads", "n_layers", "max_seq_len", "dropout", "d_ff", "batch_size", "eval_batch_size",
                 "learning_rate", "weight_decay", "grad_clip", "eval_steps", "warmup_steps", "lr_schedule", "precision",
                 "eval_stride")


def legacy_context(config: Config, eval_split: str) -> str:
    settings = {name: getattr(config, name) for name in LEGACY_FIELDS}
    if config.block != "gpt2":
        settings["block"] = config.block
    if config.favor_features != 64:
        settings["favor_features"] = config.favor_features
    settings["eval_split"] = eval_split
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("changes", [{}, {"block": "llama"}, {"favor_features": 32}, {"learning_rate": 2e-3},
                                     {"eval_steps": None, "eval_stride": 8}, {"lr_schedule": "cosine", "d_ff": 100},
                                     {"precision": "fp32", "dropout": 0.0, "batch_size": 16}])
@pytest.mark.parametrize("split", ["valid", "test"])
def test_the_key_of_a_config_equals_the_one_its_stores_were_written_with(changes, split):
    config = Config(**changes)
    assert Trial.from_config("dot|softmax|none|fixed", config, eval_split=split).context == legacy_context(config, split)
    assert Trial.from_config("dot|softmax|none|fixed", Config()).context == "3fe7a76cab98488e"  # a golden value


def test_a_field_added_to_a_spec_reaches_the_key_by_construction():
    base = Trial("dot|softmax|none|fixed", 0, 10, task=TaskSpec(fingerprint="f"))
    Extended = dataclasses.make_dataclass("Extended", [("label_smoothing", float, field(default=0.0))], bases=(TrainSpec,),
                                          frozen=True)
    changed = base.replace(train=Extended(label_smoothing=0.1))
    assert changed.key() != base.key() and changed.settings()["label_smoothing"] == 0.1
    # declared as added later (omit_default): at its default the old keys stay valid
    Later = dataclasses.make_dataclass("Later", [("label_smoothing", float, field(default=0.0, metadata=identity(
        omit_default=True)))], bases=(TrainSpec,), frozen=True)
    assert base.replace(train=Later()).key() == base.key() != base.replace(train=Later(label_smoothing=0.1)).key()
    # fields that cannot change a result never reach it; the data reaches it through its fingerprint
    assert base.replace(train=TrainSpec(device="cpu", compile="off")).key() == base.key()
    assert base.replace(task=TaskSpec(fingerprint="f", data_dir="/elsewhere")).key() == base.key()
    assert base.replace(task=TaskSpec(fingerprint="g")).key() != base.key()
    assert base.replace(train=TrainSpec(log_every=10)).key() != base.key()  # divergence is judged per interval


@pytest.mark.parametrize("whole", [{"grad_clip": 1, "weight_decay": 0, "dropout": 0}, {"learning_rate": 1},
                                   {"lr_schedule": "wsd", "lr_decay_fraction": 0}])
def test_a_whole_number_for_a_float_setting_is_the_float_and_keys_the_same_training(whole):
    # a YAML file or the API gives 1, the CLI and the defaults 1.0: equal configs, one training, one key
    as_float = {name: float(v) if isinstance(v, int) else v for name, v in whole.items()}
    trial, same = (Trial.from_config("dot|softmax|none|fixed", Config(**c)) for c in (whole, as_float))
    assert trial.context == same.context
    assert all(type(trial.record_settings()[name]) is float for name in whole if name != "lr_schedule")
    assert Trial.from_config("dot|softmax|none|fixed", Config(grad_clip=1)).context == "3fe7a76cab98488e"
    assert TrainSpec(grad_clip=True).grad_clip is True  # a bool stays what it is (Config refuses it)


# The key order of every config a run has stored (Config.to_dict), frozen: settings added later may
# come anywhere, but these keep their order, so a stored config is written byte for byte as before.
STORED_KEY_ORDER = (
    "vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len", "dropout", "d_ff", "block", "favor_features",
    "batch_size", "eval_batch_size", "learning_rate", "weight_decay", "grad_clip", "train_steps", "eval_steps",
    "warmup_steps", "warmup", "lr_schedule", "lr_decay_fraction", "precision", "compile", "log_every",
    "population_size", "n_generations", "elite_size", "mutation_rate", "crossover_rate", "seed", "device", "strategy",
    "strategy_options", "search_space", "genome", "objectives", "baseline", "suite", "init_from", "max_params",
    "max_flops", "max_latency_ms", "max_memory_mb", "fidelity", "halving_eta", "halving_rungs", "hurdle",
    "halving_audit", "data", "tokenizer", "text_field", "data_dir", "eval_stride", "recall", "plugins", "batch_models")


@pytest.mark.filterwarnings("ignore:warmup.* does not apply to lr_schedule constant")  # set there on purpose
def test_the_config_takes_every_spec_field_from_its_one_declaration():
    config_fields = {f.name: f for f in dataclasses.fields(Config)}
    order = list(config_fields)
    for group, spec in {"model": ModelSpec, "train": TrainSpec}.items():
        declared = dataclasses.fields(spec)
        assert [f.name for f in Config.settings_of(group)] == [n for n in order if n in {f.name for f in declared}]
        for f in declared:  # in the Config, with its default, type and metadata (flag, help, key)
            assert f.name in config_fields, f"{f.name} of {spec.__name__} is not a Config field"
            generated = config_fields[f.name]
            assert (generated.default, generated.type, dict(generated.metadata)) == (
                f.default, f.type, {**f.metadata, "group": group}), f.name
        # in the spec's order, but for a field declared ``after`` another: right after it
        moved = {f.name: f.metadata["after"] for f in declared if f.metadata.get("after")}
        assert [n for n in order if n in {f.name for f in declared} - set(moved)] == [
            f.name for f in declared if f.name not in moved]
        assert all(order.index(name) == order.index(after) + 1 for name, after in moved.items())
    own = {name for name, f in config_fields.items() if f.metadata["group"] not in ("model", "train")}
    assert own == {"train_steps", "warmup", "seed"} | {f.name for group in ("search", "fidelity", "task", "execution")
                                                      for f in Config.settings_of(group)}
    assert [name for name in Config().to_dict() if name in STORED_KEY_ORDER] == list(STORED_KEY_ORDER)
    # the task fields feed the TaskSpec; a trial gives back its config's settings
    task = Config(**TINY).task
    assert {f.name for f in Config.settings_of("task")} <= {"data", "tokenizer", "text_field", "data_dir", "eval_stride",
                                                             "recall", "plugins"}
    assert task.options_dict == TINY["recall"] and task.seq_len == 16
    config = Config(**TINY, block="llama", warmup_steps=3)
    back = Config.from_dict(Trial.from_config("dot|softmax|none|fixed", config).config_dict())
    assert all(getattr(back, f.name) == getattr(config, f.name)
               for group in ("model", "train", "task", "trial") for f in Config.settings_of(group))


def test_trials_are_frozen_and_hashable():
    trial = Trial.from_config("dot|softmax|none|fixed", Config(**TINY))
    with pytest.raises(dataclasses.FrozenInstanceError):
        trial.seed = 3
    assert len({trial, trial.replace(seed=trial.seed)}) == 1
    with pytest.raises(Exception, match="fingerprint"):
        trial.key()


@pytest.mark.parametrize("executor", ["local", "process"])
def test_one_call_runs_trials_that_differ_in_learning_rate_and_task(tmp_path, executor):
    config = Config(**TINY)
    other = config.replace(recall={**TINY["recall"], "num_pairs": 3})
    data = data_from_config(config)
    trials = [Trial.from_config("dot|softmax|none|fixed", config),
              Trial.from_config("dot|softmax|none|fixed", config.replace(learning_rate=1e-3)),
              Trial.from_config("dot|softmax|none|fixed", other)]
    store = RunStore.create(tmp_path / "run", config.to_dict())
    pool = LocalExecutor() if executor == "local" else ProcessExecutor(2, threads=1)
    with pool:
        records = Runner(pool, store=store, data={config.task: data}).evaluate(trials)
    assert [records[t].settings["learning_rate"] for t in trials] == [3e-3, 1e-3, 3e-3]
    assert len({records[t].key for t in trials}) == 3
    assert records[trials[0]].data_fingerprint == data.fingerprint != records[trials[2]].data_fingerprint
    assert all(records[t].ok for t in trials)
    trained = []

    class Counting(LocalExecutor):
        def run(self, tasks, **kw):
            trained.extend(tasks)
            yield from super().run(tasks, **kw)

    again = Runner(Counting(), store=store).evaluate([EvalTask(t) for t in trials])  # all cache hits
    assert trained == [] and [again[EvalTask(t)].key for t in trials] == [records[t].key for t in trials]
    assert len(store.evaluations()) == 3
    store.close()


def test_a_llama_model_round_trips_through_save_and_load_pretrained(tmp_path):
    torch.manual_seed(0)
    model = TinyTransformer(ModelSpec(vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_seq_len=16, block="llama"),
                            "dot|softmax|output_gate|learned").eval()
    save_pretrained(model, tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m")
    x = torch.randint(0, 50, (2, 12))
    assert loaded.spec == model.spec and loaded.spec.ffn_dim == 88
    assert torch.equal(model(x), loaded(x))


def test_a_store_written_before_the_trial_opens_reports_and_resumes_without_training(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / "store-0.2.0" / "run.db", run / "run.db")
    with RunStore.open(run, readonly=True) as store:
        before = len(store.evaluations())
    assert main(["status", str(run)]) == 0
    assert main(["report", str(run)]) == 0
    assert main(["search", "--resume", "--out", str(run), "--quiet"]) == 0
    with RunStore.open(run, readonly=True) as store:
        assert len(store.evaluations()) == before  # every training of the resumed run was a cache hit
        config = Config.from_dict(store.config())
        data = data_from_config(config)
        for record in store.evaluations():  # each stored context is the key its trial has now
            trial = Trial.from_config(record["gene"], config, seed=record["seed"], steps=record["steps"], data=data)
            assert store.lookup(*trial.key())["id"] == record["id"]
    final = json.loads((run / "final_results.json").read_text())
    assert final["best_gene"]["key"] == "dot|entmax15|none|learned|nobias|0.20"
