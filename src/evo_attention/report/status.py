"""Where a run stands, read from its store (while it runs or after): ``evo-attention status``.

The state comes from the run's lock and store, never from a stored flag: ``running`` while a process holds the
lock (``search.lock``), ``finished`` once the search recorded its end, else ``interrupted`` (killed, crashed,
stopped: the resume command continues it). Workers training now come from the store's activity, and only while
a process holds the lock. Best genes and Pareto fronts are feasible ones (within the run's caps); a suite run
speaks of suite accuracy and counts one training per gene and point. Each study file the report leaves out
(unreadable, or damaged) is named.

A study's own store (meta ``study``: validate, compare, curve, ... in its ``--out``) has no search and no lock:
its status counts the trainings and names the workers training now; the study's command, run again, continues
it (finished trainings are kept).
"""
from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from evo_attention.genes import gene_label
from evo_attention.report.attachments import CHECK_PENDING
from evo_attention.search.store import RunStore, search_records
from evo_attention.util.format import finite_or_none


SEARCH_ROLES = ("search", "baseline")  # the trainings of a search's own plan


def executor_flags(described: dict) -> str:
    """The command-line flags of the executor ``describe()`` gave, for a resume command (its results are exact
    only on the executor and CPU threads the run started with); none for the default."""
    if described.get("name") == "process":
        return f" --workers {described['workers']} --cpus-per-trial {described['threads_per_worker']}"
    if described.get("name") != "ray":
        return ""
    given = {"--ray-address": described.get("address"), "--workers": described.get("workers"),
             "--cpus-per-trial": described.get("cpus_per_trial"),
             "--gpus-per-trial": described.get("gpus_per_trial")}
    return " --executor ray" + "".join(f" {flag} {shlex.quote(str(value))}" for flag, value in given.items()
                                       if value not in (None, 0) and not (flag == "--cpus-per-trial" and value == 1))


def run_status(run_dir: str | Path) -> dict:
    with RunStore.open(run_dir, readonly=True) as store:
        evaluations, generations, activity, config = (store.evaluations(), store.generations(), store.activity(),
                                                      store.config())
        done = bool(store.get_meta("done", False))
        checking = done and bool(store.get_meta(CHECK_PENDING, False))  # the search ended, its fresh check not
        meta = {key: store.get_meta(key) for key in ("planned", "fidelity", "executor", "constraints", "infeasible",
                                                     "init_from", "suite", "study")}
    from evo_attention.search.lock import holder

    planned, suite_meta, init_from = meta["planned"], meta["suite"], meta["init_from"]
    live = holder(run_dir)  # a process holding the run's lock is writing it now
    activity = activity if live else []  # a killed run's last activity is no training going on
    if meta["study"]:
        return {"run_dir": str(run_dir), "study": meta["study"], "trained": len(evaluations),
                "failed": sum(1 for e in evaluations if e.get("status") != "ok"),
                "schedule": _schedule_text(config), "workers": _workers(activity)}
    from evo_attention.search.fidelity import RUNG_ROLE

    from evo_attention.report.summary import (cache_hits, caps_text, feasible_only, init_from_text, objectives_of,
                                              pareto_summary, suite_view)
    from evo_attention.search.constraints import constraint_view

    per_request = len((suite_meta or {}).get("points") or []) or 1  # trainings per fitness request
    total_planned = None if planned is None else planned + (per_request if config.get("baseline", True) else 0)
    rungs = [e for e in evaluations if e.get("role") == RUNG_ROLE]
    # the search's plan counts its own trainings; studies that add theirs (validate --from-run, ...) are said apart
    studies = Counter(e.get("role") for e in evaluations if e.get("role") not in (*SEARCH_ROLES, RUNG_ROLE))
    evaluations = [e for e in evaluations if e.get("role") in SEARCH_ROLES]
    searched = search_records(evaluations, generations)
    constraints = constraint_view(meta["constraints"], meta["infeasible"], searched)
    never_trained = len(constraints["never_trained"]) if constraints else 0
    search = feasible_only([e for e in searched if e.metric() is not None], constraints)
    best = min(search, key=lambda e: (e["val_perplexity"], e["gene"]), default=None)
    baseline = next((e for e in evaluations if e.get("role") == "baseline"), None)
    objectives = objectives_of(config)
    validated, unreadable = _validated(run_dir)
    front = None
    if len(objectives) > 1:
        view = pareto_summary(feasible_only(searched, constraints), objectives)
        front = {k: view[k] for k in ("objectives", "front_size", "hypervolume", "reference_point")}
    suite = None
    if suite_meta:
        view = suite_view(suite_meta, [e for e in evaluations if e.get("role") != "search"] + searched,
                          config.get("seed"))
        ranked = [r for r in view["genes"] if r["rank"] is not None]
        base_row = view["baseline"]
        suite = {"name": view["name"], "points": len(view["points"]),
                 "genes": len(view["genes"]), "complete": sum(not r["missing"] for r in view["genes"]),
                 "best": None if not ranked else {k: ranked[0][k] for k in ("gene", "suite_accuracy", "generation",
                                                                             "failed")},
                 "baseline": None if base_row is None else {k: base_row[k] for k in ("gene", "suite_accuracy",
                                                                                     "failed", "missing")}}
        best = baseline = None  # a training's perplexity is one point's, not the gene's
    return {
        "run_dir": str(run_dir),
        "state": "running" if live else ("interrupted in its fresh-seed check" if checking else
                                         "finished" if done else "interrupted"),
        "writer": live,
        "resume_command": None if live or (done and not checking) else
        f"evo-attention search --resume --out {shlex.quote(str(run_dir))}{executor_flags(meta['executor'] or {})}",
        "generation": len(generations) if not done else max(len(generations) - 1, 0),
        "generations_done": len(generations),
        "generations": config.get("n_generations"),
        "schedule": _schedule_text(config),
        "trained": len(evaluations),
        "failed": sum(1 for e in evaluations if e.get("status") != "ok"),
        "planned": total_planned,
        "study_trainings": dict(sorted(studies.items(), key=lambda kv: str(kv[0]))),
        "cache_hits": cache_hits(total_planned, len(evaluations) + never_trained, done),
        "done": done,
        "best": None if best is None else {"gene": best["gene"], "perplexity": best["val_perplexity"],
                                           "bits_per_byte": best.bits_per_byte, "generation": best.get("generation")},
        "baseline": None if baseline is None else {"gene": baseline["gene"],
                                                   "perplexity": baseline.get("val_perplexity"),
                                                   "status": baseline.get("status")},
        "low_fidelity": len(rungs),
        "fidelity": meta["fidelity"],
        "pareto": front,
        "validated": validated,
        "unreadable": unreadable,
        "constraints": None if constraints is None else {
            "caps": caps_text(constraints), "never_trained": never_trained,
            "over_measured_cap": len(constraints["trained"]),
            "genes": [e["gene"] for e in constraints["never_trained"]] + [t["gene"] for t in constraints["trained"]]},
        "init_from": None if not init_from else {**init_from, "text": init_from_text(init_from)},
        "suite": suite,
        "executor": meta["executor"],
        "workers": _workers(activity),
    }


