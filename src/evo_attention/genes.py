"""The AttentionGene: one attention mechanism as an immutable value.

A gene names one similarity, normalization, gating and temperature (see ``components``), whether
the Q/K/V/output projections carry a bias, and the attention-weight dropout. Its ``key``, e.g.
``dot|sparsemax|output_gate|learned|bias|0.10``, is its identity: genes compare and hash by it,
and results are cached under it. ``AttentionGene.parse`` reads the key and the short form
``dot|sparsemax|output_gate|learned`` (bias on, dropout 0.1).

Three further axes (``AXIS_FIELDS``; see ``nn.positions`` and ``nn.attention``) appear in the key
only when they differ from their default, as ``name=value`` parts after the six fixed ones, so a
key without them names a gene with the default axes:

=============  ============  ================================================================
field          key part      values (default first)
=============  ============  ================================================================
position       ``pos=``      ``learned``, ``rope``, ``rope:linear:F``, ``rope:ntk:F``, ``alibi``, ``none``
qkv_rank       ``rank=``     ``0`` (full Q/K/V projections) or r > 0 (factorised d -> r -> d)
attn_bias      ``abias=``    ``none`` or ``rel`` (a learned bias per head and causal offset)
window         ``win=``      ``0`` (every earlier key) or W > 0 (each query sees its last W keys)
kv_heads       ``kvh=``      ``0`` (a key/value head per head) or K dividing the heads (grouped-query
                             attention; K = 1 is multi-query attention)
=============  ============  ================================================================

e.g. ``dot|softmax|none|fixed|bias|0.10|pos=rope:ntk:4|rank=32|abias=rel``. ``parse`` accepts the
named parts in any order (also after the 4-part short form).

The search space is ``SearchSpace``: the options of each field. By default it is ``OPTIONS``, the
live list of registered component names (``nn.components`` registers the built-in ones and a
``register_*`` decorator adds a user's), so registering a component adds it to random draws and
mutations; the three axes default to their single default value. A field with one option
consumes no random numbers, so adding an axis to the code leaves every seeded draw of a space
that does not vary it unchanged.

Some combinations of valid values make no model: a kernel normalization (``linear``, ``favor``)
weighs keys by feature maps phi(q) . phi(k), so it needs a dot-product similarity and admits no
score bias. ``RULES`` names each such rule; a gene that breaks one is refused with a one-line error
naming the rule, random draws redraw, and mutation and crossover try again with the same RNG
(deterministic for a seed; a space that never breaks a rule consumes exactly the numbers it did
before the rules existed). The kernel normalizations are ``OPT_IN``: a search space includes them
only when it lists them.

This module owns the *grammar* of every field (which names and values are valid, how a key is
written); ``nn`` owns what the names compute. Nothing here imports torch.
"""

from __future__ import annotations

import itertools
import math
import random as _random
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from evo_attention.util.errors import UserError

CATEGORICAL_FIELDS = ("similarity", "normalization", "gating", "temperature_mode")
FIELDS = CATEGORICAL_FIELDS + ("use_bias", "attention_dropout")  # the six parts every key starts with
AXIS_FIELDS = ("position", "qkv_rank", "attn_bias", "window", "kv_heads")  # optional name=value parts of a key
ALL_FIELDS = FIELDS + AXIS_FIELDS
AXIS_DEFAULTS = {"position": "learned", "qkv_rank": 0, "attn_bias": "none", "window": 0, "kv_heads": 0}
KEY_PARTS = {"position": "pos", "qkv_rank": "rank", "attn_bias": "abias", "window": "win",
             "kv_heads": "kvh"}  # field -> key part name
_PART_FIELDS = {**{v: k for k, v in KEY_PARTS.items()}, **{k: k for k in KEY_PARTS}}
DROPOUT_CHOICES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
MAX_DROPOUT = 0.3
VANILLA_KEY = "dot|softmax|none|fixed|bias|0.10"

# The registered option names of each categorical field, in registration order. ``nn.components``
# fills them (``register_similarity`` etc.); every gene and search space is checked against them.
OPTIONS: dict[str, list] = {name: [] for name in CATEGORICAL_FIELDS}
# Registered names that a search space contains only when it lists them: the efficient attention
# families are comparisons, not part of the original study's space, whose seeded draws stay as they were.
OPT_IN: dict[str, set] = {name: set() for name in CATEGORICAL_FIELDS}
# What the validity rules need to know of the components, filled at registration: similarities whose
# score is a dot product of transformed q and k, and normalizations computed from feature maps
# phi(q) . phi(k) (kernel forms, which never see a score and so cannot add a bias to one).
DOT_FORM_SIMILARITIES: set = set()
KERNEL_NORMALIZATIONS: set = set()

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


