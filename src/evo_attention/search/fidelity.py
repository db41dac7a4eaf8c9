"""Multi-fidelity evaluation: spend the full training budget only on individuals that earn it
(docs/scaling.md, "Multi-fidelity").

``--fidelity halving``: successive halving inside every generation over ``halving_rungs`` rungs at
``budget / eta^k`` steps (``rung_steps``); the best ``ceil(n / eta)`` by validation loss continue from
a checkpoint to the next rung. ``--hurdle Q`` stops, at the first rung, every individual worse than
the Q-quantile of the first-rung losses. ``--halving-audit N`` trains N drawn individuals of each
generation to the full budget whatever their early losses (records ``audit: true``).

Exactness: a rung is the first ``steps`` steps of the full training and a continuation restores the
whole trainer state, so an individual that reaches the full budget gets exactly the record an
uninterrupted training gives (role ``search``, a cache hit for any later request). A rung evaluation
is a record of role ``rung`` with its own ``steps``, ``budget``, ``resumed_from`` and ``checkpoint``
(a file under ``RUN_DIR/rung_states/``); a resume replays the promotions from the stored losses.
``told_fitness`` gives the strategy each individual's perplexity at the highest rung it reached,
shifted so that it ranks below every individual of the generation that trained longer.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from evo_attention.train.config import Config
from evo_attention.train.record import usable_metric
from evo_attention.util.errors import UserError

RUNG_ROLE = "rung"
STATE_DIR = "rung_states"  # trainer states of partial trainings, to continue them


# -- the schedule ---------------------------------------------------------------------------------
def rung_steps(budget: int, eta: int, rungs: int, log_every: int = 1) -> tuple[int, ...]:
    """Steps of the rungs: ``budget / eta^k`` for k = rungs-1 ... 0, each lower rung rounded up to
    a multiple of ``log_every`` (and kept below the budget); duplicates dropped."""
    steps = []
    for k in range(rungs - 1, 0, -1):
        value = max(log_every, math.ceil(budget / eta ** k / log_every) * log_every)
        if value < budget and (not steps or value > steps[-1]):
            steps.append(value)
    return tuple(steps) + (budget,)


@dataclass(frozen=True)
class Schedule:
    """The rungs of a generation and the rule that promotes individuals from one to the next."""

    budget: int
    rungs: tuple[int, ...]  # increasing; the last is the budget
    eta: int
    halving: bool
    hurdle: float | None
    audit: int = 0  # new individuals per generation trained to the full budget regardless

    def promote(self, rung: int, results: Iterable[tuple[str, Mapping]]) -> list[str]:
        """The keys that go on from rung ``rung``, best first.

        ``results`` are ``(key, record)`` of every individual evaluated at that rung. Failed ones
        never go on; halving keeps the best ``ceil(n / eta)`` of the n (by validation loss, ties by
        key); the hurdle (first rung only) drops those whose loss is above the ``hurdle``-quantile
        of the finite losses.
        """
        results = list(results)
        finite = sorted((loss, key) for key, record in results if (loss := usable_metric(record, "val_loss")) is not None)
        ranked = finite[: math.ceil(len(results) / self.eta)] if self.halving else finite
        if self.hurdle is not None and rung == 0 and ranked:
            import numpy as np

            threshold = float(np.quantile([loss for loss, _ in finite], self.hurdle))
            ranked = [(loss, key) for loss, key in ranked if loss <= threshold]
        return [key for _, key in ranked]

    def planned(self, n: int) -> int:
        """Evaluations ``n`` individuals need at most (a progress estimate)."""
        total, alive = 0, n
        for _ in self.rungs:
            total += alive
            if self.halving:
                alive = min(alive, math.ceil(alive / self.eta) + self.audit)
        return total

    def audited(self, keys: Iterable[str], seed: int, generation: int) -> list[str]:
        """The ``audit`` keys of a generation's new individuals that skip the stopping rules: a
        uniform draw that depends only on the run's seed, the generation and the keys."""
        keys = sorted(set(keys))
        return sorted(random.Random(f"audit/{seed}/{generation}").sample(keys, min(self.audit, len(keys))))

    def to_dict(self) -> dict:
        return {"mode": "halving" if self.halving else "hurdle", "budget": self.budget, "rungs": list(self.rungs),
                "eta": self.eta, "hurdle": self.hurdle, "audit": self.audit}


