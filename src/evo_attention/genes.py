"""The AttentionGene: one attention mechanism as an immutable value.

A gene names one similarity, normalization, gating and temperature (see ``components``), whether
the Q/K/V/output projections carry a bias, and the attention-weight dropout. Its ``key``, e.g.
``dot|sparsemax|output_gate|learned|bias|0.10``, is its identity: genes compare and hash by it,
and results are cached under it. ``AttentionGene.parse`` reads the key and the short form
``dot|sparsemax|output_gate|learned`` (bias on, dropout 0.1).

Further fields (``AXIS_FIELDS``; see ``nn.positions`` and ``nn.attention``) appear in the key only
when they differ from their default, as ``name=value`` parts after the six fixed ones (in any order
for ``parse``), so a key without them names a gene with the default axes: ``pos=`` (position:
learned, rope, rope:linear:F, rope:ntk:F, alibi, none), ``rank=`` (qkv_rank: 0 or a factorised
d -> r -> d), ``abias=`` (attn_bias: none or rel), ``win=`` (window: 0 or the last W keys),
``kvh=`` (kv_heads: 0 or K dividing the heads), ``dconv=`` (qkv_conv: 0 or a causal convolution
width 2-4 of q, k, v) and ``prog=`` (an attention program, ``programs``, in place of the four
components), e.g. ``dot|softmax|none|fixed|bias|0.10|pos=rope:ntk:4|rank=32|abias=rel``.

The training *recipe* (``RECIPE_FIELDS``: ``lr=``, ``wu=`` as steps or a fraction in (0, 1),
``wd=``) lets a search tune the recipe jointly with the mechanism; its default, None, is the run's
configured value. The trainer reads it through ``train.spec.Trial.recipe``; ``nn`` builds the same
model whatever it says. The layers of a per-layer genome share one recipe (``layers_violation``).
``mechanism_of`` drops the recipe parts, ``recipe_of`` gives them.

Every field is described once, by its ``Field`` in ``GENE_FIELDS`` (in key order); the older
names (``FIELDS``, ``AXIS_FIELDS``, ``KEY_PARTS``, ...) are derived from that table.

``SearchSpace`` holds the options of each field; by default ``OPTIONS``: the built-ins, then those
a ``register_*`` decorator adds, in registration order. Seeded draws index into these lists: the
built-ins' order never changes, and a field with one option consumes no random number, so a new
axis leaves every seeded draw of a space that does not vary it unchanged.

``RULES`` name the combinations of valid values that make no model (a kernel normalization,
``linear`` or ``favor``, needs a dot-product similarity and admits no score bias) and the fields
each reads. A gene that breaks one is refused in one line naming the rule; random draws redraw, and
mutation and crossover try again with the same RNG (deterministic for a seed). The kernel
normalizations are ``OPT_IN``: a space holds them only when it lists them. ``size_problem`` and
``full_window_note`` say whether a genome or a space fits a model.

This module owns the *grammar* of every field (valid names and values, how a key is written);
``nn`` owns what the names compute. It imports neither torch nor ``nn``.
"""

from __future__ import annotations

import functools
import itertools
import math
import random as _random
from dataclasses import dataclass, make_dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from evo_attention import programs
from evo_attention.util.errors import UserError, check_argument

DROPOUT_CHOICES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
MAX_DROPOUT = 0.3

POSITION_KINDS = ("learned", "rope", "alibi", "none")
ROPE_SCALINGS = ("none", "linear", "ntk")
ATTN_BIASES = ("none", "rel")
_POSITION_HELP = "learned, rope, rope:linear:F, rope:ntk:F (F > 1), alibi, none"


class PositionSpec(NamedTuple):
    """A parsed ``position`` value: where a layer gets word order from (see ``nn.positions``)."""

    kind: str  # one of POSITION_KINDS
    scaling: str = "none"  # rope only: one of ROPE_SCALINGS
    factor: float = 1.0  # rope scaling factor (> 1 when scaling != "none")

    def __str__(self) -> str:
        if self.kind != "rope" or self.scaling == "none":
            return self.kind
        return f"rope:{self.scaling}:{self.factor:g}"


def parse_position(value) -> PositionSpec:
    """Read a position option ('learned', 'rope', 'rope:ntk:4', ...); UserError if invalid."""
    if isinstance(value, PositionSpec):
        return value
    text = str(value).strip().lower() if isinstance(value, str) else None
    parts = text.split(":") if text else []
    if not parts or parts[0] not in POSITION_KINDS:
        raise UserError(f"unknown position {value!r}: valid options are {_POSITION_HELP}")
    if parts[0] != "rope":
        if len(parts) != 1:
            raise UserError(f"position {value!r}: only rope takes a scaling; valid options are {_POSITION_HELP}")
        return PositionSpec(parts[0])
    if len(parts) == 1 or (len(parts) == 2 and parts[1] == "none"):
        return PositionSpec("rope")
    if len(parts) != 3 or parts[1] not in ROPE_SCALINGS[1:]:
        raise UserError(f"unknown rope scaling in position {value!r}: write rope, rope:linear:F or rope:ntk:F")
    try:
        factor = float(parts[2])
    except ValueError:
        raise UserError(f"rope scaling factor {parts[2]!r} in position {value!r} is not a number: use e.g. rope:{parts[1]}:4") from None
    if not math.isfinite(factor) or factor <= 1.0:
        raise UserError(f"rope scaling factor in position {value!r} must be a number > 1 (use plain 'rope' for no scaling)")
    return PositionSpec("rope", parts[1], factor)


