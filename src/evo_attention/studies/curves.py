"""Difficulty curves: each gene's accuracy on a generated task as one knob grows.

    from evo_attention.studies.curves import run_curve
    config = Config(data="mqar:seq_len=128,vocab=128", d_model=64, train_steps=600)
    result = run_curve(config, "baseline,linear", "pairs", [4, 8, 16, 32], seeds=3, out_dir="runs/curve")

Every value of the knob is the config's data name with the knob set inline
(``mqar:pairs=4,seq_len=128,vocab=128``). Every gene (compare's named configurations or gene strings,
resolved once at the config's size: the same mechanism at every value) trains on it with the seeds
``seed + 1 ... seed + N``, each training a ``Trial`` through the runner and a run store (role ``curve``,
in ``out_dir``): a repeat trains nothing, an interrupted curve resumes. Every value's trainings go to the
executor in one call.

Before anything trains (``plan_points``): the data must be a generated task; the knob one of its knobs,
given neither inline in the data name nor in the task options; each value allowed and, with the other
knobs, a task that can be built; at least two distinct values.

Per gene and value: the per-seed accuracy and validation loss, their mean and sd, the t interval of the
mean accuracy, the seeds that finished or failed, and the data's chance accuracy. A gene *breaks* at the
first value, in the order given (easy to hard), where its mean accuracy falls below ``break_at``. Written
as ``curve.json``, ``curve.md`` and ``curve.png`` (accuracy against the knob, a band per gene).

Recall outcomes are bimodal, so with ``solve_threshold`` A a seed *solves* a point when its accuracy is
at least A (above the no-recall level 1/pairs of every point with pairs). Each gene at each point gets its
solve count among its finished seeds with the exact (Clopper-Pearson) interval; every other gene meets
the reference gene (the one named ``baseline``, else the first) at the same point by Fisher's (or
Barnard's) exact test, Holm over every gene and point; and a gene's *solve break* is where its solve rate
falls below one half, with its range (``solve_break``).

With ``match_params`` the reference gene is also trained at every point at each other gene's parameter
count (its feed-forward width changed, ``nn.matching``): a row ``REFERENCE (FFN W)`` per distinct set of
widths (``matched_rows``); a gene of the reference's size is matched by the reference itself. The solve
verdicts are then against each gene's matched reference (``versus`` names it); ``solve_versus_plain``
keeps the comparison with the plain reference (a Holm family of its own).

With ``lr_grid`` each gene trains at each point at its own best rate of the grid (``studies.lr_grid``),
selected by mean accuracy on the tuning seeds on the validation split; the result keeps each point's
``grid`` block (``grids``) and each gene row its rate per point (``lr``). Not with ``match_params``.

On a generated task the named configurations train without attention dropout; a gene string is used as
written (``...|bias|0.10`` asks for dropout).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from evo_attention.data import data_from_config
from evo_attention.data.synthetic import (TASKS, chance_of, data_name, given_knobs, is_synthetic, parse_data_name,
                                          resolve_knobs, task_names)
from evo_attention.genes import AttentionGene
from evo_attention.report.attachments import CURVE_FIGURE, CURVE_RESULTS, CURVE_TABLE
from evo_attention.studies.common import (DEFAULT_TUNING_SEEDS, StudyResult, StudySetup, scored,
                                          study_resources, validation_seeds, write_files)
from evo_attention.studies.compare import named_dropout, resolve_configs
from evo_attention.studies.lr_grid import grid_of, selected_rates, tuning_tasks
from evo_attention.train.config import Config
from evo_attention.train.record import usable_metric
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir
from evo_attention.util.jsonio import to_jsonable

DEFAULT_BREAK_AT = 0.5  # a gene breaks where its mean accuracy falls below this
MIN_VALUES = 2
METRIC = "accuracy"


# -- the points of a curve ------------------------------------------------------------------------
@dataclass(frozen=True)
class CurvePoint:
    """One value of the knob: the data name with the value inline, every knob of that data (resolved)
    and its chance accuracy."""

    value: int | float
    data: str
    knobs: dict
    chance_accuracy: float


def parse_knob(text: str) -> tuple[str, list[str]]:
    """``"pairs=4,8,16"`` -> ``("pairs", ["4", "8", "16"])``; UserError (naming ``knob``) otherwise."""
    name, sep, rest = str(text).partition("=")
    values = [v.strip() for v in rest.split(",")]
    if not sep or not name.strip() or not all(values):
        raise UserError(f"knob {text!r} is not NAME=V1,V2,...: name one of the task's knobs and its values, e.g. "
                        "pairs=4,8,16,32", setting="knob")
    return name.strip(), values


def plan_points(config: Config, knob: str, values: Sequence[Any] | str) -> tuple[str, list[CurvePoint]]:
    """``(task, points)`` of a curve over ``knob`` at ``values`` on ``config.data``; every check of
    the module docstring, so that a bad knob or value fails before anything trains."""
    if not is_synthetic(config.data):
        raise UserError(f"data {config.data!r} is not a generated task: a curve sets a knob of one of {task_names()} "
                        "(TASK[:knob=value,...], see docs/tasks.md)", setting="data")
    task, inline = parse_data_name(config.data)
    definition = TASKS[task]
    valid = [k.name for k in definition.all_knobs]
    if knob not in valid:
        raise UserError(f"knob {knob!r} is not one of {task}'s; its knobs: {', '.join(valid)}", setting="knob")
    if knob in inline:
        raise UserError(f"knob {knob} is also given in data {config.data!r}: leave it out of data, the curve sets "
                        "it at every value", setting=("knob", "data"))
    options = dict(config.recall or {})
    options.pop("seed", None)  # the data seed, not a knob
    if knob in options:
        raise UserError(f"knob {knob} is also given in the task options (recall: {options}): leave it out there, the "
                        "curve sets it at every value", setting="knob")
    items = [v.strip() for v in values.split(",")] if isinstance(values, str) else list(values)
    if len(items) < MIN_VALUES:
        raise UserError(f"knob {knob} has {len(items)} value{'s' if len(items) != 1 else ''}: a curve needs at least "
                        f"{MIN_VALUES}, e.g. {knob}=4,8,16", setting="knob")
    spec = definition.knob(knob)
    converted = []
    for item in items:
        try:
            converted.append(spec.convert(item, task))
        except UserError:
            raise UserError(f"knob {knob}={item}: {knob} must be {spec.allowed}", setting="knob") from None
    repeated = sorted({v for v in converted if converted.count(v) > 1})
    if repeated:
        raise UserError(f"knob {knob} gives {repeated[0]} more than once: give each value once", setting="knob")
    base = {key: definition.knob(key).convert(value, task) for key, value in inline.items()}
    points = []
    for value in converted:
        name = data_name(task, {**base, knob: value})
        _, given = given_knobs(name, seq_len=config.max_seq_len, vocab_size=config.vocab_size, options=options)
        try:
            knobs = resolve_knobs(task, given)
        except UserError as exc:  # the task's own check between knobs, at this value
            raise UserError(f"knob {knob}={value}: {exc}", setting="knob") from None
        points.append(CurvePoint(value, name, knobs, chance_of(definition, knobs)))
    return task, points


def gene_entries(genes, config: Config) -> list[tuple[str, AttentionGene]]:
    """``[(name, gene)]``: ``(name, gene)`` pairs as given, else names and gene strings resolved as
    compare resolves them, at the config's size."""
    items = [genes] if isinstance(genes, str) else list(genes or [])
    if items and all(isinstance(g, tuple) and len(g) == 2 for g in items):
        return [(str(name), AttentionGene.parse(gene)) for name, gene in items]
    if not any(str(g).strip(", ") for g in items):
        raise UserError("genes is empty: give names such as baseline,linear or gene strings", setting="genes")
    return resolve_configs(items[0] if len(items) == 1 else [str(g) for g in items], config.d_model, config.n_heads,
                           config.max_seq_len, attention_dropout=named_dropout(config))


