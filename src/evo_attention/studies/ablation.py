"""Ablation: which of a gene's differences from the vanilla transformer carry its effect.

For each field F in which the gene differs from the baseline two variants are trained, with the seeds
rule and statistics of ``validate``: *without F* (the gene with F set back to the vanilla value; the
gene against it is what F changes inside the gene) and *baseline + F* (the vanilla transformer with F
taken from the gene: what F changes on its own). Plus the gene itself and the baseline; each distinct
gene is trained once per seed whatever its names. A contribution is the signed change of the metric
the field causes, with it minus without it (``report.studies.ablation.field_changes``, the one sign
convention: for perplexity a helpful field shows as a negative change); interactions show as
contributions that do not add up to the whole gene's change.

Recipe or mechanism: a gene that sets its own training recipe (``lr=``, ``wu=``, ``wd=``) also gets
the two crossed cells of the 2x2 (``recipe_cells``): *mechanism alone* (its mechanism at the
baseline's recipe) and *recipe alone* (the baseline with its recipe). With the gene and the baseline,
``stats.two_factor_shares`` splits the gene's advantage into the recipe's and the mechanism's shares
(each the mean of its gain without and with the other, so the two add up to the whole), with the
interaction test: the result's ``recipe_vs_mechanism``.

``write_ablation`` writes the ``AblationResult`` as ``ablation.{json,md,png}``. With a learning-rate
grid (``studies.lr_grid``) every variant trains at its own best rate of the grid; the result carries
the ``grid`` block (``ablation_lr_grid.png``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from evo_attention import programs
from evo_attention.genes import (KEY_PARTS, RECIPE_FIELDS, AttentionGene, canonical_program, mechanism_of,
                                 program_grammar, recipe_of, with_recipe)
from evo_attention.report.studies.ablation import FIELD_LABELS, ablation_markdown, field_changes, recipe_changes
from evo_attention.report.studies.common import metric_info, metric_direction
from evo_attention.search.executors import Executor
from evo_attention.studies import lr_grid as grids
from evo_attention.studies.common import (DEFAULT_SEEDS, DEFAULT_TUNING_SEEDS, SeedStudyResult, StudySetup, samples,
                                          write_json_and_markdown, written)
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.jsonio import to_jsonable


@dataclass(frozen=True)
class Variant:
    """One gene of the ablation: ``kind`` is full, baseline, remove or add; ``field`` the gene
    field it is about (None for full and baseline); ``change`` says what was changed, in words."""

    name: str
    kind: str
    field: str | None
    gene: AttentionGene
    change: str


def option_text(gene: AttentionGene, name: str) -> str:
    value = getattr(gene, name)
    if name == "use_bias":
        return "bias" if value else "nobias"
    if name == "attention_dropout":
        return f"{value:.2f}"
    if name in RECIPE_FIELDS and value is None:  # a recipe part at its default: the run's configured value
        return "default"
    return str(value)


def recipe_cells(gene: AttentionGene, reference: AttentionGene) -> dict[str, AttentionGene] | None:
    """The 2x2 of a gene that sets its own recipe: ``neither`` (the reference), ``mechanism`` (the
    gene's mechanism at the reference's recipe), ``recipe`` (the reference with the gene's recipe)
    and ``both`` (the gene); None for a gene without recipe parts."""
    recipe = recipe_of(gene)
    if not recipe:
        return None
    mechanism = with_recipe(mechanism_of(gene), recipe_of(reference))
    return {"neither": reference, "mechanism": mechanism,
            "recipe": with_recipe(reference, {**dict.fromkeys(recipe), **recipe}), "both": gene}


def recipe_text(gene: AttentionGene) -> str:
    """The recipe parts of a gene as its key writes them ('lr=0.002|wu=0.05'), or 'the run's recipe'."""
    parts = [p for p in gene.key.split("|") if p.split("=", 1)[0] in {KEY_PARTS[n] for n in recipe_of(gene)}]
    return "|".join(parts) or "the run's recipe"


def ablation_variants(gene: AttentionGene | str, reference: AttentionGene | None = None) -> list[Variant]:
    """The full gene, the reference (default: the vanilla gene), the crossed cells of a gene with recipe
    parts (``recipe_cells``) that no field's variant already is, then per differing field its
    removal from the gene and its addition to the reference. Raises UserError if nothing differs."""
    gene = AttentionGene.parse(gene)
    if not isinstance(gene, AttentionGene):
        raise UserError(f"ablation takes one gene shared by every layer, and {gene.key!r} is a per-layer genome: "
                        "ablate one of its layers' genes", setting="gene")
    reference = reference or AttentionGene.vanilla()
    fields = gene.differences(reference)
    if not fields:
        raise UserError(f"gene {gene.key!r} is the baseline itself: nothing to ablate; give a gene that differs from "
                        f"{reference.key}")
    variants = [Variant("full gene", "full", None, gene, "the gene as found"),
                Variant("baseline", "baseline", None, reference, "the vanilla transformer")]
    for name in fields:
        if name == "program" and gene.program is not None:  # a program: one variant per removable op node
            variants += program_variants(gene)
            continue
        label = FIELD_LABELS.get(name, name)
        mine, theirs = option_text(gene, name), option_text(reference, name)
        variants.append(Variant(f"without {label}", "remove", name, gene.replace(**{name: getattr(reference, name)}),
                                f"{label}: {mine} -> {theirs}"))
        variants.append(Variant(f"baseline + {label}", "add", name, reference.replace(**{name: getattr(gene, name)}),
                                f"{label}: {theirs} -> {mine}"))
    cells = recipe_cells(gene, reference)
    if cells:  # the crossed cells of the 2x2, after the gene and the baseline, unless a field's variant is one
        crossed = [Variant("mechanism alone", "mechanism", None, cells["mechanism"],
                           "the gene's mechanism at the baseline's recipe"),
                   Variant("recipe alone", "recipe", None, cells["recipe"],
                           f"the baseline with the gene's recipe ({recipe_text(gene)})")]
        known = {v.gene.key for v in variants}
        variants[2:2] = [v for v in crossed if v.gene.key not in known]
    return variants


def program_variants(gene: AttentionGene) -> list[Variant]:
    """The ablation of a gene's program: the gene without each of its op nodes in turn (the node
    replaced by an argument of its type, ``programs.deletions``), named by the node."""
    variants = []
    for node, argument, program in programs.deletions(canonical_program(gene.program), program_grammar()):
        shown = node.text if len(node.text) <= 40 else node.text[:37] + "..."
        name = f"without {node.op} in {shown}" + ("" if len(node.args) == 1 else f" (keeping {argument.text[:20]})")
        variants.append(Variant(name, "remove", "program", gene.replace(program=program.text),
                                f"program: {node.text} -> {argument.text}"))
    return variants


@dataclass(frozen=True, eq=False)
class AblationResult(SeedStudyResult):
    """An ablation: every variant's row, the per-field contributions and the whole gene's
    change from the baseline (``total``), and the provenance."""

    kind: ClassVar[str] = "ablation"

    gene = written("gene")
    variants = written("variants")
    contributions = written("contributions")
    total = written("total")


def ablate(gene: AttentionGene | str, config, data, *, n_seeds: int = DEFAULT_SEEDS, steps: int | None = None,
           eval_split: str = "valid", metric: str = "val_perplexity", confidence: float = 0.95, store=None,
           executor: Executor | None = None, search_seed: int | None = None,
           source_run: str | os.PathLike | None = None, quiet: bool = True, lr_grid=None,
           n_tuning_seeds: int = DEFAULT_TUNING_SEEDS) -> AblationResult:
    """Train every variant of ``gene`` and measure the changes (the keyword arguments are those of
    ``StudySetup.resolve``)."""
    setup = StudySetup.resolve(config, data, role="ablation", n_seeds=n_seeds, steps=steps, eval_split=eval_split,
                               metric=metric, confidence=confidence, store=store, executor=executor,
                               search_seed=search_seed, source_run=source_run, quiet=quiet, lr_grid=lr_grid,
                               n_tuning_seeds=n_tuning_seeds)
    return run_ablation(setup, gene)


def run_ablation(setup: StudySetup, gene: AttentionGene | str) -> AblationResult:
    """The ablation of ``gene`` with a resolved ``setup``, against its baseline (``StudySetup.baseline``)."""
    variants = ablation_variants(gene, AttentionGene.parse(setup.baseline))
    genes = [v.gene for v in variants]
    if not setup.lr_grid:
        return AblationResult(ablation_statistics(setup, variants, setup.train(genes)), setup.provenance())
    grid = grids.tune(setup, genes)
    rates = grids.selected_rates(grid)
    numbers = ablation_statistics(setup, variants, grids.train_at_rates(setup, genes, rates), rates=rates)
    numbers["grid"] = grids.with_verdict_seeds(grid, setup.seeds)
    return AblationResult(numbers, setup.provenance())


def ablation_statistics(setup: StudySetup, variants: Sequence[Variant], records: Mapping[tuple[str, int], Mapping], *,
                        rates: Mapping[str, float] | None = None) -> dict:
    """The statistics of an ablation from its records ((gene key, seed) -> record; no provenance): per
    variant its values, mean and interval and its paired comparisons with the full gene (Holm over the
    variants) and with the baseline (``StudySetup.versus_baseline``), the per-field ``contributions``
    and the ``total``. ``rates`` (gene key -> rate): each variant trained at its own rate of a grid."""
    seeds, metric, confidence, lower = list(setup.seeds), setup.metric, setup.confidence, setup.lower_is_better
    values = {v.gene.key: samples(records, v.gene.key, seeds, metric) for v in variants}
    full, base = variants[0].gene.key, variants[1].gene.key
    # a gene two variants share (baseline + F is the gene without G when it differs in F and G alone) is one
    # comparison, in each Holm family
    by_key = setup.versus({v.gene.key: values[v.gene.key]["values"] for v in variants if v.gene.key != full},
                          values[full]["values"])
    vs_full = {v.name: by_key[v.gene.key] for v in variants if v.gene.key in by_key}
    against = {v.gene.key: values[v.gene.key]["values"] for v in variants if v.gene.key != base}
    by_gene = (setup.versus_baseline(against, values[base]["values"]) if rates is None
               else grids.versus_baseline(setup, against, values[base]["values"], rates))
    vs_base = {v.name: by_gene[v.gene.key] for v in variants if v.gene.key in by_gene}
    rows = [{"name": v.name, "kind": v.kind, "field": v.field, "change": v.change, "gene": v.gene.key,
             "str": str(v.gene), **values[v.gene.key], **stats.describe(values[v.gene.key]["values"], confidence),
             "vs_full": _comparison(vs_full.get(v.name, {})), "vs_baseline": _comparison(vs_base.get(v.name, {}))}
            for v in variants]
    contributions, total = field_changes(rows)
    numbers = {
        "kind": "ablation", "analysis": stats.ANALYSIS, "margin": setup.margin,
        "gene": full, "str": str(variants[0].gene), "baseline_gene": base,
        "fields": [v.field for v in variants if v.kind == "remove"],
        "metric": metric, "metric_label": setup.metric_label, "lower_is_better": lower, "eval_split": setup.eval_split,
        "confidence": confidence, "seeds": list(seeds),
        "variants": rows, "contributions": contributions, "total": total,
    }
    cells = recipe_cells(variants[0].gene, variants[1].gene)
    if cells:
        numbers["recipe_vs_mechanism"] = recipe_vs_mechanism(setup, cells, values)
    return to_jsonable(numbers)


def recipe_vs_mechanism(setup: StudySetup, cells: Mapping[str, AttentionGene], values: Mapping[str, Mapping]) -> dict:
    """The 2x2 of a gene with recipe parts (``recipe_cells``): the parts, each cell's key, values and
    mean, ``stats.two_factor_shares`` (the mechanism the first factor) in the one sign convention
    (``report.studies.ablation.recipe_changes``), and which share carries more of the advantage (``larger``)."""
    keys = {name: gene.key for name, gene in cells.items()}
    per_cell = {name: values[key]["values"] for name, key in keys.items()}
    shares = stats.two_factor_shares(per_cell["neither"], per_cell["mechanism"], per_cell["recipe"],
                                     per_cell["both"], setup.confidence, log=setup.log_scale,
                                     lower_is_better=setup.lower_is_better)
    mechanism, recipe = shares["first"], shares["second"]
    larger = None
    if mechanism["mean"] is not None and recipe["mean"] is not None and mechanism["mean"] != recipe["mean"]:
        larger = "mechanism" if mechanism["mean"] > recipe["mean"] else "recipe"  # gains: the larger benefit
    changes, interaction = recipe_changes({"total": shares["total"], "mechanism": mechanism, "recipe": recipe},
                                          shares["interaction"], shares["scale"], lower=setup.lower_is_better)
    return {
        "parts": recipe_of(cells["both"]), "parts_text": recipe_text(cells["both"]),
        "cells": {name: {"gene": keys[name], "values": per_cell[name], **stats.describe(per_cell[name], setup.confidence)}
                  for name in ("neither", "mechanism", "recipe", "both")},
        "scale": shares["scale"], "n": shares["n"], "n_dropped": shares["n_dropped"],
        "shares": changes, "interaction": interaction, "larger": larger,
    }


def _comparison(numbers: Mapping) -> dict | None:
    if not numbers:
        return None
    keys = ("scale", "difference", "diff_ci_low", "diff_ci_high", "relative", "relative_ci_low", "relative_ci_high",
            "p_value", "p_holm", "family_size", "cohens_d", "verdict", "verdict_label")
    return {k: numbers.get(k) for k in keys}


# -- output ---------------------------------------------------------------------------------------
def figure_items(result: Mapping) -> list[dict]:
    """The bars of ``ablation.png``: each contribution's change (``value``, ``low``, ``high``)."""
    def bar(c: Mapping, label: str) -> dict:
        return {"kind": c.get("kind"), "label": label, "value": c.get("metric_change"),
                "low": c.get("metric_change_low"), "high": c.get("metric_change_high")}

    items = [bar(result["total"], "whole gene vs baseline")] if result.get("total") else []
    for c in result.get("contributions", []):
        field = FIELD_LABELS.get(c["field"], c["field"])
        label = f"without {field}" if c["kind"] == "remove" else f"baseline + {field}"
        items.append(bar(c, f"{label} ({str(c['change']).split(': ', 1)[-1]})"))
    return items


def write_ablation(result: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``ablation.{json,md,png}`` (``ablation_test.*`` for the test split) into ``out_dir``;
    with a learning-rate grid also ``ablation_lr_grid.png`` (``grid`` in the paths)."""
    from evo_attention.report.figures import plot_contributions

    paths = write_json_and_markdown("ablation", result, out_dir, ablation_markdown(result))
    metric = result.get("metric", "val_perplexity")
    label, _, _ = metric_info(metric)
    plot_contributions(figure_items(result), paths["png"],
                       xlabel=f"change of {label} the field causes, with it minus without it ({metric_direction(metric)}):"
                              f" mean and {stats.percent(result.get('confidence', 0.95))} CI",
                       title=f"Ablation of {result.get('str')}, {len(result.get('seeds') or [])} seeds")
    grids.add_grid_figure(paths, result, "ablation", out_dir)
    return paths
