"""A gene's score on a suite: one training per (gene, point, seed), one number per gene and seed.

    from evo_attention.data.suites import load_suite
    from evo_attention.train.suite import point_configs, suite_score

    suite = load_suite("mad-cpu")
    configs = point_configs(config, suite)           # label -> the Config of a training on that point
    trial = Trial.from_config(gene, configs["recall"], seed=seed, data=...)
    score = suite_score(suite.labels, {label: record, ...})
    score.aggregate, score.point("recall").accuracy, score.failed

The contract every user of a suite shares (``search --suite``, ``compare --suite``,
``validate --suite`` and the report):

- **A training on a point is an ordinary Trial** of ``point_config(config, point)``: the caller's
  Config overlaid with ``point.settings()`` (the point's data name, task options and steps), cached
  like any other.
- **Steps: the suite's win.** ``train_steps`` applies only to the points the suite gives none
  steps; for other steps, write a suite file (``steps:`` at the top or per point).
- **The score of a gene on one seed** (``SuiteScore``): per point, the accuracy over the answer
  positions (a language point: next-token accuracy), its validation loss and ``eval_tokens``,
  ``eval_complete``; the **aggregate is the mean accuracy over all points**, weighted by the suite's
  weights where it gives any. A point whose training failed (or finished without a finite accuracy)
  scores **0** and is listed in ``failed``, never dropped. A point without a record yet is
  ``missing``, and the aggregate is then None.
- **Higher is better.** The aggregate is maximised (``SUITE_OBJECTIVE``, ``suite_accuracy``); a
  strategy, which minimises, is told its negative (``search.evaluation.Suite``).

``suite_meta`` is what a run store keeps of its suite (labels, data names, steps, and the data
fingerprint and context of every point's trainings), so the report and ``status`` rebuild every
score from the store alone; ``scores_from_records`` does that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from evo_attention.train.config import Config
from evo_attention.train.presets import overlay
from evo_attention.train.record import SUITE_OBJECTIVE, Status, usable_metric
from evo_attention.util.errors import UserError

FAILED_ACCURACY = 0.0  # what a failed point contributes to the aggregate
MISSING = "missing"  # the status of a point without a record
NO_ACCURACY = "no_accuracy"  # the status of an 'ok' training without a finite accuracy

__all__ = ["FAILED_ACCURACY", "SUITE_OBJECTIVE", "PointResult", "SuiteScore", "point_config", "point_configs",
           "scores_from_records", "suite_meta", "suite_score"]


# -- the trainings ------------------------------------------------------------------------------------
def point_config(config: Config, point) -> Config:
    """``config`` overlaid with ``point.settings()``; UserError naming the point if that is not a valid
    Config (e.g. a warm-up longer than the point's steps)."""
    settings = overlay(config.to_dict(), point.settings())
    try:
        return Config.from_dict(settings, source=f"suite point {point.label}")
    except UserError as error:
        raise UserError(f"suite point {point.label}: {error}", setting=error.settings) from None


def point_configs(config: Config, suite) -> dict[str, Config]:  # by label, in the suite's order
    return {point.label: point_config(config, point) for point in suite.points}


# -- the score ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PointResult:
    """One point of a gene's score on one seed."""

    label: str
    status: str  # the record's status; 'no_accuracy' (ok, no finite accuracy) or 'missing' (no record)
    accuracy: float | None = None  # the finite accuracy of a finished training, else None
    val_loss: float | None = None  # its finite validation loss, else None
    error: str | None = None
    eval_tokens: int | None = None  # the record's: the tokens its accuracy was scored on
    eval_complete: bool | None = None  # the record's: whether that was the whole split (None: an old record)

    @property
    def failed(self) -> bool:
        return self.status != MISSING and self.accuracy is None

    @property
    def scored(self) -> float | None:  # what this point adds to the aggregate (None: missing)
        if self.status == MISSING:
            return None
        return FAILED_ACCURACY if self.accuracy is None else self.accuracy


def point_result(label: str, record: Mapping | None) -> PointResult:
    """A point's result from its training's record (None: not trained yet)."""
    if record is None:
        return PointResult(label, MISSING)
    accuracy, loss = usable_metric(record, "accuracy"), usable_metric(record, "val_loss")
    status = str(record.get("status"))
    if status == Status.OK and accuracy is None:
        status = NO_ACCURACY
    error = record.get("error")
    return PointResult(label, status, accuracy, loss, None if error is None else str(error),
                       record.get("eval_tokens"), record.get("eval_complete"))


@dataclass(frozen=True)
class SuiteScore:
    """A gene's score on a suite for one seed: a ``PointResult`` per point, in the suite's order."""

    points: tuple[PointResult, ...]
    weights: tuple[float, ...] | None = None  # one per point (the suite's); None: all 1

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.points)

    def point(self, label: str) -> PointResult:
        return next(p for p in self.points if p.label == label)

    @property
    def failed(self) -> tuple[str, ...]:  # the points whose training failed (each scores 0)
        return tuple(p.label for p in self.points if p.failed)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.points if p.status == MISSING)

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def aggregate(self) -> float | None:
        """The weighted mean accuracy over all points (a failed one counts 0); None while one is missing."""
        if not self.points or self.missing:
            return None
        if self.weights is None:
            return math.fsum(p.scored for p in self.points) / len(self.points)
        return math.fsum(w * p.scored for w, p in zip(self.weights, self.points)) / math.fsum(self.weights)

    @property
    def all_failed(self) -> bool:
        """Every point trained and every one failed (the gene has no result at all)."""
        return self.complete and bool(self.points) and len(self.failed) == len(self.points)

    def to_dict(self) -> dict:
        return {"aggregate": self.aggregate, "failed": list(self.failed), "missing": list(self.missing),
                "points": {p.label: {"status": p.status, "accuracy": p.accuracy, "val_loss": p.val_loss,
                                     "error": p.error, "eval_tokens": p.eval_tokens, "eval_complete": p.eval_complete}
                           for p in self.points}}


