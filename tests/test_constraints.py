"""Constraints: caps on parameters and FLOPs checked before any training is spent, measured caps
(latency, memory) marked after training, relative caps, constrained ranking in every strategy, and
what status, the report and the Pareto front say of infeasible genes."""

import json
import math
from pathlib import Path

import pytest

from evo_attention import AttentionGene, Config, Evolution
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.report import load_run
from evo_attention.report.status import format_status, run_status
from evo_attention.search import constraints as caps
from evo_attention.search import make_strategy
from evo_attention.search.base import Individual, best_member, rank_members
from evo_attention.search.executors import LocalExecutor
from evo_attention.search.store import RunStore
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_training
from evo_attention.util.errors import UserError

TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, population_size=4, n_generations=3, elite_size=1)
TINY_FLAGS = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
              "--layers", "1", "--batch-size", "8", "--steps", "6", "--population", "4", "--generations", "2",
              "--elite", "1", "--quiet"]
VANILLA_PARAMS = 3824  # the vanilla transformer at TINY's sizes (checked below)


class CountingExecutor(LocalExecutor):
    """Records every training it runs: (gene, params, flops per step)."""

    def __init__(self, stop_after=None):
        self.trained = []
        self.stop_after = stop_after

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.gene, record.params, record.flops_per_step, task.role))
            yield task, record
            if self.stop_after is not None and len(self.trained) >= self.stop_after:
                raise KeyboardInterrupt


def _final(run_dir):
    return json.loads((Path(run_dir) / "final_results.json").read_text())


# -- settings ----------------------------------------------------------------------------------------
def test_caps_are_numbers_or_factors_of_the_baseline():
    c = Config(max_params="5e4", max_flops=3e9, max_latency_ms="1.2X", max_memory_mb="900.5")
    assert (c.max_params, c.max_flops, c.max_latency_ms, c.max_memory_mb) == (50000, 3000000000, "1.2x", 900.5)
    assert caps.settings_of(c) == {"max_params": 50000, "max_flops": 3000000000, "max_latency_ms": "1.2x",
                                   "max_memory_mb": 900.5}
    limits = caps.resolve_limits(caps.settings_of(c), {"latency_ms": 2.5})
    assert limits["max_latency_ms"]["limit"] == pytest.approx(3.0) and limits["max_params"]["limit"] == 50000
    assert caps.resolve_limits({"max_memory_mb": "2x"}, {})["max_memory_mb"]["limit"] is None  # no baseline value
    for bad, fragment in ((dict(max_params="many"), "max_params must be a positive number"),
                          (dict(max_flops=0), "max_flops must be a positive number"),
                          (dict(max_params="-1x"), "max_params"),
                          (dict(max_latency_ms="1.2x", baseline=False), "trains no baseline")):
        with pytest.raises(UserError, match=fragment):
            Config(**bad)


def test_excess_and_violation():
    limits = caps.resolve_limits({"max_params": 100, "max_latency_ms": 2.0}, {})
    e = caps.excess({"params": 150, "latency_ms": 1.0}, limits)
    assert e == {"max_params": pytest.approx(0.5), "max_latency_ms": pytest.approx(-0.5)}
    assert caps.violation(e) == pytest.approx(0.5) and caps.violation({"max_params": -0.1}) == 0.0
    assert caps.excess({"params": None, "latency_ms": math.inf}, limits) == {}  # unknown: not judged
    assert "params 150 > max_params 100" in caps.violations_text(caps.violations_of({"params": 150}, limits))


def test_costs_before_training_are_those_the_trainer_records():
    config = Config(**TINY)
    data = data_from_config(config)
    for key in (AttentionGene.vanilla().key, "cosine|entmax15|output_gate|learned|nobias|0.20"):
        trial = Trial.from_config(key, config, data=data)
        costs = caps.gene_costs(trial, data, flops=True)
        record = run_training(trial, data).record
        assert costs == {"params": record.params, "flops": record.flops_per_step}
        assert caps.gene_costs(trial, data, flops=False) == {"params": record.params, "flops": None}
    assert caps.gene_costs(Trial.from_config(AttentionGene.vanilla().key, config, data=data), data,
                           flops=False)["params"] == VANILLA_PARAMS


# -- ranking -----------------------------------------------------------------------------------------
def _genes(n):
    return [make_strategy("random", seed=s, population_size=1, n_generations=1, elite_size=0).ask()[0]
            for s in range(n)]


