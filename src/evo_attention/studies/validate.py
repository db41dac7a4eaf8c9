"""Multi-seed validation: re-train genes and the vanilla baseline with fresh seeds and compare.

A search ranks its genes by one training each, all with the run's seed, and keeps the best: the
winner's score is biased downwards (the winner's curse), and one seed says nothing about the
spread between seeds. ``validate_genes`` trains every chosen gene and the baseline again with N
*other* seeds (``common.validation_seeds``) at the same budget, through the runner (a stored
evaluation is never trained twice; each is stored as soon as it finishes), and compares each gene
to the baseline with the helpers of ``util.stats``: mean, sd and t interval per gene; the
difference to the baseline with its Welch interval, Welch's p-value, Holm's correction across the
genes, Cohen's d, and the verdict.

``validate_genes`` resolves a ``common.StudySetup`` and trains through it, ``validation_statistics``
computes the numbers from the records, and the ``ValidationResult`` (those numbers, then the
setup's provenance; a mapping of what is written) is what ``write_validation`` writes as
``validation.json``, ``validation.md`` and ``validation.png`` (``validation_test.*`` for the test
split).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from evo_attention.genes import AttentionGene
from evo_attention.report.studies import digits_for, interval, metric_info, validation_markdown
from evo_attention.search.executors import Executor
from evo_attention.studies.common import (DEFAULT_SEEDS, SeedStudyResult, StudySetup, samples,
                                          write_json_and_markdown)
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.format import fmt
from evo_attention.util.jsonio import to_jsonable


@dataclass(frozen=True, eq=False)
class ValidationResult(SeedStudyResult):
    """A validation: the baseline's and every gene's row (per-seed values, statistics, verdict),
    the headline, and the provenance (see ``write_validation`` for the files)."""

    kind: ClassVar[str] = "validation"

    @property
    def baseline(self) -> dict:
        return self["baseline"]

    @property
    def genes(self) -> list[dict]:
        return self["genes"]

    @property
    def headline(self) -> str:
        return self["headline"]

    @property
    def best(self) -> dict | None:
        """The validated gene with the best mean (None if none has a value)."""
        return best_row(self)


def validate_genes(genes: Sequence[AttentionGene | str], config, data, *, n_seeds: int = DEFAULT_SEEDS,
                   steps: int | None = None, eval_split: str = "valid", metric: str = "val_perplexity",
                   confidence: float = 0.95, store=None, executor: Executor | None = None,
                   search_seed: int | None = None, search_values: Mapping[str, float] | None = None,
                   source_run: str | os.PathLike | None = None, quiet: bool = True) -> ValidationResult:
    """Re-train ``genes`` and the vanilla baseline with seeds ``config.seed + 1 ...`` and compare
    (the keyword arguments are those of ``StudySetup.resolve``).

    ``search_values`` (gene key -> the search's value) is shown next to the validated mean.
    """
    setup = StudySetup.resolve(config, data, role="validate", n_seeds=n_seeds, steps=steps, eval_split=eval_split,
                               metric=metric, confidence=confidence, store=store, executor=executor,
                               search_seed=search_seed, source_run=source_run, quiet=quiet)
    return run_validation(setup, genes, search_values=search_values)


def run_validation(setup: StudySetup, genes: Sequence[AttentionGene | str], *,
                   search_values: Mapping[str, float] | None = None) -> ValidationResult:
    """The validation of ``genes`` against the vanilla baseline with a resolved ``setup``."""
    vanilla = AttentionGene.vanilla().key
    keys = [k for k in dict.fromkeys(AttentionGene.parse(g).key for g in genes) if k != vanilla]
    if not keys:
        raise UserError("no gene to validate other than the baseline: give at least one non-vanilla gene",
                        setting="genes")
    records = setup.train([vanilla] + keys)
    numbers = validation_statistics(records, keys, list(setup.seeds), metric=setup.metric,
                                    confidence=setup.confidence, eval_split=setup.eval_split,
                                    search_values=search_values)
    return ValidationResult(numbers, setup.provenance())


def validation_statistics(records: Mapping[tuple[str, int], Mapping], keys: Sequence[str], seeds: Sequence[int], *,
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
            f"{interval(best['ci_low'], best['ci_high'], d)}"
            f" vs baseline {fmt(base.get('mean'), d)} {interval(base.get('ci_low'), base.get('ci_high'), d)}")
    if best.get("difference") is not None:
        text += f"; difference {best['difference']:+.{d}f} {interval(best['diff_ci_low'], best['diff_ci_high'], d)}"
    if best.get("p_holm") is not None:
        text += f", Holm p = {best['p_holm']:.3g}"
    return text + f" over {span}: **{best['verdict']}**."


# -- output ---------------------------------------------------------------------------------------
def figure_groups(result: Mapping) -> list[dict]:
    rows = [result.get("baseline") or {}] + list(result.get("genes", []))
    return [{"label": ("baseline " if i == 0 else "") + str(r.get("str", "")), "values": r.get("values") or [],
             "baseline": i == 0, "failed": r.get("n_failed", 0), "ci": (r.get("ci_low"), r.get("ci_high"))}
            for i, r in enumerate(rows)]


def write_validation(result: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``validation.{json,md,png}`` (``validation_test.*`` for the test split) into ``out_dir``."""
    from evo_attention.report.figures import plot_samples

    paths = write_json_and_markdown("validation", result, out_dir, validation_markdown(result))
    _, _, axis = metric_info(result.get("metric", "val_perplexity"), result.get("eval_split", "valid"))
    seeds = result.get("seeds") or []
    plot_samples(figure_groups(result), paths["png"], xlabel=axis.capitalize(),
                 title=f"{len(seeds)} seeds per gene, {result.get('steps')} steps each",
                 ci_label=f"{stats.percent(result.get('confidence', 0.95))} confidence interval of the mean")
    return paths
