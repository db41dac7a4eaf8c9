"""Multi-fidelity: exact continuation from a checkpoint, the schedule and its promotions, what
the strategy is told, steps spent, resume in the middle of a generation, the CLI and status."""

import json
import math
from pathlib import Path

import pytest
import torch

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.util.errors import UserError
from evo_attention import Evolution
from evo_attention.search.executors import LocalExecutor
from evo_attention.search.fidelity import (RUNG_ROLE, STATE_DIR, Schedule, fidelity_lines, rung_steps, schedule_from_config, told_fitness)
from evo_attention.report.status import format_status, run_status
from evo_attention.search.store import RunStore
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import Trainer, run_training, train_and_evaluate

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=18, log_every=3, population_size=6, n_generations=3, elite_size=1,
            fidelity="halving")
KEYS = ("best_gene", "best_perplexity", "best_generation", "history", "top_5")


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ok(loss, steps=6):
    return {"status": "ok", "val_loss": loss, "val_perplexity": math.exp(loss), "steps": steps}


# -- the schedule --------------------------------------------------------------------------------
def test_rungs_and_schedule_settings():
    assert rung_steps(400, 3, 3, 50) == (50, 150, 400)  # the quick preset: 44.4 -> 50, 133.3 -> 150
    assert rung_steps(5000, 3, 3, 50) == (600, 1700, 5000)
    assert rung_steps(400, 2, 4, 50) == (50, 100, 200, 400)
    assert rung_steps(6, 3, 3, 3) == (3, 6)  # rounding merges rungs
    assert schedule_from_config(Config(**{**TINY, "fidelity": "full"})) is None
    hurdle = schedule_from_config(Config(**{**TINY, "fidelity": "full", "hurdle": 0.5}))
    assert hurdle.rungs == (3, 18) and not hurdle.halving
    with pytest.raises(UserError, match="no room for a lower rung"):
        schedule_from_config(Config(**{**TINY, "train_steps": 3}))
    for bad, fragment in [({"fidelity": "quarter"}, "unknown fidelity 'quarter'"),
                          ({"halving_eta": 1}, "halving_eta must be an integer >= 2"),
                          ({"halving_rungs": 1.5}, "halving_rungs must be an integer >= 2"),
                          ({"hurdle": 1.5}, "hurdle must be a quantile in \\(0, 1\\]"),
                          ({"hurdle": 0}, "hurdle must be a quantile")]:
        with pytest.raises(UserError, match=fragment):
            Config(**{**TINY, **bad})


def test_promotions_keep_the_best_third_and_apply_the_hurdle():
    results = [("a", _ok(1.0)), ("b", _ok(0.5)), ("c", _ok(2.0)), ("d", {"status": "diverged", "val_loss": None}),
               ("e", _ok(0.7)), ("f", _ok(3.0)), ("g", _ok(0.6))]
    halving = Schedule(budget=18, rungs=(3, 6, 18), eta=3, halving=True, hurdle=None)
    assert halving.promote(0, results) == ["b", "g", "e"]  # ceil(7 / 3) of 7, the failure never
    assert halving.promote(1, results[:2]) == ["b"]
    hurdle = Schedule(budget=18, rungs=(3, 18), eta=3, halving=False, hurdle=0.5)
    assert hurdle.promote(0, results) == ["b", "g", "e"]  # losses <= the median 0.85 of the 6 finite ones
    assert Schedule(18, (3, 18), 3, False, 0.5).promote(1, results) == ["b", "g", "e", "a", "c", "f"]
    both = Schedule(budget=18, rungs=(3, 6, 18), eta=2, halving=True, hurdle=0.2)
    assert both.promote(0, results) == ["b", "g"]  # the stricter of the two rules
    assert halving.planned(7) == 7 + 3 + 1


def test_stopped_individuals_are_told_a_value_below_every_longer_trained_one():
    reached = {"full1": _ok(0.9, 18), "full2": _ok(1.2, 18), "mid": _ok(1.0, 6), "low1": _ok(0.8, 3),
               "low2": _ok(1.5, 3), "bad": {"status": "diverged", "val_loss": None, "steps": 3}}
    told = told_fitness(reached)
    assert told["full1"] == math.exp(0.9) and told["full2"] == math.exp(1.2)  # truthful at full budget
    assert told["bad"] is None
    assert told["mid"] > told["full2"] and told["mid"] - math.exp(1.0) == pytest.approx(math.exp(1.2) - math.exp(1.0))
    assert told["mid"] < told["low1"] < told["low2"]  # rung order, then loss order within a rung
    assert told["low2"] - told["low1"] == pytest.approx(math.exp(1.5) - math.exp(0.8))  # one shift per rung
    clear = told_fitness({"full": _ok(0.5, 18), "low": _ok(2.0, 3)})
    assert clear["low"] == math.exp(2.0)  # no shift when the order holds anyway


