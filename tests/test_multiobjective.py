"""Multi-objective search: the Pareto arithmetic, nsga2 and tpe, objective vectors from records,
latency on every record, the results (pareto_front, pareto.png, status) and bad input."""

import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.report.status import format_status, run_status
from evo_attention.search import STRATEGIES, make_strategy, pareto
from evo_attention.search.base import Individual, rank_members
from evo_attention.search.store import RunStore
from evo_attention.train.record import EvaluationRecord, objective_values
from evo_attention.util.errors import UserError

TINY_FLAGS = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
              "--layers", "1", "--batch-size", "8", "--quiet", "--no-baseline"]
MO_KEYS = ("best_gene", "history", "top_5", "objectives", "pareto_front", "hypervolume")


def _final(run_dir):
    return json.loads((Path(run_dir) / "final_results.json").read_text())


# -- the arithmetic --------------------------------------------------------------------------------
def test_fronts_crowding_and_order():
    points = [(1, 5), (2, 2), (5, 1), (3, 3), (4, 4), (math.inf, math.inf), (2, 2)]
    assert pareto.fronts(points) == [[0, 1, 2, 6], [3], [4]]
    assert pareto.dominates((1, 1), (1, 2)) and not pareto.dominates((1, 2), (1, 2))
    distance = pareto.crowding(points, [0, 1, 2, 6])
    assert distance[0] == distance[2] == math.inf and 0 < distance[1] < math.inf
    order = pareto.pareto_order(points)
    assert order[-1] == 5 and set(order[:4]) == {0, 1, 2, 6} and order[4:6] == [3, 4]


def _union_volume(points, reference):
    """The volume of the union of the boxes [p, reference], by inclusion and exclusion."""
    total = 0.0
    for n in range(1, len(points) + 1):
        for subset in itertools.combinations(points, n):
            corner = [max(p[d] for p in subset) for d in range(len(reference))]
            total += (-1) ** (n + 1) * math.prod(max(0.0, r - c) for r, c in zip(reference, corner))
    return total


@pytest.mark.parametrize("dims", [2, 3, 4])
def test_hypervolume_is_the_volume_of_the_dominated_region(dims):
    rng = random.Random(dims)
    for _ in range(5):
        points = [tuple(rng.uniform(0, 1) for _ in range(dims)) for _ in range(6)]
        reference = (1.05,) * dims
        assert pareto.hypervolume(points, reference) == pytest.approx(_union_volume(points, reference))
    assert pareto.hypervolume([(1, 3), (2, 2), (3, 1)], (4, 4)) == pytest.approx(6.0)
    assert pareto.hypervolume([(5, 5), (math.nan, 0)], (4, 4)) == 0.0  # outside the box, not finite
    ideal, reference = pareto.bounds([(1, 10), (3, 10)])
    assert ideal == (1, 10) and reference == (pytest.approx(3.2), pytest.approx(11.0))
    assert pareto.hypervolume_share([(1, 10)], ideal, reference) == pytest.approx(1.0)


def test_rank_members_uses_fronts_only_with_several_objectives():
    genes = [make_strategy("random", seed=s, population_size=1, n_generations=1, elite_size=0).ask()[0]
             for s in range(3)]
    single = [Individual(genes[0], 3.0), Individual(genes[1], 2.0), Individual(genes[2], math.inf)]
    assert [m.perplexity for m in rank_members(single)] == [2.0, 3.0, math.inf]
    multi = [Individual(genes[0], 3.0, objectives=(3.0, 1.0)), Individual(genes[1], 2.0, objectives=(2.0, 5.0)),
             Individual(genes[2], 4.0, objectives=(4.0, 6.0))]
    assert [m.perplexity for m in rank_members(multi)][-1] == 4.0  # the only dominated member


# -- objectives of a record ------------------------------------------------------------------------
def test_objective_values_of_records():
    ok = EvaluationRecord(gene="dot|softmax|none|fixed|bias|0.10", seed=1, steps=10, data_fingerprint="f",
                          context="c", val_loss=1.0, val_perplexity=2.7, params=100, flops_per_step=5000,
                          train_time_s=0.5, trained_steps=10, latency_ms=1.5, peak_memory_mb=12.0)
    names = ("perplexity", "params", "flops", "train_ms_per_step", "latency_ms", "peak_memory_mb")
    assert objective_values(ok, names) == (2.7, 100.0, 5000.0, 50.0, 1.5, 12.0)
    assert objective_values(ok.replace(latency_ms=None), ("perplexity", "latency_ms")) == (2.7, math.inf)
    assert objective_values(ok.replace(status="diverged"), ("perplexity", "params")) == (math.inf, math.inf)


