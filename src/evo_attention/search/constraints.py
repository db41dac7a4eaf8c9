"""Constraints: caps on what a gene of a search may cost (docs/search.md#constraints).

A run may cap four measures (``CAPS``), each by a number or by a factor of the baseline's value
(``"1.2x"``). Parameters and FLOPs are known before training (``gene_costs`` measures them exactly as
the trainer records them): a gene over such a cap is never trained, and is kept in the store's meta
``infeasible`` instead of as an evaluation. A trained gene whose record breaks a cap (any of the four)
is infeasible too, read from its record and the run's limits (meta ``constraints``) where needed.

A gene's *excess* over a cap is ``value / limit - 1`` (positive: broken); its *violation* is the sum
of its positive excesses (0: feasible). The strategies rank feasible genes first and infeasible ones
by violation (``search.base.rank_members``); TPE gets the excesses as Optuna constraints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from evo_attention.train.config import CAP_FIELDS, cap_factor
from evo_attention.train.record import objective_value
from evo_attention.util.format import finite_or_none

META_LIMITS = "constraints"  # store meta: {"limits": {cap: {...}}}
META_INFEASIBLE = "infeasible"  # store meta: [{"gene", "generation", "params", "flops", "violations"}]


@dataclass(frozen=True)
class Cap:
    field: str  # the Config field
    measure: str  # the objective it caps (train.record.OBJECTIVES)
    label: str  # how the reports name the measure
    before_training: bool  # known before any training is spent


CAPS = (Cap("max_params", "params", "parameters", True),
        Cap("max_flops", "flops", "FLOPs per training step", True),
        Cap("max_latency_ms", "latency_ms", "inference latency (ms)", False),
        Cap("max_memory_mb", "peak_memory_mb", "peak memory (MB)", False))
CAP = {cap.field: cap for cap in CAPS}
assert tuple(CAP) == CAP_FIELDS


def settings_of(config) -> dict:
    """The caps a config (a Config or the dict a run stores) sets: field -> value."""
    get = config.get if isinstance(config, Mapping) else (lambda name: getattr(config, name, None))
    return {name: get(name) for name in CAP_FIELDS if get(name) is not None}


# -- limits ----------------------------------------------------------------------------------------
def resolve_limits(caps: Mapping, baseline: Mapping[str, float | None]) -> dict:
    """``{cap: {"given", "limit", "factor", "baseline", "measure"}}``: each cap's limit in its measure's
    units. A relative cap (``"1.2x"``) is ``factor`` times the baseline's value of the measure
    (``baseline``: measure -> value); its limit is None when that value is unknown (a failed
    baseline), and then the cap is not applied."""
    out = {}
    for name, given in caps.items():
        cap = CAP[name]
        factor = cap_factor(given)
        base = finite_or_none(baseline.get(cap.measure)) if factor is not None else None
        limit = float(given) if factor is None else (factor * base if base is not None else None)
        out[name] = {"given": given, "limit": limit, "factor": factor, "baseline": base, "measure": cap.measure}
    return out


def describe_limit(name: str, limit: Mapping) -> str:
    """``max_params 50,000`` or ``max_latency_ms 1.2x (3.41)``."""
    value = limit.get("limit")
    shown = "-" if value is None else _number(value)
    if limit.get("factor") is not None:
        return f"{name} {limit['given']} ({shown})" if value is not None else f"{name} {limit['given']} (not applied)"
    return f"{name} {shown}"


def _number(value: float) -> str:
    """``104,192``, ``114,611`` (counts and large values whole), ``38.41``, ``3.5e+15``."""
    value = float(value)
    if abs(value) >= 1e15:
        return f"{value:.4g}"
    if value.is_integer() or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


# -- violations ------------------------------------------------------------------------------------
def excess(values: Mapping[str, float | None], limits: Mapping[str, Mapping]) -> dict[str, float]:
    """``{cap: value / limit - 1}`` for every applied cap whose measure ``values`` holds (measure ->
    value; a missing or non-finite value is unknown and left out)."""
    out = {}
    for name, limit in limits.items():
        bound = limit.get("limit")
        value = finite_or_none(values.get(CAP[name].measure))
        if bound is None or value is None or bound <= 0:
            continue
        out[name] = value / bound - 1.0
    return out


def violation(excesses: Mapping[str, float] | float | None) -> float:
    """The total violation: the sum of the positive excesses (0 for a feasible gene)."""
    if excesses is None:
        return 0.0
    if isinstance(excesses, Mapping):
        return float(sum(v for v in excesses.values() if v > 0))
    value = float(excesses)
    return 0.0 if math.isnan(value) else max(0.0, value)


def record_values(record: Mapping) -> dict[str, float | None]:
    """The measures of a trained gene's record that caps read (None where unknown or failed)."""
    return {cap.measure: objective_value(record, cap.measure) for cap in CAPS}