def schedule_from_config(config: Config) -> Schedule | None:
    """The schedule a config asks for; None for plain full-fidelity evaluation."""
    if config.fidelity == "full" and config.hurdle is None:
        return None
    rungs = rung_steps(config.train_steps, config.halving_eta, config.halving_rungs, config.log_every)
    if config.fidelity == "full":
        rungs = (rungs[0], rungs[-1]) if len(rungs) > 1 else rungs
    if len(rungs) < 2:
        raise UserError(
            f"train_steps {config.train_steps} leaves no room for a lower rung (rungs are multiples of log_every "
            f"{config.log_every}): raise train_steps or lower log_every, or use fidelity full without a hurdle",
            setting=("train_steps", "fidelity", "hurdle"))
    return Schedule(budget=config.train_steps, rungs=rungs, eta=config.halving_eta,
                    halving=config.fidelity == "halving", hurdle=config.hurdle, audit=config.halving_audit)


# -- identity of a rung evaluation ----------------------------------------------------------------
# A rung evaluation is a Trial with ``budget`` set (train.spec): its key's context carries the budget
# under a decaying schedule, where the rate at a step depends on it; a rung of a constant-rate
# schedule is exactly a plain training of its steps and shares its cache entries.
def state_file_name(gene: str, seed: int, steps: int, context: str) -> str:
    """File name (under ``STATE_DIR``) of a rung's trainer state."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", gene)
    digest = hashlib.sha256(f"{gene}/{seed}/{steps}/{context}".encode()).hexdigest()[:10]
    return f"{slug}-s{seed}-{steps}-{digest}.pt"


# -- what the strategy is told ---------------------------------------------------------------------
def told_fitness(reached: Mapping[str, Mapping]) -> dict[str, float | None]:
    """Perplexity to tell the strategy for each key, from the record of the highest rung it
    reached (see the module docstring): truthful at the full budget, shifted below the longer-
    trained individuals for the ones stopped early, None for failures."""
    told: dict[str, float | None] = {}
    floor: float | None = None
    for steps in sorted({int(r["steps"]) for r in reached.values()}, reverse=True):
        keys = [k for k, r in reached.items() if int(r["steps"]) == steps]
        values = {k: usable_metric(reached[k], "val_perplexity") for k in keys}
        finite = [v for v in values.values() if v is not None]
        shift = 0.0
        if floor is not None and finite and min(finite) <= floor:
            gap = 1e-9 * max(1.0, abs(floor))
            while min(finite) + (floor - min(finite) + gap) <= floor:
                gap *= 2
            shift = floor - min(finite) + gap
        for key, value in values.items():
            told[key] = None if value is None else value + shift
        if finite:
            top = max(finite) + shift
            floor = top if floor is None else max(floor, top)
    return told


# -- what it cost and how well it predicted --------------------------------------------------------
def fidelity_summary(evaluations: Iterable[Mapping], schedule: Schedule) -> dict:
    """Steps spent vs the full-fidelity equivalent, how far individuals got, and the Spearman rank
    correlation between each lower rung's loss and the full-budget loss (over the genes that have
    both). Computed from the run's records, so it is the same after a resume."""
    records = [r for r in evaluations if r.get("role") in ("search", RUNG_ROLE, "baseline")]
    spent = sum(max(0, int(r.get("trained_steps") or 0) - int(r.get("resumed_from") or 0)) for r in records)
    highest: dict[str, int] = {}  # each individual's highest rung
    for r in records:
        if r.get("role") in ("search", RUNG_ROLE):
            highest[r["gene"]] = max(highest.get(r["gene"], 0), int(r["steps"]))
    baseline_steps = sum(int(r.get("steps") or 0) for r in records if r.get("role") == "baseline")
    equivalent = schedule.budget * len(highest) + baseline_steps
    full = _losses(records, "search", schedule.budget)
    audited = {r["gene"] for r in records if r.get("audit")}
    out = {
        **schedule.to_dict(),
        "steps_spent": spent,
        "steps_full_equivalent": equivalent,
        "step_saving": equivalent / spent if spent else None,
        "reached": {str(s): sum(1 for v in highest.values() if v == s) for s in schedule.rungs},
        "rank_correlation": _rank_correlation(records, schedule, full),
    }
    if schedule.audit:
        out["rank_correlation_audited"] = _rank_correlation(records, schedule, {g: full[g] for g in full if g in audited})
    return out