# -- exact continuation ----------------------------------------------------------------------------
def test_continuing_from_a_checkpoint_equals_an_uninterrupted_training():
    config = Config(**{**TINY, "dropout": 0.1, "lr_schedule": "cosine", "warmup_steps": 4, "train_steps": 12})
    data = data_from_config(config)
    gene = "dot|softmax|output_gate|learned|bias|0.20"  # attention dropout: the RNG state matters
    whole = Trainer.from_config(gene, config, data, seed=3)
    whole.train()
    first = Trainer.from_config(gene, config, data, seed=3)
    first.train(until_step=6)
    state = first.state_dict()
    torch.manual_seed(123)  # anything in between must not matter
    second = Trainer.from_config(gene, config, data, seed=3)
    second.load_state_dict(state)
    second.train()
    for a, b in zip(whole.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert whole.curve == second.curve and whole.step == second.step == 12
    assert whole.evaluate() == second.evaluate()
    with pytest.raises(ValueError, match="seed"):
        Trainer.from_config(gene, config, data, seed=4).load_state_dict(state)

    # the same through the rung function and bytes, as executors ship it
    rung = Trial.from_config(gene, config, seed=3, steps=6, budget=12, data=data)
    low, blob = (lambda r: (r.record, r.state))(run_training(rung, data, keep_state=True))
    high, none = (lambda r: (r.record, r.state))(run_training(rung.replace(steps=12), data, state=blob))
    plain = train_and_evaluate(gene, config, data, seed=3)
    assert none is None and high["resumed_from"] == 6 and low["steps"] == 6 and high["steps"] == 12
    for key in ("val_loss", "val_perplexity", "accuracy", "train_loss", "curve", "trained_steps", "context"):
        assert high[key] == plain[key], key
    assert low["context"].endswith("~12")  # a cosine rung is not a 6-step training: its own cache key


# -- in a search -------------------------------------------------------------------------------------
class Counting(LocalExecutor):
    def __init__(self, stop_after=None):
        self.trained, self.stop_after = [], stop_after

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.gene, task.steps, record.get("resumed_from")))
            yield task, record
            if self.stop_after is not None and len(self.trained) >= self.stop_after:
                raise KeyboardInterrupt


def _final(run_dir):
    data = json.loads((Path(run_dir) / "final_results.json").read_text())
    return {key: data[key] for key in KEYS}


def test_halving_search_spends_the_scheduled_steps_and_resumes_mid_generation(tmp_path):
    config = Config(**TINY)
    executor = Counting()
    with Evolution(config, out_dir=tmp_path / "full", executor=executor) as evo:
        best = evo.run()
    store = RunStore.open(tmp_path / "full", readonly=True)
    records = store.evaluations()
    rungs = [r for r in records if r["role"] == RUNG_ROLE]
    for generation in range(3):
        mine = [r for r in records if r["generation"] == generation]
        at = {s: sorted(r["gene"] for r in mine if r["steps"] == s) for s in (3, 6, 18)}
        assert len(at[6]) == math.ceil(len(at[3]) / 3) and len(at[18]) == math.ceil(len(at[6]) / 3)
        assert set(at[6]) <= set(at[3]) and set(at[18]) <= set(at[6])
        losses = {r["gene"]: r["val_loss"] for r in mine if r["steps"] == 3}
        assert sorted(losses, key=losses.get)[: len(at[6])] == sorted(at[6], key=losses.get)  # the best went on
    for gene, steps, resumed in executor.trained:  # every continuation started at the rung below
        assert resumed == {3: 0, 6: 3, 18: 6}[steps] or gene == "dot|softmax|none|fixed|bias|0.10"
    meta = store.get_meta("fidelity")
    spent = sum(s - (r or 0) for _, s, r in executor.trained)
    assert meta["steps_spent"] == spent
    n_individuals = len({r["gene"] for r in records if r["role"] in ("search", RUNG_ROLE)})
    assert meta["steps_full_equivalent"] == 18 * (n_individuals + 1)
    assert meta["step_saving"] == pytest.approx(meta["steps_full_equivalent"] / spent) and meta["step_saving"] > 1.5
    assert [c["steps"] for c in meta["rank_correlation"]] == [3, 6]
    # the winner trained on the full budget, and its record is what a plain training gives
    assert best.steps == 18 and best.record["role"] == "search"
    plain = train_and_evaluate(best.gene, config, data_from_config(config))
    assert best.record["val_loss"] == plain["val_loss"] and best.record["curve"] == plain["curve"]
    # stopped individuals keep a checkpoint; superseded ones are gone
    files = {p.name for p in (tmp_path / "full" / STATE_DIR).iterdir()}
    highest = {}
    for r in rungs + [r for r in records if r["role"] == "search"]:
        highest[r["gene"]] = max(highest.get(r["gene"], 0), r["steps"])
    kept = {Path(r["checkpoint"]).name for r in rungs if r["steps"] == highest[r["gene"]]}
    assert files == kept
    store.close()

    # interrupted inside generation 0 (after its first rung and one continuation), then resumed
    cut = Counting(stop_after=1 + 6 + 1)
    with Evolution(config, out_dir=tmp_path / "cut", executor=cut) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    resumed = Counting()
    with Evolution(config, out_dir=tmp_path / "cut", resume=True, executor=resumed) as evo:
        evo.run()
    assert not {t[:2] for t in resumed.trained} & {t[:2] for t in cut.trained}  # nothing trained twice
    assert resumed.trained[0][1:] == (6, 3)  # the next continuation picked up its checkpoint
    assert _final(tmp_path / "cut") == _final(tmp_path / "full")