def test_infeasible_members_rank_after_feasible_ones_by_violation():
    g = _genes(4)
    members = [Individual(g[0], 2.0, violation=0.5), Individual(g[1], 9.0), Individual(g[2], 1.0, violation=0.1),
               Individual(g[3], 5.0)]
    assert [m.gene for m in rank_members(members)] == [g[3], g[1], g[2], g[0]]
    assert best_member(members).gene == g[3]  # the lowest perplexity among the feasible
    multi = [Individual(g[0], 1.0, objectives=(1.0, 1.0), violation=0.2),  # dominates the rest but breaks a cap
             Individual(g[1], 3.0, objectives=(3.0, 2.0)), Individual(g[2], 2.0, objectives=(2.0, 3.0))]
    ranked = rank_members(multi)
    assert ranked[-1].gene == g[0] and {m.gene for m in ranked[:2]} == {g[1], g[2]}
    assert Individual(g[0], 1.0, violation=0.2).to_dict()["violation"] == 0.2


@pytest.mark.parametrize("name", ["ga", "random", "nsga2", "tpe"])
def test_strategies_are_told_violations_and_prefer_feasible_genes(name):
    objectives = ("perplexity", "params")
    strategy = make_strategy(name, population_size=6, n_generations=2, elite_size=2, seed=3, objectives=objectives,
                             constraints=("max_params",))
    genes = strategy.ask()
    # the genes with an even key length break the cap (by a tenth), whatever their perplexity
    excess = {g.key: {"max_params": 0.1 if len(g.key) % 2 == 0 else -0.2} for g in genes}
    strategy.tell([(g, (1.0 + i, 100.0 + i)) for i, g in enumerate(genes)], violations=excess)
    feasible = [m for m in strategy.population if m.feasible]
    infeasible = [m for m in strategy.population if not m.feasible]
    assert strategy.population[: len(feasible)] == feasible  # feasible first
    assert all(m.violation == pytest.approx(0.1) for m in infeasible)
    if feasible:
        assert strategy.best.feasible
    if name == "tpe":  # every trial of the study carries its constraints
        trials = strategy.study.trials
        assert len(trials) == len(genes)
        assert all(len(t.constraints) == 1 for t in trials)
        assert sorted(v for t in trials for v in t.constraints.values()) == sorted(
            e["max_params"] for e in excess.values())
        strategy.ask()  # the sampler proposes with them


def test_tpe_without_set_constraint_passes_a_constraints_func(monkeypatch):
    """An Optuna before 5.0 (no Trial.set_constraint) gets the constraints through constraints_func."""
    from evo_attention.search import tpe

    monkeypatch.setattr(tpe, "sets_constraints", lambda optuna: False)
    strategy = make_strategy("tpe", population_size=4, n_generations=2, elite_size=1, seed=0,
                             constraints=("max_params",))
    assert strategy.study.sampler._constraints_func is not None
    genes = strategy.ask()
    strategy.tell([(g, 1.0 + i) for i, g in enumerate(genes)], violations={genes[0]: {"max_params": 0.3}})
    strategy.ask()
    asked = strategy.study.trials
    assert asked[0].constraints == {"0": 0.3} and all(t.user_attrs["constraints"] for t in asked[:4])


# -- in a search -------------------------------------------------------------------------------------
def test_no_training_is_spent_on_a_gene_over_the_parameter_cap(tmp_path, capsys):
    config = Config(**TINY, max_params=VANILLA_PARAMS, objectives=["perplexity", "params"])
    executor = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "run", executor=executor, quiet=False) as evo:
        best = evo.run()
    printed = capsys.readouterr()
    assert "refused: " in printed.out + printed.err  # the progress log names each refused gene
    search_trained = [t for t in executor.trained if t[3] == "search"]
    assert search_trained and all(params <= VANILLA_PARAMS for _, params, _, _ in search_trained)
    store = RunStore.open(tmp_path / "run", readonly=True)
    refused = store.get_meta("infeasible")
    assert refused, "the cap must refuse some genes of this run"
    trained_keys = {t[0] for t in executor.trained}
    for entry in refused:
        assert entry["params"] > VANILLA_PARAMS and entry["gene"] not in trained_keys
        assert set(entry["violations"]) == {"max_params"}
    assert store.get_meta("constraints")["limits"]["max_params"]["limit"] == VANILLA_PARAMS
    # the strategy ranked the refused genes last; the best is feasible
    assert best.feasible and best.status == "ok"
    flags = [i.feasible for i in evo.population]
    assert flags == sorted(flags, reverse=True)  # feasible members first
    assert all(i.status == "infeasible" for i in evo.population if i.gene.key in {e["gene"] for e in refused})
    # the front, the ranking and the best gene hold feasible genes only
    final = _final(tmp_path / "run")
    refused_keys = {e["gene"] for e in refused}
    assert final["pareto_front"] and not {m["key"] for m in final["pareto_front"]} & refused_keys
    assert all(m["params"] <= VANILLA_PARAMS for m in final["pareto_front"])
    assert final["best_gene"]["key"] not in refused_keys
    assert final["counts"]["infeasible"] == {"never_trained": len(refused), "trained": 0}
    assert len(final["constraints"]["never_trained"]) == len(refused)
    # status and the report say so
    text = format_status(run_status(tmp_path / "run"))
    assert f"{len(refused)} infeasible gene" in text and "max_params 3,824" in text
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Infeasible genes" in report and "no (refused)" in report
    assert "Infeasible genes" in (tmp_path / "run" / "report.html").read_text()