# -- the fields ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """One gene field: everything the grammar knows of it. ``check(field, value)`` returns the canonical
    value or raises a ``UserError`` naming the field; a fixed part (``part`` None) is always in the key,
    in ``GENE_FIELDS`` order, an axis only as ``part=value`` where its value is not ``default``."""

    name: str
    default: Any  # the vanilla transformer's value; a gene built without the field takes it
    check: Callable[["Field", Any], Any]
    space: tuple = ()  # a SearchSpace's options unless it lists some; () means the registered names
    part: str | None = None  # the axis's key part name (pos, rank, ...); None for a fixed part
    write: Callable[[Any], str] = str  # the value as the key writes it
    help: str = ""  # how to write a valid value (the end of the error for an invalid one)
    builtins: tuple | None = None  # a registered field (OPTIONS, extendable by nn.components): the built-in names
    recipe: bool = False  # a field of the training recipe (not of the mechanism): default None, the run's value

    def canonical(self, value: Any) -> Any:
        return self.check(self, value)


def _check_choice(fieldname: str, value: Any, options: Sequence[str]) -> str:
    if value not in options:
        raise UserError(f"unknown {fieldname} {value!r}: valid options are {', '.join(map(str, options))}")
    return value


def _check_registered(field: Field, value: Any) -> str:
    return _check_choice(field.name, value, OPTIONS[field.name])


_BOOLEAN_WORDS = {**dict.fromkeys(("bias", "true", "yes", "on"), True),
                  **dict.fromkeys(("nobias", "false", "no", "off"), False)}


def _check_bias(field: Field, value: Any) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _BOOLEAN_WORDS:
        return _BOOLEAN_WORDS[value.lower()]
    raise UserError(f"{field.name} {value!r} is not a boolean: {field.help}")


def _check_dropout(field: Field, value: Any) -> float:
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{field.name} {value!r} is not a number: {field.help}") from None
    if not 0.0 <= p <= MAX_DROPOUT + 1e-9:
        raise UserError(f"{field.name} {value!r} is outside [0, {MAX_DROPOUT}]: pick a value in that range")
    if abs(p * 100 - round(p * 100)) > 1e-6:  # a key holds two decimals: another value would not read back
        raise UserError(f"{field.name} {value!r} is not a multiple of 0.01 (a gene key holds two decimals): use "
                        f"{p:.2f} or another multiple of 0.01")
    return round(p, 2)


MAX_COUNT = 2**62  # a count the engine's int64 position arithmetic holds (a window past any sequence is full)


def _check_count(field: Field, value: Any) -> int:
    """A non-negative integer (qkv_rank, window, kv_heads) below ``MAX_COUNT``."""
    try:
        number = None if isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        number = None
    if number is None:
        raise UserError(f"{field.name} {value!r} is not an integer: {field.help}")
    if number < 0 or (isinstance(value, float) and value != number):
        raise UserError(f"{field.name} {value!r} is not a non-negative integer: {field.help}")
    if number >= MAX_COUNT:
        raise UserError(f"{field.name} {value!r} is too large (at most 2^62 - 1): {field.help}")
    return number


def _recipe_number(field: Field, value: Any) -> float | None:
    """None for the run's configured value (None, or the word 'default'), else the value as a finite float
    kept to 6 significant digits (what its key part writes)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("default", "none", "null", "")):
        return None
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise UserError(f"{field.name} {value!r} is not a number: {field.help}")
    return float(f"{number:.6g}")


def _recipe_bounded(fits: Callable[[float], bool], problem: str) -> Callable[[Field, Any], float | None]:
    """A recipe field's check: the recipe number if ``fits`` it (UserError saying ``problem``)."""
    def check(field: Field, value: Any) -> float | None:
        number = _recipe_number(field, value)
        if number is not None and not fits(number):
            raise UserError(f"{field.name} {value!r} {problem}: {field.help}")
        return number
    return check


def _check_warmup(field: Field, value: Any) -> int | float | None:
    """None, whole warm-up steps (an int), or a fraction of the schedule's steps in (0, 1) (a float)."""
    number = _recipe_number(field, value)
    if number is None:
        return None
    if number < 0 or (number >= 1 and not number.is_integer()):
        raise UserError(f"{field.name} {value!r} is neither whole steps nor a fraction in (0, 1): {field.help}")
    return number if 0 < number < 1 else int(number)


def _write_number(value: Any) -> str:
    return f"{value:g}"


QKV_CONV_WIDTHS = (2, 3, 4)


def _check_conv(field: Field, value: Any) -> int:
    width = _check_count(field, value)
    if width and width not in QKV_CONV_WIDTHS:
        raise UserError(f"{field.part}={value} is not a convolution width ({field.name}): {field.help}")
    return width