def suite_score(labels: Sequence[str], records: Mapping[str, Mapping | None],
                weights: Sequence[float] | None = None) -> SuiteScore:
    """The score from each point's record (by label; absent: missing), with the suite's ``weights``."""
    weights = None if weights is None or all(w == 1 for w in weights) else tuple(float(w) for w in weights)
    return SuiteScore(tuple(point_result(label, records.get(label)) for label in labels), weights)


# -- what a run store keeps of its suite -----------------------------------------------------------
def suite_meta(suite, trials: Mapping[str, object]) -> dict:
    """The run store's record of ``suite`` (meta ``suite``); per point the data fingerprint and context
    of its trainings too (``trials``: label -> a Trial of that point with its fingerprint; any gene, seed)."""
    return {
        "name": suite.name, "source": suite.source, "description": suite.description,
        "points": [{"label": p.label, "data": p.data, "options": dict(p.options), "steps": trials[p.label].steps,
                    "fingerprint": trials[p.label].task.fingerprint, "context": trials[p.label].context,
                    **({} if p.weight == 1 else {"weight": p.weight})}
                   for p in suite.points],
    }


def point_of(record: Mapping, meta: Mapping) -> str | None:
    """The label of the point ``record`` trained on (by data fingerprint, steps and context), else None."""
    for p in meta.get("points") or []:
        if (record.get("data_fingerprint") == p.get("fingerprint") and record.get("context") == p.get("context")
                and int(record.get("steps") or 0) == int(p.get("steps") or -1)):
            return str(p["label"])
    return None


def scores_from_records(records: Iterable[Mapping], meta: Mapping, *, seed: int | None = None) -> dict[str, SuiteScore]:
    """The suite score of every gene among ``records`` (one seed: ``seed``, else each record's own;
    the first record of a (gene, point) counts), by gene key in order of first appearance; records
    of no point of the suite are left out. The points' weights are the kept ones (1 where none is)."""
    labels = tuple(str(p["label"]) for p in meta.get("points") or [])
    weights = tuple(float(p.get("weight", 1.0)) for p in meta.get("points") or [])
    found: dict[str, dict[str, Mapping]] = {}
    for record in records:
        if seed is not None and record.get("seed") != seed:
            continue
        label = point_of(record, meta)
        if label is not None:
            found.setdefault(str(record.get("gene")), {}).setdefault(label, record)
    return {gene: suite_score(labels, by_label, weights) for gene, by_label in found.items()}

