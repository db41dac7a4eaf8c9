"""Multi-seed validation: re-train genes and the vanilla baseline with fresh seeds and compare.

A search ranks its genes by one training each, all with the run's seed, and keeps the best: the
winner's score is biased downwards (the winner's curse), and one seed says nothing about the
spread between seeds. ``validate_genes`` trains every chosen gene and the baseline again with N
*other* seeds, ``config.seed + 1 ... config.seed + N`` (never the search seed, on which the
winners were selected), at the same budget, and compares each gene to the baseline with the
helpers of ``stats``: mean, sd and t interval per gene; the difference to the baseline with its
Welch interval, Welch's p-value, Holm's correction across the genes, Cohen's d, and the verdict.

The trainings go through an ``Executor`` (parallel executors work unchanged); with a run store
each record is looked up first (an identical gene, seed, steps, data and settings is never
trained twice) and stored with its role as soon as it finishes.

``run_seeds`` is the shared engine (the ablation uses it too). ``validate_genes`` trains,
``summarize`` computes the result dict from the records, and ``write_validation`` writes it as
``validation.json``, ``validation.md`` and ``validation.png`` (``validation_test.*`` for the test
split).
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..errors import UserError
from ..executors import EvalTask, Executor, make_executor
from ..genes import AttentionGene
from ..jsonio import to_jsonable
from ..report.tables import code, fmt, markdown_table, md_cell, write_text
from . import stats

# metric -> (label, lower is better)
METRICS = {"val_perplexity": ("perplexity", True), "val_loss": ("loss", True), "accuracy": ("accuracy", False)}
DEFAULT_SEEDS = 5


# -- seeds and stems ------------------------------------------------------------------------------
def validation_seeds(base_seed: int, n: int, search_seed: int | None = None) -> list[int]:
    """``base_seed + 1 ... base_seed + n``; refuses n < 2 and a list that holds ``search_seed``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise UserError(f"--seeds {n!r} is too few: a spread and a confidence interval need at least 2 seeds "
                        "(5 is the default)")
    seeds = list(range(int(base_seed) + 1, int(base_seed) + n + 1))
    if search_seed is not None and search_seed in seeds:
        raise UserError(f"the validation seeds {seeds[0]}..{seeds[-1]} include the search seed {search_seed}, on which "
                        f"the winners were selected: use --seed {search_seed} (seeds {search_seed + 1}..) or leave "
                        "--seed unset")
    return seeds


def output_stem(base: str, eval_split: str) -> str:
    """``validation`` for the validation split, ``validation_test`` for the test split."""
    return base if eval_split == "valid" else f"{base}_{eval_split}"


def metric_info(metric: str, eval_split: str = "valid") -> tuple[str, bool, str]:
    """(label, lower_is_better, axis text) of a metric name."""
    if metric not in METRICS:
        raise UserError(f"unknown metric {metric!r}: use one of {', '.join(METRICS)}")
    label, lower = METRICS[metric]
    split = "validation" if eval_split == "valid" else eval_split
    return label, lower, f"{split} {label} ({'lower' if lower else 'higher'} is better)"


def value_of(record: Mapping, metric: str) -> float | None:
    """The record's finite metric, or None when the training failed."""
    if record.get("status") != "ok":
        return None
    value = record.get(metric)
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# -- the engine -----------------------------------------------------------------------------------
def run_seeds(genes: Iterable[AttentionGene | str], config, data, seeds: Sequence[int], *, steps: int | None = None,
              eval_split: str = "valid", role: str = "validate", store=None, executor: Executor | None = None,
              quiet: bool = True) -> dict[tuple[str, int], dict]:
    """Records of every (gene, seed): from ``store`` when there, else trained by ``executor``
    (default: the local one) and stored at once. Keys are (gene key, seed)."""
    from ..progress import SearchView
    from ..training import training_context

    keys = list(dict.fromkeys(AttentionGene.parse(g).key for g in genes))
    steps = int(config.train_steps if steps is None else steps)
    context = training_context(config, eval_split)
    records: dict[tuple[str, int], dict] = {}
    tasks = []
    for key in keys:
        for seed in seeds:
            hit = None if store is None else store.lookup(key, seed, steps, data.fingerprint, context)
            if hit is not None:
                records[key, seed] = hit
            else:
                tasks.append(EvalTask(key, int(seed), steps, eval_split=eval_split, role=role, label=f"seed {seed}"))
    own = executor is None
    executor = make_executor("local") if own else executor
    done = len(records)
    with SearchView(len(keys) * len(seeds), enabled=not quiet) as view:
        for i, ((key, seed), record) in enumerate(records.items()):
            view.finished(f"seed {seed}", key, record, True, i + 1)

        def on_start(task):
            view.start(task.label, task.gene, task.steps, worker=_worker(task))

        def on_step(task, step, total, loss):
            view.step(step, total, loss, worker=_worker(task))
            if store is not None:
                store.set_activity(f"{role}:{_worker(task) or executor.name}", task.gene, step, total, loss)

        try:
            for task, record in executor.run(tasks, config, data, on_start=on_start, on_step=on_step):
                if store is not None:
                    store.record(record, role=task.role)
                records[task.gene, task.seed] = record
                done += 1
                view.finished(task.label, task.gene, record, False, done, worker=_worker(task))
        finally:
            if store is not None:  # only its own rows: a search may be running beside it
                for row in store.activity():
                    if str(row["worker"]).startswith(f"{role}:"):
                        store.clear_activity(row["worker"])
            if own:
                executor.close()
    return records