def _check_program(field: Field, value: Any) -> str | None:
    """None (the four components), or a program's canonical text (``programs``)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    if not isinstance(value, (str, programs.Program)):
        raise UserError(f"program {value!r} must be a program's text such as o(mix(w.softmax(t.fixed(s.dot(q,k))),v)), "
                        f"not a {type(value).__name__}", setting="program")
    return canonical_program(value).text


def program_grammar() -> programs.Grammar:
    """The program language over the components registered now (``OPTIONS``)."""
    return _grammar(tuple(tuple(OPTIONS[name]) for name in CATEGORICAL_FIELDS), tuple(sorted(KERNEL_NORMALIZATIONS)),
                    programs.generation())


@functools.lru_cache(maxsize=8)
def _grammar(options: tuple, kernels: tuple, generation: int) -> programs.Grammar:
    return programs.Grammar(dict(zip(CATEGORICAL_FIELDS, options)), kernels)


def canonical_program(text: "str | programs.Program") -> programs.Program:
    """A program (its text or itself) checked and in canonical form; ProgramError if it is none."""
    return _canonical_program(str(text), program_grammar())


@functools.lru_cache(maxsize=4096)
def _canonical_program(text: str, grammar: programs.Grammar) -> programs.Program:
    return programs.canonical(programs.parse(text, grammar), grammar)


# Every gene field, in key order: the six fixed parts, then the axes. The built-in names are
# listed in the order nn.components registers them; seeded draws index into that order.
GENE_FIELDS = (
    Field("similarity", "dot", _check_registered,
          builtins=("dot", "multiplicative", "additive", "cosine")),
    Field("normalization", "softmax", _check_registered,
          builtins=("softmax", "sparsemax", "relu_norm", "sigmoid", "entmax15", "linear", "favor")),
    Field("gating", "none", _check_registered,
          builtins=("none", "input_gate", "output_gate", "highway")),
    Field("temperature_mode", "fixed", _check_registered,
          builtins=("fixed", "learned", "adaptive")),
    Field("use_bias", True, _check_bias, space=(True, False), write=lambda b: "bias" if b else "nobias",
          help="use true/false (or 'bias'/'nobias' in a key)"),
    Field("attention_dropout", 0.1, _check_dropout, space=DROPOUT_CHOICES, write=lambda p: f"{p:.2f}",
          help=f"use a float in [0, {MAX_DROPOUT}]"),
    # a position in its canonical spelling: 'rope:ntk:4.0' -> 'rope:ntk:4'
    Field("position", "learned", lambda field, value: str(parse_position(value)), space=("learned",), part="pos"),
    Field("qkv_rank", 0, _check_count, space=(0,), part="rank", help="use 0 (full projections) or a rank r > 0"),
    Field("attn_bias", "none", lambda field, value: _check_choice(field.name, value, ATTN_BIASES), space=("none",),
          part="abias"),
    Field("window", 0, _check_count, space=(0,), part="win", help="use 0 (every earlier key) or a window W > 0"),
    Field("kv_heads", 0, _check_count, space=(0,), part="kvh",
          help="use 0 (one key/value head per head) or a K that divides the number of heads"),
    Field("qkv_conv", 0, _check_conv, space=(0,), part="dconv",
          help="use 0 (off) or a width 2, 3 or 4 (a depthwise causal convolution of q, k and v along time)"),
    # an attention program (``programs``) in place of the four components; a search space draws
    # programs when it holds a ProgramSpace (``SearchSpace.program_space``)
    Field("program", None, _check_program, space=(None,), part="prog", write=str,
          help="write a program such as o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"),
    # the training recipe: None is the run's configured value (train.spec.Trial.recipe applies the others)
    Field("learning_rate", None, _recipe_bounded(lambda rate: rate > 0, "is not a positive number"), space=(None,),
          part="lr", write=_write_number, recipe=True,
          help="use a positive rate such as 1e-3, or default (the run's learning_rate)"),
    Field("warmup", None, _check_warmup, space=(None,), part="wu", write=_write_number, recipe=True,
          help="use whole steps such as 100, a fraction of the steps in (0, 1) such as 0.05, or default (the "
               "run's warm-up)"),
    Field("weight_decay", None, _recipe_bounded(lambda decay: decay >= 0, "is negative"), space=(None,), part="wd",
          write=_write_number, recipe=True,
          help="use a number >= 0 such as 0.1, or default (the run's weight_decay)"),
)
FIELD = {f.name: f for f in GENE_FIELDS}

# Views of the table, under the names other modules (and users) import.
CATEGORICAL_FIELDS = tuple(f.name for f in GENE_FIELDS if f.builtins is not None)
FIELDS = tuple(f.name for f in GENE_FIELDS if f.part is None)  # the six parts every key starts with
AXIS_FIELDS = tuple(f.name for f in GENE_FIELDS if f.part is not None)  # optional name=value parts of a key
ALL_FIELDS = FIELDS + AXIS_FIELDS
RECIPE_FIELDS = tuple(f.name for f in GENE_FIELDS if f.recipe)  # the training recipe's parts (lr=, wu=, wd=)
MECHANISM_FIELDS = tuple(name for name in ALL_FIELDS if name not in RECIPE_FIELDS)  # what nn computes
AXIS_DEFAULTS = {name: FIELD[name].default for name in AXIS_FIELDS}
KEY_PARTS = {name: FIELD[name].part for name in AXIS_FIELDS}  # field -> key part name
_PART_FIELDS = {**{v: k for k, v in KEY_PARTS.items()}, **{k: k for k in KEY_PARTS}}  # part or field -> field
_SPACE_NAMES = {**{name: name for name in ALL_FIELDS}, **_PART_FIELDS}  # what a search space's keys may be


def _axis_parts(values: Mapping[str, Any]) -> list:
    """The ``name=value`` parts of the axes whose value is not the default."""
    return [f"{KEY_PARTS[n]}={FIELD[n].write(values[n])}" for n in AXIS_FIELDS if values[n] != AXIS_DEFAULTS[n]]


def _key_of(values: Mapping[str, Any]) -> str:
    """The key of canonical gene values: the six fixed parts, then the non-default axes."""
    return "|".join([FIELD[n].write(values[n]) for n in FIELDS] + _axis_parts(values))


VANILLA_KEY = _key_of({f.name: f.default for f in GENE_FIELDS})  # dot|softmax|none|fixed|bias|0.10

# The option names of each registered field (module docstring); every gene and search space is checked against them.
OPTIONS: dict[str, list] = {name: list(FIELD[name].builtins) for name in CATEGORICAL_FIELDS}
# What the validity rules need to know of the options: similarities whose score is a dot product
# of transformed q and k, and normalizations computed from feature maps phi(q) . phi(k) (kernel
# forms, which never see a score and so cannot add a bias to one). Registration adds a plugin's.
DOT_FORM_SIMILARITIES: set = {"dot", "cosine"}
KERNEL_NORMALIZATIONS: set = {"linear", "favor"}
# Option names that a search space contains only when it lists them: the efficient attention
# families are comparisons, not part of the original study's space, whose seeded draws stay as they were.
OPT_IN: dict[str, set] = {name: set() for name in CATEGORICAL_FIELDS}
OPT_IN["normalization"].update(KERNEL_NORMALIZATIONS)


# -- validity: combinations of valid field values that still make no model ----------------------
class Rule(NamedTuple):
    name: str
    broken: Callable[[Mapping[str, Any]], bool]  # gene values -> whether the rule is broken
    explain: Callable[[Mapping[str, Any]], str]  # gene values -> what is wrong and what to do
    fields: tuple = ALL_FIELDS  # the only fields broken and explain read (default: possibly any)


def _kernel(values) -> bool:
    return values["normalization"] in KERNEL_NORMALIZATIONS


CORE_FIELDS = ("similarity", "normalization", "gating", "temperature_mode")  # what a program replaces


def _program_without_scores(values) -> bool:
    """A program that forms no weights from scores (only kernel or along-time mixing) with a score bias."""
    if values.get("program") is None or (str(values["position"]) != "alibi" and values["attn_bias"] == "none"):
        return False
    return not any(n.op.startswith("w.") for n in canonical_program(values["program"]).nodes())


RULES = (
    Rule("kernel-needs-dot-similarity",
         lambda v: _kernel(v) and v["similarity"] not in DOT_FORM_SIMILARITIES,
         lambda v: f"normalization {v['normalization']} weighs keys by phi(q) . phi(k), which needs a dot-product "
                   f"similarity, not {v['similarity']}: use {' or '.join(sorted(DOT_FORM_SIMILARITIES))}",
         fields=("normalization", "similarity")),
    Rule("kernel-has-no-score-bias",
         lambda v: _kernel(v) and (str(v["position"]) == "alibi" or v["attn_bias"] != "none"),
         lambda v: f"normalization {v['normalization']} never forms a score, so it cannot add the score bias of "
                   f"{'pos=alibi' if str(v['position']) == 'alibi' else 'abias=' + v['attn_bias']}: use pos=learned, "
                   "rope or none with abias=none",
         fields=("normalization", "position", "attn_bias")),
    Rule("program-replaces-components",
         lambda v: v.get("program") is not None and any(v[n] != FIELD[n].default for n in CORE_FIELDS),
         lambda v: "a gene with a program (prog=) computes what its program says, so its four components stay at "
                   f"their defaults ({'|'.join(str(FIELD[n].default) for n in CORE_FIELDS)}): write them into the "
                   "program instead",
         fields=CORE_FIELDS + ("program",)),
    Rule("program-score-bias-needs-weights",
         _program_without_scores,
         lambda v: "the program forms no weights from scores (no w.* op), so it cannot add the score bias of "
                   f"{'pos=alibi' if str(v['position']) == 'alibi' else 'abias=' + v['attn_bias']}: use pos=learned, "
                   "rope or none with abias=none",
         fields=("program", "position", "attn_bias")),
)


def violation(values: Mapping[str, Any]) -> str | None:
    """The message of the first rule that the gene ``values`` break, naming the rule; None if valid.

    ``values`` needs only the fields the rules read (``rule_fields()``)."""
    for rule in RULES:
        if rule.broken(values):
            return f"{rule.explain(values)} (rule {rule.name})"
    return None


def rule_fields() -> tuple:
    """The fields that some rule of ``RULES`` reads, in ``ALL_FIELDS`` order (read when called, so a
    rule added to ``RULES`` counts)."""
    read = {name for rule in RULES for name in rule.fields}
    return tuple(name for name in ALL_FIELDS if name in read)


MAX_REDRAWS = 1000  # a space with any valid gene passes this many draws with vanishing probability


# A SearchSpace's dataclass fields: one tuple of options per gene field (in GENE_FIELDS order,
# defaulting to the field's ``space``), then ``layers``.
_SpaceFields = make_dataclass("_SpaceFields", [(f.name, tuple, f.space) for f in GENE_FIELDS] + [("layers", int, 0)],
                              frozen=True, namespace={"__module__": __name__})


@dataclass(frozen=True)
class SearchSpace(_SpaceFields):
    """The options of each gene field that random draws and mutations pick from.

    One tuple per gene field (``ALL_FIELDS``), e.g. ``position=("learned", "rope", "rope:ntk:4")``,
    ``qkv_rank=(0, 16, 32)``, ``kv_heads=(0, 1, 2)``; an omitted field takes its ``Field.space``.
    Empty categorical tuples (the default) mean "everything registered right now" (but ``OPT_IN``).
    ``layers``: 0, one gene shared by every layer; N, a per-layer genome of N genes (``LayerGenes``).
    """

    def __post_init__(self):
        drawn = self.program
        if isinstance(drawn, tuple) and len(drawn) == 1 and isinstance(drawn[0], (Mapping, programs.ProgramSpace)):
            drawn = drawn[0]
        if isinstance(drawn, (Mapping, programs.ProgramSpace)) or drawn is True:
            space = drawn if isinstance(drawn, programs.ProgramSpace) else programs.ProgramSpace.from_dict(
                drawn, program_grammar())
            listed = [n for n in CORE_FIELDS if getattr(self, n) not in ((), (FIELD[n].default,))]
            if listed:
                raise UserError(f"a program search space draws programs in place of the four components: leave "
                                f"{listed[0]} out of the search space (or write it into the programs' ops)",
                                setting="search_space")
            object.__setattr__(self, "program_space", space)
            object.__setattr__(self, "program", (programs.KNOWN_PROGRAMS["softmax attention"],))
            for n in CORE_FIELDS:
                object.__setattr__(self, n, (FIELD[n].default,))
        else:
            object.__setattr__(self, "program_space", None)
        for f in GENE_FIELDS:
            values = getattr(self, f.name)
            if f.part is None:  # one bare option is a list of one (a string is never read letter by letter)
                values = tuple(f.canonical(v) for v in ((values,) if isinstance(values, str) else values))
            else:  # an axis may be given as one bare value; canonical spellings, duplicates dropped
                single = values is None or isinstance(values, (str, int, float))
                values = (values,) if single else values  # (rope and rope:none are one)
                values = tuple(dict.fromkeys(f.canonical(v) for v in values))
            object.__setattr__(self, f.name, values)
        for f in GENE_FIELDS:
            if f.name not in CATEGORICAL_FIELDS and not getattr(self, f.name):
                raise UserError(f"search space option list for {f.name} is empty: give at least one value")
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            raise UserError(f"layers {self.layers!r} must be 0 (a shared gene) or the number of layers of a per-layer "
                            "genome", setting="genome")
        self._check_some_gene_is_valid()

    def random(self, rng: _random.Random | None = None) -> "AttentionGene | LayerGenes":
        """A random genome of this space: a gene, or one gene per layer when ``layers`` > 0."""
        rng = rng or _random
        if not self.layers:
            return AttentionGene(rng=rng, space=self)
        return LayerGenes.random(rng, self)

    def vanilla(self) -> "AttentionGene | LayerGenes":
        """The vanilla transformer as a genome of this space."""
        gene = AttentionGene.vanilla()
        return LayerGenes([gene] * self.layers) if self.layers else gene

    def _check_some_gene_is_valid(self) -> None:
        """Only the fields the rules read decide validity, so trying their combinations settles it."""
        ruled = rule_fields()
        first = None
        for combo in itertools.product(*(self.options(n) for n in ruled)):
            problem = violation(dict(zip(ruled, combo)))
            if problem is None:
                return
            first = first or problem
        raise UserError(f"the search space holds no valid gene: {first}", setting="search_space")

    def options(self, fieldname: str) -> list:
        chosen = getattr(self, fieldname)
        if fieldname in CATEGORICAL_FIELDS and not chosen:
            return [name for name in OPTIONS[fieldname] if name not in OPT_IN[fieldname]]
        return list(chosen)

    def size(self) -> int | float:
        """How many genomes the space holds (math.inf for a program space)."""
        if self.program_space is not None:
            return math.inf
        return math.prod(len(self.options(name)) for name in ALL_FIELDS)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "SearchSpace":
        if data is not None and not isinstance(data, Mapping):
            raise UserError(f"search_space {data!r} must be a mapping of fields to options such as "
                            "{normalization: [softmax, sparsemax]}", setting="search_space")
        data = dict(data or {})
        unknown = sorted(str(k) for k in data if k not in _SPACE_NAMES)
        if unknown:
            raise UserError(f"unknown search-space field {unknown[0]!r}: valid fields are {', '.join(ALL_FIELDS)} "
                            f"(or their key parts {', '.join(KEY_PARTS.values())})", setting="search_space")
        named = {}
        for name, value in data.items():  # a key part (lr, pos, ...) names its field
            field = _SPACE_NAMES[name]
            if field in named:
                raise UserError(f"the search space names {field} twice (as {KEY_PARTS[field]} and {field}): keep one",
                                setting="search_space")
            named[field] = value
        for name, value in named.items():
            if isinstance(value, (list, tuple)) and not value:
                raise UserError(f"search space option list for {name} is empty: give at least one option, or leave "
                                f"{name} out to search every registered option", setting="search_space")
        return cls(**{k: tuple(v) if isinstance(v, (list, tuple)) else (v,) for k, v in named.items()})

    def to_dict(self) -> dict:
        values = {name: self.options(name) for name in ALL_FIELDS}
        if self.program_space is not None:
            values["program"] = self.program_space.to_dict()
        return values


LAYER_SEPARATOR = " / "


class _Keyed:
    """An immutable value whose key is its identity: equal (within its type) and hashed by the key,
    pickled as the key (``AttentionGene.parse`` reads every kind back)."""

    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable: use replace(), mutate() or crossover()")

    @property
    def key(self) -> str:
        return self._key

    def __repr__(self) -> str:
        return f"AttentionGene.parse({self._key!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, type(self)) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self):
        return (AttentionGene.parse, (self._key,))


class AttentionGene(_Keyed):
    """An attention mechanism. Immutable; equal and hashed by ``key``.

    ``AttentionGene()`` draws a random gene from the module RNG, ``AttentionGene(rng=r)`` from a
    ``random.Random``; ``AttentionGene(gene_dict={...})`` or keyword fields build a given one
    (missing fields take the vanilla transformer's values).
    """

    # The live option lists (registering a component extends them).
    SIMILARITY_FUNCS = OPTIONS["similarity"]
    NORMALIZATIONS = OPTIONS["normalization"]
    GATING = OPTIONS["gating"]
    TEMPERATURE_MODES = OPTIONS["temperature_mode"]

    __slots__ = ALL_FIELDS + ("_key",)

    def __init__(self, gene_dict: Mapping[str, Any] | None = None, *, rng: _random.Random | None = None,
                 space: SearchSpace | None = None, **fields: Any):
        _check_rng_space(rng, space)
        if isinstance(gene_dict, str):
            raise TypeError(f"gene_dict must be a mapping of gene fields; a gene key such as {gene_dict!r} is read by "
                            "AttentionGene.parse(key)")
        if gene_dict is not None:
            check_argument("gene_dict", gene_dict, Mapping, "a mapping of gene fields (or None)")
            if fields:
                raise UserError("give a gene either as gene_dict or as keyword fields, not both")
            values = dict(gene_dict)
        else:  # keyword fields, or none: a random gene
            values = fields or _random_values(rng or _random, space or SearchSpace())
        unknown = sorted(set(values) - set(ALL_FIELDS))
        if unknown:
            raise UserError(f"unknown gene field {unknown[0]!r}: valid fields are {', '.join(ALL_FIELDS)}")
        for f in GENE_FIELDS:
            object.__setattr__(self, f.name, f.canonical(values.get(f.name, f.default)))
        object.__setattr__(self, "_key", _key_of(self.to_dict()))
        problem = violation(self.to_dict())
        if problem:
            raise UserError(f"gene {self._key}: {problem}")

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def random(cls, rng: _random.Random | None = None, space: SearchSpace | None = None) -> "AttentionGene":
        """A random gene from ``rng`` (default: the module RNG) over ``space`` (the constructor checks both)."""
        return cls(rng=rng, space=space)

    @classmethod
    def vanilla(cls) -> "AttentionGene":
        """The standard transformer: dot|softmax|none|fixed, bias on, dropout 0.1."""
        return cls.parse(VANILLA_KEY)

    @classmethod
    def parse(cls, text: str) -> "AttentionGene":
        """Read a gene from its key, its short form, or ``str(gene)`` (``Attn(...)``), each optionally
        followed by ``name=value`` parts (``pos=``, ``rank=``, ``abias=``, ``win=``, ``kvh=``; the recipe's
        ``lr=``, ``wu=``, ``wd=``) in any order.

        A text joining genes with `` / `` is a per-layer genome: a ``LayerGenes`` is returned."""
        if isinstance(text, (AttentionGene, LayerGenes)):
            return text
        if not isinstance(text, str):
            raise UserError(f"cannot parse gene from {text!r}: expected a string like 'dot|softmax|none|fixed'")
        if "/" in text:
            return LayerGenes.parse(text)
        s = text.strip()
        if s.startswith("Attn(") and s.endswith(")"):
            s = s[5:-1]
        parts = [p.strip() for p in s.split("|")]
        named = _named_parts(text, [p for p in parts if "=" in p])
        parts = [p for p in parts if "=" not in p]
        if len(parts) in (0, 2) and named.get("program") is not None:  # a program: the default components
            parts = [str(FIELD[n].default) for n in CORE_FIELDS] + parts
        if len(parts) == 4:
            parts += ["bias", "0.10"]
        if len(parts) != 6:
            raise UserError(f"cannot parse gene {text!r}: expected 4 parts "
                            "'similarity|normalization|gating|temperature' or 6 parts '...|bias|0.10' (optionally "
                            "followed by pos=, rank=, abias=, win=, kvh=, prog=, lr=, wu=, wd= parts), or a program "
                            "'prog=...' with or without '|bias|0.10'")
        return cls(gene_dict={**dict(zip(FIELDS, parts)), **named})

    def replace(self, **changes: Any) -> "AttentionGene":
        return AttentionGene(gene_dict={**self.to_dict(), **changes})

    # -- genetic operators --------------------------------------------------------------------
    # The fixed parts always consume a random number; an axis only when it could change (a space
    # that does not vary an axis draws exactly what it drew before the axis existed).
    def mutate(self, mutation_rate: float, rng: _random.Random | None = None,
               space: SearchSpace | None = None) -> "AttentionGene":
        """Resample each field with probability ``mutation_rate``; returns a new gene."""
        check_argument("mutation_rate", mutation_rate, (int, float), "a number in [0, 1]")
        if not 0.0 <= mutation_rate <= 1.0:
            raise UserError(f"mutation_rate {mutation_rate!r} is outside [0, 1]")
        _check_rng_space(rng, space)
        rng = rng or _random
        space = space or SearchSpace()
        for _ in range(MAX_REDRAWS):  # an invalid result is mutated again from self, with the same rng
            values = self.to_dict()
            for name in FIELDS:
                if rng.random() < mutation_rate:
                    values[name] = rng.choice(space.options(name))
            for name in AXIS_FIELDS:
                options = space.options(name)
                if (name == "program" and space.program_space is not None) or options == [values[name]]:
                    continue  # a program space edits the program below; a single option could not change: no draw
                if rng.random() < mutation_rate:
                    values[name] = rng.choice(options)
            if space.program_space is not None:  # in a program space every child is one program edit away
                parent = canonical_program(values["program"] or programs.KNOWN_PROGRAMS["softmax attention"])
                values["program"] = programs.mutate(parent, rng, space.program_space, program_grammar()).text
            if violation(values) is None:
                return AttentionGene(gene_dict=values)
        return self

    def crossover(self, other: "AttentionGene", rng: _random.Random | None = None,
                  space: SearchSpace | None = None) -> "AttentionGene":
        """Uniform crossover: each field from self or other with probability 1/2; two programs of a
        program ``space`` cross by a subtree (``programs.crossover``)."""
        check_argument("other", other, AttentionGene, "an AttentionGene (AttentionGene.parse(key))")
        _check_rng_space(rng, space)
        rng = rng or _random
        mine, theirs = self.to_dict(), other.to_dict()
        for _ in range(MAX_REDRAWS):  # an invalid child is drawn again (both parents are valid children)
            child = {n: mine[n] if rng.random() < 0.5 else theirs[n] for n in FIELDS}
            for n in AXIS_FIELDS:  # equal values need no draw
                child[n] = mine[n] if mine[n] == theirs[n] or rng.random() < 0.5 else theirs[n]
            if space is not None and space.program_space is not None and None not in (mine["program"], theirs["program"]):
                child["program"] = programs.crossover(canonical_program(mine["program"]),
                                                      canonical_program(theirs["program"]), rng,
                                                      space.program_space, program_grammar()).text
            if violation(child) is None:
                return AttentionGene(gene_dict=child)
        return self

    # -- views ---------------------------------------------------------------------------------
    @property
    def short(self) -> str:
        """The four components, plus the non-default axes (``dot|softmax|none|fixed|pos=rope``); a
        gene with a program: its axes alone (``prog=o(...)|pos=rope``), the program first."""
        axes = _axis_parts(self.to_dict())
        if self.program is not None:
            return "|".join(sorted(axes, key=lambda part: not part.startswith("prog=")))
        return "|".join([getattr(self, n) for n in CATEGORICAL_FIELDS] + axes)

    @property
    def label(self) -> str:
        """The key as shown: a program gene's program first, then what applies besides it (its four
        components are the defaults a program ignores, so they are left out); ``parse(label)`` gives
        the same gene. Any other gene: its key."""
        if self.program is None:
            return self.key
        values = self.to_dict()
        return "|".join([f"prog={self.program}"] + [FIELD[n].write(values[n]) for n in FIELDS[len(CORE_FIELDS):]]
                        + [p for p in _axis_parts(values) if not p.startswith("prog=")])

    @property
    def uses_absolute_positions(self) -> bool:
        """Whether the model adds learned absolute position embeddings at its input."""
        return self.position == "learned"

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in ALL_FIELDS}

    def differences(self, other: "AttentionGene") -> list:
        """Field names whose values differ between the two genes."""
        return [n for n in ALL_FIELDS if getattr(self, n) != getattr(other, n)]

    def __str__(self) -> str:
        return f"Attn({self.short})"


def _check_rng_space(rng, space) -> None:
    if rng is not None:
        check_argument("rng", rng, _random.Random, "a random.Random")
    if space is not None:
        check_argument("space", space, SearchSpace, "a SearchSpace (SearchSpace.from_dict({...}))")


class LayerGenes(_Keyed):
    """A per-layer genome: one ``AttentionGene`` per layer, first layer first. Immutable; its key
    joins the layer keys with `` / ``. Mutation and crossover act layer by layer (layer i of a
    child comes from layer i of its parents). The layers obey ``layers_violation``: draws redraw and
    the operators try again, as for a gene's own rules, and give every layer the first layer's recipe."""

    __slots__ = ("layers", "_key")

    def __init__(self, layers: Sequence["AttentionGene | str"]):
        layers = tuple(AttentionGene.parse(g) if isinstance(g, str) else g for g in layers)
        if not layers or not all(isinstance(g, AttentionGene) for g in layers):
            raise UserError("a per-layer genome needs one gene per layer, e.g. 'dot|softmax|none|fixed / "
                            "cosine|sparsemax|output_gate|learned'")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "_key", LAYER_SEPARATOR.join(g.key for g in layers))
        problem = layers_violation(layers)
        if problem:
            raise UserError(f"genome {self._key}: {problem}")

    @classmethod
    def parse(cls, text: str) -> "LayerGenes":
        return cls([part for part in (p.strip() for p in text.split("/")) if part] or [text])

    @classmethod
    def random(cls, rng: _random.Random, space: SearchSpace) -> "LayerGenes":
        for _ in range(MAX_REDRAWS):
            layers = _share_recipe([AttentionGene(rng=rng, space=space) for _ in range(space.layers)])
            if layers_violation(layers) is None:
                return cls(layers)
        raise UserError(f"no valid per-layer genome in {MAX_REDRAWS} draws: {layers_violation(layers)}",
                        setting="search_space")

    def mutate(self, mutation_rate: float, rng: _random.Random | None = None,
               space: SearchSpace | None = None) -> "LayerGenes":
        return self._first_valid(lambda: [g.mutate(mutation_rate, rng, space) for g in self.layers])

    def crossover(self, other: "LayerGenes", rng: _random.Random | None = None,
                  space: SearchSpace | None = None) -> "LayerGenes":
        if not isinstance(other, LayerGenes) or len(other.layers) != len(self.layers):
            raise UserError(f"cannot cross {self.key!r} with {getattr(other, 'key', other)!r}: per-layer genomes "
                            "cross only with genomes of as many layers")
        return self._first_valid(lambda: [a.crossover(b, rng, space) for a, b in zip(self.layers, other.layers)])

    def _first_valid(self, draw: Callable[[], list]) -> "LayerGenes":
        """The first valid genome of ``draw``'s layers (given the first layer's recipe) in MAX_REDRAWS
        draws; self when none is."""
        for _ in range(MAX_REDRAWS):
            layers = _share_recipe(draw())
            if layers_violation(layers) is None:
                return LayerGenes(layers)
        return self

    @property
    def short(self) -> str:
        return LAYER_SEPARATOR.join(g.short for g in self.layers)

    @property
    def label(self) -> str:
        return LAYER_SEPARATOR.join(g.label for g in self.layers)

    @property
    def uses_absolute_positions(self) -> bool:
        return self.layers[0].uses_absolute_positions

    def to_dict(self) -> dict:
        return {"layers": [g.to_dict() for g in self.layers]}

    def differences(self, other: "LayerGenes") -> list:
        """``L<i>.<field>`` for each field that differs in layer i (1-based)."""
        return [f"L{i}.{name}" for i, (a, b) in enumerate(zip(self.layers, other.layers), 1)
                for name in a.differences(b)]

    def __str__(self) -> str:
        return f"Layers({self.short})"


def split_genes(text: str) -> list[str]:
    """A comma-separated list of genes and names -> its items, stripped, empty ones dropped. A comma
    inside parentheses belongs to a program (``prog=o(mix(w.softmax(s.dot(q,k)),v))``), so only the
    commas outside every pair of parentheses separate items."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def is_gene_text(item: str) -> bool:
    """Whether a list item is a gene string (``a|b|c|d...`` or a bare ``prog=...``) rather than a name."""
    return "|" in item or item.strip().startswith("prog=")