def record_excess(record: Mapping, limits: Mapping[str, Mapping]) -> dict[str, float]:
    return excess(record_values(record), limits)


def violations_text(violations: Mapping[str, Mapping]) -> str:
    """``params 61,000 > max_params 50,000; latency_ms 4.1 > max_latency_ms 1.2x (3.41)``."""
    return "; ".join(f"{CAP[name].measure} {_number(v['value'])} > {describe_limit(name, v)}"
                     for name, v in violations.items())


def violations_of(values: Mapping[str, float | None], limits: Mapping[str, Mapping]) -> dict[str, dict]:
    """``{cap: {"value", "limit", "given", "factor", "excess"}}`` of the caps ``values`` breaks."""
    return {name: {"value": values[CAP[name].measure], "limit": limits[name]["limit"], "given": limits[name]["given"],
                   "factor": limits[name].get("factor"), "excess": e}
            for name, e in excess(values, limits).items() if e > 0}


# -- what the reports read -------------------------------------------------------------------------
def constraint_view(limits_meta: Mapping | None, infeasible_meta: Iterable[Mapping] | None,
                    search: Iterable[Mapping]) -> dict | None:
    """The constraints of a run as the reports show them, from its store: None for a run without
    caps; else ``{"limits", "never_trained" (the genes refused before training, in the order they
    were asked), "trained" (the trained search genes over a cap: gene, generation, id, violations),
    "infeasible_keys" (both, as a set of gene keys)}``."""
    limits = dict((limits_meta or {}).get("limits") or {})
    never = [dict(entry) for entry in infeasible_meta or []]
    if not limits and not never:
        return None
    trained, seen = [], set()
    for record in search:
        key = str(record.get("gene"))
        if key in seen:
            continue
        seen.add(key)
        found = violations_of(record_values(record), limits)
        if found:
            trained.append({"gene": key, "generation": record.get("generation"), "id": record.get("id"),
                            "violations": found})
    keys = {str(e["gene"]) for e in never} | {t["gene"] for t in trained}
    return {"limits": limits, "never_trained": never, "trained": trained, "infeasible_keys": keys}


# -- the costs of a gene before training ----------------------------------------------------------
def gene_costs(trial, data, *, flops: bool) -> dict[str, int | None]:
    """``{"params", "flops"}`` of the model a trial trains, measured as the trainer records them but
    without training: the model is built (on the CPU, the global random state untouched) and its
    trainable parameters counted; with ``flops`` one training step on the trial's first batch runs
    under the trainer's FLOP counter (fp32, eager: a FLOP count depends on neither). ``flops`` is
    None when not asked for."""
    import torch

    from evo_attention.train.trainer import Trainer

    counted = trial.replace(train=trial.train.replace(precision="fp32", compile="off", device="cpu"))
    with torch.random.fork_rng(devices=[]):
        if not flops:
            from evo_attention.nn.model import TinyTransformer

            model = TinyTransformer(trial.model.with_data(data.vocab_size, data.seq_len), trial.gene)
            return {"params": int(model.num_parameters()), "flops": None}
        trainer = Trainer(counted, data, device="cpu")
        x, y = next(trainer.batches)
        trainer.count_flops(x, y)  # the trainer's own FLOP count of its first step
        return {"params": int(trainer.model.num_parameters()), "flops": int(trainer.flops_per_step)}