# -- the statistics ---------------------------------------------------------------------------------
def first_break(values: Sequence, means: Sequence[float | None], threshold: float) -> Any:
    """The first of ``values`` (in their order) whose mean is below ``threshold``; None when no
    mean is (a value without a mean, every seed failed, is passed over)."""
    return next((value for value, mean in zip(values, means) if mean is not None and mean < threshold), None)


SOLVE_HALF = 0.5  # a gene's solve break: where its solve rate falls below this


def check_solve_threshold(value, points: Sequence[CurvePoint], knob: str) -> float | None:
    """The solve threshold (None: none asked for); UserError (naming ``solve_threshold``) unless it
    is an accuracy in (0, 1] above the no-recall level 1/pairs of every point with pairs."""
    if value is None:
        return None
    value = check_break_at(value, "solve_threshold", "0.9")
    for point in points:
        pairs = point.knobs.get("pairs")
        if pairs and value <= 1.0 / pairs:
            raise UserError(f"solve_threshold {value:g} is at or below the no-recall level 1/pairs = {1 / pairs:.3g} "
                            f"at {knob}={point.value}: a seed that recalls nothing would count as solving; give a "
                            "threshold above it, e.g. 0.9", setting="solve_threshold")
    return value


def solve_count(row: Mapping, threshold: float, confidence: float) -> dict:
    """A gene at one point: how many of its finished seeds reach ``threshold``, with the exact
    interval of the rate (``stats.solve_rate``); failed seeds are left out of n."""
    finished = [a for a in row.get("accuracy") or [] if a is not None]
    return stats.solve_rate(sum(a >= threshold for a in finished), len(finished), confidence)


