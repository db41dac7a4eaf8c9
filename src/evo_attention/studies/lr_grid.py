"""Each gene at its own best learning rate: a grid of rates, the same for every gene.

A shared rate handicaps a gene that learns best at another one (or favours the gene it was tuned
for). With a grid (``StudySetup.lr_grid``) every gene, the baseline included, gets the same tuning
budget, and each gene is compared at its own best rate:

1. **Tuning.** Every gene at every rate of the grid on the *tuning seeds*
   (``StudySetup.tuning_seeds``: ``seed + 1001 ... seed + 1000 + T``), measured on the validation
   split whatever split the study reports on; a ``Trial`` each through ``StudySetup.run`` (cached by
   the run store: a resumed grid trains nothing again), stored with the role ``lr-grid``.
2. **Selection** (``RULE``): the best mean over the tuning seeds among the rates at which every
   tuning seed finished (if every rate had failures, the fewest failures first), ties to the smaller
   rate. A rate at an end of the grid is flagged ``at_edge``: the grid should be widened.
3. **The verdict.** Each gene at its rate on the study's own seeds (``seed + 1 ... seed + N``,
   disjoint from the tuning seeds) and split, against the baseline at the baseline's rate, paired by
   seed. Holm's family is that of the baseline trainings at its rate (``versus_baseline``).

``tune`` runs steps 1 and 2 and returns the ``grid`` block a result carries; ``selected_rates``
reads the rates from it; ``train_at_rates`` and ``versus_baseline`` make step 3.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

from evo_attention.genes import AttentionGene, recipe_of
from evo_attention.report.studies.common import metric_info
from evo_attention.report.studies.lr_grid import grid_figure_name
from evo_attention.search.tuning import select_rate as select
from evo_attention.studies.common import Records, StudySetup, gene_keys, samples
from evo_attention.util.errors import UserError

TUNING_ROLE = "lr-grid"  # the role the tuning trainings are stored with
RULE = ("each gene trained at every rate on the tuning seeds, measured on the validation split; its rate: the best "
        "mean over the rates at which every tuning seed finished (fewest failures first), ties to the smaller rate; "
        "the verdict is measured at that rate on the study's seeds, disjoint from the tuning seeds")


def tune(setup: StudySetup, genes: Sequence[AttentionGene | str], *, labels: Mapping[str, str] | None = None) -> dict:
    """Train every gene at every rate of ``setup.lr_grid`` on ``setup.tuning_seeds`` (validation
    split; from the store where there) in one call of the runner, and select each gene's rate:
    the ``grid`` block (see ``grid_of``)."""
    keys = gene_keys(genes)
    return grid_of(setup, keys, tuning_setup(setup).run(tuning_tasks(setup, keys, labels=labels)))


def tuning_setup(setup: StudySetup) -> StudySetup:
    """The setup of the tuning trainings: the tuning seeds, the validation split, role ``lr-grid``."""
    return dataclasses.replace(setup, seeds=tuple(setup.tuning_seeds), eval_split="valid", role=TUNING_ROLE,
                               planned=None)


def tuning_tasks(setup: StudySetup, genes: Sequence[AttentionGene | str], *,
                 labels: Mapping[str, str] | None = None) -> list:
    """Every gene at every rate of ``setup.lr_grid`` on the tuning seeds: the tasks of step 1, for
    a caller that runs them together with other tasks (``grid_of`` reads their records)."""
    keys = gene_keys(genes)
    check_rates_free(keys)
    tuning = tuning_setup(setup)
    return [task for rate in setup.lr_grid for task in tuning.at_rate(rate).tasks(keys, _at(keys, rate, labels))]


def grid_of(setup: StudySetup, genes: Sequence[AttentionGene | str], results: Mapping) -> dict:
    """The ``grid`` block (step 2) from the records of this setup's ``tuning_tasks`` (task -> record):
    the rates, the tuning and verdict seeds, and per gene its ``curve`` (per rate: the tuning values,
    their mean and failures), ``selected`` rate and ``at_edge``; ``at_edge`` also lists the genes whose
    rate is an end of the grid."""
    rates, seeds = list(setup.lr_grid), list(setup.tuning_seeds)
    records: dict[float, Records] = {rate: {} for rate in rates}
    for task, record in results.items():
        records[task.trial.train.learning_rate][task.gene, task.seed] = record
    rows = {}
    for key in gene_keys(genes):
        curve = []
        for rate in rates:
            sample = samples(records[rate], key, seeds, setup.metric)
            finished = [v for v in sample["values"] if v is not None]
            curve.append({"lr": rate, "mean": sum(finished) / len(finished) if finished else None,
                          "values": sample["values"], "n_failed": sample["n_failed"]})
        chosen = select(curve, setup.lower_is_better)
        rows[key] = {"str": str(AttentionGene.parse(key)), "baseline": key == setup.baseline, "curve": curve,
                     "selected": chosen, "at_edge": chosen in (rates[0], rates[-1])}
    return {"rates": rates, "tuning_seeds": seeds, "verdict_seeds": list(setup.seeds), "tuning_split": "valid",
            "metric": setup.metric, "metric_label": setup.metric_label, "lower_is_better": setup.lower_is_better,
            "rule": RULE, "genes": rows, "at_edge": [k for k, g in rows.items() if g["at_edge"]]}


def check_rates_free(genes: Sequence[AttentionGene | str]) -> None:
    """UserError (naming ``lr_grid``) for a gene that sets its own learning rate (an ``lr=`` part):
    the grid could not change it."""
    fixed = next((g for g in genes if recipe_of(g).get("learning_rate") is not None), None)
    if fixed is not None:
        key = AttentionGene.parse(fixed).key
        raise UserError(f"gene {key} sets its own learning rate (lr={recipe_of(key)['learning_rate']:g}), which a "
                        "learning-rate grid would not change: leave out lr_grid, or give the gene without its lr= part",
                        setting="lr_grid")


def _at(keys: Sequence[str], rate: float, labels: Mapping[str, str] | None) -> dict[str, str]:
    """Progress labels that say the rate: ``NAME at lr RATE`` (``lr RATE`` for a gene without a name)."""
    labels = labels or {}
    return {k: f"{labels[k]} at lr {rate:g}" if k in labels else f"lr {rate:g}" for k in keys}


def selected_rates(grid: Mapping) -> dict[str, float]:
    """Gene key -> its selected rate, from a ``grid`` block."""
    return {key: row["selected"] for key, row in grid["genes"].items()}


def with_verdict_seeds(grid: Mapping, seeds: Sequence[int]) -> dict:
    """The block with the seeds the verdict was measured on (they change when seeds are planned)."""
    return {**grid, "verdict_seeds": list(seeds)}


def train_at_rates(setup: StudySetup, genes: Sequence[AttentionGene | str], rates: Mapping[str, float], *,
                   labels: Mapping[str, str] | None = None, on_finished=None) -> Records:
    """The record of every (gene, seed) of ``setup.seeds``, each gene trained at its rate of
    ``rates`` (one call of the runner; from the store where there)."""
    keys = gene_keys(genes)
    tasks = [task for key in keys for task in setup.at_rate(rates[key]).tasks([key], _at([key], rates[key], labels))]
    return {(task.gene, task.seed): record for task, record in setup.run(tasks, on_finished=on_finished).items()}


def versus_baseline(setup: StudySetup, values: Mapping[str, Sequence], baseline: Sequence,
                    rates: Mapping[str, float]) -> dict[str, dict]:
    """``StudySetup.versus_baseline`` for genes at their own rates: each gene's per-seed values
    against the baseline's at the baseline's rate, Holm over the family of the baseline trainings
    at that rate (``store_family``)."""
    return setup.at_rate(rates[setup.baseline]).versus(values, baseline, store_family(setup, values, rates))


def store_family(setup: StudySetup, genes: Sequence[str] | Mapping[str, object],
                 rates: Mapping[str, float]) -> dict[str, dict]:
    """The store's other comparisons against the baseline trainings at the baseline's rate
    (``StudySetup.others`` of the setup at that rate). A gene of ``genes`` whose rate differs from
    the baseline's and that the store also holds at the baseline's rate (an earlier comparison at
    that rate) joins as a comparison of its own, named ``GENE @ lr RATE``."""
    base_rate = rates[setup.baseline]
    keys = list(genes)
    same = [k for k in keys if rates.get(k) == base_rate]
    return {(k if k not in keys else f"{k} @ lr {base_rate:g}"): pair
            for k, pair in setup.at_rate(base_rate).others(same).items()}


# -- output ---------------------------------------------------------------------------------------
def panel(grid_genes: Mapping[str, Mapping], title: str = "") -> dict:
    """One panel of the figure: a line per gene (the baseline first) with its selected rate."""
    rows = sorted(grid_genes.items(), key=lambda item: not item[1].get("baseline"))
    return {"title": title, "genes": [{"label": ("baseline " if g.get("baseline") else "") + str(g.get("str", k)),
                                       "baseline": bool(g.get("baseline")), "curve": g.get("curve") or [],
                                       "selected": g.get("selected"), "at_edge": bool(g.get("at_edge"))}
                                      for k, g in rows]}


def add_grid_figure(paths: dict, result: Mapping, kind: str, out_dir: str | os.PathLike,
                    panels: Callable[[Mapping], Sequence[dict]] | None = None) -> None:
    """With a ``grid`` block in ``result``: draw its curves (``panels(grid)``, default one panel of its
    genes) as ``<kind>_lr_grid.png`` (``grid_figure_name``) in ``out_dir``, its path as ``paths["grid"]``."""
    from evo_attention.report.figures import plot_lr_grid

    grid = result.get("grid")
    if not grid:
        return
    _, _, axis = metric_info(grid.get("metric", "val_perplexity"), "valid")
    seeds, name = grid.get("tuning_seeds") or [], grid_figure_name(kind, result.get("eval_split", "valid"))
    paths["grid"] = plot_lr_grid([panel(grid["genes"])] if panels is None else panels(grid), Path(out_dir) / name,
                                 ylabel=f"{axis}, mean over {len(seeds)} tuning seed{'s' if len(seeds) != 1 else ''}",
                                 title=f"Learning-rate grid: tuning seeds {', '.join(map(str, seeds))}; ringed: "
                                       "selected")