def test_audited_individuals_reach_the_full_budget_and_give_an_unselected_correlation(tmp_path, capsys):
    schedule = Schedule(budget=18, rungs=(3, 6, 18), eta=3, halving=True, hurdle=None, audit=2)
    keys = [f"g{i}" for i in range(6)]
    drawn = schedule.audited(keys, 7, 1)
    assert len(drawn) == 2 and set(drawn) <= set(keys)
    assert schedule.audited(list(reversed(keys)), 7, 1) == drawn  # the order of asking does not matter
    assert {tuple(schedule.audited(keys, 7, g)) for g in range(8)} != {tuple(drawn)}  # it varies by generation
    assert schedule.planned(6) == 6 + 4 + 4
    with pytest.raises(UserError, match="halving_audit 1 needs fidelity halving or a hurdle"):
        Config(**{**TINY, "fidelity": "full", "halving_audit": 1})
    with pytest.raises(UserError, match="halving_audit must be a non-negative integer"):
        Config(**{**TINY, "halving_audit": -1})

    config = Config(**{**TINY, "halving_audit": 1})
    with Evolution(config, out_dir=tmp_path / "run", executor=Counting()) as evo:
        evo.run()
    store = RunStore.open(tmp_path / "run", readonly=True)
    records = store.evaluations()
    meta = store.get_meta("fidelity")
    store.close()
    audited_genes = set()
    for generation in range(3):
        mine = [r for r in records if r["generation"] == generation and r["role"] in ("search", RUNG_ROLE)]
        new = sorted({r["gene"] for r in mine if r["steps"] == 3})
        expected = schedule_from_config(config).audited(new, config.seed, generation)
        flagged = sorted({r["gene"] for r in mine if r.get("audit")})
        assert flagged == expected and len(flagged) == 1
        at = {s: {r["gene"] for r in mine if r["steps"] == s} for s in (3, 6, 18)}
        assert set(flagged) <= at[6] and set(flagged) <= at[18]  # trained on whatever its early loss
        losses = {r["gene"]: r["val_loss"] for r in mine if r["steps"] == 3}
        promoted = sorted(losses, key=losses.get)[: math.ceil(len(new) / 3)]
        assert at[6] == set(promoted) | set(flagged)
        audited_genes |= set(flagged)
    assert meta["audit"] == 1
    assert [c["steps"] for c in meta["rank_correlation_audited"]] == [3, 6]
    assert meta["rank_correlation_audited"][0]["n"] == len(audited_genes) == 3
    text = "\n".join(fidelity_lines(meta))
    assert "over 3 audited (randomly drawn) genes" in text
    # the report carries the schedule, the saving and both correlations
    final = json.loads((tmp_path / "run" / "final_results.json").read_text())
    assert final["fidelity"]["audit"] == 1 and final["fidelity"]["steps_spent"] == meta["steps_spent"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| Multi-fidelity | halving (rungs 3/6/18 steps, eta 3, audit 1): " in report
    assert f"{meta['steps_spent']:,} training steps spent vs {meta['steps_full_equivalent']:,} at full fidelity" in report
    assert "| Rank correlation, audited genes only | 3 steps: Spearman" in report


def test_hurdle_cli_status_and_resume_checks(tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
             "--layers", "1", "--batch-size", "8", "--population", "4", "--generations", "2", "--elite", "1",
             "--steps", "100", "--no-baseline", "--quiet", "--out", str(out)]
    assert main(["search", *flags, "--hurdle", "0.5"]) == 0
    config = RunStore.open(out, readonly=True).config()
    assert config["hurdle"] == 0.5 and config["fidelity"] == "full"
    status = run_status(out)
    assert status["fidelity"]["rungs"] == [50, 100] and status["fidelity"]["mode"] == "hurdle"
    with RunStore.open(out, readonly=True) as store:
        gen0 = [r for r in store.evaluations() if r["generation"] == 0]
    first = sorted(r["val_loss"] for r in gen0 if r["steps"] == 50)
    assert len([r for r in gen0 if r["steps"] == 100]) == sum(1 for x in first if x <= (first[1] + first[2]) / 2)
    text = format_status(status)
    assert "training steps spent" in text and "rank correlation" in text
    capsys.readouterr()
    assert main(["search", *flags, "--resume", "--fidelity", "halving"]) == 2
    assert "--fidelity 'halving' contradicts the run" in capsys.readouterr().err
    assert main(["search", *flags, "--resume", "--halving-audit", "2"]) == 2
    assert "--halving-audit 2 contradicts the run" in capsys.readouterr().err
    assert main(["search", *flags, "--resume", "--hurdle", "0.5", "--workers", "1"]) == 0  # executors may change


# -- damaged rung states (docs/reliability.md) --------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("rungs") / "whole"
    with Evolution(Config(**{**TINY, "n_generations": 2}), out_dir=out, executor=Counting()) as evo:
        evo.run()
    return _final(out)


def _damage(files, how):
    blobs = [p.read_bytes() for p in files]
    for i, path in enumerate(files):
        if how == "overwrite":
            path.write_bytes(b"\x00garbage" * 64)
        elif how == "truncate":
            path.write_bytes(blobs[i][: len(blobs[i]) // 2])
        elif how == "flipped":  # same size, one byte changed inside the trainer state
            path.write_bytes(blobs[i][:-40] + bytes([blobs[i][-40] ^ 0xFF]) + blobs[i][-39:])
        elif how == "foreign":  # an intact state of another gene or rung
            path.write_bytes(blobs[(i + 1) % len(blobs)])
        else:  # empty
            path.write_bytes(b"")


@pytest.mark.parametrize("how", ["overwrite", "truncate", "flipped", "foreign", "empty"])
def test_a_damaged_rung_state_is_retrained_like_a_missing_one(tmp_path, how, uninterrupted):
    config = Config(**{**TINY, "n_generations": 2})
    cut = Counting(stop_after=1 + 6 + 1)  # baseline, the first rung, one continuation (it left a state)
    with Evolution(config, out_dir=tmp_path / "run", executor=cut) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    files = sorted((tmp_path / "run" / STATE_DIR).iterdir())
    assert len(files) >= 2
    _damage(files, how)
    for _ in range(2):  # a second resume finds nothing of the damage cached
        resumed = Counting()
        with pytest.warns(UserWarning, match="rung state .* is not usable") if _ == 0 else _nothing():
            with Evolution(config, out_dir=tmp_path / "run", resume=True, executor=resumed) as evo:
                evo.run()
        assert _final(tmp_path / "run") == uninterrupted
    with RunStore.open(tmp_path / "run", readonly=True) as store:
        assert all(r["status"] == "ok" for r in store.evaluations())  # no "error" from the tool's own files
    assert resumed.trained == []  # the second resume found everything in the store


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_state_that_cannot_be_loaded_never_becomes_the_genes_failure(recwarn):
    config = Config(**{**TINY, "train_steps": 12})
    data = data_from_config(config)
    gene = "dot|softmax|none|fixed"
    rung = Trial.from_config(gene, config, steps=6, budget=12, data=data)
    plain = run_training(rung.replace(steps=12), data).record
    for blob in (b"PK\x03\x04 not a zip at all", run_training(rung, data, keep_state=True).state[:200]):
        record = run_training(rung.replace(steps=12), data, state=blob).record
        assert record.status == "ok" and record.resumed_from == 0
        assert record["val_loss"] == plain["val_loss"] and record["curve"] == plain["curve"]
    assert any("training it from scratch" in str(w.message) for w in recwarn)