def test_a_relative_flops_cap_and_resume_replay_the_same_decisions(tmp_path):
    config = Config(**TINY, max_flops="1.07x")  # some genes refused, most trained
    with Evolution(config, out_dir=tmp_path / "full") as evo:
        evo.run()
    limit = RunStore.open(tmp_path / "full", readonly=True).get_meta("constraints")["limits"]["max_flops"]
    assert limit["limit"] == pytest.approx(1.07 * limit["baseline"])
    cut = CountingExecutor(stop_after=4)
    with Evolution(config, out_dir=tmp_path / "cut", executor=cut) as evo:
        with pytest.raises(KeyboardInterrupt):
            evo.run()
    resumed = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "cut", resume=True, executor=resumed) as evo:
        evo.run()
    assert not {t[0] for t in resumed.trained} & {t[0] for t in cut.trained}
    assert all(flops <= limit["limit"] for _, _, flops, role in cut.trained + resumed.trained if role == "search")
    full, again = _final(tmp_path / "full"), _final(tmp_path / "cut")
    assert full["constraints"]["never_trained"]  # the cap refused genes
    for key in ("best_gene", "best_perplexity", "history", "top_5", "constraints"):
        assert full[key] == again[key], key


def test_a_measured_cap_marks_genes_infeasible_after_training(tmp_path):
    config = Config(**{**TINY, "n_generations": 2}, max_latency_ms=1e-6, objectives=["perplexity", "latency_ms"])
    executor = CountingExecutor()
    with Evolution(config, out_dir=tmp_path / "run", executor=executor) as evo:
        evo.run()
    assert len([t for t in executor.trained if t[3] == "search"]) >= config.population_size  # all were trained
    assert all(not i.feasible for i in evo.population)
    summary = load_run(tmp_path / "run")
    assert summary.outcome == "all_infeasible" and "No feasible gene" in summary.statement
    assert summary.best is None and summary.pareto["front"] == []
    assert summary.counts["infeasible"]["trained"] == len(summary.constraints["trained"]) > 0
    assert all("max_latency_ms" in t["violations"] for t in summary.constraints["trained"])
    assert (tmp_path / "run" / "pareto.png").is_file()
    assert "trained over a measured cap" in format_status(run_status(tmp_path / "run"))
    import csv

    rows = list(csv.DictReader((tmp_path / "run" / "evaluations.csv").open()))
    searched = [r for r in rows if r["role"] == "search"]
    assert searched and all(r["feasible"] == "false" for r in searched)  # the csv says which genes break a cap


def test_caps_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["search", *TINY_FLAGS, "--no-baseline", "--max-params", "1.0x", "--max-latency-ms", "1000",
                 "--objectives", "perplexity,params", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    stored = RunStore.open(out, readonly=True).config()
    assert stored["max_params"] == "1x" and stored["max_latency_ms"] == 1000
    # a resume may repeat the caps in any spelling; a different cap contradicts the run
    assert main(["search", "--resume", "--out", str(out), "--max-params", "1X", "--quiet"]) == 0
    assert main(["search", "--resume", "--out", str(out), "--max-params", "2x", "--quiet"]) == 2
    assert "--max-params" in capsys.readouterr().err
    assert main(["search", *TINY_FLAGS, "--max-flops", "lots", "--out", str(tmp_path / "bad")]) == 2
    assert "--max-flops must be a positive number" in capsys.readouterr().err