def layers_of(genome: "AttentionGene | LayerGenes") -> list:
    """The genes of a genome's layers ([gene] for a shared gene)."""
    return list(genome.layers) if isinstance(genome, LayerGenes) else [genome]


def layers_violation(layers: Sequence[AttentionGene]) -> str | None:
    """The rules between the layers of one model: the input embedding is shared by every layer, so
    a learned absolute position table would leak into the layers that chose otherwise; and a model
    trains with one recipe, so the layers agree on it. The message naming the rule, or None when
    the layers agree."""
    absolute = {g.uses_absolute_positions for g in layers}
    if len(absolute) > 1:
        return ("its layers mix position=learned (absolute positions added at the input) with "
                f"{', '.join(sorted({g.position for g in layers if not g.uses_absolute_positions}))}: give every "
                "layer position learned, or none of them (rule layers-share-absolute-positions)")
    for name in RECIPE_FIELDS:
        values = list(dict.fromkeys(getattr(g, name) for g in layers))
        if len(values) > 1:
            shown = ", ".join("default" if v is None else _write_number(v) for v in values)
            return (f"its layers give {name} ({KEY_PARTS[name]}=) different values ({shown}), and a model trains with "
                    f"one recipe: give every layer the same {KEY_PARTS[name]}= part, or none "
                    "(rule layers-share-recipe)")
    return None