def normalize_position(value) -> str:
    """The canonical spelling of a position option (e.g. 'rope:ntk:4.0' -> 'rope:ntk:4')."""
    return str(parse_position(value))


def _check_choice(fieldname: str, value: Any, options: Sequence[str]) -> str:
    if value not in options:
        raise UserError(
            f"unknown {fieldname} {value!r}: valid options are {', '.join(map(str, options))}"
        )
    return value


# -- validity: combinations of valid field values that still make no model ----------------------
class Rule(NamedTuple):
    name: str
    broken: Callable[[Mapping[str, Any]], bool]  # gene values -> whether the rule is broken
    explain: Callable[[Mapping[str, Any]], str]  # gene values -> what is wrong and what to do


def _kernel(values) -> bool:
    return values["normalization"] in KERNEL_NORMALIZATIONS


RULES = (
    Rule("kernel-needs-dot-similarity",
         lambda v: _kernel(v) and v["similarity"] not in DOT_FORM_SIMILARITIES,
         lambda v: f"normalization {v['normalization']} weighs keys by phi(q) . phi(k), which needs a dot-product "
                   f"similarity, not {v['similarity']}: use {' or '.join(sorted(DOT_FORM_SIMILARITIES))}"),
    Rule("kernel-has-no-score-bias",
         lambda v: _kernel(v) and (str(v["position"]) == "alibi" or v["attn_bias"] != "none"),
         lambda v: f"normalization {v['normalization']} never forms a score, so it cannot add the score bias of "
                   f"{'pos=alibi' if str(v['position']) == 'alibi' else 'abias=' + v['attn_bias']}: use pos=learned, "
                   "rope or none with abias=none"),
)


def violation(values: Mapping[str, Any]) -> str | None:
    """The message of the first rule that the gene ``values`` break, naming the rule; None if valid."""
    for rule in RULES:
        if rule.broken(values):
            return f"{rule.explain(values)} (rule {rule.name})"
    return None


MAX_REDRAWS = 1000  # a space with any valid gene passes this many draws with vanishing probability


def _check_dropout(value: Any) -> float:
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise UserError(f"attention_dropout {value!r} is not a number: use a float in [0, {MAX_DROPOUT}]") from None
    if not 0.0 <= p <= MAX_DROPOUT + 1e-9:
        raise UserError(f"attention_dropout {value!r} is outside [0, {MAX_DROPOUT}]: pick a value in that range")
    return round(p, 2)


_COUNT_HELP = {"qkv_rank": "use 0 (full projections) or a rank r > 0",
               "window": "use 0 (every earlier key) or a window W > 0",
               "kv_heads": "use 0 (one key/value head per head) or a K that divides the number of heads"}