def _workers(activity) -> list[dict]:
    return [{k: a[k] for k in ("worker", "gene", "step", "total", "loss", "updated_at")} for a in activity]


def _schedule_text(config) -> str | None:
    from evo_attention.report.summary import run_schedule_text

    return run_schedule_text(config) if config else None


def _worker_lines(status: dict) -> list[str]:
    return [f"  worker {w['worker']}: {w['gene']} step {w['step']}/{w['total']}"
            + ("" if w["loss"] is None else f" loss {round(w['loss'], 4)}") for w in status["workers"]]


def _suite_lines(suite: dict) -> list[str]:
    """The lines of a suite run: its suite, the best gene and the baseline by suite accuracy."""
    lines = [f"  suite {suite['name']}: {suite['points']} points per gene; {suite['complete']} of {suite['genes']} "
             "search genes trained on every point"]
    b = suite["best"]
    if b is None:
        lines.append("  best: none yet")
    else:
        failed = f", failed on {', '.join(b['failed'])}" if b["failed"] else ""
        lines.append(f"  best: {gene_label(b['gene'])}  suite accuracy {b['suite_accuracy']:.4f} (generation {b['generation']}"
                     f"{failed})")
    base = suite["baseline"]
    if base is not None:
        if base["suite_accuracy"] is None:
            lines.append(f"  baseline: {base['gene']}  missing points {', '.join(base['missing'])}")
        else:
            lines.append(f"  baseline: {base['gene']}  suite accuracy {base['suite_accuracy']:.4f}"
                         + (f" (failed on {', '.join(base['failed'])})" if base["failed"] else ""))
    return lines


def _validated(run_dir) -> tuple[list[dict], list[str]]:
    """Every validated gene of the run's validations with its paired change and verdict; and the study files the
    report leaves out as unreadable or damaged (``Attachments.problems``)."""
    from evo_attention.report.studies.common import change_text, metric_direction, verdict_cell
    from evo_attention.report.studies.validation import read_studies

    found = read_studies(run_dir)
    return [{"split": v.get("eval_split"), "seeds": len(v.get("seeds") or []), "gene": g.get("gene"),
             "metric": v.get("metric"), "change": change_text(g, v.get("metric", "")),
             "direction": metric_direction(v.get("metric", "")),
             "p_holm": g.get("p_holm"), "family_size": v.get("family_size"), "verdict": g.get("verdict"),
             "verdict_label": verdict_cell(g), "recomputed": bool(v.get("recomputed"))}
            for v in found.validations for g in v.get("genes", [])], found.problems


