"""Config: every setting of a run in one validated dataclass (names and defaults: the original
EvoAttention ``Config``'s, extended). Construction validates every field and raises ``UserError`` (a
``ValueError``) naming the bad value; it has no side effects (no directory created, no device probed).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from dataclasses import InitVar, dataclass, field, fields
from typing import Any, Mapping

from evo_attention.nn.spec import BLOCKS, SHORT_CONV_WIDTHS, ModelSpec, setting
from evo_attention.train.record import OBJECTIVES, PRIMARY_OBJECTIVE, SUITE_OBJECTIVE
from evo_attention.train.schedules import SCHEDULES, alternatives, takes_warmup, uses_decay
from evo_attention.train.spec import (COMPILE_MODES, CUDA_GRAPH_MODES, DROPOUT_STREAMS, PRECISIONS, TaskSpec, TrainSpec,
                                      freeze, steps_of)
from evo_attention.util.errors import UserError

FIDELITIES = ("full", "halving")
GENOMES = ("shared", "per_layer")
MAX_SEED = 2**63 - 1  # torch seeds are 64-bit; validation seeds count up from the seed
# the first tuning seed of a run seed's block (studies.common: seed + TUNING_OFFSET + 1 ...), on which
# rate_grid chooses each gene's rate (search.tuning)
TUNING_FROM = 1001
MAX_STEPS = 10**9  # training steps of one model: beyond, a run could not end (docs/reliability.md)
SPECS = {"model": ModelSpec, "train": TrainSpec}  # group -> the spec whose fields are the Config's of that group


def with_spec_settings(cls):
    """Give ``cls`` every field of the specs (``SPECS``), in its group, among its own fields, in the key
    order of every config a run stores: the specs' fields in their order, but a field declared
    ``after=NAME`` right after NAME, and an own field without ``after`` right after the one before it."""
    layout = [(f.name, f.type, field(default=f.default, metadata={**f.metadata, "group": group}))
              for group, spec in SPECS.items() for f in fields(spec)]
    for entry in [e for e in layout if e[2].metadata.get("after")]:
        layout.remove(entry)
        layout.insert([e[0] for e in layout].index(entry[2].metadata["after"]) + 1, entry)
    at = len(layout)
    for name, kind in cls.__annotations__.items():
        after = cls.__dict__[name].metadata.get("after")
        at = [e[0] for e in layout].index(after) + 1 if after else at
        layout.insert(at, (name, kind, cls.__dict__[name]))
        at += 1
    cls.__annotations__ = {name: kind for name, kind, _ in layout}
    for name, _, declared in layout:
        setattr(cls, name, declared)
    return cls


@dataclass
@with_spec_settings
class Config:
    # The fields of ModelSpec (nn/spec.py: group model) and TrainSpec (train/spec.py: group train)
    # are declared there, once, and placed here by ``with_spec_settings``; these are the Config's own.
    train_steps: int = setting(5000, group="trial", after="grad_clip", flag="steps", parse="int",
                               help="training steps per model")
    # group trial: the fraction reaches the TrainSpec (and the key) resolved into its warmup_steps,
    # so a warm-up given either way is one training with one key (Config.train_for)
    warmup: float | None = setting(None, group="trial", after="warmup_steps", flag="warmup-fraction", parse="float",
                                   metavar="F", help="the warm-up as a fraction of the training steps, e.g. 0.05 "
                                                     "(rounded to whole steps; instead of --warmup-steps)")
    # evolution
    population_size: int = setting(12, group="search", after="log_every", flag="population", parse="int")
    n_generations: int = setting(10, group="search", flag="generations", parse="int")
    elite_size: int = setting(3, group="search", flag="elite", parse="int")
    mutation_rate: float = setting(0.3, group="search", flag="mutation-rate", parse="float")
    crossover_rate: float = setting(0.7, group="search", flag="crossover-rate", parse="float")
    seed: int = setting(42, group="trial", flag="seed", parse="int")
    strategy: str = setting("ga", group="search", after="device", flag="strategy", parse="str",
                            help="search strategy: ga, random, neighbours (random one-edit neighbours of start_from), "
                                 "climb (a hill climb from start_from), nsga2 or tpe "
                                 "(tpe needs the [tpe] extra: Optuna), or "
                                 "one a plugin registers")  # a name from evo_attention.search.STRATEGIES
    strategy_options: dict = setting(group="search", factory=dict)
    # field -> allowed options; {} = everything registered
    search_space: dict = setting(group="search", factory=dict)
    genome: str = setting("shared", group="search", flag="genome", parse="str",
                          help="shared (one gene for every layer, default) or per_layer (a gene per layer)")
    # train.record.OBJECTIVES; more than one makes the search multi-objective (Pareto front)
    objectives: list = setting(group="search", factory=lambda: [PRIMARY_OBJECTIVE], flag="objectives", parse="list",
                               help="what the search minimises, comma-separated: perplexity first, then any of "
                                    "params, flops, train_ms_per_step, latency_ms, peak_memory_mb (default perplexity)")
    baseline: bool = setting(True, group="search")  # also train the baseline gene under the same budget
    # never part of a trial, only of what it is compared with (None: ``resolved_baseline()``)
    baseline_gene: str | None = setting(None, group="search", flag="baseline-gene", parse="str", metavar="GENE",
                                        help="the gene the verdicts compare against (default: the vanilla "
                                             "transformer; on a generated task without attention dropout, "
                                             "dot|softmax|none|fixed|bias|0.00)")
    # data.suites, train.suite: the points' data replaces ``data``
    suite: str | None = setting(None, group="search", flag="suite", parse="str", metavar="NAME|FILE",
                                help=lambda: f"score each gene on every point of this suite of tasks "
                                             f"({shipped_suites()} or a suite YAML file): fitness is its mean accuracy "
                                             "over the points (suite_accuracy, maximised); each point trains for the "
                                             "suite's steps")
    # read by search/warm_start.py (init_from, start_from), search/racing.py (elite_seeds), search/tuning.py (rate_grid)
    init_from: str | None = setting(None, group="search", flag="init-from", parse="str", metavar="RUN[:K]",
                                    help="start the first generation from the best K genes (default: the population "
                                         "size) of the earlier run in directory RUN; genes outside this run's search "
                                         "space are skipped with a warning")
    start_from: str | None = setting(None, group="search", flag="start-from", parse="str",
                                     metavar="vanilla|GENES|RUN[:K]|random",
                                     help="start generation 0 from these genes and their one-edit neighbours: vanilla "
                                          "(the vanilla gene, whatever baseline_gene says), gene strings, or the best "
                                          "K genes of the run in RUN; random draws random genes (the default, but for "
                                          "the climb and neighbours strategies, which start from vanilla)")
    elite_seeds: int = setting(1, group="search", flag="elite-seeds", parse="int", metavar="K",
                               help="measure a gene that would enter the elite (the climb's incumbent) on K seeds "
                                    "first and rank it by mean + standard error over them (default 1: one seed)")
    rate_grid: tuple | None = setting(None, group="search", flag="rate-grid", parse="str", metavar="R1,R2,...",
                                      help="give every candidate (and the baseline) its own learning rate: the best "
                                           f"of these rates on a tuning seed (seed + {TUNING_FROM}), then its search "
                                           "training at that rate; costs one training per rate per candidate")
    # constraints (search/constraints.py): latency and memory are measured, so a gene over their cap is
    # marked infeasible after its training
    max_params: int | float | str | None = setting(None, group="search", flag="max-params", parse="str", metavar="N",
                                                   help="cap on a gene's parameters, e.g. 50000 or 1.2x (the "
                                                        "baseline's); checked before training")
    max_flops: float | str | None = setting(None, group="search", flag="max-flops", parse="str", metavar="X",
                                            help="cap on the FLOPs of one training step, e.g. 3e9 or 1.1x; checked "
                                                 "before training")
    max_latency_ms: float | str | None = setting(None, group="search", flag="max-latency-ms", parse="str",
                                                 metavar="X", help="cap on the measured inference latency in ms, "
                                                                   "e.g. 5 or 1.2x (the baseline's)")
    max_memory_mb: float | str | None = setting(None, group="search", flag="max-memory-mb", parse="str",
                                                metavar="X", help="cap on the measured peak memory in MB, e.g. 900 "
                                                                  "or 1.5x (the baseline's)")
    # multi-fidelity (search/fidelity.py)
    fidelity: str = setting("full", group="fidelity", flag="fidelity", parse="str", choices=FIDELITIES,
                            help="halving: successive halving inside each generation; only the best 1/eta of the new "
                                 "individuals at each rung train on (default full)")
    halving_eta: int = setting(3, group="fidelity", flag="halving-eta", parse="int", metavar="ETA",
                               help="keep the best 1/ETA at each rung (default 3)")
    halving_rungs: int = setting(3, group="fidelity", flag="halving-rungs", parse="int", metavar="R",
                                 help="rungs at budget/ETA^k steps, k = R-1 ... 0, the full budget included (default 3)")
    hurdle: float | None = setting(None, group="fidelity", flag="hurdle", parse="float", metavar="Q",
                                   help="stop individuals whose loss at the first rung is worse than the generation's "
                                        "Q-quantile")
    halving_audit: int = setting(0, group="fidelity", flag="halving-audit", parse="int", metavar="N",
                                 help="per generation, train N randomly chosen new individuals to the full budget "
                                      "whatever their early loss, to measure on them how well early losses predict "
                                      "final ones (default 0)")
    # data (-> TaskSpec)
    data: str = setting("wikitext2", group="task", flag="data", parse="str",
                        help=lambda: f"dataset: wikitext2, text, recall, a generated task ({task_names()})"
                                     "[:knob=value,...], hf:NAME[:CONFIG] or hf:/path/to/saved")
    tokenizer: str = setting("word", group="task", flag="tokenizer", parse="str",
                             help="word (default), char, byte or bpe:N (BPE trained on the train split)")
    text_field: str = setting("text", group="task", flag="text-field", parse="str",
                              help="the text column of an hf: dataset (default text)")
    data_dir: str | None = setting(None, group="task", flag="data-dir", parse="str",
                                   help="directory of train.txt/valid.txt/test.txt (else $EVO_ATTENTION_DATA_DIR)")
    eval_stride: int | None = setting(None, group="task", flag="eval-stride", parse="int",
                                      help="strided evaluation: score the last S tokens of each window")
    # options of the generated recall task (or a plugin dataset)
    recall: dict = setting(group="task", factory=dict)
    # modules or .py files imported everywhere before any gene
    plugins: list = setting(group="task", factory=list)
    # execution (how trials run, never what a trial is: no spec field, so never in a key)
    batch_models: str | int = setting("auto", group="execution", flag="batch-models", parse="str", metavar="K",
                                      help="train up to K trials that differ only in seed or learning rate as one "
                                           "batched model: auto (measured per model shape on this machine, the "
                                           "default), off, or K")
    # a warm-up the schedule ignores is said so where given here (Config, or replace naming it); settings from a
    # preset, a file or a store (from_dict) keep theirs silently: it is in their keys (the CLI refuses its own)
    warn_unused_warmup: InitVar[bool] = field(default=True)

    def __post_init__(self, warn_unused_warmup: bool):
        _check_model(self)
        _check_training(self)
        name = "warmup" if self.warmup else "warmup_steps"  # the warm-up is given in one form (_check_schedule)
        if warn_unused_warmup and not takes_warmup(self.lr_schedule) and getattr(self, name) not in (0, 500):
            warnings.warn(unused_warmup(name, self.lr_schedule), stacklevel=3)  # 500: the default warmup_steps
        _check_search(self)
        _check_data(self)
        self.batch_models = batch_models_value(self.batch_models)

    def space(self):
        """The SearchSpace this config describes: valid option names, every option fitting the model."""
        from evo_attention.genes import SearchSpace, full_window_note, size_problem

        space = SearchSpace.from_dict(self.search_space)
        if self.genome == "per_layer":
            space = dataclasses.replace(space, layers=self.n_layers)
        problem = size_problem(space, d_model=self.d_model, n_heads=self.n_heads)
        if problem:
            raise UserError(str(problem), setting="search_space")
        note = full_window_note(space, max_seq_len=self.max_seq_len)
        if note:
            warnings.warn(note, stacklevel=2)
        for warmup in space.options("warmup"):  # a recipe axis: each warm-up must apply and fit the schedule
            if warmup is not None:
                try:
                    self.train.with_recipe({"warmup": warmup}, self.train_steps)
                except UserError as exc:
                    raise UserError(f"search space option {exc}", setting=exc.settings) from None
        return space

    # -- the specs this config produces (train.spec: what one training is) ------------------------
    @property
    def model(self) -> ModelSpec:
        return ModelSpec(**{f.name: getattr(self, f.name) for f in fields(ModelSpec)})

    @property
    def train(self) -> TrainSpec:
        """The recipe of a training of ``train_steps`` steps (``train_for``)."""
        return self.train_for(self.train_steps)

    def train_for(self, steps: int) -> TrainSpec:
        """The recipe of a training whose schedule spans ``steps`` steps: a ``warmup`` fraction becomes
        whole steps of them, and the schedules other than wsd carry the default decay fraction (so it
        cannot split their key). UserError if the warm-up (and wsd's decay) does not fit in ``steps``."""
        values = {f.name: getattr(self, f.name) for f in fields(TrainSpec)}
        if self.warmup is not None:
            values["warmup_steps"] = steps_of(self.warmup, steps)
        if not uses_decay(self.lr_schedule):
            values["lr_decay_fraction"] = _DEFAULT_DECAY_FRACTION
        spec = TrainSpec(**values)
        _check_schedule_fits(self, spec, steps)
        return spec

    @property
    def task(self) -> TaskSpec:
        return TaskSpec(data=self.data, tokenizer=self.tokenizer, text_field=self.text_field,
                        vocab_size=self.vocab_size, seq_len=self.max_seq_len, eval_stride=self.eval_stride,
                        options=freeze(self.recall), plugins=tuple(self.plugins), data_dir=self.data_dir)

    @property
    def ffn_dim(self) -> int:  # d_ff, else the block's default
        return self.model.ffn_dim

    @property
    def generated_task(self) -> bool:
        """Whether this config trains on generated tasks: a suite, or ``mqar``, ``mad:...`` and the
        like (``data.synthetic``; not the quick preset's embedded ``recall``)."""
        from evo_attention.data import is_synthetic  # the data layer imports torch: only when a config asks

        return self.suite is not None or is_synthetic(self.data)

    def resolved_baseline(self):
        """The gene this config's studies and searches compare against: ``baseline_gene`` (trained as
        written: ``|0.10`` asks for dropout), else ``vanilla_gene()``."""
        from evo_attention.genes import AttentionGene

        return self.vanilla_gene() if self.baseline_gene is None else AttentionGene.parse(self.baseline_gene)

    def vanilla_gene(self):
        """The vanilla transformer, on a generated task without attention dropout (docs/tasks.md; the
        named configurations resolve the same way: ``studies.compare.named_dropout``)."""
        from evo_attention.genes import AttentionGene

        gene = AttentionGene.vanilla()
        return gene.replace(attention_dropout=0.0) if self.generated_task else gene

    @classmethod
    def settings_of(cls, group: str) -> list:
        """The fields of ``group`` (model, train, trial, search, fidelity, task, execution), in declaration order."""
        return [f for f in fields(cls) if f.metadata.get("group") == group]

    def replace(self, **changes: Any) -> "Config":
        """This config with ``changes``; a warm-up given in one form (``warmup_steps`` or the fraction
        ``warmup``) replaces the config's warm-up in the other form too."""
        if changes.get("warmup") is not None and "warmup_steps" not in changes:
            changes["warmup_steps"] = _DEFAULT_WARMUP_STEPS
        if changes.get("warmup_steps") is not None and "warmup" not in changes:
            changes["warmup"] = None
        return dataclasses.replace(self, **changes, warn_unused_warmup=bool({"warmup", "warmup_steps"} & set(changes)))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> "Config":
        """Build from a mapping; an unknown key is an error that names it. A field whose None means
        "all of it" also takes the word its flag takes (``vocab_size: full``, ``eval_steps: all``)."""
        cls.check_keys(data, source)
        words = {f.name for f in dataclasses.fields(cls) if f.metadata.get("parse") in ("vocab", "count_or_all")}
        return cls(**{k: None if k in words and isinstance(v, str) and v.strip().lower() in ("full", "all", "none")
                      else v for k, v in data.items()}, warn_unused_warmup=False)

    @classmethod
    def check_keys(cls, data: Mapping[str, Any], source: str = "config") -> None:
        known = set(cls.field_names())
        for key in data:
            if key not in known:
                raise UserError(f"unknown key {key!r} in {source}{_did_you_mean(str(key), known)}: valid keys are "
                                f"{', '.join(sorted(known))}")


def _did_you_mean(word: str, options) -> str:
    match = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


# -- validation, one group of fields at a time; every error names its field -----------------------
def _integer(config: Config, name: str, minimum: int = 1, allow_none: bool = False) -> None:
    value = getattr(config, name)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        raise UserError(f"{name} must be {what}, got {value!r}", setting=name)


def check_seed(seed) -> None:
    """UserError unless ``seed`` is an integer in 0..MAX_SEED (a torch generator takes no other)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UserError(f"seed must be an integer in 0..2^63-1, got {seed!r}", setting="seed")


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
    _integer(c, "short_conv", minimum=0)
    if c.short_conv and c.short_conv not in SHORT_CONV_WIDTHS:
        raise UserError(f"short_conv {c.short_conv} is not a convolution width: use 0 (none) or a width from "
                        f"{SHORT_CONV_WIDTHS[0]} to {SHORT_CONV_WIDTHS[-1]}",
                        setting="short_conv")
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
    if c.train_steps > MAX_STEPS:
        raise UserError(f"train_steps {c.train_steps:,} is beyond {MAX_STEPS:,}, the most one training may take (at a "
                        "millisecond a step a billion steps already take 11 days per model): lower it",
                        setting="train_steps")
    _integer(c, "eval_steps", allow_none=True)
    _integer(c, "warmup_steps", minimum=0)
    _number(c, "learning_rate", 0.0, open_low=True)
    _number(c, "grad_clip", 0.0, open_low=True)
    _number(c, "weight_decay", 0.0)
    _choice(c, "lr_schedule", tuple(SCHEDULES))
    _check_schedule(c)
    _choice(c, "precision", PRECISIONS)
    _choice(c, "dropout_stream", DROPOUT_STREAMS)
    c.compile, c.cuda_graph = switch_word(c.compile), switch_word(c.cuda_graph)
    _choice(c, "compile", COMPILE_MODES)
    _choice(c, "cuda_graph", CUDA_GRAPH_MODES)
    if not isinstance(c.device, str) and isinstance(getattr(c.device, "type", None), str):
        c.device = str(c.device)  # a torch.device (e.g. the original's get_device()) is kept as its name
    if not isinstance(c.device, str) or not c.device:
        raise UserError(f"device must be a string like 'auto', 'cpu', 'cuda' or 'cuda:1', got {c.device!r}",
                        setting="device")


_DEFAULT_WARMUP_STEPS = next(f.default for f in fields(Config) if f.name == "warmup_steps")
_DEFAULT_DECAY_FRACTION = next(f.default for f in fields(TrainSpec) if f.name == "lr_decay_fraction")


def _check_schedule(c: Config) -> None:
    """The warm-up (in one form: steps or a fraction), the decay fraction, and that the schedule
    fits in ``train_steps`` where it is used (cosine and wsd; constant ignores the warm-up)."""
    warmup = c.warmup
    if warmup is not None:
        if (isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not math.isfinite(warmup)
                or not 0 <= warmup < 1):
            raise UserError(f"warmup must be a fraction of the training steps in [0, 1) such as 0.05, got {warmup!r} "
                            "(a number of steps is warmup_steps)", setting=("warmup", "warmup_steps"))
        if c.warmup_steps != _DEFAULT_WARMUP_STEPS:
            raise UserError(warmup_twice(warmup, c.warmup_steps), setting=("warmup", "warmup_steps"))
    _number(c, "lr_decay_fraction", 0.0, 1.0)
    c.train_for(c.train_steps)  # checks the fit (``_check_schedule_fits``)


def warmup_twice(fraction, steps) -> str:
    """The error of a warm-up given both as a fraction and as steps."""
    return (f"warmup {fraction!r} and warmup_steps {steps!r} both set the warm-up: give one of them (warmup is a "
            "fraction of the training steps, warmup_steps a number of steps)")


def unused_warmup(name: str, schedule: str) -> str:
    """The line of a warm-up (``name``: warmup_steps or warmup) that lr_schedule ``schedule`` does not use."""
    return (f"{name} does not apply to lr_schedule {schedule} (it has no warm-up): leave it out or choose a schedule "
            f"with a warm-up ({alternatives(filter(takes_warmup, SCHEDULES))})")


def _check_schedule_fits(c: Config, spec: TrainSpec, steps: int) -> None:
    if not takes_warmup(spec.lr_schedule):
        return
    warmup, decay = spec.warmup_steps, spec.decay_steps(steps)
    given = f"warmup {c.warmup:g} ({warmup} steps)" if c.warmup is not None else f"warmup_steps {warmup}"
    names = ("warmup", "warmup_steps") if c.warmup is not None else ("warmup_steps", "warmup")
    if warmup >= steps:
        raise UserError(f"{given} >= train_steps {steps}: the {spec.lr_schedule} schedule's warm-up would never end; "
                        "use a shorter warm-up (warmup_steps, or warmup as a fraction of the steps such as 0.05), "
                        "more train_steps or lr_schedule constant", setting=(*names, "train_steps", "lr_schedule"))
    if warmup + decay > steps:
        raise UserError(f"{given} + {decay} decay steps (lr_decay_fraction {spec.lr_decay_fraction:g} of {steps}) > "
                        f"train_steps {steps}: the {spec.lr_schedule} schedule's warm-up and decay overlap; use a "
                        "shorter warm-up, a smaller lr_decay_fraction or more train_steps",
                        setting=(*names, "lr_decay_fraction", "train_steps"))


def describe_schedule(settings, steps: int | None = None) -> str:
    """The learning-rate schedule of ``settings`` (a Config, a stored config dict or a record's settings:
    give ``steps``, default ``train_steps``) in words, e.g. ``lr 0.002, wsd: linear warm-up over 20 steps,
    stable to step 320, linear decay to 0 over the last 80 steps (decay fraction 0.2)``."""
    get = settings.get if isinstance(settings, Mapping) else (lambda name, default=None: getattr(settings, name,
                                                                                                  default))
    steps = get("train_steps") if steps is None else steps
    rate, name = get("learning_rate"), get("lr_schedule") or "constant"
    head = f"lr {rate:g}" if isinstance(rate, (int, float)) else "lr ?"
    schedule = SCHEDULES.get(name)
    if schedule is None:
        return f"{head}, {name}"
    parts = []
    fraction = get("warmup")
    if schedule.warmup and fraction is not None and steps is not None:
        parts.append(f"linear warm-up over {steps_of(fraction, steps)} steps ({fraction:g} of {steps})")
    elif schedule.warmup:
        parts.append(f"linear warm-up over {get('warmup_steps', _DEFAULT_WARMUP_STEPS)} steps")
    decay_fraction = get("lr_decay_fraction")
    parts.append(schedule.words(steps, _DEFAULT_DECAY_FRACTION if decay_fraction is None else decay_fraction))
    parts = [part for part in parts if part]
    return f"{head}, {name}: {', '.join(parts)}" if parts else f"{head}, {name}"


def _check_search(c: Config) -> None:
    _choice(c, "genome", GENOMES)
    check_seed(c.seed)
    _integer(c, "population_size")
    _integer(c, "n_generations")
    _integer(c, "elite_size", minimum=0)  # below population_size where the strategy reads it (Strategy checks)
    _number(c, "mutation_rate", 0.0, 1.0)
    _number(c, "crossover_rate", 0.0, 1.0)
    if not isinstance(c.strategy, str) or not c.strategy:
        raise UserError(f"strategy must be a name such as 'ga' or 'random', got {c.strategy!r}", setting="strategy")
    _mapping(c, "strategy_options")
    _mapping(c, "search_space")
    if c.suite is not None and (not isinstance(c.suite, str) or not c.suite.strip()):
        raise UserError(f"suite must be {shipped_suites()} (shipped) or the path of a YAML file of task points, got "
                        f"{c.suite!r}", setting="suite")
    as_bool("baseline", c.baseline)
    _check_baseline_gene(c)
    _check_objectives(c)
    _check_init_from(c)
    for name in CAP_FIELDS:
        setattr(c, name, cap_value(getattr(c, name), name))
    relative = [name for name in MEASURED_CAPS if cap_factor(getattr(c, name)) is not None]
    if relative and not c.baseline:
        raise UserError(f"{relative[0]} {getattr(c, relative[0])} is relative to the baseline's measured value, but "
                        "the run trains no baseline: give an absolute cap, or train the baseline",
                        setting=(relative[0], "baseline"))
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
    _check_suite_search(c)
    _check_racing(c)
    _check_rate_grid(c)


def _check_racing(c: Config) -> None:
    _integer(c, "elite_seeds")
    if c.elite_seeds == 1:
        return
    if len(c.objectives) > 1:
        raise UserError(f"elite_seeds {c.elite_seeds} races one objective: drop the other objectives or elite_seeds",
                        setting=("elite_seeds", "objectives"))
    if c.fidelity != "full" or c.hurdle is not None:
        raise UserError(f"elite_seeds {c.elite_seeds} races genes at the full budget: drop fidelity/hurdle or "
                        "elite_seeds", setting=("elite_seeds", "fidelity", "hurdle"))
    if c.elite_seeds > 1000:
        raise UserError(f"elite_seeds {c.elite_seeds} is more than the 1000 seeds racing has: give fewer",
                        setting="elite_seeds")
    if c.seed > MAX_SEED - 2000:
        raise UserError(f"seed {c.seed} leaves no room for the racing seeds (up to seed + 2000): give a smaller seed "
                        "or drop elite_seeds", setting=("seed", "elite_seeds"))


def _check_rate_grid(c: Config) -> None:
    if c.rate_grid is None:
        return
    c.rate_grid = parse_lr_grid(c.rate_grid, "rate_grid")
    space = c.search_space if isinstance(c.search_space, dict) else {}
    given = [n for n in ("learning_rate", "lr") if n in space]
    caps = [n for n in CAP_FIELDS if getattr(c, n) is not None]
    clash = (("objectives", len(c.objectives) > 1, "tunes by one objective"),
             ("fidelity", c.fidelity != "full" or c.hurdle is not None, "tunes at the full budget"),
             ("search_space", bool(given), f"chooses each gene's rate itself, which {''.join(given[:1])} in the "
                                           "search space would set"),
             (caps[0] if caps else "", bool(caps), "does not combine with caps"))
    for name, clashes, why in clash:
        if clashes:
            raise UserError(f"rate_grid {why}: drop {name} or rate_grid", setting=("rate_grid", name))
    if c.seed > MAX_SEED - TUNING_FROM:
        raise UserError(f"seed {c.seed} leaves no room for the tuning seed (seed + {TUNING_FROM}): give a smaller seed",
                        setting=("seed", "rate_grid"))


MIN_RATES = 2  # a grid of one rate is a learning rate, not a grid


def parse_lr_grid(value, setting: str = "lr_grid") -> tuple[float, ...]:
    """A learning-rate grid (``"5e-4,1e-3,2e-3"`` or a sequence of numbers) as its distinct rates in
    increasing order; UserError naming ``setting`` for a rate that is not positive or fewer than two."""
    items = [t.strip() for t in value.split(",")] if isinstance(value, str) else list(value)
    rates = []
    for item in items:
        rate = _positive(item)
        if rate is None:
            raise UserError(f"{setting} {value!r}: {item!r} is not a learning rate: give positive numbers separated by "
                            "commas, e.g. 5e-4,1e-3,2e-3,4e-3", setting=setting)
        rates.append(rate)
    rates = sorted(set(rates))
    if len(rates) < MIN_RATES:
        raise UserError(f"{setting} {value!r} holds {len(rates)} distinct rate{'s' if len(rates) != 1 else ''}: a grid "
                        f"needs at least {MIN_RATES} (e.g. 5e-4,1e-3,2e-3,4e-3); for one rate set learning_rate",
                        setting=setting)
    return tuple(rates)


# the constraints a search may set (search/constraints.py): Config field -> what it caps
CAP_FIELDS = ("max_params", "max_flops", "max_latency_ms", "max_memory_mb")
MEASURED_CAPS = ("max_latency_ms", "max_memory_mb")  # known only after a training (the others before any)


def cap_value(value: Any, name: str = "cap") -> int | float | str | None:
    """A cap (a number or its text: ``"5e4"``, ``"1.2X"``) as a Config keeps it: None, a positive number
    (an integral one as an int), or a factor of the baseline's value (``"1.2x"``); else UserError."""
    if value is None:
        return None
    relative = isinstance(value, str) and value.strip().lower().endswith("x")
    number = _positive(value.strip()[:-1] if relative else value)
    if number is None:
        raise UserError(f"{name} must be a positive number such as 50000, or a factor of the baseline's value such "
                        f"as 1.2x, got {value!r}", setting=name)
    if relative:
        return f"{number:g}x"
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def _positive(value: Any) -> float | None:  # a number or its text as a positive finite float, else None
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def cap_factor(value: Any) -> float | None:  # "1.2x" -> 1.2; None for an absolute cap or none
    return float(value[:-1]) if isinstance(value, str) and value.endswith("x") else None


def _check_init_from(c: Config) -> None:
    if c.start_from is not None and (not isinstance(c.start_from, str) or not c.start_from.strip()):
        raise UserError(f"start_from must be vanilla, random, gene strings or a run directory, got {c.start_from!r}",
                        setting="start_from")
    if c.strategy == "neighbours" and c.start_from is not None and c.start_from.strip() == "random":
        raise UserError("the neighbours strategy samples one-edit neighbours of a start: set start_from to "
                        "vanilla, gene strings or a run", setting=("strategy", "start_from"))
    if c.init_from is None:
        return
    if c.start_from is not None:
        raise UserError("init_from and start_from both name generation 0: give one (start_from RUN:K also adds "
                        "one-edit neighbours of the run's best)", setting=("init_from", "start_from"))
    if not isinstance(c.init_from, str) or not c.init_from.strip():
        raise UserError(f"init_from must be the directory of an earlier run, optionally with :K (its best K genes), "
                        f"got {c.init_from!r}", setting="init_from")
    head, sep, tail = c.init_from.rpartition(":")
    if sep and head and tail.strip().lstrip("+-").isdigit() and int(tail) < 1:
        raise UserError(f"init_from {c.init_from!r}: K must be a whole number >= 1 (the best K genes of the run)",
                        setting="init_from")


def task_names() -> str:
    from evo_attention.data.synthetic import task_names as names  # the data layer imports torch: only when asked

    return names()


def shipped_suites() -> str:
    from evo_attention.data.suites import shipped_suites as names  # the data layer imports torch: only when asked

    return ", ".join(names())


def _check_baseline_gene(c: Config) -> None:
    if c.baseline_gene is None:
        return
    from evo_attention.genes import AttentionGene

    if not isinstance(c.baseline_gene, str):
        raise UserError(f"baseline_gene must be a gene string such as 'dot|softmax|none|fixed|bias|0.10', got "
                        f"{c.baseline_gene!r}", setting="baseline_gene")
    try:
        AttentionGene.parse(c.baseline_gene)
    except (UserError, ValueError) as exc:
        raise UserError(f"baseline_gene {c.baseline_gene!r} is not a gene: {str(exc).splitlines()[0]}",
                        setting="baseline_gene") from None


def _check_suite_search(c: Config) -> None:
    """What a search on a suite does not support (yet): each would need its own rule per point."""
    if c.suite is None:
        return
    unsupported = [("fidelity", c.fidelity != "full"), ("hurdle", c.hurdle is not None),
                   ("init_from", c.init_from is not None)]
    unsupported += [(name, getattr(c, name) is not None) for name in CAP_FIELDS]
    name = next((name for name, given in unsupported if given), None)
    if name is not None:
        raise UserError(f"{name} {getattr(c, name)!r} cannot be combined with suite {c.suite!r}: a search on task "
                        f"points scores a gene by its mean accuracy over them, and {name} is not defined for that "
                        "yet; drop one of them", setting=(name, "suite"))


def _check_objectives(c: Config) -> None:
    if isinstance(c.objectives, str):  # "perplexity,params" as a YAML scalar
        c.objectives = [name.strip() for name in c.objectives.split(",")]
    elif isinstance(c.objectives, tuple):
        c.objectives = list(c.objectives)
    valid = ", ".join(list(OBJECTIVES) + [SUITE_OBJECTIVE])
    if not isinstance(c.objectives, list) or not c.objectives or not all(isinstance(o, str) for o in c.objectives):
        raise UserError(f"objectives must be a list of names such as [perplexity, params], got {c.objectives!r}",
                        setting="objectives")
    for name in c.objectives:
        if name not in OBJECTIVES and name != SUITE_OBJECTIVE:
            raise UserError(f"unknown objective {name!r}{_did_you_mean(name, OBJECTIVES)}: valid objectives are "
                            f"{valid}", setting="objectives")
    repeated = next((name for i, name in enumerate(c.objectives) if name in c.objectives[:i]), None)
    if repeated is not None:
        raise UserError(f"objective {repeated!r} is named twice in objectives: name each objective once",
                        setting="objectives")
    if c.suite is not None:
        if c.objectives == [PRIMARY_OBJECTIVE]:  # the default: on a suite, the primary objective is the suite's
            c.objectives = [SUITE_OBJECTIVE]
        if c.objectives != [SUITE_OBJECTIVE]:
            raise UserError(f"objectives {','.join(c.objectives)} with suite {c.suite}: a search on task points has "
                            f"one objective, {SUITE_OBJECTIVE} (the mean accuracy over the points, maximised); several "
                            "objectives are not supported there", setting=("objectives", "suite"))
        return
    if SUITE_OBJECTIVE in c.objectives:
        raise UserError(f"objective {SUITE_OBJECTIVE} scores a gene on a set of task points: give suite (e.g. "
                        f"mad-cpu), or use {PRIMARY_OBJECTIVE}", setting=("objectives", "suite"))
    if c.objectives[0] != PRIMARY_OBJECTIVE:
        raise UserError(f"objectives must start with {PRIMARY_OBJECTIVE} (the primary objective), got "
                        f"{','.join(c.objectives)}: put {PRIMARY_OBJECTIVE} first", setting="objectives")


def _check_data(c: Config) -> None:
    from evo_attention.data import check_data_name, parse_tokenizer, takes_options  # imports torch: only to check

    check_data_name(c.data)
    parse_tokenizer(c.tokenizer)
    if not isinstance(c.text_field, str) or not c.text_field:
        raise UserError(f"text_field must be a column name such as 'text', got {c.text_field!r}", setting="text_field")
    _integer(c, "eval_stride", allow_none=True)
    if c.eval_stride is not None and c.eval_stride > c.max_seq_len:
        raise UserError(f"eval_stride {c.eval_stride} is larger than max_seq_len {c.max_seq_len}",
                        setting=("eval_stride", "max_seq_len"))
    _mapping(c, "recall")
    taken = {"seq_len", "vocab_size", "data_dir", "eval_stride", "tokenizer", "text_field"} & set(c.recall or {})
    if taken:  # settings of their own, which load_data takes beside the options
        raise UserError(f"task option {sorted(taken)[0]} is a setting of its own: give it as max_seq_len / "
                        f"vocab_size (or inline, --data TASK:{sorted(taken)[0]}=N), not among the task options",
                        setting=("recall", "data"))
    if c.recall and not takes_options(c.data):  # options the data would ignore (yet they would join the key)
        raise UserError(f"task options ({', '.join(map(str, c.recall))}) apply to a generated task (recall, mqar, "
                        f"mad:TASK, a registered one), not to data {c.data}: remove them", setting=("recall", "data"))
    if not isinstance(c.plugins, list) or not all(isinstance(p, str) and p.strip() for p in c.plugins):
        raise UserError(f"plugins must be a list of module names or .py files, got {c.plugins!r}", setting="plugins")


def batch_models_value(value: Any, name: str = "batch_models") -> str | int:
    """A ``batch_models`` setting as a Config keeps it: ``"auto"``, ``"off"`` or a whole number K >= 1
    (YAML's ``off`` and text such as ``"4"`` too); else a UserError naming ``name``."""
    value = switch_word(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "off"):
            return text
        value = int(text) if text.isdigit() else value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise UserError(f"{name} must be auto, off or a whole number of models >= 1, got {value!r}", setting=name)


def as_bool(name: str, value: Any) -> bool:
    """A true/false setting ``name`` (e.g. ``baseline``, a strategy's ``dedupe``) as given, else a
    UserError naming it: Python would take any text, "false" too, for true."""
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false (unquoted in YAML), got {value!r}", setting=name)
    return value


def switch_word(value: Any) -> Any:
    """YAML 1.1 reads the words ``on`` and ``off`` (and yes/no, true/false) of a switch such as
    ``compile`` as booleans: those as the words, any other value as it is."""
    return ("on" if value else "off") if isinstance(value, bool) else value
