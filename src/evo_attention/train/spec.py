"""What one training is: the ``Trial``, a frozen value with one ``key()``.

A trial names everything that can change the result of one training: the genome, the seed, the
steps (and, for a partial training of a multi-fidelity schedule, the full ``budget``), the split it
is measured on, and three specs: ``ModelSpec`` (``nn.spec``), ``TrainSpec`` (the optimisation and
evaluation recipe) and ``TaskSpec`` (the data, identified by its ``fingerprint``, not its directory).

``Trial.key()`` is the single cache identity: ``(genome, seed, steps, data fingerprint, context)``,
where ``context`` is a short hash of every spec field that can change a result. The fields join it
by construction: each spec field does, unless its metadata (``nn.spec.identity``) says it cannot
change a result (``device``, ``compile``: where and how fast) or reaches the key another way (the
data fields, through the fingerprint). A field added later is declared with ``omit_default``: at
its default it leaves the key as it was, so the records of runs made before it existed stay cache
hits, and any other value gives a new key.

The hash is the same one earlier versions computed from their list of settings (the same names
and values), so their stores resume with cache hits.

``Config`` produces the specs (``config.model``, ``config.train``, ``config.task``) and trials
(``Trial.from_config``); executors, the runner, the store and the studies speak in trials.
``load_task`` builds (once per process) the dataset a ``TaskSpec`` names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from evo_attention.genes import KEY_PARTS, AttentionGene, layers_of, recipe_of
from evo_attention.nn.spec import ModelSpec, identity, setting, whole_floats
from evo_attention.train.schedules import (SCHEDULES, alternatives, schedules_help, steps_of, takes_warmup, uses_decay,
                                           warmup_schedules)
from evo_attention.util.errors import UserError


def freeze(value: Any) -> Any:
    """A hashable, order-independent form of plain JSON-like data (dicts become sorted pairs)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of ``freeze`` for option mappings: pairs back to a dict."""
    if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


PRECISIONS = ("auto", "fp32", "bf16")  # no fp16: the engine has no loss scaling, and programs overflow its range
COMPILE_MODES = ("auto", "on", "off")
CUDA_GRAPH_MODES = ("auto", "off")
# where dropout masks come from (nn.dropout): cpu, each model's seeded CPU generator (masks copied to
# the device); counter, a hash of (seed, step, call, element) computed on the device
DROPOUT_STREAMS = ("cpu", "counter")


@dataclass(frozen=True)
class TrainSpec:
    """The recipe of one training, its step count aside (that is the trial's ``steps``). Each field
    is declared once, here (``nn.spec.setting``); the flat ``Config`` takes them from here."""

    batch_size: int = setting(32, flag="batch-size", parse="int")
    eval_batch_size: int = setting(64, flag="eval-batch-size", parse="int")
    learning_rate: float = setting(3e-4, flag="lr", parse="float", help="learning rate")
    weight_decay: float = setting(0.01)
    grad_clip: float = setting(1.0)
    eval_steps: int | None = setting(200, flag="eval-steps", parse="count_or_all",  # None: the whole split
                                     help="cap on evaluation batches, or 'all' for the whole split (the default of "
                                          "the presets)")
    # used by the schedules that take a warm-up (a Config's warm-up fraction arrives resolved)
    warmup_steps: int = setting(500, flag="warmup-steps", parse="int", metavar="N", help=lambda: (
        f"linear warm-up steps of --lr-schedule {alternatives(warmup_schedules())} (default 500)"))
    lr_schedule: str = setting("constant", flag="lr-schedule", parse="str", choices=lambda: tuple(SCHEDULES),
                               help=schedules_help)  # train.schedules
    precision: str = setting("auto", flag="precision", parse="str", choices=PRECISIONS)
    # another stream is another training (other masks): it joins a key, but only when not the default
    dropout_stream: str = setting("cpu", flag="dropout-stream", parse="str", choices=DROPOUT_STREAMS,
                                  omit_default=True, after="precision",
                                  help="where dropout masks come from: cpu (the default: each model's seeded CPU "
                                       "generator, masks copied to the device) or counter (a hash of seed, step, "
                                       "site and element computed on the device: the same bits on every device, "
                                       "nothing copied)")
    # the learning-curve resolution (steps); divergence is judged per interval, so it can change a result
    log_every: int = setting(50, omit_default=True, after="compile")
    # wsd: the last fraction of the schedule's steps decays linearly to 0; a Config gives the other
    # schedules the default, so it joins a key only for wsd (and a record's settings say it for wsd)
    lr_decay_fraction: float = setting(0.2, flag="decay-fraction", parse="float", metavar="F", omit_default=True,
                                       after="lr_schedule",
                                       help="--lr-schedule wsd: the fraction of the steps at the end over which the "
                                            "rate decays to 0 (default 0.2)")
    # compile and device cannot change a result: the same function at another speed, anywhere
    compile: str = setting("auto", flag="compile", parse="str", choices=COMPILE_MODES, key=False, compare=False,
                           help="torch.compile the model (auto: only where measured to pay, e.g. additive on CPU)")
    device: str = setting("auto", flag="device", parse="str", key=False, compare=False,
                          help="auto, cpu, cuda, cuda:N or mps")
    cuda_graph: str = setting("auto", flag="cuda-graph", parse="str", choices=CUDA_GRAPH_MODES, key=False,
                              compare=False,
                              help="on a CUDA device, capture one training step as a CUDA graph and replay it "
                                   "(auto: one model, not compiled, no dropout mask drawn on the CPU; off: eager)")
    __post_init__ = whole_floats

    def replace(self, **changes: Any) -> "TrainSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def decay_steps(self, total_steps: int) -> int:
        """The steps at the end of a ``total_steps``-step schedule over which wsd decays (0 otherwise)."""
        return steps_of(self.lr_decay_fraction, total_steps) if uses_decay(self.lr_schedule) else 0

    def with_recipe(self, recipe: Mapping[str, Any], total_steps: int) -> "TrainSpec":
        """This recipe with a genome's recipe parts (``genes.recipe_of``: learning_rate, warmup,
        weight_decay; a part not set keeps this spec's value) for a schedule of ``total_steps``
        steps: a warm-up fraction becomes its whole steps of them. UserError for a warm-up that the
        schedule does not use (constant) or that does not fit in ``total_steps``."""
        if not recipe:
            return self
        changes = {name: recipe[name] for name in ("learning_rate", "weight_decay") if name in recipe}
        warmup = recipe.get("warmup")
        if warmup is not None:
            part = f"{KEY_PARTS['warmup']}={warmup:g}"
            if not takes_warmup(self.lr_schedule):
                raise UserError(f"warm-up {part} does nothing under lr_schedule {self.lr_schedule}, which has "
                                f"no warm-up: use lr_schedule {alternatives(warmup_schedules())}, or drop the "
                                f"{KEY_PARTS['warmup']}= part", setting=("lr_schedule", "search_space"))
            changes["warmup_steps"] = warmup if isinstance(warmup, int) else steps_of(warmup, total_steps)
        spec = self.replace(**changes)
        span, decay_steps = spec.warmup_steps, spec.decay_steps(total_steps)
        if warmup is not None and (span >= total_steps or span + decay_steps > total_steps):
            decay = f" and {decay_steps} decay steps" if decay_steps else ""
            raise UserError(f"warm-up {part} ({spec.warmup_steps} steps){decay} does not fit in the "
                            f"{total_steps} steps of the schedule: use a shorter warm-up or more train_steps",
                            setting=("train_steps", "search_space"))
        return spec


@dataclass(frozen=True)
class TaskSpec:
    """The data of a training. Its identity in a key is the data's ``fingerprint`` (set once the
    data is loaded), plus the evaluation stride, which is not part of the fingerprint."""

    data: str = field(default="wikitext2", metadata=identity(key=False))
    tokenizer: str = field(default="word", metadata=identity(key=False))
    text_field: str = field(default="text", metadata=identity(key=False))
    vocab_size: int | None = field(default=10000, metadata=identity(key=False))
    seq_len: int = field(default=128, metadata=identity(key=False))  # the model's max_seq_len keys it
    eval_stride: int | None = None
    options: tuple = field(default=(), metadata=identity(key=False))  # frozen task options (recall, plugins)
    plugins: tuple = field(default=(), metadata=identity(key=False), compare=False)
    data_dir: str | None = field(default=None, metadata=identity(key=False), compare=False)
    fingerprint: str | None = field(default=None, metadata=identity(key=False))  # the key's own part

    def replace(self, **changes: Any) -> "TaskSpec":
        return dataclasses.replace(self, **changes)

    @property
    def options_dict(self) -> dict:
        return thaw(self.options) if self.options else {}

    def build_key(self) -> str:
        """What determines the dataset this spec loads (the directory included, the fingerprint not)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "fingerprint"}
        return json.dumps(values, sort_keys=True, default=str)

    def load(self):
        """The dataset this spec names (``data.load_data``); built afresh, see ``load_task``."""
        from evo_attention.data import load_data, takes_options

        options = self.options_dict if takes_options(self.data) else {}
        return load_data(self.data, data_dir=self.data_dir, vocab_size=self.vocab_size, seq_len=self.seq_len,
                         seed=options.pop("seed", 0), eval_stride=self.eval_stride, tokenizer=self.tokenizer,
                         text_field=self.text_field, **options)