def _losses(records: list, role: str, steps: int) -> dict[str, float]:
    """Each gene's usable validation loss among ``records`` of ``role`` at ``steps``."""
    return {r["gene"]: loss for r in records if r.get("role") == role and int(r["steps"]) == steps
            and (loss := usable_metric(r, "val_loss")) is not None}


def _rank_correlation(records: list, schedule: Schedule, full: Mapping[str, float]) -> list[dict]:
    """Spearman between each lower rung's loss and the full-budget loss, over the genes of ``full``."""
    correlation = []
    for steps in schedule.rungs[:-1]:
        low = _losses(records, RUNG_ROLE, steps)
        common = sorted(set(low) & set(full))
        rho = p_value = None
        if len(common) >= 3:
            from scipy.stats import spearmanr

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # constant input: NaN, reported as None
                result = spearmanr([low[g] for g in common], [full[g] for g in common])
            rho = float(result.statistic) if math.isfinite(result.statistic) else None
            p_value = float(result.pvalue) if rho is not None and math.isfinite(result.pvalue) else None
        correlation.append({"steps": steps, "n": len(common), "spearman": rho, "p_value": p_value})
    return correlation


def describe_schedule(summary: Mapping) -> str:
    """``halving (rungs 50/150/400 steps, eta 3, audit 1)``: the schedule of a ``fidelity_summary`` dict."""
    how = [f"rungs {'/'.join(str(s) for s in summary.get('rungs') or [])} steps"]
    if summary.get("mode") == "halving":
        how.append(f"eta {summary.get('eta')}")
    if summary.get("hurdle") is not None:
        how.append(f"hurdle {summary['hurdle']}")
    if summary.get("audit"):
        how.append(f"audit {summary['audit']}")
    return f"{summary.get('mode')} ({', '.join(how)})"


def describe_cost(summary: Mapping) -> str:
    """``3,250 training steps spent vs 9,600 at full fidelity (2.95x fewer)``."""
    saving = summary.get("step_saving")
    return (f"{summary.get('steps_spent') or 0:,} training steps spent vs {summary.get('steps_full_equivalent') or 0:,} "
            "at full fidelity" + (f" ({saving:.2f}x fewer)" if saving else ""))


def fidelity_lines(summary: Mapping) -> list[str]:
    """Plain lines of a ``fidelity_summary`` for ``evo-attention status`` and logs."""
    lines = [f"  fidelity {describe_schedule(summary)}: {describe_cost(summary)}"]
    reached = summary.get("reached") or {}
    if reached:
        lines.append("  individuals by highest rung: " + ", ".join(f"{k} steps: {v}" for k, v in reached.items()))
    for key, over in (("rank_correlation", "genes"), ("rank_correlation_audited", "audited (randomly drawn) genes")):
        for c in summary.get(key) or []:
            rho = "n/a (fewer than 3 pairs)" if c["spearman"] is None and c["n"] < 3 else (
                "n/a" if c["spearman"] is None else f"{c['spearman']:+.3f}")
            lines.append(f"  rank correlation, loss at {c['steps']} steps vs full budget: Spearman {rho} over "
                         f"{c['n']} {over}")
    return lines