def recipe_of(genome: "AttentionGene | LayerGenes | str") -> dict:
    """The recipe parts a genome sets, ``{field: value}`` (none: the run's recipe); the layers of
    a per-layer genome agree on them, so the first layer's are the genome's."""
    gene = layers_of(AttentionGene.parse(genome))[0]
    return {name: getattr(gene, name) for name in RECIPE_FIELDS if getattr(gene, name) is not None}


def mechanism_of(genome: "AttentionGene | LayerGenes | str") -> "AttentionGene | LayerGenes":
    """The genome without its recipe parts: the same mechanism, trained with the run's recipe."""
    genome = AttentionGene.parse(genome)
    return with_recipe(genome, dict.fromkeys(RECIPE_FIELDS)) if recipe_of(genome) else genome


def with_recipe(genome: "AttentionGene | LayerGenes | str", recipe: Mapping[str, Any]) -> "AttentionGene | LayerGenes":
    """The genome with the recipe parts of ``recipe`` (``{field: value}``; None: the run's value),
    the others as they were."""
    genome = AttentionGene.parse(genome)
    unknown = sorted(set(recipe) - set(RECIPE_FIELDS))
    if unknown:
        raise UserError(f"{unknown[0]!r} is not a recipe field: the recipe fields are {', '.join(RECIPE_FIELDS)}")
    if isinstance(genome, LayerGenes):
        return LayerGenes([g.replace(**recipe) for g in genome.layers])
    return genome.replace(**recipe)