def _worker(task) -> str | None:
    """Who trains ``task`` (set by parallel executors), or None."""
    return getattr(task, "worker", None) or None


def samples(records: Mapping[tuple[str, int], dict], key: str, seeds: Sequence[int], metric: str) -> dict:
    """``{"seeds", "values", "statuses", "n_failed", "errors"}`` of one gene (values None where failed)."""
    rows = [records[key, s] for s in seeds]
    values = [value_of(r, metric) for r in rows]
    errors = sorted({str(r.get("error") or r.get("status")) for r, v in zip(rows, values) if v is None})
    return {"seeds": list(seeds), "values": values, "statuses": [r.get("status") for r in rows],
            "n_failed": sum(v is None for v in values), "errors": errors}


def provenance(config, data, eval_split: str, metric: str, confidence: float, seeds: Sequence[int],
               steps: int, search_seed: int | None, source_run: str | os.PathLike | None) -> dict:
    """The settings block every analysis result carries (enough to reproduce it)."""
    from ..training import versions

    import matplotlib
    import numpy
    import scipy

    label, lower, _ = metric_info(metric, eval_split)
    return {
        "metric": metric, "metric_label": label, "lower_is_better": lower, "eval_split": eval_split,
        "confidence": confidence, "seeds": list(seeds), "search_seed": search_seed, "steps": steps,
        "source_run": None if source_run is None else str(source_run),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_dict(), "data": data.describe(),
        "versions": {**versions(), "numpy": numpy.__version__, "scipy": scipy.__version__,
                     "matplotlib": matplotlib.__version__},
    }


# -- validation -----------------------------------------------------------------------------------
def validate_genes(genes: Sequence[AttentionGene | str], config, data, *, n_seeds: int = DEFAULT_SEEDS,
             steps: int | None = None, eval_split: str = "valid", metric: str = "val_perplexity",
             confidence: float = 0.95, store=None, executor: Executor | None = None,
             search_seed: int | None = None, search_values: Mapping[str, float] | None = None,
             source_run: str | os.PathLike | None = None, quiet: bool = True) -> dict:
    """Re-train ``genes`` and the vanilla baseline with seeds ``config.seed + 1 ...`` and compare.

    Returns the JSON-able result (see ``write_validation``): ``baseline`` and ``genes`` rows with
    the per-seed values and the statistics. ``search_values`` (gene key -> the search's value) is
    shown next to the validated mean.
    """
    stats._check_confidence(confidence)
    metric_info(metric, eval_split)
    seeds = validation_seeds(config.seed, n_seeds, search_seed)
    steps = int(config.train_steps if steps is None else steps)
    vanilla = AttentionGene.vanilla().key
    keys = [k for k in dict.fromkeys(AttentionGene.parse(g).key for g in genes) if k != vanilla]
    if not keys:
        raise UserError("no gene to validate other than the baseline: give --genes with at least one non-vanilla gene")
    records = run_seeds([vanilla] + keys, config, data, seeds, steps=steps, eval_split=eval_split,
                        role="validate", store=store, executor=executor, quiet=quiet)
    result = summarize(records, keys, seeds, metric=metric, confidence=confidence, eval_split=eval_split,
                       search_values=search_values)
    result.update(provenance(config, data, eval_split, metric, confidence, seeds, steps, search_seed, source_run))
    return to_jsonable(result)