@dataclass(frozen=True)
class Trial:
    """One training: genome, seed, steps, specs, split (and the budget of a partial training)."""

    genome: str  # the genome's key
    seed: int
    steps: int  # trained steps (a rung's steps, for a partial training)
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    eval_split: str = "valid"
    budget: int | None = None  # multi-fidelity: these are steps 0..steps of a budget-step schedule

    def __post_init__(self):
        if not isinstance(self.genome, str):
            object.__setattr__(self, "genome", AttentionGene.parse(self.genome).key)
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "steps", int(self.steps))
        if self.budget is not None:
            object.__setattr__(self, "budget", int(self.budget))
            if self.steps > self.budget:
                raise UserError(f"a trial of {self.steps} steps cannot belong to a {self.budget}-step budget",
                                setting="steps")

    # -- identity -----------------------------------------------------------------------------------
    def settings(self) -> dict:
        """The settings (besides genome, seed, steps and data) that shape the result: the spec fields
        that join a key (see the module docstring), by name."""
        return {f.name: getattr(spec, f.name) for spec in (self.model, self.train, self.task)
                for f in dataclasses.fields(spec) if f.metadata.get("key", True)
                and not (f.metadata.get("omit_default") and getattr(spec, f.name) == f.default)}

    @property
    def context(self) -> str:
        """A short hash of the settings and the split; under a decaying schedule a partial training's
        rate at a step depends on the budget, so the budget joins it (a rung of a constant rate is a
        plain training)."""
        payload = json.dumps(dict(self.settings(), eval_split=self.eval_split), sort_keys=True)
        context = hashlib.sha256(payload.encode()).hexdigest()[:16]
        if self.budget is None or self.steps == self.budget or self.train.lr_schedule == "constant":
            return context
        return f"{context}~{self.budget}"

    def key(self) -> tuple:
        """The cache key: ``(genome, seed, steps, data fingerprint, context)``."""
        if self.task.fingerprint is None:
            raise UserError(f"trial {self.genome} has no data fingerprint: load its task first (load_task)")
        return (self.genome, self.seed, self.steps, self.task.fingerprint, self.context)

    @property
    def recipe(self) -> TrainSpec:
        """The recipe this training runs: ``train`` with the genome's recipe parts where it sets
        them (``lr=``, ``wu=``, ``wd=``: ``TrainSpec.with_recipe``), over the schedule's steps. The
        one rule every trainer follows; the key keeps ``train`` (the configured recipe) and the
        genome (its parts), so the recipe that ran is named by both."""
        return self.train.with_recipe(recipe_of(self.genome), self.schedule_steps)

    def record_settings(self) -> dict:
        """What a record keeps as its ``settings``: the key's settings with the recipe that ran
        (``warmup_steps``: the steps the warm-up took), plus what the gene ran with, defaults included:
        the random features of a genome that uses favor and the decay fraction of a wsd schedule."""
        settings = self.settings()
        recipe = self.recipe
        for name in ("learning_rate", "warmup_steps", "weight_decay"):
            settings[name] = getattr(recipe, name)
        if not takes_warmup(recipe.lr_schedule):  # the schedule ignores warmup_steps (constant): none ran
            settings["warmup_steps"] = 0
        if any(g.normalization == "favor" for g in layers_of(self.gene)):
            settings["favor_features"] = self.model.favor_features
        if uses_decay(self.train.lr_schedule):  # the decay it ran with (wsd), its default included
            settings["lr_decay_fraction"] = self.train.lr_decay_fraction
        return settings

    # -- views and changes --------------------------------------------------------------------------
    @property
    def gene(self):  # the genome as an AttentionGene (or LayerGenes)
        return AttentionGene.parse(self.genome)

    @property
    def schedule_steps(self) -> int:  # the steps the schedule spans: the budget of a partial training
        return self.budget if self.budget is not None else self.steps

    def replace(self, **changes: Any) -> "Trial":
        return dataclasses.replace(self, **changes)

    def with_data(self, data) -> "Trial":
        """This trial with the fingerprint of ``data`` (a ``TaskData`` built for its task)."""
        return self.replace(task=self.task.replace(fingerprint=data.fingerprint))

    def config_dict(self, model: ModelSpec | None = None) -> dict:
        """This trial's settings by their ``Config`` names (``model``: the spec built for the data, in
        its own's place); ``Config.from_dict`` of it is the trial's Config, what its model is saved with."""
        task = self.task
        return {**(model or self.model).to_dict(), **self.train.to_dict(), "seed": self.seed,
                "train_steps": self.schedule_steps, "data": task.data, "tokenizer": task.tokenizer,
                "text_field": task.text_field, "data_dir": task.data_dir, "eval_stride": task.eval_stride,
                "recall": task.options_dict, "plugins": list(task.plugins)}

    @classmethod
    def from_config(cls, genome, config, *, seed: int | None = None, steps: int | None = None,
                    eval_split: str = "valid", budget: int | None = None, data=None) -> "Trial":
        """The trial of training ``genome`` with ``config`` (its seed and steps unless given); with
        ``data``, its fingerprint is filled in. A warm-up given as a fraction (``config.warmup``)
        becomes the whole steps it is of the steps the schedule spans (``budget``, else ``steps``)."""
        genome = genome if isinstance(genome, str) else genome.key
        steps = config.train_steps if steps is None else steps
        trial = cls(genome=AttentionGene.parse(genome).key, seed=config.seed if seed is None else seed,
                    steps=steps, model=config.model, train=config.train_for(steps if budget is None else budget),
                    task=config.task, eval_split=eval_split, budget=budget)
        trial.recipe  # a genome's recipe parts that do not fit the schedule fail here, before any training
        return trial.with_data(data) if data is not None else trial