def _share_recipe(layers: Sequence[AttentionGene]) -> list:
    """The layers with the first layer's recipe (a draw or a genetic operator acts per layer; the
    recipe is one per model, so the first layer's decides)."""
    recipe = {name: getattr(layers[0], name) for name in RECIPE_FIELDS}
    return [g if all(getattr(g, n) == v for n, v in recipe.items()) else g.replace(**recipe) for g in layers]


# -- fitting a model size --------------------------------------------------------------------------
class SizeProblem(NamedTuple):
    """Why a gene (or an option of a space) does not fit a model size."""

    field: str  # the gene field that does not fit: qkv_rank or kv_heads
    problem: str  # what does not fit, e.g. "gene K: kv_heads 3 does not divide the 4 heads"
    fix: str  # how to change the gene or the space

    def __str__(self) -> str:
        return f"{self.problem}: {self.fix}"


def size_problem(genome_or_space: "AttentionGene | LayerGenes | SearchSpace | str", *, d_model: int,
                 n_heads: int, size: str = "") -> SizeProblem | None:
    """The first way the genome (each layer's gene) or any option of the space does not fit a model
    of ``d_model`` and ``n_heads``; None if it fits. A low-rank projection needs qkv_rank <= d_model;
    grouped key/value heads need kv_heads dividing the heads. ``size`` names the model in the
    message (``... the 4 heads of size 64x2``)."""
    if isinstance(genome_or_space, SearchSpace):
        values = [(f"{name} {value} in the search space", name, value)
                  for name in ("qkv_rank", "kv_heads") for value in genome_or_space.options(name)]
    else:
        values = [(f"gene {gene.key}: {name} {getattr(gene, name)}", name, getattr(gene, name))
                  for gene in layers_of(AttentionGene.parse(genome_or_space)) for name in ("qkv_rank", "kv_heads")]
    of = f" of size {size}" if size else ""
    for subject, name, value in values:
        if name == "qkv_rank" and value > d_model:
            return SizeProblem(name, f"{subject} is larger than d_model {d_model}{of}",
                               "a low-rank projection needs a rank r <= d_model")
        if name == "kv_heads" and value and n_heads % value:
            return SizeProblem(name, f"{subject} does not divide the {n_heads} heads{of}",
                               "use a divisor of the heads (1 is multi-query attention)")
    return None