def summarize(records: Mapping[tuple[str, int], Mapping], keys: Sequence[str], seeds: Sequence[int], *,
              metric: str = "val_perplexity", confidence: float = 0.95, eval_split: str = "valid",
              search_values: Mapping[str, float] | None = None) -> dict:
    """The statistics of a validation from its records ((gene key, seed) -> record, the vanilla
    baseline's included): ``{"kind", "baseline", "genes", "headline", ...}`` (no provenance)."""
    label, lower, _ = metric_info(metric, eval_split)
    vanilla = AttentionGene.vanilla().key
    base = samples(records, vanilla, seeds, metric)
    per_gene = {k: samples(records, k, seeds, metric) for k in keys}
    compared = stats.compare({k: s["values"] for k, s in per_gene.items()}, base["values"], confidence, lower)
    search_values = dict(search_values or {})

    def row(key: str, sample: dict, numbers: dict) -> dict:
        return {"gene": key, "str": str(AttentionGene.parse(key)), "search_value": search_values.get(key),
                **sample, **numbers}

    result = {
        "kind": "validation", "metric": metric, "metric_label": label, "lower_is_better": lower,
        "eval_split": eval_split, "confidence": confidence, "seeds": list(seeds),
        "baseline": row(vanilla, base, stats.describe(base["values"], confidence)),
        "genes": [row(k, per_gene[k], compared[k]) for k in keys],
    }
    result["headline"] = headline(result)
    return to_jsonable(result)


def best_row(result: Mapping) -> dict | None:
    """The validated gene with the best mean (None if none has a value)."""
    rows = [r for r in result.get("genes", []) if r.get("mean") is not None]
    if not rows:
        return None
    sign = 1 if result.get("lower_is_better", True) else -1
    return min(rows, key=lambda r: (sign * r["mean"], r["gene"]))


def _interval(low, high, digits: int) -> str:
    return "-" if low is None or high is None else f"[{fmt(low, digits)}, {fmt(high, digits)}]"


def digits_for(metric: str) -> int:
    return 4 if metric in ("val_loss", "accuracy") else 3


def headline(result: Mapping) -> str:
    """One sentence: the best validated gene vs the baseline, with intervals and the verdict."""
    best, base = best_row(result), result.get("baseline") or {}
    label, conf, d = result.get("metric_label", "perplexity"), stats.percent(result.get("confidence", 0.95)), \
        digits_for(result.get("metric", ""))
    seeds = result.get("seeds") or []
    split = "validation" if result.get("eval_split") == "valid" else str(result.get("eval_split"))
    span = f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]})" if seeds else "no seeds"
    if best is None:
        return f"No validated gene finished a training ({span}, {split} split)."
    text = (f"{best['str']} {split} {label} {fmt(best['mean'], d)} {conf} CI "
            f"{_interval(best['ci_low'], best['ci_high'], d)}"
            f" vs baseline {fmt(base.get('mean'), d)} {_interval(base.get('ci_low'), base.get('ci_high'), d)}")
    if best.get("difference") is not None:
        text += f"; difference {best['difference']:+.{d}f} {_interval(best['diff_ci_low'], best['diff_ci_high'], d)}"
    if best.get("p_holm") is not None:
        text += f", Holm p = {best['p_holm']:.3g}"
    return text + f" over {span}: **{best['verdict']}**."