def solve_break(values: Sequence, rates: Sequence[Mapping]) -> dict:
    """Where a gene's solve rate falls below one half: ``at`` the first value whose rate is below it,
    ``rate`` its count and interval, ``range`` [the first value whose interval reaches below one half,
    the first whose interval lies below it] (None: no value is so; values without a finished seed
    are passed over)."""
    at, low, high = (first_break(values, [r.get(key) for r in rates], SOLVE_HALF)
                     for key in ("rate", "ci_low", "ci_high"))
    rate = next((r for v, r in zip(values, rates) if v == at), None) if at is not None else None
    return {"at": at, "rate": rate, "range": [low, high]}


def solve_statistics(genes: list[dict], values: Sequence, threshold: float, confidence: float,
                     test: str = "fisher") -> dict:
    """Adds the solve counts, the verdicts against the reference gene and the solve break to the gene
    rows of a curve (in place); returns the curve's ``solve`` block."""
    for gene in genes:
        for row in gene["points"]:
            row["solve"] = solve_count(row, threshold, confidence)
        gene["solve_break"] = solve_break(values, [r["solve"] for r in gene["points"]])
    reference = reference_gene(genes)
    compared_genes = [g for g in genes if g is not reference and not g.get("matched_to")]
    matched = {name: g for g in genes for name in g.get("matched_to") or []}

    def versus(reference_of, field: str) -> int:
        counts, refs = {}, {}
        for gene in compared_genes:
            for row, ref in zip(gene["points"], reference_of(gene)["points"]):
                key = (gene["name"], row["value"])
                counts[key] = (row["solve"]["solved"], row["solve"]["n"])
                refs[key] = (ref["solve"]["solved"], ref["solve"]["n"])
        compared = stats.solve_rates_versus(counts, refs, alpha=1.0 - confidence, test=test, confidence=confidence)
        for gene in compared_genes:
            for row in gene["points"]:
                found = compared.get((gene["name"], row["value"]))
                if found is not None:
                    row[field] = {k: found[k] for k in ("difference", "p_value", "p_holm", "verdict", "cannot_decide")}
                    row[field]["versus"] = reference_of(gene)["name"]
        return len(compared)

    family = versus(lambda gene: matched.get(gene["name"], reference), "solve_versus")
    if matched:
        versus(lambda gene: reference, "solve_versus_plain")
    return {"threshold": threshold, "reference": reference["name"], "test": test, "alpha": 1.0 - confidence,
            "family_size": family, "half": SOLVE_HALF, **({"matched": True} if matched else {})}


def reference_gene(genes: Sequence[Mapping]) -> Mapping:
    """A curve's reference gene: the one named ``baseline``, else the first."""
    return next((g for g in genes if g["name"] == "baseline"), genes[0])