def full_window_note(genome_or_space: "AttentionGene | LayerGenes | SearchSpace | str", *,
                     max_seq_len: int) -> str | None:
    """A note (for a warning: it is no error) when a window of the genome or space is at least
    ``max_seq_len``: such a window is full attention, the same as window 0."""
    if isinstance(genome_or_space, SearchSpace):
        values = [(f"window {w}", w) for w in genome_or_space.options("window")]
    else:
        values = [(f"gene {gene.key}: window {gene.window}", gene.window)
                  for gene in layers_of(AttentionGene.parse(genome_or_space))]
    for subject, window in values:
        if window >= max_seq_len:
            return f"{subject} is at least max_seq_len {max_seq_len}: it is full attention (the same as window 0)"
    return None


def _random_values(rng, space: SearchSpace) -> dict:
    """A random valid gene's values: an invalid draw is redrawn (deterministic for a seeded rng)."""
    for _ in range(MAX_REDRAWS):
        values = {name: rng.choice(space.options(name)) for name in FIELDS}
        for name in AXIS_FIELDS:  # a single option is taken without a draw
            options = space.options(name)
            values[name] = options[0] if len(options) == 1 else rng.choice(options)
        if space.program_space is not None:
            values["program"] = programs.random_program(rng, space.program_space, program_grammar()).text
        if violation(values) is None:
            return values
    raise UserError(f"no valid gene in {MAX_REDRAWS} draws from the search space: {violation(values)}",
                    setting="search_space")


