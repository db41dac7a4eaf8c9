"""EvaluationRecord: the result of one training, the one record type from the trainer through the
run store to every report.

A record is identified by its cache key ``(gene, seed, steps, data_fingerprint, context)``.
``status`` says how the training ended; a failed record keeps its metrics at NaN/inf and says why in
``error``. ``metric(name)`` is the one way to ask for a usable number: the finite value of a
successful training, else None. The run store adds ``id``, ``role``, ``generation`` and
``created_at``; keys of an older or foreign record that are not fields here are kept in ``extra``
and written back unchanged. Records read like a mapping too (``record.get("budget")``).

Objectives: a search minimises ``perplexity`` and optionally cost measures of the same record
(``OBJECTIVES``); ``objective_values`` is the one rule that turns a record into the vector a
multi-objective strategy is told and the reports rank by.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

from evo_attention.util.format import finite_or_none


class Status(str, enum.Enum):
    """How a training ended. Compares equal to its string value (``Status.OK == "ok"``)."""

    OK = "ok"
    DIVERGED = "diverged"  # a non-finite loss ended the training early
    OOM = "oom"  # the device ran out of memory
    ERROR = "error"  # any other exception, or a worker that kept dying

    __str__ = str.__str__
    __format__ = str.__format__


# Keys written only when set (None / False means absent), and the keys the store adds (present,
# maybe None, exactly when the record came from a store).
_OPTIONAL = ("eval_bytes", "eval_chars", "bits_per_byte", "bits_per_char", "latency_ms", "latency_ms_iqr",
             "latency_threads", "budget", "resumed_from", "checkpoint", "audit")
_STORED = ("id", "role", "generation", "created_at")


@dataclass(eq=False)
class EvaluationRecord(Mapping):
    # identity: the cache key, plus the split it was measured on
    gene: str
    seed: int
    steps: int
    data_fingerprint: str
    context: str  # settings_hash of the other settings that shape the result
    data: str = ""  # the dataset's name
    status: Status = Status.OK
    error: str | None = None
    # evaluation
    val_loss: float = math.nan
    val_perplexity: float = math.inf
    accuracy: float = math.nan
    eval_tokens: int = 0
    eval_split: str = "valid"
    eval_tokens_total: int | None = None
    eval_complete: bool | None = None
    eval_bytes: int | None = None  # UTF-8 bytes of the scored text (corpora only)
    eval_chars: int | None = None  # its characters
    bits_per_byte: float | None = None  # total NLL in bits / eval_bytes
    bits_per_char: float | None = None  # total NLL in bits / eval_chars
    # training
    train_loss: float = math.nan
    trained_steps: int = 0
    curve: list = field(default_factory=list)  # [step, mean train loss over the last log interval]
    val_curve: list = field(default_factory=list)  # [step, validation loss] at a few steps (trainer.VAL_POINTS)
    params: int | None = None
    flops_per_step: int | None = None
    time_s: float | None = None
    train_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_mb: float | None = None
    # inference: the median and interquartile range of timed eval-mode forward passes over one
    # evaluation batch (Trainer.measure_latency), and the CPU threads torch used for them
    latency_ms: float | None = None
    latency_ms_iqr: float | None = None
    latency_threads: int | None = None
    device: str | None = None
    precision: str | None = None
    compiled: bool | None = None  # the model ran through torch.compile
    versions: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    # multi-fidelity
    budget: int | None = None  # the full budget of the schedule this partial training belongs to
    resumed_from: int | None = None  # the step it continued from (0: trained from scratch)
    checkpoint: str | None = None  # the trainer state it left, relative to the run directory
    audit: bool = False  # trained to the full budget whatever its early loss
    # set by the run store
    id: int | None = None
    role: str | None = None
    generation: int | None = None
    created_at: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.status, Status):
            self.status = Status(self.status)

    # -- the one usable-metric rule --------------------------------------------------------------
    @property
    def ok(self) -> bool:  # finished with a finite validation loss
        return self.status == Status.OK and math.isfinite(self.val_loss)

    def metric(self, name: str = "val_perplexity") -> float | None:  # usable_metric
        return usable_metric(self, name)

    @property
    def key(self) -> tuple:
        return (self.gene, int(self.seed), int(self.steps), str(self.data_fingerprint), str(self.context))

    # -- conversion ------------------------------------------------------------------------------
    def to_dict(self) -> dict:  # every field (``extra`` merged in), optional ones only when set
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "extra")
        out = {name: value.value if isinstance(value, Status) else value
               for name, value in values if not self._absent(name, value)}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "EvaluationRecord":  # a stored record, or an older version's
        if isinstance(data, EvaluationRecord):
            return data
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        gene = known.get("gene")
        if gene is not None and not isinstance(gene, str):
            known["gene"] = gene.key
        known["audit"] = bool(known.get("audit", False))
        return cls(**known, extra=dict(data.get("extra") or {}, **extra) if "extra" in data else extra)

    def replace(self, **changes: Any) -> "EvaluationRecord":
        return dataclasses.replace(self, **changes)

    # -- read as a mapping -----------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        if name == "extra" or name not in _FIELD_NAMES or self._absent(name, getattr(self, name)):
            raise KeyError(name)
        return getattr(self, name)

    def _absent(self, name: str, value: Any) -> bool:
        if name in _OPTIONAL:
            return value is None or value is False
        return name in _STORED and self.role is None

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __eq__(self, other) -> bool:
        if isinstance(other, EvaluationRecord):
            return self.to_dict() == other.to_dict()
        return NotImplemented

    __hash__ = None


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(EvaluationRecord))


def usable_metric(record: Mapping, name: str = "val_perplexity") -> float | None:
    """The finite value of ``record[name]`` if the record's status is ok, else None (the one rule
    for "a result to rank by"; it reads an ``EvaluationRecord`` or any mapping of its keys)."""
    if record.get("status") != Status.OK:
        return None
    return finite_or_none(record.get(name))


# objective name -> the record field it reads (train_ms_per_step is derived from two fields); every
# objective is minimised, and the first objective of a search is always perplexity
OBJECTIVES = {
    "perplexity": "val_perplexity",
    "params": "params",
    "flops": "flops_per_step",
    "train_ms_per_step": None,
    "latency_ms": "latency_ms",
    "peak_memory_mb": "peak_memory_mb",
}
PRIMARY_OBJECTIVE = "perplexity"
# the primary (and only) objective of a search on a suite of tasks: a gene's mean accuracy over the
# suite's points, read from its records on every point (train.suite), maximised; not a record field
SUITE_OBJECTIVE = "suite_accuracy"


def objective_value(record: Mapping, name: str) -> float | None:
    """The usable value of objective ``name`` of ``record`` (None: failed, or lacking it)."""
    if name not in OBJECTIVES:
        raise KeyError(f"unknown objective {name!r}: valid objectives are {', '.join(OBJECTIVES)}")
    if usable_metric(record) is None:
        return None  # a failed training has no usable cost either
    if name == "train_ms_per_step":
        seconds, steps = finite_or_none(record.get("train_time_s")), finite_or_none(record.get("trained_steps"))
        return 1000.0 * seconds / steps if seconds is not None and steps else None
    return usable_metric(record, OBJECTIVES[name])


def objective_values(record: Mapping, names) -> tuple[float, ...]:
    """The objective vector of ``record`` (all minimised): ``inf`` in every place when the training
    failed, and in the place of an objective the record lacks."""
    if usable_metric(record) is None:
        return tuple(math.inf for _ in names)
    values = (objective_value(record, name) for name in names)
    return tuple(math.inf if v is None else float(v) for v in values)


def failed_record(gene: str, seed: int, steps: int, data: str, data_fingerprint: str, context: str, *,
                  status: Status | str = Status.ERROR, error: str | None = None, **fields: Any) -> EvaluationRecord:
    """The record of a training that could not produce a result."""
    return EvaluationRecord(gene=gene, seed=int(seed), steps=int(steps), data=data, data_fingerprint=data_fingerprint,
                            context=context, status=Status(status), error=error, **fields)
