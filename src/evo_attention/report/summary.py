"""RunSummary: every number the reports show, computed from a run store in one place.

The writers (``tables``, ``figures``, ``markdown``, ``final_results.json``) only format a ``RunSummary``, so
all outputs agree and can be regenerated from the store at any time; nothing depends on the clock or the
machine, so the same store always gives the same values.

- Fitness is validation perplexity (lower is better). An evaluation *failed* when its status is not ``"ok"``
  or it has no finite ``val_perplexity``; its perplexity then counts as ``inf``.
- The search results are the evaluations of role ``"search"`` and the baseline's of a gene the strategy was
  told from it (``search.store.search_records``); other roles (``"validate"``, ...) are counted, never ranked.
- Genes rank as in the search strategies: finite perplexity ascending, ties by gene key; a gene evaluated
  several times (several seeds) by its best evaluation.
- A multi-objective run also gets ``pareto`` (``pareto_summary``: the front, reference point and hypervolume
  after each generation); a single-objective run's outputs are those of a run without objectives.
- A run with caps (``search.constraints``) gets ``constraints``: its limits, the genes refused before training
  and the trained genes over a cap. Infeasible genes are never ranked: the best gene, the ranking and the
  Pareto front hold feasible genes only. A warm-started run gets ``init_from`` (its genes taken and skipped).
- A suite run (meta ``suite``; ``train.suite``) ranks genes by suite accuracy (the mean accuracy over the
  points, a failed point counting 0; higher is better): ``suite`` holds the gene x point table
  (``suite_view``); the ranking, best gene, baseline and history speak of suite accuracy (their perplexity
  None: a suite has none), and the component analysis is not computed. A gene ranks once it has a record on
  every point, unless every point failed.
- Missing values are ``None``; non-finite floats appear only in ``evaluations`` (the raw records) and become
  ``None`` (``util.jsonio.to_jsonable``) before anything is written as JSON.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from evo_attention.genes import (ALL_FIELDS, AXIS_DEFAULTS, AXIS_FIELDS, FIELDS, KEY_PARTS, RECIPE_FIELDS,
                                 AttentionGene, SearchSpace)
from evo_attention.report.attachments import CHECK_PENDING
from evo_attention.report.studies.common import schedule_text
from evo_attention.search import STRATEGIES
from evo_attention.search import constraints as caps
from evo_attention.search import pareto
from evo_attention.search.lock import holder, is_this_process
from evo_attention.search.racing import RACING_META
from evo_attention.search.store import RunStore, search_records
from evo_attention.train.config import TUNING_FROM
from evo_attention.train.record import PRIMARY_OBJECTIVE, objective_values, usable_metric
from evo_attention.train.suite import scores_from_records
from evo_attention.util.format import finite_or_none
from evo_attention.util.jsonio import to_jsonable

TOP_N = 10  # the component analysis counts options among the best TOP_N genes
NO_PERPLEXITY = "no_perplexity"  # failure label of an 'ok' record without a finite perplexity

# The columns of evaluations.csv, in order; the gene fields (the six, then the axes) follow them.
EVALUATION_COLUMNS = ("id", "role", "generation", "gene", "status", "val_perplexity", "val_loss", "accuracy",
                      "bits_per_byte", "train_loss", "params", "flops_per_step", "time_s", "tokens_per_s", "latency_ms",
                      "peak_memory_mb", "seed", "steps", "eval_tokens", "error", "created_at", "feasible") + ALL_FIELDS

# The top-level keys of final_results.json, in order; a multi-objective run adds "objectives",
# "pareto_front" and "hypervolume", a run with caps "constraints", a warm-started run "init_from", a suite run "suite".
FINAL_RESULTS_KEYS = ("best_gene", "best_perplexity", "best_generation", "history", "top_5", "baseline", "change",
                      "config", "strategy", "data", "versions", "counts", "fidelity", "done")
# how the reports name each objective (all are minimised)
OBJECTIVE_LABELS = {"perplexity": "validation perplexity", "params": "parameters", "flops": "FLOPs per training step",
                    "train_ms_per_step": "training ms per step", "latency_ms": "inference latency (ms, median)",
                    "peak_memory_mb": "peak memory (MB)"}


# -- small helpers ----------------------------------------------------------------------------
def perplexity_of(record: Mapping) -> float:
    """The fitness of an evaluation record: its usable perplexity, else ``inf``."""
    value = usable_metric(record)
    return math.inf if value is None else value


def failed(record: Mapping) -> bool:
    return math.isinf(perplexity_of(record))


def failure_label(record: Mapping) -> str:
    """The status a failed record is counted under (``no_perplexity`` for an 'ok' without one)."""
    status = str(record.get("status") or "unknown")
    return NO_PERPLEXITY if status == "ok" else status


def gene_info(key: Any) -> dict:
    """``{"key", "str", <the gene fields>}`` of a gene key; one naming a component not registered in this
    process (a plugin not imported) is split by hand, so a report never fails on it."""
    text = str(key)
    try:
        gene = AttentionGene.parse(text)
        return {"key": gene.key, "str": str(gene), **gene.to_dict()}
    except ValueError:
        parts = [p.strip() for p in text.split("|")]
        if len(parts) == 4:
            parts += ["bias", "0.10"]
        parts = (parts + [""] * len(FIELDS))[: len(FIELDS)]
        info: dict = {"key": text, "str": f"Attn({'|'.join(parts[:4])})"}
        info.update(zip(FIELDS[:4], parts[:4]))
        info["use_bias"] = parts[4] == "bias" if parts[4] in ("bias", "nobias") else parts[4] or None
        info["attention_dropout"] = finite_or_none(parts[5])
        axes = dict(p.split("=", 1) for p in text.split("|")[6:] if "=" in p)
        for name in AXIS_FIELDS:
            info[name] = axes.get(KEY_PARTS[name], AXIS_DEFAULTS[name])
        return info


def gene_fields(info: Mapping) -> dict:
    """The gene fields of ``gene_info`` as a JSON output names them: every mechanism field, and a recipe
    field or the program only where the gene sets it, so the outputs of a run without them read as before."""
    optional = RECIPE_FIELDS + ("program",)
    return {name: info.get(name) for name in ALL_FIELDS if name not in optional or info.get(name) is not None}


def option_labels(key: Any) -> dict:
    """The option of each gene field as the gene key writes it (``nobias``, ``0.10``, ``rope:ntk:4``); an
    axis the key does not name has its default (a recipe part's: ``default``, the run's configured value)."""
    info = gene_info(key)
    parts = info["key"].split("|")
    labels = {name: str(info.get(name)) for name in ALL_FIELDS}
    if len(parts) >= len(FIELDS) and "=" not in "".join(parts[: len(FIELDS)]):
        labels.update(zip(FIELDS, parts))  # the six leading parts
    axes = dict(p.split("=", 1) for p in parts[len(FIELDS):] if "=" in p)
    labels.update({name: axes.get(KEY_PARTS[name], "default" if name in RECIPE_FIELDS else str(AXIS_DEFAULTS[name]))
                   for name in AXIS_FIELDS})
    return labels


def layer_keys(key: Any) -> list[str]:
    """The gene key of each layer of a genome key (one for a shared gene)."""
    return [part.strip() for part in str(key).split("/")]


def field_labels(key: Any, n_layers: int = 1) -> dict:
    """``option_labels`` of a genome over ``n_layers`` > 1 layers, fields named ``L<i>.<field>`` (a shared
    gene counts in every layer); ``option_labels`` itself for one layer."""
    if n_layers == 1:
        return option_labels(key)
    parts = layer_keys(key)
    parts = parts * n_layers if len(parts) == 1 else parts
    return {f"L{i}.{name}": value for i, part in enumerate(parts, 1) for name, value in option_labels(part).items()}


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


# -- the pieces -------------------------------------------------------------------------------
def rank_genes(records: Iterable[Mapping]) -> list[dict]:
    """Unique genes with a finite perplexity, best first: ``{"rank", "gene", "str", "perplexity", "generation",
    "id", "params", "bits_per_byte", "n"}`` (``n``: evaluations of that gene)."""
    best: dict[str, dict] = {}
    n: Counter = Counter()
    for record in records:
        ppl = perplexity_of(record)
        if math.isinf(ppl):
            continue
        info = gene_info(record.get("gene"))
        key = info["key"]
        n[key] += 1
        if key not in best or ppl < best[key]["perplexity"]:  # ties keep the earliest
            best[key] = {"gene": key, "str": info["str"], "perplexity": ppl,
                         "generation": record.get("generation"), "id": record.get("id"),
                         "params": record.get("params"), "bits_per_byte": record.get("bits_per_byte")}
    ranked = sorted(best.values(), key=lambda r: (r["perplexity"], r["gene"]))
    return [{"rank": i + 1, **r, "n": n[r["gene"]]} for i, r in enumerate(ranked)]


def component_analysis(records: list[Mapping], top_n: int = TOP_N) -> list[dict]:
    """For each gene field and option in ``records``: ``{"field", "option", "n_ok", "n_failed",
    "best_perplexity", "mean_perplexity", "in_top"}``, best first within a field (then by name). The six fixed
    fields are always listed, an axis only if it took more than one value; a per-layer genome counts per
    layer (``L1.similarity``, ...). ``n_ok``/``n_failed`` count evaluations, ``in_top`` the best ``top_n``
    unique genes using the option."""
    top_keys = [r["gene"] for r in rank_genes(records)[:top_n]]
    n_layers = max((len(layer_keys(r.get("gene"))) for r in records), default=1)
    labels = [(field_labels(r.get("gene"), n_layers), perplexity_of(r)) for r in records]
    top_labels = [field_labels(k, n_layers) for k in top_keys]
    rows: list[dict] = []
    prefixes = [""] if n_layers == 1 else [f"L{i}." for i in range(1, n_layers + 1)]
    varied = {p + name for p in prefixes for name in AXIS_FIELDS if len({opts[p + name] for opts, _ in labels}) > 1}
    names = [p + name for p in prefixes for name in ALL_FIELDS if name in FIELDS or p + name in varied]
    for name in names:
        options: dict[str, list[float]] = {}
        failures: Counter = Counter()
        for opts, ppl in labels:
            values = options.setdefault(opts[name], [])
            if math.isinf(ppl):
                failures[opts[name]] += 1
            else:
                values.append(ppl)
        block = [{
            "field": name,
            "option": option,
            "n_ok": len(values),
            "n_failed": failures[option],
            "best_perplexity": min(values) if values else None,
            "mean_perplexity": _mean(values),
            "in_top": sum(1 for t in top_labels if t[name] == option),
        } for option, values in options.items()]
        block.sort(key=lambda r: (r["best_perplexity"] is None, r["best_perplexity"] or 0.0, r["option"]))
        rows.extend(block)
    return rows


def generation_history(table: list[dict], search: list[Mapping], infeasible=frozenset(), *,
                       suite: bool = False) -> list[dict]:
    """Per generation: ``{"generation", "best_perplexity", "mean_perplexity", "best_gene", "n_members",
    "n_evaluated", "n_failed", "best_so_far", "complete"}``.

    A generation in the generations table is described by its population (elites included); one in progress
    by its evaluations so far, ``complete`` False. ``n_evaluated``/``n_failed`` count the evaluations
    requested in it. The mean is over finite perplexities (best and mean None without any); genes in
    ``infeasible`` (over a cap) are neither best nor in the mean.

    ``suite=True`` (``search``: a suite view's genes): ``best_suite_accuracy`` and ``mean_suite_accuracy``,
    higher is better (the perplexity ones None). A recorded population was told minus each member's suite
    accuracy; one in progress has as members the genes first trained in it that did not fail on every point.
    ``n_evaluated`` counts the genes first trained in the generation, ``n_failed`` those that failed on every
    point.
    """
    sign, metric = (-1, "suite_accuracy") if suite else (1, "perplexity")
    history = []
    best_so_far: float | None = None
    for generation, records, recorded in _generations(table, search):
        if recorded is not None:
            members = [(str(m["gene"]), finite_or_none(m["perplexity"])) for m in recorded]
        elif suite:
            members = [(r["gene"], -r["suite_accuracy"]) for r in records if not r["all_failed"]]
        else:
            members = [(gene_info(r.get("gene"))["key"], finite_or_none(perplexity_of(r))) for r in records]
        finite = sorted((p, k) for k, p in members if p is not None and k not in infeasible)
        best, best_gene = (sign * finite[0][0], finite[0][1]) if finite else (None, None)
        if best is not None and (best_so_far is None or sign * best < sign * best_so_far):
            best_so_far = best
        history.append({
            "generation": generation,
            f"best_{metric}": best,
            f"mean_{metric}": _mean(sign * p for p, _ in finite),
            "best_gene": best_gene,
            "n_members": len(members),
            "n_evaluated": len(records),
            "n_failed": sum(1 for r in records if (r["all_failed"] if suite else failed(r))),
            "best_so_far": best_so_far,
            "complete": recorded is not None,
            **({"best_perplexity": None, "mean_perplexity": None} if suite else {}),
        })
    return history


def _generations(table: list[dict], rows: Iterable[Mapping]) -> Iterable[tuple[int, list, list | None]]:
    """``(generation, its rows, its members in ``table`` or None while in progress)`` for every generation of
    ``table`` or ``rows`` (records or suite rows), in order."""
    recorded = {g["generation"]: g["members"] for g in table}
    evaluated: dict[int, list[Mapping]] = {}
    for row in rows:
        if row.get("generation") is not None:
            evaluated.setdefault(int(row["generation"]), []).append(row)
    for generation in sorted(set(recorded) | set(evaluated)):
        yield generation, evaluated.get(generation, []), recorded.get(generation)


def objectives_of(config: Mapping) -> list[str]:
    """The objectives a run's config names (perplexity alone for a run made before objectives)."""
    return list(config.get("objectives") or [PRIMARY_OBJECTIVE])


def pareto_summary(search: list[Mapping], objectives: Sequence[str], baseline: Sequence[Mapping] = ()) -> dict:
    """The multi-objective view of a run's search evaluations (one per gene, the first stored): ``{"objectives",
    "front" (the non-dominated finished evaluations, lowest perplexity first: key, str, gene fields, each
    objective, generation, id), "ideal_point" and "reference_point" (``search.pareto.bounds`` of every finished
    evaluation), "reference_rule", "history" ([{"generation", "front_size", "hypervolume"}] over that
    generation and the ones before), "front_size", "hypervolume", "baseline" (its objectives, or None)}``.
    Hypervolumes (``search.pareto.hypervolume_share``) all share the box between the ideal and reference point.
    """
    objectives = list(objectives)
    records: dict[str, Mapping] = {}
    for record in search:
        records.setdefault(gene_info(record.get("gene"))["key"], record)
    keys = list(records)
    points = [objective_values(records[k], objectives) for k in keys]
    box = pareto.bounds(points)
    ideal, reference = box if box else (None, None)
    members = sorted(pareto.front(points), key=lambda i: (points[i], keys[i]))
    front = [{"key": info["key"], "str": info["str"], "gene": gene_fields(info), **dict(zip(objectives, points[i])),
              "generation": records[keys[i]].get("generation"), "id": records[keys[i]].get("id")}
             for i in members for info in [gene_info(keys[i])]]
    generations = [None if r.get("generation") is None else int(r["generation"]) for r in records.values()]
    history = []
    for generation in sorted({g for g in generations if g is not None}):
        upto = [p for g, p in zip(generations, points) if g is not None and g <= generation]
        history.append({"generation": generation, "front_size": len(pareto.front(upto)),
                        "hypervolume": pareto.hypervolume_share(upto, ideal, reference) if box else None})
    base = next((objective_values(r, objectives) for r in baseline if usable_metric(r) is not None), None)
    return {
        "objectives": objectives,
        "front": front,
        "front_size": len(front),
        "hypervolume": pareto.hypervolume_share(points, ideal, reference) if box else None,
        "ideal_point": dict(zip(objectives, ideal)) if box else None,
        "reference_point": dict(zip(objectives, reference)) if box else None,
        "reference_rule": f"the worst value of each objective over the finished search evaluations plus "
                          f"{100 * pareto.REFERENCE_MARGIN:g}% of its range; the hypervolume is the share of the box "
                          "between the ideal point (the best value of each objective) and the reference point that "
                          "the front dominates (0 to 1)",
        "history": history,
        "baseline": dict(zip(objectives, base)) if base is not None and pareto.finite(base) else None,
    }


def baseline_of(records: list[Mapping]) -> dict | None:
    """The baseline: ``{"gene", "str", "perplexity", "status", "error", "n", "params"}``, the perplexity the mean
    over its successful evaluations (seeds); if all failed, None with the first one's status and error."""
    if not records:
        return None
    values = [perplexity_of(r) for r in records if not failed(r)]
    first = next((r for r in records if not failed(r)), records[0])
    info = gene_info(first.get("gene"))
    return {
        "gene": info["key"],
        "str": info["str"],
        "perplexity": _mean(values),
        "status": "ok" if values else str(first.get("status")),
        "error": None if values else first.get("error"),
        "n": len(records),
        "params": first.get("params"),
    }


def change_of(best: float | None, baseline: float | None) -> dict | None:
    """``{"absolute", "percent"}``: best - baseline perplexity, and in % of the baseline (negative = better; the
    sign every output shows, ``util.format``), or None if either is missing."""
    if best is None or baseline is None or baseline <= 0:
        return None
    absolute = best - baseline
    return {"absolute": absolute, "percent": 100.0 * absolute / baseline}


# -- a suite run ------------------------------------------------------------------------------
def suite_row(gene: str, score, first: Mapping) -> dict:
    """A gene's row of the suite table: its suite accuracy and every point's result (one seed)."""
    info = gene_info(gene)
    losses = [p.val_loss for p in score.points if p.val_loss is not None]
    return {"gene": info["key"], "str": info["str"], "generation": first.get("generation"), "id": first.get("id"),
            "suite_accuracy": score.aggregate, "mean_val_loss": _mean(losses), "failed": list(score.failed),
            "missing": list(score.missing), "all_failed": score.all_failed,
            "points": {p.label: {"accuracy": p.accuracy, "val_loss": p.val_loss, "status": p.status}
                       for p in score.points}}


def suite_view(meta: Mapping, evaluations: Sequence[Mapping], seed: int | None = None) -> dict:
    """The suite block of a suite run, from its meta ``suite`` and records: ``{"name", "source", "description",
    "points" ([{label, data, steps}]), "genes" (the search genes, best suite accuracy first; then, ``rank``
    None, those still missing a point or whose every point failed), "baseline" (its row, or None)}``."""
    def rows(role: str) -> list[dict]:
        records = [r for r in evaluations if r.get("role") == role]
        first: dict[str, Mapping] = {}
        for r in records:
            first.setdefault(str(r.get("gene")), r)
        return [suite_row(gene, score, first[gene])
                for gene, score in scores_from_records(records, meta, seed=seed).items()]

    return {"name": meta.get("name"), "source": meta.get("source"), "description": meta.get("description"),
            "points": [{"label": p.get("label"), "data": p.get("data"), "steps": p.get("steps"),
                        **({"weight": p["weight"]} if "weight" in p else {})} for p in meta.get("points") or []],
            "genes": _rank_suite(rows("search"), lambda r: r["suite_accuracy"] is not None and not r["all_failed"]),
            "baseline": next(iter(rows("baseline")), None)}


def _rank_suite(rows: list[dict], ranks) -> list[dict]:
    """The ``rows`` for which ``ranks`` holds numbered best suite accuracy first (ties by gene key), then the
    others with ``rank`` None."""
    ranked = sorted(filter(ranks, rows), key=lambda r: (-r["suite_accuracy"], r["gene"]))
    return [{**r, "rank": i + 1} for i, r in enumerate(ranked)] + [{**r, "rank": None} for r in rows if not ranks(r)]


# -- the summary ----------------------------------------------------------------------------
@dataclass
class RunSummary:
    """One run in memory, computed from its store by ``from_store``. ``outcome`` is ``"ok"`` (a search
    evaluation succeeded), ``"all_failed"``, ``"all_infeasible"`` or ``"empty"`` (none yet); ``statement`` says
    it in one plain sentence."""

    run_dir: Path
    config: dict
    strategy: dict | None
    data: dict | None
    versions: dict
    created_at: str | None
    finished_at: str | None
    done: bool
    planned: int | None
    evaluations: list[dict]  # every stored record (all roles), in store order
    history: list[dict]
    ranking: list[dict]  # unique search genes with a finite perplexity, best first
    best: dict | None  # gene_info of the best gene + perplexity, generation, id
    baseline: dict | None
    change: dict | None  # change_of: the best gene's perplexity vs the baseline's
    counts: dict
    components: list[dict]
    failures: list[dict]
    outcome: str = ""  # set by from_store once the summary is complete, as is statement
    statement: str = ""
    top_n: int = TOP_N
    settings: list[tuple[str, str]] = field(default_factory=list)
    writer: dict | None = None  # the process writing the run now (its lock holder), None when none is
    fidelity: dict | None = None  # multi-fidelity runs: steps spent and rank correlations (fidelity.fidelity_summary)
    objectives: list = field(default_factory=lambda: [PRIMARY_OBJECTIVE])
    pareto: dict | None = None  # multi-objective runs: pareto_summary
    constraints: dict | None = None  # runs with caps: search.constraints.constraint_view
    init_from: dict | None = None  # warm-started runs: the store's meta init_from
    suite: dict | None = None  # suite runs: suite_view (the gene x point table, ranked by suite accuracy)
    racing: dict | None = None  # raced runs: the store's meta racing (search.racing)
    check_pending: bool = False  # the search ended and its fresh-seed check was stopped before it did
    search_evaluations: list = field(default_factory=list)  # the records the run ranks (search_records)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_store(cls, store: RunStore, top_n: int = TOP_N) -> "RunSummary":
        evaluations = store.evaluations()
        search = search_records(evaluations, store.generations())
        constraints = caps.constraint_view(store.get_meta(caps.META_LIMITS), store.get_meta(caps.META_INFEASIBLE),
                                           search)
        feasible = feasible_only(search, constraints)
        baselines = [r for r in evaluations if r.get("role") == "baseline"]
        suite_meta, racing = store.get_meta("suite"), store.get_meta(RACING_META) or None
        ranking, told, baseline = rank_genes(feasible), search, baseline_of(baselines)
        if racing and not suite_meta:  # ranked as its strategy was told
            ranking, told, baseline = _as_raced(racing, ranking, search, baseline)
        best = _best_of(ranking)
        planned = store.get_meta("planned")
        planned = planned if isinstance(planned, int) and not isinstance(planned, bool) else None
        done = bool(store.get_meta("done", False))
        writer = holder(store.run_dir)  # this process writing a done search's closing outputs is no "running" writer
        counts = _counts(evaluations, [r for r in evaluations if r.get("role") == "search"], planned, done,
                         constraints)
        config = dict(store.config() or {})
        objectives = objectives_of(config)
        summary = cls(
            run_dir=Path(store.run_dir),
            config=config,
            strategy=store.get_meta("strategy"),
            data=store.get_meta("data"),
            versions=dict(store.get_meta("versions") or {}),
            created_at=store.get_meta("created_at"),
            finished_at=store.get_meta("finished_at"),
            done=done,
            planned=planned,
            evaluations=evaluations,
            history=generation_history(store.generations(), search,
                                       constraints["infeasible_keys"] if constraints else frozenset()),
            ranking=ranking,
            best=best,
            baseline=baseline,
            change=change_of(best["perplexity"] if best else None,
                             baseline["perplexity"] if baseline else None),
            counts=counts,
            components=[] if suite_meta else component_analysis(told, top_n),
            failures=[_failure(r) for r in evaluations if failed(r)],
            top_n=top_n,
            fidelity=store.get_meta("fidelity"),
            writer=None if done and is_this_process(writer) else writer,
            objectives=objectives,
            pareto=pareto_summary(feasible, objectives, baselines) if len(objectives) > 1 else None,
            constraints=constraints,
            init_from=store.get_meta("init_from"),
            check_pending=done and bool(store.get_meta(CHECK_PENDING, False)),
            search_evaluations=search,
            racing=racing,
        )
        if suite_meta:
            _as_suite_run(summary, suite_meta, store.generations(), racing)
        summary.outcome, summary.statement = _outcome(summary)
        summary.settings = _settings(summary)
        return summary

    # -- views ----------------------------------------------------------------------------------
    @property
    def best_gene(self) -> str | None:
        return self.best["key"] if self.best else None

    @property
    def best_perplexity(self) -> float | None:
        return self.best["perplexity"] if self.best else None

    @property
    def best_row(self) -> dict | None:
        """A suite run's best gene's row of the suite table (None otherwise)."""
        if self.suite is None or self.best is None:
            return None
        return next(r for r in self.suite["genes"] if r["gene"] == self.best["key"])

    @property
    def best_generation(self) -> int | None:
        return self.best["generation"] if self.best else None

    @property
    def data_fingerprint(self) -> str | None:
        """The data fingerprint from the data description, else the one the records share."""
        if isinstance(self.data, Mapping) and self.data.get("fingerprint"):
            return str(self.data["fingerprint"])
        prints = sorted({str(r["data_fingerprint"]) for r in self.evaluations if r.get("data_fingerprint")})
        return ", ".join(prints) or None

    def search_points(self, names: Sequence[str], feasible: bool | None = True) -> list[tuple]:
        """The objective vectors on ``names`` of the finished search evaluations, in store order: of
        the genes that break no cap of the run (``feasible`` True, the default; every gene in a run
        without caps), of those that break one (False) or of all (None)."""
        records = self.search_evaluations
        if feasible is not None:
            keys = self.infeasible_keys
            records = [r for r in records if (str(r.get("gene")) not in keys) == feasible]
        return [p for p in (objective_values(r, names) for r in records) if pareto.finite(p)]

    @property
    def infeasible_keys(self) -> set:
        """The gene keys that break a cap of the run (trained or not)."""
        return set(self.constraints["infeasible_keys"]) if self.constraints else set()

    def top(self, k: int) -> list[dict]:
        """The best ``k`` unique search genes."""
        return self.ranking[:k]

    def evaluation_rows(self) -> list[dict]:
        """One dict per evaluation with exactly ``EVALUATION_COLUMNS`` (gene fields split out).
        ``feasible``: in a run with caps, whether the gene breaks none of them; empty without caps."""
        infeasible, columns = self.infeasible_keys, [name for name in EVALUATION_COLUMNS if name not in ALL_FIELDS]
        return [{**{name: record.get(name) for name in columns}, "gene": info["key"],
                 "feasible": (str(record.get("gene")) not in infeasible) if self.constraints else None,
                 **{name: info.get(name) for name in ALL_FIELDS}}
                for record in self.evaluations for info in [gene_info(record.get("gene"))]]

    def final_results(self) -> dict:
        """The content of ``final_results.json`` (JSON-safe: no NaN or inf)."""
        best_gene = None
        if self.best:
            best_gene = gene_fields(self.best)
            best_gene.update(key=self.best["key"], str=self.best["str"])
            if "layers" in self.best:  # a per-layer genome: its fields are per layer
                best_gene["layers"] = self.best["layers"]
        value = ("suite_accuracy",) if self.suite is not None else ()  # a suite run's value beside perplexity
        result = {
            "best_gene": best_gene,
            "best_perplexity": self.best_perplexity,
            "best_generation": self.best_generation,
            "history": [{k: h[k] for k in ("generation", "best_perplexity", "mean_perplexity", "best_gene")}
                        | {f"{k}_suite_accuracy": h[f"{k}_suite_accuracy"] for k in ("best", "mean") if value}
                        for h in self.history],
            "top_5": [{"gene": r["gene"], "perplexity": r["perplexity"], "generation": r["generation"]}
                      | {k: r[k] for k in value} for r in self.top(5)],
            "baseline": self.baseline,
            "change": self.change,
            "config": self.config,
            "strategy": self.strategy,
            "data": self.data,
            "versions": self.versions,
            "counts": self.counts,
            "fidelity": self.fidelity,
            "done": self.done,
        }
        if self.pareto is not None:
            result["objectives"] = self.objectives
            result["pareto_front"] = self.pareto["front"]
            result["hypervolume"] = {k: self.pareto[k] for k in ("hypervolume", "ideal_point", "reference_point",
                                                                  "reference_rule", "history")}
        if self.constraints is not None:
            result["constraints"] = {k: v for k, v in self.constraints.items() if k != "infeasible_keys"}
        if self.init_from is not None:
            result["init_from"] = self.init_from
        if self.suite is not None:
            result["suite"] = self.suite
        return to_jsonable(result)

    @property
    def multi_objective(self) -> bool:
        return self.pareto is not None


def _as_suite_run(summary: RunSummary, meta: Mapping, table: list[dict], racing: Mapping | None) -> None:
    """Replace the perplexity-ranked parts of ``summary`` by a suite run's (a raced run's ranked as its strategy
    was told, as ``_as_raced`` says; a suite accuracy is ``0.0 - told``: a told 0.0 is accuracy 0.0, not -0.0);
    counts, failures, evaluations and the generations' history stay per training."""
    others = [r for r in summary.evaluations if r.get("role") != "search"]
    suite = suite_view(meta, others + summary.search_evaluations, summary.config.get("seed"))
    summary.suite = suite
    summary.change = None
    summary.history = generation_history(table, suite["genes"], suite=True)
    if racing:
        seeds, bounds, base = _race(racing)
        rows = [{**r, "suite_accuracy": 0.0 - bounds[r["gene"]] if bounds.get(r["gene"]) is not None else None,
                 "seeds": seeds} if r["gene"] in bounds else {**r, "seeds": 1} for r in suite["genes"]]
        suite["genes"] = _rank_suite(rows, lambda r: r["rank"] is not None and r["suite_accuracy"] is not None)
        if suite.get("baseline") is not None and racing.get("baseline"):
            suite["baseline"] = {**suite["baseline"], "suite_accuracy": None if base is None else 0.0 - base,
                                 "seeds": seeds}
    _suite_results(summary)


def _suite_results(summary: RunSummary) -> None:
    """A suite run's ranking (shaped as ``rank_genes``', perplexity None), best, baseline (``baseline_of``'s
    shape) and its difference."""
    suite = summary.suite
    summary.ranking = [{"rank": r["rank"], "gene": r["gene"], "str": r["str"], "perplexity": None,
                        "suite_accuracy": r["suite_accuracy"], "generation": r["generation"], "id": None,
                        "params": None, "bits_per_byte": None, "n": len(r["points"])}
                       for r in suite["genes"] if r["rank"] is not None]
    top = summary.ranking[0] if summary.ranking else None
    summary.best = None if top is None else {**gene_info(top["gene"]), "perplexity": None,
                                             "suite_accuracy": top["suite_accuracy"],
                                             "generation": top["generation"], "id": None}
    row = suite.get("baseline")
    ok = row is not None and row["suite_accuracy"] is not None and not row["all_failed"]
    base = row["suite_accuracy"] if ok else None
    summary.baseline = None if row is None else {
        "gene": row["gene"], "str": row["str"], "perplexity": None, "suite_accuracy": base,
        "status": "ok" if ok else ("missing" if row["missing"] else "failed"),
        "error": None if ok else f"points failed: {', '.join(row['failed'])}" if row["failed"] else None,
        "n": len(row["points"]), "params": None}
    suite["vs_baseline"] = None if top is None or base is None else top["suite_accuracy"] - base


def _best_of(ranking: list[dict]) -> dict | None:
    top = ranking[0] if ranking else None
    return None if top is None else {**gene_info(top["gene"]), "perplexity": top["perplexity"],
                                     "generation": top["generation"], "id": top["id"],
                                     **({"seeds": top["seeds"]} if "seeds" in top else {})}


def _race(racing: Mapping) -> tuple[int, dict, float | None]:
    """A raced run's (``search.racing``) seeds, each raced gene's told value by key and the baseline's."""
    bounds = {gene_info(r["gene"])["key"]: r["told"] for r in racing.get("genes") or []}
    return len(racing.get("seeds") or []), bounds, (racing.get("baseline") or {}).get("told")


def _as_raced(racing: Mapping, ranking: list[dict], search: list, baseline: dict | None) -> tuple:
    """A raced run's ``ranking``, ``search`` records and ``baseline`` as its strategy was told: a raced gene, and the
    baseline, by its lower bound over its seeds (a failed seed: unranked), any other gene by its one seed; the
    records (read by the component analysis) hold the same values (a failed seed: failed)."""
    seeds, bounds, base = _race(racing)
    rows = [{**r, "perplexity": bounds.get(r["gene"], r["perplexity"]), "seeds": seeds if r["gene"] in bounds
             else 1} for r in ranking]
    rows = sorted((r for r in rows if r["perplexity"] is not None), key=lambda r: (r["perplexity"], r["gene"]))
    told = [{**r, "val_perplexity": bounds[key]} if key in bounds else r
            for r in search for key in [gene_info(r.get("gene"))["key"]]]
    if baseline is not None and racing.get("baseline"):
        baseline = {**baseline, "perplexity": base, "n": seeds}
    return [{**r, "rank": i + 1} for i, r in enumerate(rows)], told, baseline


def load_run(run_dir: str | os.PathLike, top_n: int = TOP_N) -> RunSummary:
    """The summary of the run in ``run_dir`` (opened read-only; safe while the run goes on)."""
    with RunStore.open(run_dir, readonly=True) as store:
        return RunSummary.from_store(store, top_n=top_n)


# -- internals ------------------------------------------------------------------------------
def cache_hits(planned: int | None, trained: int, done: bool) -> int | None:
    """Fitness requests answered from the store, not by training: planned minus trained, known only once the
    run is done (None before, or without a plan)."""
    return planned - trained if done and planned is not None and planned >= trained else None


def _counts(evaluations: list[Mapping], search: list[Mapping], planned: int | None, done: bool,
            constraints: Mapping | None = None) -> dict:
    """Counts of the search evaluations (every role's in ``by_role``). ``cache_hits``: the planned requests
    neither trained nor refused before training (``cache_hits``). A run with caps also counts ``infeasible``:
    ``never_trained`` (refused before training) and ``trained`` (over a cap measured after training)."""
    failures = Counter(failure_label(r) for r in search if failed(r))
    trained = len(search)
    never = len(constraints["never_trained"]) if constraints else 0
    counts = {
        "trained": trained,
        "ok": trained - sum(failures.values()),
        "failed": dict(sorted(failures.items())),
        "planned": planned,
        "cache_hits": cache_hits(planned, trained + never, done),
        "by_role": dict(sorted(Counter(str(r.get("role")) for r in evaluations).items())),
    }
    equivalent = sum(1 for r in evaluations if r.get("equivalent_to"))
    if equivalent:  # records answered by a functionally equivalent program's training (search.equivalence)
        counts["equivalent"] = equivalent
    if constraints:
        counts["infeasible"] = {"never_trained": never, "trained": len(constraints["trained"])}
    return counts


def feasible_only(search: list[Mapping], constraints: Mapping | None) -> list[Mapping]:
    """The search evaluations of genes that break no cap of the run (all of them without caps)."""
    if not constraints:
        return list(search)
    keys = constraints["infeasible_keys"]
    return [r for r in search if str(r.get("gene")) not in keys]


def _failure(record: Mapping) -> dict:
    error = record.get("error")
    if not error and record.get("status") == "ok":
        error = "finished without a finite validation perplexity"
    return {"id": record.get("id"), "role": record.get("role"), "generation": record.get("generation"),
            "gene": gene_info(record.get("gene"))["key"], "status": failure_label(record),
            "error": None if error is None else str(error)}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _outcome(s: RunSummary) -> tuple[str, str]:
    n_all = len(s.evaluations)
    n_search = s.counts["trained"]
    if n_search == 0:
        if n_all == 0:
            return "empty", "No evaluation finished yet."
        return "empty", f"No search evaluation finished yet ({_plural(n_all, 'other evaluation')} stored)."
    if s.best is None and s.constraints and s.counts["ok"]:
        return "all_infeasible", (f"No feasible gene: every one of the {_plural(s.counts['ok'], 'finished evaluation')} "
                                  f"breaks a cap ({caps_text(s.constraints)}).")
    if s.suite is not None:
        return _suite_outcome(s)
    if s.best is None:
        failures = ", ".join(f"{status}: {n}" for status, n in s.counts["failed"].items())
        return "all_failed", f"All {_plural(n_search, 'evaluation')} failed ({failures})."
    raced = f" (mean + standard error over {s.best['seeds']} seeds)" if s.best.get("seeds", 1) > 1 else ""
    text = (f"Best gene {s.best['str']} (`{s.best['key']}`): validation perplexity "
            f"{s.best['perplexity']:.2f}{raced}, found in generation {s.best['generation']}.")
    return "ok", text


def _suite_outcome(s: RunSummary) -> tuple[str, str]:
    suite, n = s.suite, len(s.suite["points"])
    if s.best is None:
        if all(r["missing"] for r in suite["genes"]):
            return "empty", f"No gene has trained on all {n} points of suite {suite['name']} yet."
        return "all_failed", f"Every gene failed on every point of suite {suite['name']}."
    failed = f"; it failed on {', '.join(s.best_row['failed'])} (scored 0)" if s.best_row["failed"] else ""
    seeds = s.best_row.get("seeds", 1)
    raced = f"; mean - standard error over {seeds} seeds" if seeds > 1 else ""
    return "ok", (f"Best gene {s.best['str']} (`{s.best['key']}`): suite accuracy {s.best['suite_accuracy']:.4f} "
                  f"(the mean accuracy over the {n} points of suite {suite['name']}{raced}), found in generation "
                  f"{s.best['generation']}{failed}.")


def _settings(s: RunSummary) -> list[tuple[str, str]]:
    """The configuration essentials as (label, text) pairs for the report's settings table."""
    c, data = s.config, s.data if isinstance(s.data, Mapping) else {}
    rows: list[tuple[str, str]] = []
    if s.writer:
        rows.append(("State", f"running: process {s.writer.get('pid')} on {s.writer.get('host')} is still writing "
                              "this run; the report shows what is stored so far"))
    name = data.get("name") or c.get("data")
    details = [f"{k} {data[k]}" for k in ("vocab_size", "seq_len") if data.get(k) is not None]
    if s.suite is not None:
        rows.append(("Suite", f"{s.suite['name']} ({s.suite.get('source')}): " + ", ".join(
            f"{p['label']} ({p['steps']} steps)" for p in s.suite["points"])))
    elif name is not None:
        rows.append(("Data", f"{name}" + (f" ({', '.join(details)})" if details else "")))
    if c.get("train_steps") is not None and s.suite is None:
        rows.append(("Training steps per evaluation", f"{c['train_steps']} (batch {c.get('batch_size')})"))
    if c:
        rows.append(("Learning-rate schedule", run_schedule_text(c)))
    if c.get("d_model") is not None:
        model = (f"d_model {c['d_model']}, {c.get('n_heads')} heads, {c.get('n_layers')} layers, "
                 f"context {c.get('max_seq_len')}")
        if c.get("block", "gpt2") != "gpt2":
            model += f", {c['block']} block"
        params = sorted({int(r["params"]) for r in s.evaluations if finite_or_none(r.get("params")) is not None})
        if params:
            span = f"{params[0]:,}" if params[0] == params[-1] else f"{params[0]:,} to {params[-1]:,}"
            model += f"; {span} parameters"
        rows.append(("Model", model))
    strategy = s.strategy if isinstance(s.strategy, Mapping) else {}
    if c.get("population_size") is not None:
        reads = STRATEGIES.get(strategy.get("name") or c.get("strategy"))
        elite = f" (elite {c.get('elite_size')})" if reads is None or "elite_size" in reads.CONFIG_FIELDS else ""
        rows.append(("Population x generations", f"{c['population_size']} x {c.get('n_generations')}{elite}"))
    if strategy:
        options = strategy.get("options") or {}
        opts = ", ".join(f"{k}={v}" for k, v in options.items())
        rows.append(("Strategy", f"{strategy.get('name')}" + (f" ({opts})" if opts else "")))
    if isinstance(s.fidelity, Mapping):
        rows += _fidelity_rows(s.fidelity)
    if s.init_from:
        rows.append(("Warm start", init_from_text(s.init_from)))
    if s.constraints:
        rows.append(("Constraints", caps_text(s.constraints) + "; " + infeasible_text(s.constraints)))
    if c.get("seed") is not None:
        rows.append(("Seed", str(c["seed"])))
    for key, label in (("device", "Device"), ("precision", "Precision")):
        values = sorted({str(r[key]) for r in s.evaluations if r.get(key)})
        if values:
            rows.append((label, ", ".join(values)))
    if c.get("dropout_stream") == "counter":
        rows.append(("Dropout masks", "drawn on the device (dropout_stream counter)"))
    return rows


def run_schedule_text(config: Mapping) -> str:
    """A run's learning-rate schedule in words (each gene's own rate with ``rate_grid``, ``search.tuning``),
    and the recipe axes its search varies per gene (``lr=``, ``wu=``, ``wd=``), where it does."""
    text = schedule_text(config, grid=config.get("rate_grid") or (),
                         chosen_on=f"on the tuning seed {int(config.get('seed') or 0) + TUNING_FROM}")
    try:
        space = SearchSpace.from_dict(config.get("search_space") or {})
    except ValueError:  # a plugin's option that is not loaded here: the schedule alone
        return text
    varied = [(name, space.options(name)) for name in RECIPE_FIELDS if space.options(name) != [None]]
    if varied:
        text += "; the search varies per gene " + ", ".join(
            f"{name} over " + "/".join("default" if v is None else f"{v:g}" for v in options) for name, options in varied)
    return text


def _fidelity_rows(f: Mapping) -> list[tuple[str, str]]:
    """Settings rows of a multi-fidelity run: the schedule, the steps saved, the rank correlations."""
    from evo_attention.search.fidelity import describe_cost, describe_schedule

    rows = [("Multi-fidelity", f"{describe_schedule(f)}: {describe_cost(f)}")]
    for key, label in (("rank_correlation", "Rank correlation with the full budget"),
                       ("rank_correlation_audited", "Rank correlation, audited genes only")):
        parts = [f"{c.get('steps')} steps: " + ("n/a" if rho is None else f"Spearman {rho:+.2f}")
                 + f" over {c.get('n')} genes" for c in f.get(key) or [] for rho in [finite_or_none(c.get("spearman"))]]
        if parts:
            rows.append((label, "; ".join(parts)))
    return rows


# -- constraints and warm starts in words -----------------------------------------------------------
def caps_text(constraints: Mapping) -> str:
    """``max_params 50,000, max_latency_ms 1.2x (3.41)``."""
    limits = constraints.get("limits") or {}
    return ", ".join(caps.describe_limit(name, limit) for name, limit in limits.items()) or "none"


def infeasible_text(constraints: Mapping) -> str:
    """``3 genes refused before training, 1 trained gene over a cap``."""
    never, trained = len(constraints.get("never_trained") or []), len(constraints.get("trained") or [])
    return (f"{_plural(never, 'gene')} refused before training (never trained), "
            f"{_plural(trained, 'trained gene')} over a measured cap")


def infeasible_rows(constraints: Mapping | None) -> list[dict]:
    """One row per infeasible gene: ``{"gene", "generation", "trained", "why"}`` (refused first)."""
    if not constraints:
        return []
    return [{"gene": e["gene"], "generation": e.get("generation"), "trained": trained,
             "why": caps.violations_text(e.get("violations") or {})}
            for kind, trained in (("never_trained", False), ("trained", True)) for e in constraints.get(kind) or []]


def init_from_text(info: Mapping) -> str:
    """``runs/a: its best 4 genes; 3 taken, 1 skipped (outside this run's search space)``."""
    n, skipped = len(info.get("genes") or []), info.get("skipped") or []
    available = info.get("available")
    fewer = f" (it has {available})" if isinstance(available, int) and available < (info.get("k") or 0) else ""
    text = f"run {info.get('run')}: its best {info.get('k')} genes{fewer}; {n} taken into generation 0"
    if skipped:
        text += f", {len(skipped)} skipped (outside this run's search space: " + ", ".join(
            str(x["gene"]) for x in skipped) + ")"
    return text
