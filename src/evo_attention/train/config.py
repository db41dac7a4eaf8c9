"""Config: every setting of a run in one validated dataclass.

Field names and defaults follow the original EvoAttention ``Config`` (vocab 10000, 128-dim,
4 heads, 2 layers, 128 tokens, 5000 steps, population 12 x 10 generations, ...), extended with
the data and training options this project adds. Construction validates every field and raises
``UserError`` (a ``ValueError``) naming the bad value; it has no side effects (no directories are
created, no device is probed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from evo_attention.util.errors import UserError

DATASETS = ("wikitext2", "text", "recall")
LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
FIDELITIES = ("full", "halving")


@dataclass
class Config:
    # model
    vocab_size: int | None = 10000  # None: the full training vocabulary of a word-level corpus
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    max_seq_len: int = 128
    dropout: float = 0.1
    d_ff: int | None = None  # None: 4 * d_model
    # training
    batch_size: int = 32
    eval_batch_size: int = 64
    learning_rate: float = 3e-4
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    train_steps: int = 5000
    eval_steps: int | None = 200  # cap on evaluation batches; None: the whole split
    warmup_steps: int = 500  # used by lr_schedule="cosine"
    lr_schedule: str = "constant"  # the original trained at a constant rate
    precision: str = "auto"
    log_every: int = 50  # learning-curve resolution (steps)
    # evolution
    population_size: int = 12
    n_generations: int = 10
    elite_size: int = 3
    mutation_rate: float = 0.3
    crossover_rate: float = 0.7
    seed: int = 42
    device: str = "auto"
    strategy: str = "ga"  # a name from evo_attention.search.STRATEGIES
    strategy_options: dict = field(default_factory=dict)  # e.g. {"dedupe": True, "seed_vanilla": True}
    search_space: dict = field(default_factory=dict)  # field -> allowed options; {} = everything registered
    baseline: bool = True  # also train the vanilla transformer under the same budget
    # multi-fidelity (fidelity.py): spend less than the full budget on clearly bad individuals
    fidelity: str = "full"  # "full" or "halving" (successive halving inside each generation)
    halving_eta: int = 3  # halving keeps the best 1/eta of the individuals at each rung
    halving_rungs: int = 3  # rungs of the schedule, the full budget included: budget/eta^k steps
    hurdle: float | None = None  # stop individuals worse than this quantile of the first rung
    halving_audit: int = 0  # per generation, this many random new individuals skip the stopping rules,
    # so the rank correlation between low and full fidelity is measured on an unselected sample
    # data
    data: str = "wikitext2"
    data_dir: str | None = None
    eval_stride: int | None = None
    recall: dict = field(default_factory=dict)  # options of the generated recall task

    def __post_init__(self):
        def positive(name, allow_none=False):
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be a positive integer, got {value!r}")

        for name in ("d_model", "n_heads", "n_layers", "max_seq_len", "batch_size", "eval_batch_size",
                     "train_steps", "population_size", "n_generations", "log_every"):
            positive(name)
        for name in ("d_ff", "eval_steps", "eval_stride"):
            positive(name, allow_none=True)
        if self.vocab_size is not None:
            positive("vocab_size")
            if self.vocab_size < 2:
                raise UserError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.d_model % self.n_heads:
            raise UserError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}: choose sizes with d_model % n_heads == 0"
            )
        if isinstance(self.elite_size, bool) or not isinstance(self.elite_size, int) or self.elite_size < 0:
            raise UserError(f"elite_size must be a non-negative integer, got {self.elite_size!r}")
        if self.elite_size >= self.population_size:
            raise UserError(
                f"elite_size {self.elite_size} must be smaller than population_size {self.population_size}"
            )
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise UserError(f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        for name, low, high in (("dropout", 0.0, 0.999), ("mutation_rate", 0.0, 1.0), ("crossover_rate", 0.0, 1.0)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low <= value <= high:
                raise UserError(f"{name} must be a number in [{low}, {high}], got {value!r}")
        for name in ("learning_rate", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise UserError(f"{name} must be a positive number, got {value!r}")
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            raise UserError(f"weight_decay must be a non-negative number, got {self.weight_decay!r}")
        for name, options in (("lr_schedule", LR_SCHEDULES), ("precision", PRECISIONS), ("data", DATASETS)):
            if getattr(self, name) not in options:
                raise UserError(f"unknown {name} {getattr(self, name)!r}: valid options are {', '.join(options)}")
        if not isinstance(self.device, str) or not self.device:
            raise UserError(f"device must be a string like 'auto', 'cpu', 'cuda' or 'cuda:1', got {self.device!r}")
        if self.eval_stride is not None and self.eval_stride > self.max_seq_len:
            raise UserError(f"eval_stride {self.eval_stride} is larger than max_seq_len {self.max_seq_len}")
        for name in ("recall", "strategy_options", "search_space"):
            if not isinstance(getattr(self, name), dict):
                raise UserError(f"{name} must be a mapping, got {getattr(self, name)!r}")
        if not isinstance(self.strategy, str) or not self.strategy:
            raise UserError(f"strategy must be a name such as 'ga' or 'random', got {self.strategy!r}")
        if self.fidelity not in FIDELITIES:
            raise UserError(f"unknown fidelity {self.fidelity!r}: valid options are {', '.join(FIDELITIES)}")
        for name in ("halving_eta", "halving_rungs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise UserError(f"{name} must be an integer >= 2, got {value!r}")
        if self.hurdle is not None and (isinstance(self.hurdle, bool) or not isinstance(self.hurdle, (int, float))
                                        or not 0.0 < self.hurdle <= 1.0):
            raise UserError(f"hurdle must be a quantile in (0, 1] such as 0.5, got {self.hurdle!r}")
        if isinstance(self.halving_audit, bool) or not isinstance(self.halving_audit, int) or self.halving_audit < 0:
            raise UserError(f"halving_audit must be a non-negative integer, got {self.halving_audit!r}")
        if self.halving_audit and self.fidelity == "full" and self.hurdle is None:
            raise UserError(f"halving_audit {self.halving_audit} needs --fidelity halving or --hurdle: at full "
                            "fidelity every individual trains on the full budget anyway")

    def space(self):
        """The SearchSpace this config describes (validates the option names)."""
        from evo_attention.genes import SearchSpace

        return SearchSpace.from_dict(self.search_space)

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> "Config":
        """Build from a mapping; an unknown key is an error that names it."""
        cls.check_keys(data, source)
        return cls(**dict(data))

    @classmethod
    def check_keys(cls, data: Mapping[str, Any], source: str = "config") -> None:
        known = set(cls.field_names())
        for key in data:
            if key not in known:
                close = _closest(str(key), known)
                hint = f" (did you mean {close!r}?)" if close else ""
                raise UserError(f"unknown key {key!r} in {source}{hint}: valid keys are {', '.join(sorted(known))}")


def _closest(word: str, options) -> str | None:
    import difflib

    match = difflib.get_close_matches(word, list(options), n=1)
    return match[0] if match else None
