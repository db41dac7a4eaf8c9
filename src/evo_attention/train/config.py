"""Config: every setting of a run in one validated dataclass.

Field names and defaults follow the original EvoAttention ``Config`` (vocab 10000, 128-dim,
4 heads, 2 layers, 128 tokens, 5000 steps, population 12 x 10 generations, ...), extended with
the data and training options this project adds. Construction validates every field and raises
``UserError`` (a ``ValueError``) naming the bad value; it has no side effects (no directories are
created, no device is probed).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from evo_attention.data import check_data_name
from evo_attention.data.tokenizers import parse_tokenizer
from evo_attention.nn.model import BLOCKS, llama_ffn_dim
from evo_attention.train.record import OBJECTIVES, PRIMARY_OBJECTIVE
from evo_attention.util.errors import UserError

LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE_MODES = ("auto", "on", "off")
FIDELITIES = ("full", "halving")
GENOMES = ("shared", "per_layer")
MAX_SEED = 2**63 - 1  # torch seeds are 64-bit; validation seeds count up from the seed


@dataclass
class Config:
    # model
    vocab_size: int | None = 10000  # None: the full training vocabulary of a word-level corpus
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    max_seq_len: int = 128
    dropout: float = 0.1
    d_ff: int | None = None  # None: 4 * d_model (gpt2 block), about 8/3 * d_model (llama block)
    block: str = "gpt2"  # the block around the attention: gpt2 (LayerNorm, GELU) or llama (RMSNorm, SwiGLU)
    favor_features: int = 64  # random features per head of normalization=favor
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
    compile: str = "auto"  # torch.compile the model: auto (where measured to pay), on, off
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
    genome: str = "shared"  # shared: one gene for every layer; per_layer: one gene per layer
    # what the search minimises: perplexity first (the primary objective), then any cost measures
    # of train.record.OBJECTIVES; more than one makes the search multi-objective (Pareto front)
    objectives: list = field(default_factory=lambda: [PRIMARY_OBJECTIVE])
    baseline: bool = True  # also train the vanilla transformer under the same budget
    # multi-fidelity (fidelity.py): spend less than the full budget on clearly bad individuals
    fidelity: str = "full"  # "full" or "halving" (successive halving inside each generation)
    halving_eta: int = 3  # halving keeps the best 1/eta of the individuals at each rung
    halving_rungs: int = 3  # rungs of the schedule, the full budget included: budget/eta^k steps
    hurdle: float | None = None  # stop individuals worse than this quantile of the first rung
    halving_audit: int = 0  # per generation, this many random new individuals skip the stopping rules,
    # so the rank correlation between low and full fidelity is measured on an unselected sample
    # data
    data: str = "wikitext2"  # wikitext2, text, recall, or hf:NAME[:CONFIG] / hf:/path (Hugging Face datasets)
    tokenizer: str = "word"  # word, char, byte or bpe:N (corpora only; vocab_size applies to word)
    text_field: str = "text"  # the text column of an hf: dataset
    data_dir: str | None = None
    eval_stride: int | None = None
    recall: dict = field(default_factory=dict)  # options of the generated recall task (or a plugin dataset)
    plugins: list = field(default_factory=list)  # modules or .py files imported everywhere before any gene

    def __post_init__(self):
        _check_model(self)
        _check_training(self)
        _check_search(self)
        _check_data(self)

    def space(self):
        """The SearchSpace this config describes (validates the option names)."""
        from evo_attention.genes import SearchSpace

        space = SearchSpace.from_dict(self.search_space)
        if self.genome == "per_layer":
            space = dataclasses.replace(space, layers=self.n_layers)
        too_big = [r for r in space.qkv_rank if r > self.d_model]
        if too_big:
            raise UserError(f"qkv_rank {too_big[0]} in the search space is larger than d_model {self.d_model}: a "
                            "low-rank projection needs a rank r <= d_model", setting="search_space")
        not_dividing = [k for k in space.kv_heads if k and self.n_heads % k]
        if not_dividing:
            raise UserError(f"kv_heads {not_dividing[0]} in the search space does not divide n_heads {self.n_heads}: "
                            "use divisors of the heads (1 is multi-query attention)", setting="search_space")
        full = [w for w in space.window if w >= self.max_seq_len]
        if full:
            warnings.warn(f"window {full[0]} is at least max_seq_len {self.max_seq_len}: it is full attention "
                          "(the same as window 0)", stacklevel=2)
        return space

    @property
    def ffn_dim(self) -> int:
        """The feed-forward width: ``d_ff``, else the block's default."""
        if self.d_ff:
            return self.d_ff
        return llama_ffn_dim(self.d_model) if self.block == "llama" else 4 * self.d_model

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