def format_status(status: dict) -> str:
    schedule = [f"  learning-rate schedule: {status['schedule']}"] if status.get("schedule") else []
    if status.get("study"):
        return "\n".join([f"run {status['run_dir']}: the store of a {status['study']} study (its command, run again, "
                          "continues it; finished trainings are kept)",
                          f"  {status['trained']} trainings recorded ({status['failed']} failed)"]
                         + schedule + _worker_lines(status))
    if status.get("fidelity"):  # multi-fidelity: requests are answered at the rung they reach
        counts = (f"{status['trained']} full-budget trainings ({status['failed']} failed) and "
                  f"{status['low_fidelity']} low-fidelity evaluations recorded; {status['planned']} fitness requests "
                  "planned")
    elif status.get("cache_hits"):
        counts = (f"{status['trained']} trainings recorded ({status['failed']} failed) for {status['planned']} planned "
                  f"evaluations ({status['cache_hits']} answered by an earlier training of the same gene)")
    else:
        counts = f"{status['trained']} trainings recorded ({status['failed']} failed) of {status['planned']} planned"
    state = status["state"]
    if status.get("writer"):
        w = status["writer"]
        state += f" (process {w.get('pid')} on {w.get('host')}, since {w.get('started_at')})"
    elif status.get("resume_command"):
        state += f": no process is writing it; continue with {status['resume_command']}"
    if status.get("study_trainings"):
        counts += ("; beside them " + ", ".join(f"{n} {role} training{'s' * (n != 1)}"
                                                for role, n in status["study_trainings"].items()))
    lines = [f"run {status['run_dir']}: {state}",
             f"  {status['generations_done']} of {status['generations']} generations done; {counts}", *schedule]
    if status.get("init_from"):
        lines.append(f"  warm start from {status['init_from']['text']}")
    if status.get("constraints"):
        c = status["constraints"]
        lines.append(f"  constraints {c['caps']}: {c['never_trained']} infeasible gene"
                     f"{'s' if c['never_trained'] != 1 else ''} refused before training, {c['over_measured_cap']} "
                     "trained over a measured cap (infeasible genes are never ranked)")
    if status.get("suite"):
        lines.extend(_suite_lines(status["suite"]))
    elif status["best"]:
        b = status["best"]
        bpb = "" if b.get("bits_per_byte") is None else f", {b['bits_per_byte']:.4f} bits per byte"
        lines.append(f"  best: {gene_label(b['gene'])}  perplexity {b['perplexity']:.3f}{bpb} (generation {b['generation']})")
    elif status.get("constraints") and status["trained"]:
        lines.append("  best: no feasible gene yet")
    else:
        lines.append("  best: none yet")
    if status["baseline"] and not status.get("suite"):
        p = status["baseline"]["perplexity"]
        lines.append(f"  baseline: {status['baseline']['gene']}  perplexity "
                     f"{p:.3f}" if finite_or_none(p) is not None else f"  baseline: {status['baseline']['status']}")
    if status.get("pareto"):
        p = status["pareto"]
        ref = p.get("reference_point")
        hv = "none yet" if p.get("hypervolume") is None else f"{p['hypervolume']:.4f}"
        lines.append(f"  pareto front ({', '.join(p['objectives'])}): {p['front_size']} genes, hypervolume {hv}"
                     + (" (reference " + ", ".join(f"{k} {v:.4g}" for k, v in ref.items()) + ")" if ref else ""))
    for v in status.get("validated") or []:
        p = "" if v["p_holm"] is None else f", Holm p {v['p_holm']:.3g} over {v['family_size']}"
        lines.append(f"  validated ({v['split']} split, {v['seeds']} seeds): {v['gene']}  paired change "
                     f"{v['change']} ({v['direction']}){p}: {v['verdict_label']}" + (" (recomputed)" if v["recomputed"] else ""))
    lines += [f"  unreadable analysis file, left out: {problem}" for problem in status.get("unreadable") or []]
    if status.get("executor"):
        e = status["executor"]
        details = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in e.items() if k != "name" and v is not None)
        lines.append(f"  executor (last session): {e.get('name')}" + (f" ({details})" if details else ""))
    if status.get("fidelity"):
        from evo_attention.search.fidelity import fidelity_lines

        lines.extend(fidelity_lines(status["fidelity"]))
    return "\n".join(lines + _worker_lines(status))
