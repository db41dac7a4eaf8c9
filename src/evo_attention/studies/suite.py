"""Genes on a suite of tasks with several seeds: ``compare --suite`` and ``validate --suite``.

    from evo_attention.studies.suite import run_suite, write_suite
    setup = StudySetup.resolve(config, None, role="validate", n_seeds=5, metric="suite_accuracy", store=store)
    result = run_suite(setup, load_suite("mad-cpu"), [("baseline", vanilla), ("rope", rope_gene)], study="validation")
    write_suite(result, "runs/validate")     # validation_suite.json, .md and the heat map .png

Every (gene, point, seed) is one training: a Trial of ``train.suite.point_config(config, point)`` (the
suite's steps win) with seed ``seed``, all through the runner in one call (point by point), cached in the
setup's store. The baseline (the vanilla gene) always takes part.

Per gene and seed, the suite score (``train.suite.SuiteScore``): the mean accuracy over the points, a
failed training counting 0 on its point (listed under ``failed``); per gene and point, the mean ± sd
over the seeds of the same scored accuracies (``n_failed`` says how many failed), so a gene's aggregate
mean is the mean of its point means. Each gene's per-seed aggregates are compared with the baseline's,
paired by seed on the linear scale (accuracy is additive: the change and the margin are in accuracy
units, 0.01 = one point; higher is better), Holm over the genes of this study; not with one seed.

The ``SuiteResult`` (kind ``suite``) is written as ``compare_suite.*`` or ``validation_suite.*``
(``_test`` for the test split) with its markdown and heat map; the run report shows them when they lie
in its directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from evo_attention.genes import AttentionGene
from evo_attention.report.attachments import output_stem
from evo_attention.report.studies.suite import suite_heatmap_rows, suite_markdown
from evo_attention.report.studies.validation import validation_headline
from evo_attention.search.executors import EvalTask
from evo_attention.studies.common import (ANALYSIS, StudySetup, VerdictResult, scored, trained_as,
                                          write_json_and_markdown)
from evo_attention.train.record import SUITE_OBJECTIVE
from evo_attention.train.spec import Trial, load_task
from evo_attention.train.suite import point_configs, suite_score
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.jsonio import to_jsonable

STUDIES = ("compare", "validation")


@dataclass(frozen=True, eq=False)
class SuiteResult(VerdictResult):
    """Genes on a suite: the baseline's and every gene's row (per point and aggregate), the paired
    verdicts, the headline, then the provenance."""

    kind: ClassVar[str] = "suite"


def with_baseline(entries: Sequence[tuple[str, AttentionGene | str]], baseline: str) -> list[tuple[str, str]]:
    """``(name, gene key)`` of ``entries`` (repeats dropped), the ``baseline`` gene key first (named
    ``baseline`` unless an entry names it)."""
    out: dict[str, str] = {}
    for name, gene in entries:
        key = AttentionGene.parse(gene).key
        if key not in out.values():
            out[str(name)] = key
    base = next((n for n, k in out.items() if k == baseline), "baseline")
    return [(base, baseline)] + [(n, k) for n, k in out.items() if k != baseline]


def run_suite(setup: StudySetup, suite, entries: Sequence[tuple[str, AttentionGene | str]], *,
              study: str) -> SuiteResult:
    """Train every entry (and the baseline) on every point of ``suite`` with ``setup``'s seeds and
    compare; ``study`` ('compare' or 'validation') names the result's files."""
    if study not in STUDIES:
        raise ValueError(f"study must be one of {STUDIES}, got {study!r}")
    if setup.lr_grid:
        raise UserError(f"lr_grid cannot be combined with suite {suite.name}: a rate per gene and point is not "
                        "defined yet; drop one of them", setting=("lr_grid", "suite"))
    configs = point_configs(setup.config, suite)
    # every point is a generated task: the baseline of its config (no attention dropout)
    named = with_baseline(entries, next(iter(configs.values())).resolved_baseline().key)
    datasets = {label: load_task(c.task) for label, c in configs.items()}
    tasks, index = [], []
    for point in suite.points:  # point by point: a point's data is built once per worker process
        for name, key in named:
            for seed in setup.seeds:
                trial = Trial.from_config(key, configs[point.label], seed=seed, eval_split=setup.eval_split,
                                          data=datasets[point.label])
                tasks.append(EvalTask(trial, role=setup.role, label=f"{name} {point.label}, seed {seed}"))
                index.append((key, point.label, seed))
    done = setup.run(tasks, datasets={configs[label].task: data for label, data in datasets.items()})
    records = {where: done[task] for where, task in zip(index, tasks)}
    numbers = suite_statistics(setup, suite, named, records, configs)
    return SuiteResult({"study": study, **numbers}, setup.provenance(steps=None))