def check_break_at(value, name: str = "break_at", example: str = "0.5") -> float:
    """``value`` as an accuracy in (0, 1]; UserError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UserError(f"{name} must be an accuracy in (0, 1] such as {example}, got {value!r}", setting=name)
    return float(value)


def point_row(value, records: Sequence[Mapping | None], seeds: Sequence[int], confidence: float,
              interrupted: bool = False) -> dict:
    """One gene at one value: per-seed accuracy and loss (None where a training failed or did not
    run), the device each seed trained on (as its record says: a curve can read trainings made
    elsewhere), their statistics, the interval of the mean accuracy, and ``scored``'s fields."""
    missing = "interrupted" if interrupted else "not run"
    rows = [r if r is not None else {"status": missing} for r in records]  # a missing training: no value
    accuracy = [usable_metric(r, METRIC) for r in rows]
    loss = [usable_metric(r, "val_loss") for r in rows]
    acc, val = stats.describe(accuracy, confidence), stats.describe(loss, confidence)
    half = None if acc["ci_low"] is None else (acc["ci_high"] - acc["ci_low"]) / 2
    errors = sorted({str(r.get("error") or r.get("status")) for r, a in zip(rows, accuracy) if a is None})
    return {"value": value, "seeds": list(seeds), "accuracy": accuracy, "val_loss": loss,
            "statuses": [str(r.get("status")) for r in rows], "devices": [r.get("device") for r in rows],
            "n_ok": acc["n"], "n_failed": len(records) - acc["n"], "errors": errors,
            "mean": acc["mean"], "sd": acc["sd"], "ci_low": acc["ci_low"], "ci_high": acc["ci_high"],
            "half_width": half, "val_loss_mean": val["mean"], "val_loss_sd": val["sd"], **scored(rows, accuracy)}


def matched_rows(entries, matches: Sequence[Mapping[str, dict]] | None) -> list[tuple]:
    """``(name, reference gene, d_ff per point, extra fields)`` of each matched reference row: one per
    distinct widths across the points (``matches``: per point, gene name -> its match; ``d_ff`` None:
    the plain width, the reference's own trainings)."""
    if not matches:
        return []
    ref_name = reference_gene([{"name": n} for n, _ in entries])["name"]
    reference = dict(entries)[ref_name]
    groups: dict[tuple, dict] = {}
    for name, _ in entries:
        if name == ref_name:
            continue
        per_point = [m[name] for m in matches]
        widths = tuple(m["ffn_dim"] for m in per_point)
        if all(m["ffn_dim"] == m["plain_d_ff"] for m in per_point):
            continue  # the reference's size: the reference itself is its match
        group = groups.setdefault(widths, {"d_ff": [None if m["ffn_dim"] == m["plain_d_ff"] else m["ffn_dim"]
                                                    for m in per_point],
                                           "extra": {"matched_to": [], "ffn": list(widths),
                                                     "params": [m["params"] for m in per_point],
                                                     "candidate_params": {}}})
        group["extra"]["matched_to"].append(name)
        group["extra"]["candidate_params"][name] = [m["candidate_params"] for m in per_point]
    return [(f"{ref_name} (FFN {'/'.join(str(w) for w in dict.fromkeys(widths))})", reference, group["d_ff"],
             group["extra"]) for widths, group in groups.items()]


# -- the result -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class CurveResult(StudyResult):
    """A difficulty curve, as ``curve.json`` holds it: what was swept, the rule, the ``points`` (per
    value: data name, knobs, chance accuracy, the data's description), per gene its row at every value
    and where it breaks (``genes``), and the ``provenance``."""

    task: str
    knob: str
    knob_values: list  # (``values`` in the JSON; a Mapping's ``values`` is its method)
    base_data: str
    break_at: float
    confidence: float
    points: list[dict]
    genes: list[dict]
    provenance: Mapping[str, Any]
    interrupted: bool = False
    solve: Mapping[str, Any] | None = None  # the solve-rate block (``solve_statistics``) with a threshold
    grids: list[dict] | None = None  # with a learning-rate grid: each point's ``grid`` block (``lr_grid.grid_of``)

    kind: ClassVar[str] = "curve"

    def to_dict(self) -> dict:
        return to_jsonable({"kind": self.kind, "task": self.task, "knob": self.knob, "values": self.knob_values,
                            "base_data": self.base_data, "metric": METRIC, "break_at": self.break_at,
                            "confidence": self.confidence, "points": self.points, "genes": self.genes,
                            **({} if self.solve is None else {"solve": self.solve}),
                            **({} if self.grids is None else {"grids": self.grids}),
                            **({"interrupted": True} if self.interrupted else {}), **self.provenance})


