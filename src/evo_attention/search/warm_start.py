"""Warm start (``init_from: RUN[:K]``; docs/search.md): a search's first generation from the best
genes of an earlier run, and seeded starts (``start_from``).

``initial_genes`` reads the store in ``RUN``, ranks its finished search genes the way that run ranked
them (``ranked_genes``) and takes the best ``K`` (default: this run's population size); a gene that
does not fit this run (``outside_space``: a field value the space does not list, a component not
registered here, a genome of another shape) is skipped with one warning line. The genes and where
they came from are kept in the new run's meta ``init_from``, so a resume replays the same first
generation without reading ``RUN`` again. Results are not copied: the genes train again in the new run.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from evo_attention.genes import (ALL_FIELDS, CORE_FIELDS, AttentionGene, LayerGenes, SearchSpace, canonical_program,
                                 in_program_form, program_grammar, split_genes)
from evo_attention.search import constraints, pareto
from evo_attention.search.store import RACING_META, RunStore, search_records
from evo_attention.train.record import PRIMARY_OBJECTIVE, objective_values, usable_metric
from evo_attention.train.suite import scores_from_records
from evo_attention.util.errors import UserError

META_KEY = "init_from"
SUITE_META = "suite"  # a suite run's meta (search.evaluation.Suite): its points


def parse_init_from(text: str) -> tuple[str, int | None]:
    """``"runs/a:4"`` -> ``("runs/a", 4)``; ``"runs/a"`` -> ``("runs/a", None)``."""
    head, sep, tail = str(text).rpartition(":")
    if sep and head and tail.strip().isdigit():
        return head, int(tail)
    return str(text), None


def outside_space(key: str, space: SearchSpace) -> str | None:
    """Why the genome ``key`` does not fit ``space`` (None when it does)."""
    try:
        genome = AttentionGene.parse(key)
    except (ValueError, UserError) as exc:
        return f"it cannot be read here ({str(exc).splitlines()[0]}): is a plugin of the earlier run missing?"
    layers = list(genome.layers) if isinstance(genome, LayerGenes) else None
    if space.layers and layers is None:
        return (f"it is one gene shared by every layer; this run searches per-layer genomes of {space.layers} layers "
                "(one is its layers' genes joined by ' / ')")
    if not space.layers and layers is not None:
        return f"it is a per-layer genome of {len(layers)} layers; this run searches one gene shared by every layer"
    if layers is not None and len(layers) != space.layers:
        return f"it is a per-layer genome of {len(layers)} layers; this run's genomes have {space.layers}"
    programs_space = getattr(space, "program_space", None)
    for i, gene in enumerate(layers or [genome], 1):
        values = gene.to_dict()
        where = f"layer {i}: " if layers is not None else ""
        fields = ALL_FIELDS
        if programs_space is not None and gene.program is not None:  # a program: the space's rule, not a list
            problem = programs_space.admits(canonical_program(gene.program), program_grammar())
            if problem:
                return f"{where}{problem}"
            fields = [name for name in ALL_FIELDS if name not in ("program", *CORE_FIELDS)]
        for name in fields:
            options = space.options(name)
            if values[name] not in options:
                shown = ", ".join("default" if o is None else str(o) for o in options)
                return f"{where}{name} {values[name]} is not an option of this run's search space ({shown})"
    return None


def ranked_genes(store: RunStore, objectives, searched=None) -> list[str]:
    """The keys of the finished search genes of a run, best first, the way that run ranked them: by
    perplexity; with several objectives by Pareto front, crowding distance, then perplexity; genes over
    the run's own caps after the others; a suite run by suite accuracy, highest first, over the genes that
    trained on every point; a raced gene by its lower bound over its seeds (unranked when a seed failed).
    ``searched``: only these search records (default: the store's)."""
    config = store.config() or {}
    bounds = {str(r["gene"]): r["told"] for r in (store.get_meta(RACING_META) or {}).get("genes") or []}
    failed = {key for key, told in bounds.items() if told is None}  # raced and failed on a seed: unranked
    suite = store.get_meta(SUITE_META)
    if searched is None:  # with genes told from the baseline
        searched = search_records(store.evaluations(), store.generations())
    if suite:  # a suite run ranks by suite accuracy, the genes that trained on every point
        scores = scores_from_records(searched, suite, seed=config.get("seed"))
        ranked = sorted((bounds.get(key, -score.aggregate), key) for key, score in scores.items()
                        if score.aggregate is not None and not score.all_failed and key not in failed)
        return [key for _, key in ranked]
    limits = (store.get_meta(constraints.META_LIMITS) or {}).get("limits") or {}
    records: dict[str, dict] = {}
    for record in searched:
        if (usable_metric(record) is None or int(record.get("steps") or 0) < int(config.get("train_steps") or 0)
                or str(record["gene"]) in failed):
            continue
        records.setdefault(str(record["gene"]), record)
    keys = list(records)
    over = {k for k in keys if constraints.violation(constraints.record_excess(records[k], limits)) > 0}
    objectives = list(objectives)

    def order(group: list[str]) -> list[str]:
        ties = [(bounds.get(k, usable_metric(records[k])), k) for k in group]
        if len(objectives) == 1:
            return [k for _, k in sorted(ties)]
        points = [objective_values(records[k], objectives) for k in group]
        return [group[i] for i in pareto.pareto_order(points, ties)]

    return order([k for k in keys if k not in over]) + order([k for k in keys if k in over])


def _is_dir(text: str) -> bool:
    try:
        return Path(text).is_dir()
    except OSError:  # e.g. a gene list too long to be a file name
        return False


def initial_genes(init_from: str, *, space: SearchSpace, population_size: int,
                  objectives=(PRIMARY_OBJECTIVE,), warn: bool = True, setting: str = "init_from") -> dict:
    """The warm start ``init_from`` names: ``{"run", "k", "genes" (keys, best first), "skipped"
    ([{"gene", "reason"}])}``; each skipped gene is one warning line (``warn``)."""
    run, k = parse_init_from(init_from)
    k = population_size if k is None else k
    if not RunStore.exists(run):
        raise UserError(f"{setting} {init_from}: no run in {run} (a directory an earlier search wrote its run.db into)",
                        setting=setting)
    with RunStore.open(run, readonly=True) as store:
        ranked = ranked_genes(store, objectives)
    if not ranked:
        raise UserError(f"{setting} {init_from}: the run in {run} has no finished search evaluation to start from",
                        setting=setting)
    genes, skipped = [], []
    for key in ranked[:k]:
        key = in_program_form(key, space)
        reason = outside_space(key, space)
        if reason is None:
            genes.append(AttentionGene.parse(key).key)
            continue
        skipped.append({"gene": key, "reason": reason})
        if warn:
            warnings.warn(f"{setting} {run}: skipping gene {key}: {reason}", stacklevel=2)
    if warn and len(genes) > population_size:
        warnings.warn(f"{setting} {init_from}: {len(genes)} genes fit this run, and its population holds "
                      f"{population_size}: the best {population_size} are taken", stacklevel=2)
    return {"run": str(Path(run)), "k": k, "genes": genes[:population_size], "skipped": skipped,
            "available": len(ranked)}


START_META = "start_from"  # the store's meta of a seeded start: the text and the genes it resolved to
RANDOM_START = "random"


def starting_genes(start_from: str, *, space: SearchSpace, population_size: int, vanilla: str,
                   objectives=(PRIMARY_OBJECTIVE,), default_of: str | None = None) -> dict | None:
    """The genes a seeded start names (``start_from``): ``vanilla`` (``Config.vanilla_gene``, never
    the ``baseline_gene``), genes (``split_genes``: gene strings or program genes), or an earlier run's
    best (``RUN[:K]``, as ``init_from`` reads it); each in its program form in a program space. Returns
    ``{"start_from", "genes", "skipped"}``, or None for ``random`` (random draws, no seeded start).
    Generation 0 is these genes and one-edit neighbours of them (``Strategy.warm_start``).
    ``default_of``: the strategy whose default start this is (no ``start_from`` was given)."""
    text = str(start_from).strip()
    if text == RANDOM_START:
        return None
    if text == "vanilla":
        keys, skipped = [vanilla], []
    elif "|" not in text and _is_dir(text.rpartition(":")[0] or text):
        found = initial_genes(text, space=space, population_size=population_size, objectives=objectives,
                              setting="start_from")
        keys, skipped = found["genes"], found["skipped"]
    else:
        keys, skipped = [], []
        for item in split_genes(text):
            try:
                keys.append(AttentionGene.parse(item).key)
            except (ValueError, UserError) as exc:
                raise UserError(f"start_from {item!r} is not a gene, 'vanilla', 'random' or a run directory: {exc}",
                                setting="start_from") from None
    genes = []
    for key in keys:
        key = in_program_form(key, space)
        reason = outside_space(key, space)
        if reason is not None and default_of:
            raise UserError(f"the {default_of} strategy starts from the vanilla gene {key} when no start_from is "
                            f"given, and it is outside this run's search space: {reason}; give start_from genes "
                            "inside it", setting="start_from")
        if reason is not None:
            raise UserError(f"start_from gene {key} is outside this run's search space: {reason}; give start_from "
                            "genes inside it, or widen the space", setting="start_from")
        genes.append(AttentionGene.parse(key).key)
    if not genes:
        raise UserError(f"start_from {text!r} names no gene to start from", setting="start_from")
    genes = list(dict.fromkeys(genes))
    if len(genes) > population_size:
        raise UserError(f"start_from names {len(genes)} genes, more than population_size {population_size} holds: "
                        "give fewer genes or a larger population_size", setting=("start_from", "population_size"))
    return {"start_from": text, "genes": genes, "skipped": skipped}