def suite_statistics(setup: StudySetup, suite, named: Sequence[tuple[str, str]], records: Mapping,
                     configs: Mapping) -> dict:
    """The numbers of a suite study from its records ((gene key, point label, seed) -> record)."""
    labels, seeds = suite.labels, list(setup.seeds)
    scores = {(key, seed): suite_score(labels, {label: records[key, label, seed] for label in labels}, suite.weights)
              for _, key in named for seed in seeds}
    rows = {key: gene_row(name, key, [scores[key, s] for s in seeds], seeds, setup.confidence) for name, key in named}
    (_, base_key), others = named[0], named[1:]
    compared = {}
    if len(seeds) >= 2 and others:
        compared = stats.versus_reference({key: rows[key]["values"] for _, key in others}, rows[base_key]["values"],
                                          confidence=setup.confidence, log=False, margin=setup.margin,
                                          lower_is_better=False, power=setup.power)
    result = {
        "kind": "suite", "analysis": ANALYSIS, "metric": SUITE_OBJECTIVE, "metric_label": setup.metric_label,
        "lower_is_better": False, "eval_split": setup.eval_split, "confidence": setup.confidence, "seeds": seeds,
        "margin": setup.margin, "family_size": len(compared),
        "suite": {"name": suite.name, "source": suite.source, "description": suite.description,
                  "points": [{"label": p.label, "data": p.data, "options": dict(p.options),
                              "steps": configs[p.label].train_steps, **({} if p.weight == 1 else {"weight": p.weight})}
                             for p in suite.points]},
        "baseline": rows[base_key],
        "genes": [{**rows[key], **compared.get(key, {})} for _, key in others],
        "trained_as": trained_as(records.values()),
    }
    result["headline"] = validation_headline(result)
    return to_jsonable(result)


def gene_row(name: str, key: str, scores: Sequence, seeds: Sequence[int], confidence: float) -> dict:
    """One gene's row: per point the scored accuracies over the seeds (a failed training counts 0),
    their mean and sd, and the tokens they were scored on (``scored``); the per-seed aggregates with their
    mean, sd and interval; every failure."""
    points = {}
    for label in scores[0].labels:
        results = [score.point(label) for score in scores]
        values = [r.scored for r in results]
        points[label] = {"values": values, **{k: v for k, v in stats.describe(values, confidence).items()
                                              if k in ("mean", "sd")},
                         "n_failed": sum(r.failed for r in results),
                         "val_loss": stats.describe([r.val_loss for r in results if r.val_loss is not None])["mean"],
                         **scored([vars(r) for r in results], [r.accuracy for r in results])}
    failures = [{"seed": seed, "point": r.label, "status": r.status, "error": r.error}
                for seed, score in zip(seeds, scores) for r in score.points if r.failed]
    values = [score.aggregate for score in scores]
    return {"name": name, "gene": key, "str": str(AttentionGene.parse(key)), "seeds": list(seeds), "values": values,
            **stats.describe(values, confidence), "points": points, "n_failed": len(failures), "failures": failures}


def write_suite(result: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``compare_suite.*`` or ``validation_suite.*`` (json, md, png: the heat map) into ``out_dir``."""
    from evo_attention.report.figures import plot_suite_heatmap

    stem = output_stem(f"{result['study']}_suite", result.get("eval_split", "valid"))
    paths = write_json_and_markdown(f"{result['study']}_suite", result, out_dir,
                                    suite_markdown(result, figure=f"{stem}.png"))
    columns, rows = suite_heatmap_rows(result)
    seeds = result.get("seeds") or []
    plot_suite_heatmap(columns, rows, paths["png"],
                       title=f"Suite {result['suite']['name']}: accuracy per point, mean over {len(seeds)} "
                             f"seed{'s' if len(seeds) != 1 else ''} ({result.get('eval_split')} split)")
    return paths
