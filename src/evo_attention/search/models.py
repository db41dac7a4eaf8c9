"""The trained models a search keeps (``keep_models`` K): ``RUN_DIR/models/<gene>-<digest>/``.

Each is a ``save_pretrained`` directory whose config.json names the evaluation that measured it,
written from the files the worker that trained it sent back (``executors.base.store_model``): the
kept weights are exactly those whose result the store holds. ``prune`` keeps the K best as the run
ranks its genes (``warm_start.ranked_genes``), after every trained evaluation (a raced run: after
each generation's races). Only full-budget search evaluations are kept; an evaluation answered from
the store brings no new model.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

from evo_attention.search.store import KEY_FIELDS, RunStore
from evo_attention.search.warm_start import ranked_genes
from evo_attention.train.record import PRIMARY_OBJECTIVE
from evo_attention.util.errors import UserError

MODELS_DIR = "models"
KEEP_MODELS = "keep_models"  # meta: the run's kept-models count, read back on resume


def model_dir(run_dir: str | Path, gene: str) -> Path:
    """The directory a gene's kept model gets in a run."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", gene).strip("_")
    return Path(run_dir) / MODELS_DIR / f"{slug}-{hashlib.sha256(gene.encode()).hexdigest()[:8]}"


def _perplexity(evaluation: dict) -> float:
    value = evaluation.get("val_perplexity")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.inf


def _run_ranking(run_dir: str | Path, found: list[dict], store=None) -> list[str]:
    """The genes of the kept models ``found`` as the run ranks them (``warm_start.ranked_genes``: a raced gene by
    its told value), or none; ranked from their own records, since one objective orders a gene by its own record
    and told value alone, so reads do not grow with the run. ``store``: the run's store, open (else opened here)."""
    if store is None:
        if not RunStore.exists(run_dir):
            return []
        with RunStore.open(run_dir, readonly=True) as store:
            return _run_ranking(run_dir, found, store)
    records = [store.lookup(*key) for m in found for key in [tuple(m.get(f) for f in KEY_FIELDS)] if None not in key]
    return ranked_genes(store, (PRIMARY_OBJECTIVE,), [r for r in records if r is not None])


def kept_models(run_dir: str | Path, store=None) -> list[dict]:
    """The run's kept models, best first: ``{"rank", "dir", "gene", "val_perplexity", ...}`` (the
    evaluation each config.json records; ``store``: the run's, open). Files are checked when a model is loaded."""
    root = Path(run_dir) / MODELS_DIR
    found = []
    for directory in sorted(root.iterdir()) if root.is_dir() else ():
        if directory.name.startswith(".") or not (directory / "config.json").is_file():
            continue  # a directory being written, or a foreign one
        try:
            evaluation = json.loads((directory / "config.json").read_text(encoding="utf-8"))["evaluation"]
            gene = str(evaluation["gene"])
        except (OSError, ValueError, KeyError, TypeError):
            evaluation, gene = {}, directory.name  # damaged: ranked last, and named when it is loaded
        found.append({**evaluation, "gene": gene, "dir": str(directory)})
    order = {gene: i for i, gene in enumerate(_run_ranking(run_dir, found, store))}
    found.sort(key=lambda m: (order.get(m["gene"], len(order)), _perplexity(m), m["gene"]))
    return [{"rank": i + 1, **m} for i, m in enumerate(found)]


def kept_model_of(run_dir: str | Path, key: tuple) -> dict | None:
    """The run's kept model (as ``kept_models`` lists it) of the training ``key`` (``Trial.key()``), or None."""
    return next((m for m in kept_models(run_dir) if tuple(m.get(f) for f in KEY_FIELDS) == tuple(key)), None)


def prune(run_dir: str | Path, keep: int, store=None) -> list[dict]:
    """Delete every kept model below the ``keep`` best; the ones left, best first (``store``: the run's, open)."""
    ranked = kept_models(run_dir, store)
    for extra in ranked[keep:]:
        shutil.rmtree(extra["dir"], ignore_errors=True)
    return ranked[:keep]


def kept_model(run_dir: str | Path, rank: int) -> Path:
    """The directory of the run's ``rank``-th best kept model (1 = best); UserError naming the run
    when it kept none or fewer."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UserError(f"rank must be a positive integer (1 = the best kept model), got {rank!r}", setting="rank")
    if not Path(run_dir).is_dir():
        raise UserError(f"no run directory {run_dir}: give the --out directory of a search")
    ranked = kept_models(run_dir)
    if not ranked:
        if not RunStore.exists(run_dir):
            raise UserError(f"{run_dir} holds no run (no run.db): give the --out directory of a search")
        with RunStore.open(run_dir, readonly=True) as store:
            keep = store.get_meta(KEEP_MODELS)
        if keep:  # a resume answers the trainings from the store, so it never writes their models again
            raise UserError(f"the run in {run_dir} keeps {keep} trained model(s), but their files in "
                            f"{Path(run_dir) / MODELS_DIR} are missing (deleted?): a resumed run never trains them "
                            "again; restore them, or run the search again with overwrite (or give a model directory)",
                            setting="overwrite")
        raise UserError(f"the run in {run_dir} kept no trained models: run the search with keep_models K (or give "
                        "a model directory)", setting="keep_models")
    if rank > len(ranked):
        raise UserError(f"rank {rank} is beyond the {len(ranked)} model{'s' if len(ranked) != 1 else ''} the run in "
                        f"{run_dir} kept: give a rank from 1 to {len(ranked)}", setting="rank")
    return Path(ranked[rank - 1]["dir"])