def test_every_training_measures_its_latency(tiny_config):
    from evo_attention.data import RecallData
    from evo_attention.train.trainer import LATENCY_REPEATS, train_and_evaluate

    data = RecallData(vocab_size=16, seq_len=12, num_pairs=2, num_queries=2, train_examples=64, eval_examples=16)
    record = train_and_evaluate("dot|softmax|none|fixed", tiny_config.replace(train_steps=2, eval_batch_size=16), data)
    assert record.latency_ms > 0 and record.latency_ms_iqr >= 0 and record.latency_threads >= 1
    assert EvaluationRecord.from_dict(record.to_dict()) == record and LATENCY_REPEATS >= 5


# -- the strategies --------------------------------------------------------------------------------
def _drive(name, objectives, seed=3, stop_after=None, strategy=None, told=None):
    """Ask/tell a stand-in fitness (a function of the key); returns (strategy, asked keys, told)."""
    strategy = strategy or make_strategy(name, population_size=6, n_generations=4, elite_size=2, seed=seed,
                                         objectives=objectives)
    asked, told = [], told if told is not None else []
    while not strategy.done and (stop_after is None or strategy.generation < stop_after):
        genes = strategy.ask()
        asked += [g.key for g in genes]
        values = []
        for gene in genes:
            r = random.Random(gene.key)
            ppl = None if r.random() < 0.1 else 5 + 10 * r.random()
            values.append(ppl if len(objectives) == 1 else (None if ppl is None else (ppl, 1000 + 9000 * r.random())))
        told.append(list(zip(genes, values)))
        strategy.tell(told[-1])
    return strategy, asked, told


@pytest.mark.parametrize("name", ["ga", "random", "nsga2", "tpe"])
@pytest.mark.parametrize("objectives", [("perplexity",), ("perplexity", "params")])
def test_strategies_are_deterministic_and_resume_by_replay(name, objectives):
    full, asked, told = _drive(name, objectives)
    again, asked_again, _ = _drive(name, objectives)
    assert asked == asked_again and len(asked) == full.total_evaluations()
    # an interrupted run: a fresh strategy told the stored results generation by generation goes on
    # exactly as the uninterrupted one
    replay = make_strategy(name, population_size=6, n_generations=4, elite_size=2, seed=3, objectives=objectives)
    for results in told[:2]:
        replay.ask()
        replay.tell(results)
    _, rest, _ = _drive(name, objectives, strategy=replay)
    assert asked[: 6 + 4] + rest == asked
    assert [(m.gene.key, m.values) for m in replay.population] == [(m.gene.key, m.values) for m in full.population]
    assert _drive(name, objectives, seed=4)[1] != asked
    best = min((m for m in full.population if not m.failed), key=lambda m: m.perplexity)
    assert full.best.perplexity == best.perplexity == full.history[-1]["best_perplexity"]


def test_nsga2_keeps_the_front_and_tell_checks_vectors():
    strategy, _, _ = _drive("nsga2", ("perplexity", "params"))
    points = [m.values for m in strategy.population]
    assert len(strategy.population) == 6 and len({m.gene.key for m in strategy.population}) == 6
    first = pareto.front(points)
    assert sorted(first) == list(range(len(first)))  # the survivors come front first
    fresh = make_strategy("nsga2", population_size=3, n_generations=1, elite_size=1, objectives=("perplexity", "params"))
    genes = fresh.ask()
    with pytest.raises(TypeError, match="2 values"):
        fresh.tell([(g, (1.0,)) for g in genes])


def test_a_strategy_without_optuna_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(UserError, match=r"pip install 'evo-attention\[tpe\]'"):
        make_strategy("tpe")


