"""Multi-seed validation: re-train genes and the vanilla baseline with fresh seeds and compare.

A search ranks its genes by one training each on the run's seed and keeps the best, so the winner's
score is biased (the winner's curse) and says nothing about the spread between seeds.
``validate_genes`` trains every chosen gene and the baseline again with N *other* seeds at the same
budget (a ``common.StudySetup``) and compares each gene with the baseline (``util.stats``: mean, sd
and t interval per gene; the paired difference with its interval and p-value, Holm's correction,
Cohen's d, the verdict). ``write_validation`` writes the ``ValidationResult`` as
``validation.{json,md,png}`` (``validation_test.*`` for the test split; with a learning-rate grid
also ``validation_lr_grid.png``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from evo_attention.genes import AttentionGene
from evo_attention.report.studies.common import metric_info
from evo_attention.report.studies.validation import validation_best_row, validation_headline, validation_markdown
from evo_attention.studies import lr_grid as grids
from evo_attention.search.executors import Executor
from evo_attention.studies.common import (ANALYSIS, DEFAULT_MARGIN, DEFAULT_MAX_SEEDS, DEFAULT_POWER, DEFAULT_SEEDS,
                                          DEFAULT_TUNING_SEEDS, PILOT_SEEDS, StudySetup, VerdictResult, gene_keys,
                                          samples, write_json_and_markdown)
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.jsonio import to_jsonable


@dataclass(frozen=True, eq=False)
class ValidationResult(VerdictResult):
    """A validation: the baseline's and every gene's row (per-seed values, statistics, verdict),
    the headline, and the provenance (see ``write_validation`` for the files)."""

    kind: ClassVar[str] = "validation"

    @property
    def best(self) -> dict | None:
        """The validated gene with the best mean (None if none has a value)."""
        return validation_best_row(self)


def validate_genes(genes: Sequence[AttentionGene | str], config, data, *, n_seeds: int = DEFAULT_SEEDS,
                   steps: int | None = None, eval_split: str = "valid", metric: str = "val_perplexity",
                   confidence: float = 0.95, store=None, executor: Executor | None = None,
                   search_seed: int | None = None, search_values: Mapping[str, float] | None = None,
                   source_run: str | os.PathLike | None = None, quiet: bool = True, margin: float = DEFAULT_MARGIN,
                   power: float = DEFAULT_POWER, mde: float | None = None, max_seeds: int = DEFAULT_MAX_SEEDS,
                   lr_grid=None, n_tuning_seeds: int = DEFAULT_TUNING_SEEDS, match_params: bool = False,
                   seed_block: int | None = None) -> ValidationResult:
    """Re-train ``genes`` and the baseline with fresh seeds and compare (the keyword arguments are
    those of ``StudySetup.resolve``, at least 2 seeds); ``search_values`` (gene key -> the search's
    value) is shown next to the validated mean."""
    setup = StudySetup.resolve(config, data, role="validate", n_seeds=n_seeds, steps=steps, eval_split=eval_split,
                               metric=metric, confidence=confidence, store=store, executor=executor,
                               search_seed=search_seed, source_run=source_run, quiet=quiet, margin=margin,
                               power=power, mde=mde, max_seeds=max_seeds, lr_grid=lr_grid,
                               n_tuning_seeds=n_tuning_seeds, match_params=match_params, seed_block=seed_block)
    return run_validation(setup, genes, search_values=search_values)


def run_validation(setup: StudySetup, genes: Sequence[AttentionGene | str], *,
                   search_values: Mapping[str, float] | None = None) -> ValidationResult:
    """The validation of ``genes`` against the baseline (``StudySetup.baseline``) with a resolved ``setup``."""
    base_key = setup.baseline
    keys = [k for k in gene_keys(genes) if k != base_key]
    if not keys:
        raise UserError(f"no gene to validate other than the baseline: give at least one gene other than {base_key}",
                        setting="genes")
    plan = grid = rates = None
    if setup.lr_grid:
        grid = grids.tune(setup, [base_key] + keys)
        rates = grids.selected_rates(grid)
        # the search trained at the configured rate: its value measured the same thing only there
        search_values = {k: v for k, v in (search_values or {}).items() if rates.get(k) == setup.config.learning_rate}
    if setup.planned is not None:
        setup, plan = plan_seeds(setup, [base_key] + keys, rates=rates)
    records = (setup.train([base_key] + keys) if rates is None
               else grids.train_at_rates(setup, [base_key] + keys, rates))
    numbers = validation_statistics(setup, records, keys, search_values=search_values, rates=rates)
    if setup.match_params:
        numbers = matched_statistics(setup, numbers, records, keys, search_values=search_values)
    if plan is not None:
        numbers["seed_plan"] = plan
    if grid is not None:
        numbers["grid"] = grids.with_verdict_seeds(grid, setup.seeds)
    return ValidationResult(numbers, setup.provenance())


def plan_seeds(setup: StudySetup, genes: Sequence[str], *,
               rates: Mapping[str, float] | None = None) -> tuple[StudySetup, dict]:
    """Seeds from a target (``--seeds auto``): train ``PILOT_SEEDS`` pilot seeds, take the largest spread
    of the per-seed differences over the genes, and plan the paired seeds that detect ``planned.mde``
    with ``setup.power`` (``stats.seed_plan``: under the verdict rule, at Holm's level of the family the
    run will test, the store's comparisons on the planned seeds included, and at the one-sided 80% upper
    bound of the pilot's sd). The verdict is measured on fresh seeds after the pilot's, so alpha holds
    exactly (no optional stopping). ``rates``: the pilot trains each gene at its selected rate. Returns
    the setup with the planned seeds and the plan."""
    planned = setup.planned
    base_key = setup.baseline
    pilot = dataclasses.replace(setup, seeds=tuple(setup.base_seed + 1 + i for i in range(PILOT_SEEDS)), planned=None)
    records = pilot.train(genes) if rates is None else grids.train_at_rates(pilot, genes, rates)
    base = samples(records, base_key, pilot.seeds, pilot.metric)["values"]
    spreads = {key: stats.paired(samples(records, key, pilot.seeds, pilot.metric)["values"], base, pilot.confidence,
                                 log=pilot.log_scale, bootstrap_resamples=0)["sd_diff"] for key in genes[1:]}
    known = [v for v in spreads.values() if v is not None]
    if not known:
        raise UserError(f"the pilot of {PILOT_SEEDS} seeds left no gene with a spread to plan from (failed or "
                        "identical trainings): give a number of seeds instead of auto", setting="n_seeds")
    effect = stats.margin_bound(planned.mde, pilot.log_scale)
    first = pilot.seeds[-1] + 1
    family, seeds = max(1, len(genes) - 1), ()
    for _ in range(3):  # the family on the planned seeds may hold earlier comparisons: plan again at its size
        plan = stats.seed_plan(max(known), PILOT_SEEDS, effect, power=setup.power, alpha=pilot.alpha,
                               family_size=family, max_seeds=planned.max_seeds)
        needed = plan["seeds"]
        n = planned.max_seeds if needed is None else max(2, needed)
        seeds = tuple(range(first, first + n))
        grown = dataclasses.replace(setup, seeds=seeds).family_size(genes[1:])
        if grown <= family:
            break
        family = grown
    if setup.search_seed is not None and setup.search_seed in seeds:
        raise UserError(f"the planned seeds {seeds[0]}..{seeds[-1]} include the search seed {setup.search_seed}: "
                        "use another seed", setting="seed")
    plan = {"pilot_seeds": list(pilot.seeds), "sd_diff": spreads, "sd_used": max(known),
            "sd_upper": plan["sd_upper"], "sd_level": plan["level"], "family_size": plan["family_size"],
            "mde": planned.mde, "effect_on_scale": effect, "power": setup.power, "alpha_planned": plan["alpha_holm"],
            "needed": needed, "range": [plan["n_point"], plan["n_upper"]], "plan": plan["text"],
            "max_seeds": planned.max_seeds, "capped": needed is None or needed > planned.max_seeds,
            "seeds": list(seeds),
            "method": "pilot seeds estimate the sd of the paired differences; the plan takes its one-sided "
                      f"{stats.percent(plan['level'])} upper confidence bound (chi-square) at Holm's level of the "
                      "family and the verdict rule's test; the verdict is measured on the fresh seeds that follow "
                      "them (a fixed plan: the error rate stays alpha)"}
    return dataclasses.replace(setup, seeds=seeds, planned=None), plan


def validation_statistics(setup: StudySetup, records: Mapping[tuple[str, int], Mapping], keys: Sequence[str], *,
                          search_values: Mapping[str, float] | None = None,
                          rates: Mapping[str, float] | None = None) -> dict:
    """The statistics of a validation from its records ((gene key, seed) -> record, the baseline's
    included; no provenance). ``rates`` (gene key -> rate): each gene trained at its own rate of a grid."""
    base_key = setup.baseline
    seeds = list(setup.seeds)
    base = samples(records, base_key, seeds, setup.metric)
    per_gene = {k: samples(records, k, seeds, setup.metric) for k in keys}
    values = {k: s["values"] for k, s in per_gene.items()}
    compared = (setup.versus_baseline(values, base["values"]) if rates is None
                else grids.versus_baseline(setup, values, base["values"], rates))
    return comparison_result("validation", setup, base, per_gene, compared, search_values)


def matched_baseline_rows(setup: StudySetup, records: Mapping[tuple[str, int], Mapping], keys: Sequence[str]) -> dict:
    """The parameter-matched baselines of ``keys``, each width trained here (the plain width's from
    ``records``): ``{"matches": key -> match, "rows": width -> baseline row, "setups": width -> the setup
    that trained it, "references": key -> its baseline's per-seed values}``."""
    base_key = setup.baseline
    seeds = list(setup.seeds)
    matches = setup.matched_baselines(keys)
    setups, references, rows = {}, {}, {}
    for key, match in matches.items():
        width = match["ffn_dim"]
        if width not in rows:
            at = setup.with_ffn(match["d_ff"])
            sample = samples(records if match["d_ff"] == setup.config.d_ff else at.train([base_key]), base_key, seeds,
                             setup.metric)
            rows[width] = {"gene": base_key, "str": f"baseline, FFN {width}", "d_ff": width, "params": match["params"],
                           "matched_to": [], **sample, **stats.describe(sample["values"], setup.confidence)}
            setups[width] = at
        rows[width]["matched_to"].append(key)
        references[key] = rows[width]["values"]
    return {"matches": matches, "rows": rows, "setups": setups, "references": references}


def matched_statistics(setup: StudySetup, numbers: dict, records: Mapping[tuple[str, int], Mapping],
                       keys: Sequence[str], *, search_values: Mapping[str, float] | None = None,
                       trained: Mapping | None = None, others: Mapping[str, dict] | None = None) -> dict:
    """``numbers`` (a validation against the plain baseline) with each gene judged against the baseline
    of its own parameter count instead (``matched_baseline_rows``, or ``trained``: what it returned).
    Each matched baseline gets a row in ``matched_baselines``; each gene row names the baseline its
    verdict used (``versus``) and keeps the plain comparison (``versus_plain``). ``others`` (name ->
    values and reference) join Holm's family."""
    seeds = list(setup.seeds)
    trained = trained or matched_baseline_rows(setup, records, keys)
    matches, rows, setups, references = (trained[k] for k in ("matches", "rows", "setups", "references"))
    per_gene = {k: samples(records, k, seeds, setup.metric) for k in keys}
    compared = setup.versus_baselines({k: s["values"] for k, s in per_gene.items()}, references,
                                      {k: setups[m["ffn_dim"]] for k, m in matches.items()}, others=others)
    plain = {g["gene"]: g for g in numbers["genes"]}
    for key, match in matches.items():
        compared[key]["versus"] = {"baseline": "matched", "d_ff": match["ffn_dim"], "params": match["params"],
                                   "candidate_params": match["candidate_params"], "off": match["off"],
                                   "label": f"matched baseline (FFN {match['ffn_dim']}, {match['params']:,} "
                                            f"parameters; the gene {match['candidate_params']:,})"}
        compared[key]["versus_plain"] = {k: plain[key].get(k) for k in
                                         ("scale", "relative", "relative_ci_low", "relative_ci_high", "difference",
                                          "diff_ci_low", "diff_ci_high", "p_value", "p_holm", "verdict", "verdict_label")}
    result = comparison_result("validation", setup, samples(records, setup.baseline, seeds, setup.metric), per_gene,
                               compared, search_values, matched=list(rows.values()))
    result["plain_baseline"] = {"d_ff": setup.config.ffn_dim,
                                "params": next(iter(matches.values()))["plain_params"] if matches else None}
    return result


def comparison_result(kind: str, setup: StudySetup, base: dict, per_gene: Mapping[str, dict],
                      compared: Mapping[str, dict], search_values: Mapping[str, float] | None = None, *,
                      matched: Sequence[dict] | None = None) -> dict:
    """A validation-shaped result (baseline row, gene rows with their paired comparison, headline);
    ``matched``: the rows of parameter-matched baselines (``matched_statistics``)."""
    base_key = setup.baseline
    search_values = dict(search_values or {})

    def row(key: str, sample: dict, numbers: dict) -> dict:
        return {"gene": key, "str": str(AttentionGene.parse(key)), "search_value": search_values.get(key),
                **sample, **stats.describe(sample["values"], setup.confidence), **numbers}

    result = {
        "kind": kind, "analysis": ANALYSIS, "metric": setup.metric, "metric_label": setup.metric_label,
        "lower_is_better": setup.lower_is_better, "eval_split": setup.eval_split, "confidence": setup.confidence,
        "seeds": list(setup.seeds), "margin": setup.margin,
        "family_size": max((c["family_size"] for c in compared.values()), default=0),
        "baseline": row(base_key, base, {}),
        "genes": [row(k, per_gene[k], compared[k]) for k in per_gene],
    }
    if matched:
        result["matched_baselines"] = list(matched)
    result["headline"] = validation_headline(result)
    return to_jsonable(result)


# -- output ---------------------------------------------------------------------------------------
def figure_groups(result: Mapping) -> list[dict]:
    rows = [result.get("baseline") or {}] + list(result.get("genes", []))
    return [{"label": ("baseline " if i == 0 else "") + str(r.get("str", "")), "values": r.get("values") or [],
             "baseline": i == 0, "failed": r.get("n_failed", 0), "ci": (r.get("ci_low"), r.get("ci_high"))}
            for i, r in enumerate(rows)]


def write_validation(result: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``validation.{json,md,png}`` (``validation_test.*`` for the test split) into ``out_dir``;
    with a learning-rate grid also ``validation_lr_grid.png`` (``grid`` in the paths)."""
    from evo_attention.report.figures import plot_samples

    paths = write_json_and_markdown("validation", result, out_dir, validation_markdown(result))
    _, _, axis = metric_info(result.get("metric", "val_perplexity"), result.get("eval_split", "valid"))
    seeds = result.get("seeds") or []
    plot_samples(figure_groups(result), paths["png"], xlabel=axis.capitalize(),
                 title=f"{len(seeds)} seeds per gene, {result.get('steps')} steps each",
                 ci_label=f"{stats.percent(result.get('confidence', 0.95))} confidence interval of the mean")
    grids.add_grid_figure(paths, result, "validation", out_dir)
    return paths