def _check_count(fieldname: str, value: Any) -> int:
    """A non-negative integer axis value (qkv_rank, window, kv_heads)."""
    fix = _COUNT_HELP[fieldname]
    if isinstance(value, bool):
        raise UserError(f"{fieldname} {value!r} is not an integer: {fix}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UserError(f"{fieldname} {value!r} is not an integer: {fix}") from None
    if number < 0 or (isinstance(value, float) and value != number):
        raise UserError(f"{fieldname} {value!r} is not a non-negative integer: {fix}")
    return number


def _check_axis(fieldname: str, value: Any):
    """Validate and canonicalise a value of one of the AXIS_FIELDS."""
    if fieldname == "position":
        return normalize_position(value)
    if fieldname in _COUNT_HELP:
        return _check_count(fieldname, value)
    return _check_choice("attn_bias", value, ATTN_BIASES)


def _check_bias(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("bias", "true", "yes", "on", "nobias", "false", "no", "off"):
        return value.lower() in ("bias", "true", "yes", "on")
    raise UserError(f"use_bias {value!r} is not a boolean: use true/false (or 'bias'/'nobias' in a key)")


@dataclass(frozen=True)
class SearchSpace:
    """The options of each gene field that random draws and mutations pick from.

    Empty categorical tuples (the default) mean "everything registered right now".
    """

    similarity: tuple = ()
    normalization: tuple = ()
    gating: tuple = ()
    temperature_mode: tuple = ()
    use_bias: tuple = (True, False)
    attention_dropout: tuple = DROPOUT_CHOICES
    position: tuple = ("learned",)  # e.g. ("learned", "rope", "rope:ntk:4", "alibi", "none")
    qkv_rank: tuple = (0,)  # e.g. (0, 16, 32)
    attn_bias: tuple = ("none",)  # ("none", "rel")
    window: tuple = (0,)  # e.g. (0, 32, 64)
    kv_heads: tuple = (0,)  # e.g. (0, 1, 2)
    layers: int = 0  # 0: one gene shared by every layer; N: a per-layer genome of N genes (LayerGenes)

    def __post_init__(self):
        for name in CATEGORICAL_FIELDS:
            chosen = tuple(getattr(self, name))
            for value in chosen:
                _check_choice(name, value, OPTIONS[name])
            object.__setattr__(self, name, chosen)
        object.__setattr__(self, "use_bias", tuple(_check_bias(b) for b in self.use_bias))
        object.__setattr__(self, "attention_dropout", tuple(_check_dropout(p) for p in self.attention_dropout))
        for name in AXIS_FIELDS:
            values = getattr(self, name)
            values = (values,) if isinstance(values, (str, int)) else tuple(values)
            # canonical spelling, duplicates dropped (rope and rope:none are one option)
            object.__setattr__(self, name, tuple(dict.fromkeys(_check_axis(name, v) for v in values)))
        for name in ("use_bias", "attention_dropout") + AXIS_FIELDS:
            if not getattr(self, name):
                raise UserError(f"search space option list for {name} is empty: give at least one value")
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
        """The rules read only these four fields, so trying their combinations settles it."""
        ruled = ("similarity", "normalization", "position", "attn_bias")
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

    def size(self) -> int:
        n = 1
        for name in ALL_FIELDS:
            n *= len(self.options(name))
        return n

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "SearchSpace":
        data = dict(data or {})
        unknown = sorted(set(data) - set(ALL_FIELDS))
        if unknown:
            raise UserError(f"unknown search-space field {unknown[0]!r}: valid fields are {', '.join(ALL_FIELDS)}")
        for name, value in data.items():
            if isinstance(value, (list, tuple)) and not value:
                raise UserError(f"search space option list for {name} is empty: give at least one option, or leave "
                                f"{name} out to search every registered option", setting="search_space")
        return cls(**{k: tuple(v) if isinstance(v, (list, tuple)) else (v,) for k, v in data.items()})

    def to_dict(self) -> dict:
        return {name: self.options(name) for name in ALL_FIELDS}


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
    POSITION_KINDS = POSITION_KINDS  # rope also takes a scaling: rope:linear:F, rope:ntk:F
    ATTN_BIASES = ATTN_BIASES

    __slots__ = ALL_FIELDS + ("_key",)

    def __init__(self, gene_dict: Mapping[str, Any] | None = None, *, rng: _random.Random | None = None,
                 space: SearchSpace | None = None, **fields: Any):
        if gene_dict is not None and fields:
            raise UserError("give a gene either as gene_dict or as keyword fields, not both")
        values = dict(gene_dict) if gene_dict is not None else fields
        if gene_dict is None and not fields:
            values = _random_values(rng or _random, space or SearchSpace())
        unknown = sorted(set(values) - set(ALL_FIELDS))
        if unknown:
            raise UserError(f"unknown gene field {unknown[0]!r}: valid fields are {', '.join(ALL_FIELDS)}")
        defaults = _VANILLA_VALUES
        for name in CATEGORICAL_FIELDS:
            value = values.get(name, defaults[name])
            object.__setattr__(self, name, _check_choice(name, value, OPTIONS[name]))
        object.__setattr__(self, "use_bias", _check_bias(values.get("use_bias", defaults["use_bias"])))
        object.__setattr__(
            self, "attention_dropout", _check_dropout(values.get("attention_dropout", defaults["attention_dropout"]))
        )
        for name in AXIS_FIELDS:
            object.__setattr__(self, name, _check_axis(name, values.get(name, AXIS_DEFAULTS[name])))
        object.__setattr__(self, "_key", "|".join(
            [self.similarity, self.normalization, self.gating, self.temperature_mode,
             "bias" if self.use_bias else "nobias", f"{self.attention_dropout:.2f}"] + self._axis_parts()))
        problem = violation(self.to_dict())
        if problem:
            raise UserError(f"gene {self._key}: {problem}")

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def random(cls, rng: _random.Random | None = None, space: SearchSpace | None = None) -> "AttentionGene":
        """A random gene from ``rng`` (default: the module RNG) over ``space``."""
        return cls(rng=rng, space=space)

    @classmethod
    def vanilla(cls) -> "AttentionGene":
        """The standard transformer: dot|softmax|none|fixed, bias on, dropout 0.1."""
        return cls.parse(VANILLA_KEY)

    @classmethod
    def parse(cls, text: str) -> "AttentionGene":
        """Read a gene from its key, its short form, or ``str(gene)`` (``Attn(...)``), each optionally
        followed by ``name=value`` parts (``pos=``, ``rank=``, ``abias=``, ``win=``, ``kvh=``) in any order.

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
        if len(parts) == 4:
            parts += ["bias", "0.10"]
        if len(parts) != 6:
            raise UserError(
                f"cannot parse gene {text!r}: expected 4 parts 'similarity|normalization|gating|temperature' "
                "or 6 parts '...|bias|0.10' (optionally followed by pos=, rank=, abias=, win=, kvh= parts)"
            )
        return cls(gene_dict={**dict(zip(FIELDS, parts)), **named})

    def replace(self, **changes: Any) -> "AttentionGene":
        return AttentionGene(gene_dict={**self.to_dict(), **changes})

    # -- genetic operators --------------------------------------------------------------------
    def mutate(self, mutation_rate: float, rng: _random.Random | None = None,
               space: SearchSpace | None = None) -> "AttentionGene":
        """Resample each field with probability ``mutation_rate``; returns a new gene."""
        if not 0.0 <= mutation_rate <= 1.0:
            raise UserError(f"mutation_rate {mutation_rate!r} is outside [0, 1]")
        rng = rng or _random
        space = space or SearchSpace()
        for _ in range(MAX_REDRAWS):  # an invalid result is mutated again from self, with the same rng
            values = self.to_dict()
            for name in FIELDS:
                if rng.random() < mutation_rate:
                    values[name] = rng.choice(space.options(name))
            for name in AXIS_FIELDS:
                options = space.options(name)
                if options == [values[name]]:
                    continue  # resampling could not change it: draw nothing
                if rng.random() < mutation_rate:
                    values[name] = rng.choice(options)
            if violation(values) is None:
                return AttentionGene(gene_dict=values)
        return self

    def crossover(self, other: "AttentionGene", rng: _random.Random | None = None) -> "AttentionGene":
        """Uniform crossover: each field from self or other with probability 1/2."""
        rng = rng or _random
        mine, theirs = self.to_dict(), other.to_dict()
        for _ in range(MAX_REDRAWS):  # an invalid child is drawn again (both parents are valid children)
            child = {n: mine[n] if rng.random() < 0.5 else theirs[n] for n in FIELDS}
            for n in AXIS_FIELDS:  # equal values need no draw
                child[n] = mine[n] if mine[n] == theirs[n] or rng.random() < 0.5 else theirs[n]
            if violation(child) is None:
                return AttentionGene(gene_dict=child)
        return self

    # -- views ---------------------------------------------------------------------------------
    @property
    def short(self) -> str:
        """The four components, plus the non-default axes (``dot|softmax|none|fixed|pos=rope``)."""
        return "|".join([getattr(self, n) for n in CATEGORICAL_FIELDS] + self._axis_parts())

    @property
    def uses_absolute_positions(self) -> bool:
        """Whether the model adds learned absolute position embeddings at its input."""
        return self.position == "learned"

    def _axis_parts(self) -> list:
        return [f"{KEY_PARTS[n]}={getattr(self, n)}" for n in AXIS_FIELDS if getattr(self, n) != AXIS_DEFAULTS[n]]

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in ALL_FIELDS}

    def differences(self, other: "AttentionGene") -> list:
        """Field names whose values differ between the two genes."""
        return [n for n in ALL_FIELDS if getattr(self, n) != getattr(other, n)]

    def __str__(self) -> str:
        return f"Attn({self.short})"


class LayerGenes(_Keyed):
    """A per-layer genome: one ``AttentionGene`` per layer, first layer first. Immutable; its key
    joins the layer keys with `` / ``. Mutation and crossover act layer by layer (layer i of a
    child comes from layer i of its parents). The layers must agree on whether the model adds
    learned absolute positions (rule layers-share-absolute-positions): draws redraw and the
    operators try again, as for a gene's own rules."""

    __slots__ = ("layers", "_key")

    def __init__(self, layers: Sequence["AttentionGene | str"]):
        layers = tuple(AttentionGene.parse(g) if isinstance(g, str) else g for g in layers)
        if not layers or not all(isinstance(g, AttentionGene) for g in layers):
            raise UserError("a per-layer genome needs one gene per layer, e.g. 'dot|softmax|none|fixed / "
                            "cosine|sparsemax|output_gate|learned'")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "_key", LAYER_SEPARATOR.join(g.key for g in layers))
        problem = _layers_violation(layers)
        if problem:
            raise UserError(f"genome {self._key}: {problem}")

    @classmethod
    def parse(cls, text: str) -> "LayerGenes":
        return cls([part for part in (p.strip() for p in text.split("/")) if part] or [text])

    @classmethod
    def random(cls, rng: _random.Random, space: SearchSpace) -> "LayerGenes":
        for _ in range(MAX_REDRAWS):
            layers = [AttentionGene(rng=rng, space=space) for _ in range(space.layers)]
            if _layers_violation(layers) is None:
                return cls(layers)
        raise UserError(f"no valid per-layer genome in {MAX_REDRAWS} draws: {_layers_violation(layers)}",
                        setting="search_space")

    def mutate(self, mutation_rate: float, rng: _random.Random | None = None,
               space: SearchSpace | None = None) -> "LayerGenes":
        for _ in range(MAX_REDRAWS):
            layers = [g.mutate(mutation_rate, rng, space) for g in self.layers]
            if _layers_violation(layers) is None:
                return LayerGenes(layers)
        return self

    def crossover(self, other: "LayerGenes", rng: _random.Random | None = None) -> "LayerGenes":
        if not isinstance(other, LayerGenes) or len(other.layers) != len(self.layers):
            raise UserError(f"cannot cross {self.key!r} with {getattr(other, 'key', other)!r}: per-layer genomes "
                            "cross only with genomes of as many layers")
        for _ in range(MAX_REDRAWS):
            layers = [a.crossover(b, rng) for a, b in zip(self.layers, other.layers)]
            if _layers_violation(layers) is None:
                return LayerGenes(layers)
        return self

    @property
    def short(self) -> str:
        return LAYER_SEPARATOR.join(g.short for g in self.layers)

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


def layers_of(genome: "AttentionGene | LayerGenes") -> list:
    """The genes of a genome's layers ([gene] for a shared gene)."""
    return list(genome.layers) if isinstance(genome, LayerGenes) else [genome]


def _layers_violation(layers: Sequence[AttentionGene]) -> str | None:
    absolute = {g.uses_absolute_positions for g in layers}
    if len(absolute) > 1:
        return ("its layers mix position=learned (absolute positions added at the input) with "
                f"{', '.join(sorted({g.position for g in layers if not g.uses_absolute_positions}))}: give every "
                "layer position learned, or none of them (rule layers-share-absolute-positions)")
    return None


def _random_values(rng, space: SearchSpace) -> dict:
    """A random valid gene's values: an invalid draw is redrawn (deterministic for a seeded rng)."""
    for _ in range(MAX_REDRAWS):
        values = {name: rng.choice(space.options(name)) for name in FIELDS}
        for name in AXIS_FIELDS:  # a single option is taken without a draw
            options = space.options(name)
            values[name] = options[0] if len(options) == 1 else rng.choice(options)
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
                            f"{', '.join(KEY_PARTS.values())} (e.g. pos=rope, rank=32, abias=rel, win=64, kvh=1)")
        if fieldname in named:
            raise UserError(f"gene {text!r} gives {KEY_PARTS[fieldname]}= twice: keep one")
        named[fieldname] = value.strip()
    return named


_VANILLA_VALUES = {
    "similarity": "dot",
    "normalization": "softmax",
    "gating": "none",
    "temperature_mode": "fixed",
    "use_bias": True,
    "attention_dropout": 0.1,
}