def _result_of(task: str, knob: str, points: Sequence[CurvePoint], described: Mapping[int, dict], entries,
               done: Mapping, seeds: Sequence[int], config: Config, provenance: Mapping, break_at: float,
               confidence: float, interrupted: bool = False, solve_threshold: float | None = None,
               solve_test: str = "fisher", matches: Sequence[Mapping[str, dict]] | None = None,
               grids: Mapping[int, dict] | None = None) -> CurveResult:
    values = [p.value for p in points]
    genes = []
    for name, gene, d_ff, extra in [(n, g, None, {}) for n, g in entries] + matched_rows(entries, matches):
        rows = [point_row(p.value, [done.get((i, gene.key, s, None if d_ff is None else d_ff[i])) for s in seeds],
                          seeds, confidence, interrupted)
                for i, p in enumerate(points)]
        breaks = first_break(values, [r["mean"] for r in rows], break_at)
        for row in rows:
            row["below"] = None if row["mean"] is None else row["mean"] < break_at
        rates = {} if not grids else {"lr": [grids[i]["genes"][gene.key]["selected"] if i in grids else None
                                              for i in range(len(points))]}
        genes.append({"name": name, "gene": gene.key, "points": rows, "breaks_at": breaks,
                      "holds": breaks is None and all(r["mean"] is not None for r in rows), **rates, **extra})
    point_rows = [{"value": p.value, "data": p.data, "knobs": p.knobs,
                   "chance_accuracy": described[i]["chance_accuracy"] if i in described else p.chance_accuracy,
                   "description": described.get(i)} for i, p in enumerate(points)]
    solve = None if solve_threshold is None else solve_statistics(genes, values, solve_threshold, confidence,
                                                                     solve_test)
    grid_rows = None if grids is None else [{"value": p.value, **grids[i]} if i in grids else {"value": p.value}
                                            for i, p in enumerate(points)]
    return CurveResult(task, knob, values, config.data, break_at, confidence, point_rows, genes, provenance,
                       interrupted, solve, grid_rows)


def _provenance(config: Config, setup: StudySetup | None, seeds: Sequence[int], pool) -> dict:
    """The settings block of a curve: the setup's provenance (versions, time), the base config, the
    model's shape and the executor."""
    keep = ("metric_label", "eval_split", "seeds", "steps", "created_at", "versions", "machine")
    out = {k: v for k, v in setup.provenance().items() if k in keep} if setup is not None else {"seeds": list(seeds)}
    model = {"d_model": config.d_model, "n_layers": config.n_layers, "n_heads": config.n_heads, "d_ff": config.ffn_dim,
             "block": config.block, "batch_size": config.batch_size, "learning_rate": config.learning_rate,
             "lr_schedule": config.lr_schedule, "steps": config.train_steps}
    return {**out, "model": model, "executor": pool.describe(), "config": config.to_dict()}