def _named_parts(text: str, parts: list) -> dict:
    """The ``name=value`` parts of a key as {field: value} (values are checked by the gene)."""
    named: dict = {}
    for part in parts:
        name, _, value = part.partition("=")
        fieldname = _PART_FIELDS.get(name.strip().lower())
        if fieldname is None:
            raise UserError(f"unknown gene part {name.strip()!r} in {text!r}: valid names are "
                            f"{', '.join(KEY_PARTS.values())} (e.g. pos=rope, rank=32, abias=rel, win=64, kvh=1, lr=0.001, "
                            "wu=0.05, wd=0.1)")
        if fieldname in named:
            raise UserError(f"gene {text!r} gives {KEY_PARTS[fieldname]}= twice: keep one")
        if not value.strip():
            raise UserError(f"gene part {KEY_PARTS[fieldname]}= in {text!r} has no value: give one "
                            f"(e.g. {KEY_PARTS[fieldname]}=...) or leave the part out")
        named[fieldname] = value.strip()
    return named


def in_program_form(key: str, space: SearchSpace) -> str:
    """A classic gene's key as its program gene when ``space`` searches programs (every classic gene
    is a program, ``programs.classic_program``), so a warm start from a classic run enters a program
    search; any other key as it is."""
    if getattr(space, "program_space", None) is None:
        return key
    try:
        genome = AttentionGene.parse(key)
    except (ValueError, UserError):
        return key  # outside_space says why it cannot be read
    if isinstance(genome, LayerGenes) or genome.program is not None:
        return key
    text = programs.classic_program(genome.similarity, genome.normalization, genome.gating, genome.temperature_mode,
                                    kernels=KERNEL_NORMALIZATIONS)
    return genome.replace(program=text, **{name: FIELD[name].default for name in CORE_FIELDS}).key


@functools.lru_cache(maxsize=4096)
def gene_label(key: str) -> str:
    """How a gene key is shown in progress lines and summaries (``AttentionGene.label``); a key that
    does not parse (a plugin not loaded here) is shown as it is."""
    try:
        return (LayerGenes if LAYER_SEPARATOR in key else AttentionGene).parse(key).label
    except Exception:  # noqa: BLE001 - a display helper never fails on what it shows
        return key