# -- output ---------------------------------------------------------------------------------------
def validation_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of the validation table; cells are plain text, the first column the
    gene key (the baseline first)."""
    d = digits_for(result.get("metric", ""))
    conf = stats.percent(result.get("confidence", 0.95))
    search_seed = result.get("search_seed")
    show_search = any(r.get("search_value") is not None for r in result.get("genes", []))
    headers = ["Gene", "Seeds ok", "Mean ± sd", f"{conf} CI"]
    headers += ["Search" + (f" (seed {search_seed})" if search_seed is not None else "")] if show_search else []
    headers += [f"Δ vs baseline [{conf} CI]", "p (Welch)", "p (Holm)", "Cohen's d", "Verdict"]
    rows = []
    for r in [result.get("baseline") or {}] + list(result.get("genes", [])):
        is_base = r is result.get("baseline")
        n_ok = len(r.get("values") or []) - (r.get("n_failed") or 0)
        cells = [str(r.get("gene", "")), f"{n_ok}/{len(r.get('values') or [])}",
                 f"{fmt(r.get('mean'), d)} ± {fmt(r.get('sd'), d)}", _interval(r.get("ci_low"), r.get("ci_high"), d)]
        cells += [fmt(r.get("search_value"), d)] if show_search else []
        if is_base:
            cells += ["-"] * 4 + ["baseline (reference)"]
        else:
            diff = r.get("difference")
            cells += ["-" if diff is None else
                      f"{diff:+.{d}f} {_interval(r.get('diff_ci_low'), r.get('diff_ci_high'), d)}",
                      _p(r.get("p_value")), _p(r.get("p_holm")), fmt(r.get("cohens_d"), 2), str(r.get("verdict", ""))]
        rows.append(cells)
    align = "l" + "r" * (len(headers) - 2) + "l"
    return headers, rows, align


def _p(value) -> str:
    return "-" if value is None else ("< 0.0001" if value < 1e-4 else f"{value:.4f}")


def render_markdown(result: Mapping) -> str:
    """The text of ``validation.md``."""
    headers, rows, align = validation_table(result)
    md_rows = [[md_cell(c) if i != 0 else code(c) for i, c in enumerate(row)] for row in rows]
    seeds = result.get("seeds") or []
    lines = [
        "# Multi-seed validation", "",
        result.get("headline", ""), "",
        f"Every gene and the vanilla baseline were trained {len(seeds)} times, with seeds {', '.join(map(str, seeds))} "
        f"({_seed_note(result)}), "
        f"{result.get('steps')} steps each, and measured on the {result.get('eval_split')} split. "
        f"The interval of a mean is a t interval; Δ is mean(gene) − mean(baseline) with Welch's interval and "
        f"two-sided p-value; p (Holm) is corrected across the {_genes(len(result.get('genes', [])))}, and the verdict "
        f"uses it. Cohen's d uses the pooled sd.", "",
        markdown_table(headers, md_rows, align).rstrip(), "",
    ]
    failures = [(r["gene"], e) for r in [result.get("baseline") or {}] + list(result.get("genes", []))
                for e in r.get("errors", [])]
    if failures:
        lines += ["Failed trainings (left out of the statistics):", ""]
        lines += [f"- `{g}`: {md_cell(e)}" for g, e in failures] + [""]
    lines += [f"![Per-seed values]({output_stem('validation', result.get('eval_split', 'valid'))}.png)", ""]
    return "\n".join(lines)


def _genes(n: int) -> str:
    return "1 gene" if n == 1 else f"{n} genes"


def _seed_note(result: Mapping) -> str:
    if result.get("search_seed") is not None:
        return f"not the search seed {result['search_seed']}, on which the search picked its winners"
    seed = (result.get("config") or {}).get("seed")
    return f"seed + 1 ... seed + N of the configured seed {seed}, which itself is left out"


def figure_groups(result: Mapping) -> list[dict]:
    rows = [result.get("baseline") or {}] + list(result.get("genes", []))
    return [{"label": ("baseline " if i == 0 else "") + str(r.get("str", "")), "values": r.get("values") or [],
             "baseline": i == 0, "failed": r.get("n_failed", 0), "ci": (r.get("ci_low"), r.get("ci_high"))}
            for i, r in enumerate(rows)]


def write_validation(result: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``validation.{json,md,png}`` (``validation_test.*`` for the test split) into ``out_dir``."""
    from .figures import plot_samples

    paths = write_json_and_markdown("validation", result, out_dir, render_markdown(result))
    _, _, axis = metric_info(result.get("metric", "val_perplexity"), result.get("eval_split", "valid"))
    seeds = result.get("seeds") or []
    plot_samples(figure_groups(result), paths["png"], xlabel=axis.capitalize(),
                 title=f"{len(seeds)} seeds per gene, {result.get('steps')} steps each",
                 ci_label=f"{stats.percent(result.get('confidence', 0.95))} confidence interval of the mean")
    return paths


def write_json_and_markdown(kind: str, result: Mapping, out_dir: str | os.PathLike, markdown: str) -> dict[str, Path]:
    """Write ``KIND.json`` and ``KIND.md`` (``KIND_test.*`` for the test split) into ``out_dir``;
    returns their paths and the path the caller's figure goes to (``png``)."""
    from ..jsonio import dumps

    out = _out_dir(out_dir)
    stem = output_stem(kind, result.get("eval_split", "valid"))
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    write_text(paths["json"], dumps(result) + "\n")
    write_text(paths["md"], markdown)
    return paths


def _out_dir(out_dir) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output directory {out}: {exc.strerror}; pick a writable --out") from None
    return out