# -- end to end ------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy,objectives", [("nsga2", "perplexity,params"), ("tpe", "perplexity,params")])
def test_multi_objective_search_resumes_after_sigkill(tmp_path, strategy, objectives):
    flags = [*TINY_FLAGS, "--steps", "12", "--population", "3", "--generations", "3", "--elite", "1",
             "--strategy", strategy, "--objectives", objectives]
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "evo_attention.cli", "search", *flags, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if RunStore.exists(out):
                try:
                    with RunStore.open(out, readonly=True) as store:
                        if len(store.evaluations()) >= 2:
                            break
                except UserError:  # the store is still being created
                    pass
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    with RunStore.open(out, readonly=True) as store:
        assert store.get_meta("done") is False
    assert main(["search", *flags[:-4], "--out", str(out), "--resume"]) == 0  # the stored strategy and objectives
    assert main(["search", *flags, "--out", str(tmp_path / "clean")]) == 0
    resumed, clean = _final(out), _final(tmp_path / "clean")
    for key in MO_KEYS:
        assert resumed[key] == clean[key], key
    assert resumed["objectives"] == ["perplexity", "params"] and resumed["strategy"]["name"] == strategy
    assert (out / "pareto.png").stat().st_size > 0 and "## Pareto front" in (out / "report.md").read_text()
    # the front is every non-dominated finished evaluation, and nothing else
    with RunStore.open(out, readonly=True) as store:
        points = {r.gene: objective_values(r, ("perplexity", "params")) for r in store.evaluations(role="search")}
    front = {m["key"]: (m["perplexity"], m["params"]) for m in resumed["pareto_front"]}
    assert front and all(not pareto.dominates(p, q) for p in points.values() for q in front.values())
    assert set(front) == {k for k, p in points.items() if not any(pareto.dominates(q, p) for q in points.values())}
    assert all(math.isfinite(p) for p in front.values() for p in p)
    status = run_status(out)
    assert status["pareto"]["front_size"] == len(front)
    assert f"{len(front)} genes, hypervolume" in format_status(status)
    hv = [h["hypervolume"] for h in resumed["hypervolume"]["history"]]
    assert hv == sorted(hv) and 0 < hv[-1] <= 1  # measured in one box: never falls


def _bad(args, capsys):
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_objectives_and_strategies_are_one_line_errors(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    base = ["search", *TINY_FLAGS, "--steps", "2", "--population", "2", "--generations", "1", "--elite", "1"]
    assert "unknown objective 'latency'" in _bad(base + ["--objectives", "perplexity,latency", "--out", str(out)], capsys)
    assert "named twice" in _bad(base + ["--objectives", "perplexity,params,params", "--out", str(out)], capsys)
    assert "start with perplexity" in _bad(base + ["--objectives", "params", "--out", str(out)], capsys)
    assert "--objectives" in _bad(base + ["--objectives", "perplexity,flopz", "--out", str(out)], capsys)
    monkeypatch.setitem(sys.modules, "optuna", None)
    assert "needs Optuna" in _bad(base + ["--strategy", "tpe", "--out", str(out)], capsys)
    assert not out.exists()
    monkeypatch.delitem(sys.modules, "optuna")
    assert main(base + ["--objectives", "perplexity,params", "--out", str(out)]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in out.iterdir()), _final(out)
    err = _bad(base + ["--objectives", "perplexity,flops", "--out", str(out), "--resume"], capsys)
    assert "--objectives perplexity,flops contradicts the run" in err and "(it has perplexity,params)" in err
    assert (sorted(p.name for p in out.iterdir()), _final(out)) == before
    with RunStore.open(out, readonly=True) as store:
        config = Config.from_dict({**store.config(), "objectives": ["perplexity"]})
    from evo_attention.search.driver import Search

    with pytest.raises(UserError, match="differ from those the run"):
        Search(config, out_dir=out, resume=True)
    assert (sorted(p.name for p in out.iterdir()), _final(out)) == before


def test_single_objective_outputs_have_no_pareto_part(tmp_path):
    assert main(["search", *TINY_FLAGS, "--steps", "2", "--population", "2", "--generations", "1", "--elite", "1",
                 "--out", str(tmp_path / "run")]) == 0
    final = _final(tmp_path / "run")
    assert "pareto_front" not in final and not (tmp_path / "run" / "pareto.png").exists()
    assert "Pareto" not in (tmp_path / "run" / "report.md").read_text()
    assert run_status(tmp_path / "run")["pareto"] is None


def test_strategies_are_registered():
    assert {"ga", "random", "nsga2", "tpe"} <= set(STRATEGIES)


def test_the_strategy_example_of_docs_search_md_runs(capsys):
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "search.md").read_text()
    blocks = dict(re.findall(r"<!-- example: (.+?) -->\n```python\n(.*?)```", text, re.S))
    assert set(blocks) == {"front_mutation.py", "usage"}
    try:
        exec(compile(blocks["front_mutation.py"], "front_mutation.py", "exec"), {"__name__": "front_mutation"})
        first, second = ({}, {})
        exec(compile(blocks["usage"], "usage", "exec"), first)
        exec(compile(blocks["usage"], "usage", "exec"), second)
        strategy = first["strategy"]
        assert strategy.done and len(strategy.history) == 3 and strategy.total_evaluations() == 4 + 3 + 3
        assert [m.gene for m in strategy.population] == [m.gene for m in second["strategy"].population]
        assert all(len(m.values) == 2 for m in strategy.population)
        assert "Attn(" in capsys.readouterr().out
    finally:
        STRATEGIES.pop("front_mutation", None)