# -- running ----------------------------------------------------------------------------------------
def run_curve(config: Config, genes, knob: str, values: Sequence[Any] | str, *, seeds: int = 1,
              out_dir: str | Path | None = "runs/curve", break_at: float = DEFAULT_BREAK_AT,
              confidence: float = 0.95, executor="local", quiet: bool = False,
              solve_threshold: float | None = None, solve_test: str = "fisher",
              match_params: bool = False, plan: Mapping | None = None,
              lr_grid: str | Sequence[float] | None = None, n_tuning_seeds: int = DEFAULT_TUNING_SEEDS) -> CurveResult:
    """Train every gene of ``genes`` at every value of ``knob`` and write the curve into ``out_dir``
    (unless None: then nothing is cached); the options: see the module docstring (``solve_test``: fisher
    or barnard). ``genes``: names and gene strings (a comma-separated text or a list), or ``(name, gene)``
    pairs. ``executor``: a name for ``executor_for`` or an Executor (left open). ``plan``: the registered
    plan the curve runs (``studies.plan.StudyPlan.record``), kept in the result."""
    entries = gene_entries(genes, config)
    break_at = check_break_at(break_at)
    stats.check_confidence(confidence)
    task, points = plan_points(config, knob, values)
    solve_threshold = check_solve_threshold(solve_threshold, points, knob)
    if solve_test not in stats.SOLVE_TESTS:
        raise UserError(f"solve_test {solve_test!r} is not one of {', '.join(stats.SOLVE_TESTS)}",
                        setting="solve_test")
    seed_list = validation_seeds(config.seed, seeds, minimum=1, setting="seeds")
    if out_dir is not None:
        output_dir(out_dir)  # an unwritable place fails now, not after the work
    done: dict[tuple[int, str, int, int | None], Any] = {}  # (point, gene key, seed, matched width) -> record
    described: dict[int, dict] = {}
    first: StudySetup | None = None
    labels = {gene.key: name for name, gene in reversed(entries)}
    ref_name = reference_gene([{"name": n} for n, _ in entries])["name"]
    reference = dict(entries)[ref_name]
    matches: list[dict] | None = [] if match_params else None
    grids: dict[int, dict] | None = {} if lr_grid else None

    start = time.perf_counter()

    def result(interrupted: bool = False) -> CurveResult:
        provenance = {**_provenance(config, first, seed_list, pool), "total_time_s": time.perf_counter() - start,
                      **({"plan": dict(plan)} if plan is not None else {})}
        return _result_of(task, knob, points, described, entries, done, seed_list, config, provenance, break_at,
                          confidence, interrupted, solve_threshold, solve_test, matches, grids)

    with study_resources(config, executor, None, out_dir, "curve") as (pool, store):
        try:
            # every point's tasks in one runner call (module docstring)
            where: dict = {}  # task -> its key in ``done``
            datasets, setups = {}, []
            for i, point in enumerate(points):
                at = config.replace(data=point.data)
                data = data_from_config(at)
                described[i] = data.describe()
                setups.append(StudySetup.resolve(at, data, role="curve", n_seeds=seeds, min_seeds=1, metric=METRIC,
                                                 confidence=confidence, store=store, executor=pool, quiet=quiet,
                                                 seeds_setting="seeds", lr_grid=lr_grid or None,
                                                 n_tuning_seeds=n_tuning_seeds, match_params=match_params))
                datasets[setups[-1].config.task] = data
            first = setups[0]
            point_labels = [{key: f"{name}, {knob}={p.value}" for key, name in labels.items()} for p in points]
            keys = list(dict.fromkeys(gene.key for _, gene in entries))
            if grids is not None:  # every point's tuning trainings in one runner call, then the curve's
                tuning = [tuning_tasks(setup, keys, labels=names) for setup, names in zip(setups, point_labels)]
                tuned = first.run([task for point_tasks in tuning for task in point_tasks], datasets=datasets)
                for i, (setup, point_tasks) in enumerate(zip(setups, tuning)):
                    grids[i] = grid_of(setup, keys, {task: tuned[task] for task in point_tasks})
            for i, (point, setup) in enumerate(zip(points, setups)):
                rates = selected_rates(grids[i]) if grids is not None else {}
                for key in keys:
                    at_rate = setup.at_rate(rates[key]) if key in rates else setup
                    for work in at_rate.tasks([key], labels=point_labels[i]):
                        where[work] = (i, work.gene, work.seed, None)  # (``task`` is the curve's task name)
                if matches is not None:  # the reference at each other gene's parameter count at this point
                    by_key = setup.matched_baselines([g.key for n, g in entries if n != ref_name], reference.key)
                    matches.append({n: by_key[g.key] for n, g in entries if n != ref_name})
                    for width in sorted({m["ffn_dim"] for m in matches[-1].values()} - {setup.config.ffn_dim}):
                        label = f"{ref_name} (FFN {width}), {knob}={point.value}"
                        for work in setup.with_ffn(width).tasks([reference], labels={reference.key: label}):
                            where[work] = (i, work.gene, work.seed, width)

            def finished(work, record, cached):
                done[where[work]] = record

            first.run(list(where), on_finished=finished, datasets=datasets)
        except KeyboardInterrupt:
            if done and out_dir is not None:  # keep what finished; the rest is marked interrupted
                write_curve(out_dir, result(interrupted=True))
            raise
        out = result()
    if out_dir is not None:
        write_curve(out_dir, out)
    return out


# -- outputs ----------------------------------------------------------------------------------------
def write_curve(out_dir: str | Path, result: Mapping) -> dict[str, Path]:
    """Write ``curve.json``, ``curve.md`` and ``curve.png`` of a result (a ``CurveResult`` or its
    dict) into ``out_dir``; returns name -> path."""
    from evo_attention.report.figures import plot_curve
    from evo_attention.report.studies.curves import curve_markdown

    payload = dict(result)
    paths = write_files(out_dir, {"results": CURVE_RESULTS, "table": CURVE_TABLE, "figure": CURVE_FIGURE}, payload,
                        curve_markdown(payload))
    plot_curve(payload, paths["figure"])
    return paths