# -- the datasets of the trials a process runs -----------------------------------------------------
_TASK_DATA: dict[str, Any] = {}
_TASK_DATA_LIMIT = 4  # datasets kept per process (a suite of tasks cycles through a few)


def provide_task(task: TaskSpec, data) -> None:
    """Make ``data`` (already built, e.g. a caller's own ``TaskData``) the dataset of ``task`` in
    this process."""
    _remember(task.build_key(), data)


def load_task(task: TaskSpec):
    """The dataset of ``task``, built once per process; UserError if a fingerprint is given and the
    data built here differs from it (another machine's files)."""
    key = task.build_key()
    data = _TASK_DATA.get(key)
    if data is None:
        from evo_attention.util.plugins import load_plugins

        load_plugins(task.plugins)
        data = task.load()
        _remember(key, data)
    if task.fingerprint is not None and data.fingerprint != task.fingerprint:
        raise UserError(
            f"the dataset built here from the trial's task differs from the one it was planned on (fingerprint "
            f"{data.fingerprint[:12]} vs {task.fingerprint[:12]}): point data_dir at the data the run uses, or use "
            "the local executor")
    return data


def _remember(key: str, data) -> None:
    _TASK_DATA.pop(key, None)
    _TASK_DATA[key] = data
    while len(_TASK_DATA) > _TASK_DATA_LIMIT:
        _TASK_DATA.pop(next(iter(_TASK_DATA)))