# -- validation, one group of fields at a time; every error names its field -----------------------
def _integer(config: Config, name: str, minimum: int = 1, allow_none: bool = False) -> None:
    value = getattr(config, name)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        raise UserError(f"{name} must be {what}, got {value!r}", setting=name)


def _number(config: Config, name: str, low: float, high: float | None = None, *, open_low: bool = False) -> None:
    value = getattr(config, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and (high is None or value <= high)
    if not ok:
        if high is not None:
            raise UserError(f"{name} must be a number in [{low}, {high}], got {value!r}", setting=name)
        raise UserError(f"{name} must be a {'positive' if open_low else 'non-negative'} number, got {value!r}",
                        setting=name)


def _choice(config: Config, name: str, options: tuple) -> None:
    if getattr(config, name) not in options:
        raise UserError(f"unknown {name} {getattr(config, name)!r}: valid options are {', '.join(options)}",
                        setting=name)


def _mapping(config: Config, name: str) -> None:
    if not isinstance(getattr(config, name), dict):
        raise UserError(f"{name} must be a mapping, got {getattr(config, name)!r}", setting=name)


def _check_model(c: Config) -> None:
    for name in ("d_model", "n_heads", "n_layers", "max_seq_len"):
        _integer(c, name)
    _integer(c, "d_ff", allow_none=True)
    _integer(c, "favor_features")
    if c.vocab_size is not None:
        _integer(c, "vocab_size")
        if c.vocab_size < 2:
            raise UserError(f"vocab_size must be at least 2, got {c.vocab_size}", setting="vocab_size")
    if c.d_model % c.n_heads:
        raise UserError(f"d_model {c.d_model} is not divisible by n_heads {c.n_heads}: choose sizes with "
                        "d_model % n_heads == 0", setting=("d_model", "n_heads"))
    _number(c, "dropout", 0.0, 0.999)
    _choice(c, "block", BLOCKS)


def _check_training(c: Config) -> None:
    for name in ("batch_size", "eval_batch_size", "train_steps", "log_every"):
        _integer(c, name)
    _integer(c, "eval_steps", allow_none=True)
    _integer(c, "warmup_steps", minimum=0)
    _number(c, "learning_rate", 0.0, open_low=True)
    _number(c, "grad_clip", 0.0, open_low=True)
    _number(c, "weight_decay", 0.0)
    _choice(c, "lr_schedule", LR_SCHEDULES)
    _choice(c, "precision", PRECISIONS)
    _choice(c, "compile", COMPILE_MODES)
    if not isinstance(c.device, str) and isinstance(getattr(c.device, "type", None), str):
        c.device = str(c.device)  # a torch.device (e.g. the original's get_device()) is kept as its name
    if not isinstance(c.device, str) or not c.device:
        raise UserError(f"device must be a string like 'auto', 'cpu', 'cuda' or 'cuda:1', got {c.device!r}",
                        setting="device")


def _check_search(c: Config) -> None:
    _choice(c, "genome", GENOMES)
    if isinstance(c.seed, bool) or not isinstance(c.seed, int) or not 0 <= c.seed <= MAX_SEED:
        raise UserError(f"seed must be an integer in 0..2^63-1, got {c.seed!r}", setting="seed")
    _integer(c, "population_size")
    _integer(c, "n_generations")
    _integer(c, "elite_size", minimum=0)
    if c.elite_size >= c.population_size:
        raise UserError(f"elite_size {c.elite_size} must be smaller than population_size {c.population_size}",
                        setting=("elite_size", "population_size"))
    _number(c, "mutation_rate", 0.0, 1.0)
    _number(c, "crossover_rate", 0.0, 1.0)
    if not isinstance(c.strategy, str) or not c.strategy:
        raise UserError(f"strategy must be a name such as 'ga' or 'random', got {c.strategy!r}", setting="strategy")
    _mapping(c, "strategy_options")
    _mapping(c, "search_space")
    _check_objectives(c)
    _choice(c, "fidelity", FIDELITIES)
    _integer(c, "halving_eta", minimum=2)
    _integer(c, "halving_rungs", minimum=2)
    if c.hurdle is not None and (isinstance(c.hurdle, bool) or not isinstance(c.hurdle, (int, float))
                                 or not 0.0 < c.hurdle <= 1.0):
        raise UserError(f"hurdle must be a quantile in (0, 1] such as 0.5, got {c.hurdle!r}", setting="hurdle")
    _integer(c, "halving_audit", minimum=0)
    if c.halving_audit and c.fidelity == "full" and c.hurdle is None:
        raise UserError(f"halving_audit {c.halving_audit} needs fidelity halving or a hurdle: at full fidelity every "
                        "individual trains on the full budget anyway", setting=("halving_audit", "fidelity", "hurdle"))


def _check_objectives(c: Config) -> None:
    if isinstance(c.objectives, str):  # "perplexity,params" as a YAML scalar
        c.objectives = [name.strip() for name in c.objectives.split(",")]
    elif isinstance(c.objectives, tuple):
        c.objectives = list(c.objectives)
    valid = ", ".join(OBJECTIVES)
    if not isinstance(c.objectives, list) or not c.objectives or not all(isinstance(o, str) for o in c.objectives):
        raise UserError(f"objectives must be a list of names such as [perplexity, params], got {c.objectives!r}",
                        setting="objectives")
    for name in c.objectives:
        if name not in OBJECTIVES:
            close = _closest(name, OBJECTIVES)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise UserError(f"unknown objective {name!r}{hint}: valid objectives are {valid}", setting="objectives")
    repeated = next((name for i, name in enumerate(c.objectives) if name in c.objectives[:i]), None)
    if repeated is not None:
        raise UserError(f"objective {repeated!r} is named twice in objectives: name each objective once",
                        setting="objectives")
    if c.objectives[0] != PRIMARY_OBJECTIVE:
        raise UserError(f"objectives must start with {PRIMARY_OBJECTIVE} (the primary objective), got "
                        f"{','.join(c.objectives)}: put {PRIMARY_OBJECTIVE} first", setting="objectives")


def _check_data(c: Config) -> None:
    check_data_name(c.data)
    parse_tokenizer(c.tokenizer)
    if not isinstance(c.text_field, str) or not c.text_field:
        raise UserError(f"text_field must be a column name such as 'text', got {c.text_field!r}", setting="text_field")
    _integer(c, "eval_stride", allow_none=True)
    if c.eval_stride is not None and c.eval_stride > c.max_seq_len:
        raise UserError(f"eval_stride {c.eval_stride} is larger than max_seq_len {c.max_seq_len}",
                        setting=("eval_stride", "max_seq_len"))
    _mapping(c, "recall")
    if not isinstance(c.plugins, list) or not all(isinstance(p, str) and p.strip() for p in c.plugins):
        raise UserError(f"plugins must be a list of module names or .py files, got {c.plugins!r}", setting="plugins")
