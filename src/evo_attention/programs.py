"""Attention as programs: a small typed language for what one attention layer computes.

A program is an expression over the inputs ``x``, ``q``, ``k``, ``v``, written in one text syntax
that round-trips (``parse(str(p)) == p``) and is the ``prog=`` part of a gene key, e.g.
``o(mix(w.softmax(t.fixed(s.dot(q,k))),v))`` (softmax attention) or ``o(kmix(elu1(q),elu1(k),v))``
(causal linear attention). ``docs/programs.md`` lists the types and ops.

Types are shapes: X the block input and output [B, T, d_model]; H per-head vectors [B, H, T, d];
F non-negative H (``kmix`` needs them); S scores [B, H, T, T]; W weights, exactly zero on keys a
query may not see; C a constant. Every op's signature is in ``OPS`` (built in, or added by
``nn.program.register_op``) or comes from a registered component (``Grammar``: ``s.NAME``,
``t.NAME``, ``w.NAME``, ``kmix.NAME``, ``g.NAME``, ``gi.NAME``); ``nn.program`` computes them. A
program that does not type-check never exists: ``parse`` and every operator here refuse it.

Every well-typed program is causal: the ops along time (``shift``, ``dconvN``, ``cumsum``,
``cummean``, ``decay``, ``sdecay``) read only earlier positions, and the mixing ops (``w.*``,
``mix``, ``kmix``) see only the keys a query may see. ``pin(P, Y)`` (only at the root) makes the
projections read P, built from x alone, instead of x.

Identical subexpressions are one node (computed once; a learned op has one set of weights).
``canonical`` orders the arguments of commutative ops, folds constants, and drops what is never
used; ``size`` counts op nodes. The search operators (``random_program``, ``mutate``,
``crossover``) draw from a ``ProgramSpace`` with a given ``random.Random``: the same seed gives the
same programs. This module imports no torch.
"""

from __future__ import annotations

import math
import random as _random
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable, Mapping, Sequence

from evo_attention.util.errors import UserError, check_argument

INPUTS = {"x": "X", "q": "H", "k": "H", "v": "H"}
TYPES = ("X", "H", "F", "S", "W", "C")
MAX_NODES = 12  # the default node cap of a program space
MAX_DEPTH, MAX_TEXT = 128, 20_000  # program text a parser reads at all (a space's programs are far smaller)


class ProgramError(UserError):
    """A text that is no well-typed program; the message says where and what to write."""


@dataclass(frozen=True)
class Node:
    """One node: an op over argument nodes, an input (``x``, ``q``, ``k``, ``v``; no args) or a
    constant (op ``const`` and a ``value``). Equal nodes are equal texts."""

    op: str
    args: tuple = ()
    value: float | None = None

    @cached_property
    def text(self) -> str:
        if self.op == "const":
            return _number(self.value)
        if not self.args:
            return self.op
        return f"{self.op}({','.join(a.text for a in self.args)})"

    def __str__(self) -> str:
        return self.text

    def walk(self):
        """Every node under and including this one, children before parents (each distinct node once)."""
        seen: dict[str, Node] = {}
        _post_order(self, seen)
        return list(seen.values())


def _post_order(node: Node, seen: dict) -> None:
    if node.text in seen:
        return
    for a in node.args:
        _post_order(a, seen)
    seen[node.text] = node


def _number(value: float) -> str:
    text = f"{value:.4g}"
    return "0" if text == "-0" else text


def const(value: float) -> Node:
    return Node("const", value=float(_number(float(value))))


# -- op signatures --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """An op name with its signatures (argument types -> result type) and what it is."""

    name: str
    signatures: tuple  # ((arg types...), result type) pairs, tried in order
    kind: str  # elementwise, learned, feature, time, score, temperature, weight, mix, output, gate, root
    commutative: bool = False
    fold: Callable | None = None  # an elementwise op's value on numbers (constant folding), finite for finite input

    def result(self, types: Sequence[str]) -> str | None:
        for args, result in self.signatures:
            if len(args) == len(types) and all(_fits(t, a) for t, a in zip(types, args)):
                return _result(result, types)
        return None


def _fits(actual: str, wanted: str) -> bool:
    if wanted == "T":  # any value type (X, H, S): the elementwise ops
        return actual in ("X", "H", "F", "S")
    return actual == wanted or (actual == "F" and wanted == "H")


def _result(result: str, types: Sequence[str]) -> str:
    if result != "T":
        return result
    value = next(t for t in types if t != "C")
    return "H" if value == "F" else value


def _elementwise(name, arity, fold, *, positive=False, commutative=False):
    """An op applied entry by entry on X, H or S (binary: two of one type, or one and a constant);
    ``positive``: on H its values are >= 0 (an F); ``fold``: its value on numbers."""
    if arity == 1:
        signatures = ((("H",), "F"),) if positive else ()
        signatures += ((("T",), "T"),)
    else:
        signatures = tuple(((a, b), "T") for a, b in (("X", "X"), ("H", "H"), ("S", "S"), ("T", "C"), ("C", "T")))
    return Op(name, signatures, "elementwise", commutative, fold)


def signature(text: str):
    """``"H,H->S"`` -> (("H", "H"), "S"): one signature of an op (argument types, result type)."""
    args, arrow, result = str(text).partition("->")
    types = tuple(a.strip() for a in args.split(",") if a.strip())
    if (not arrow or not types or result.strip() not in TYPES + ("T",)
            or any(t not in TYPES + ("T",) for t in types)):
        raise ProgramError(f"op signature {text!r} must read like 'H,H->S' over the types {', '.join(TYPES)} "
                           "(T: any of X, H, S; at least one argument)")
    return (types, result.strip())


def _op(name: str, kind: str, *signatures: str) -> Op:
    """An op of ``kind`` with the signatures written as text (``"H,H->S"``)."""
    return Op(name, tuple(map(signature, signatures)), kind)


def _sigmoid(a: float) -> float:
    return 1 / (1 + math.exp(-max(min(a, 60.0), -60.0)))


# Every op of the language but those the registered components give: the built-ins below, and those
# ``nn.program.register_op`` adds (``add_op``). The grammar, random programs, mutation, the docs'
# table and the tests read this one table.
OPS: dict = {op.name: op for op in (
    # entry by entry (every result is clipped to +-CLIP in nn.program, so no chain overflows)
    _elementwise("add", 2, lambda a, b: a + b, commutative=True), _elementwise("sub", 2, lambda a, b: a - b),
    _elementwise("mul", 2, lambda a, b: a * b, commutative=True),
    _elementwise("sdiv", 2, lambda a, b: a * b / (b * b + 1e-2)), _elementwise("max", 2, max, commutative=True),
    _elementwise("neg", 1, lambda a: -a), _elementwise("relu", 1, lambda a: max(a, 0.0), positive=True),
    _elementwise("sqrelu", 1, lambda a: max(a, 0.0) ** 2, positive=True),
    _elementwise("sigmoid", 1, _sigmoid, positive=True), _elementwise("tanh", 1, math.tanh),
    _elementwise("exp", 1, lambda a: math.exp(min(a, 20.0)), positive=True),
    _elementwise("softplus", 1, lambda a: math.log1p(math.exp(min(a, 30.0))) if a < 30 else a, positive=True),
    _elementwise("abs", 1, abs, positive=True), _elementwise("square", 1, lambda a: a * a, positive=True),
    _elementwise("ssqrt", 1, lambda a: math.copysign(math.sqrt(abs(a) + 1e-4) - 1e-2, a)),
    _elementwise("slog1p", 1, lambda a: math.copysign(math.log1p(abs(a)), a)),
    # learned, per position
    _op("scale", "learned", "H->H", "X->X", "S->S"), _op("bias", "learned", "H->H", "X->X", "S->S"),
    _op("sgate", "learned", "H->H", "X->X"), _op("lin", "learned", "X->X"),
    # feature maps over a head's channels
    _op("l2n", "feature", "H->H"), _op("rmsn", "feature", "H->H"), _op("elu1", "feature", "H->F"),
    _op("lfeat", "feature", "H->H"),
    # along time: each reads only the positions up to its own
    *(_op(name, "time", "H->H") for name in ("shift", "dconv2", "dconv3", "dconv4", "cumsum", "cummean", "decay")),
    _op("sdecay", "time", "S->S"),
    # weights and mixing (over the keys a query may see only), the output, the root
    _op("w.none", "weight", "S->W"), _op("mix", "mix", "W,H->H"), _op("kmix", "mix", "F,F,H->H"),
    _op("o", "output", "H->X"), _op("pin", "root", "X,X->X"),
)}
STRUCTURAL = frozenset(OPS)  # the ops above: never removed; a plugin adds ops beside them
PLUGIN_KINDS = ("elementwise", "learned", "feature", "time")  # what a registered op may be
_generation = [0]  # bumped by every change of OPS: part of the grammar's cache key (genes.program_grammar)


def op_taken(name: str, how: str) -> ProgramError:
    """The one refusal of an op whose name is taken (``how``: what differs)."""
    remedy = "" if name in STRUCTURAL else ", or remove the existing one first (nn.program.unregister_op)"
    return ProgramError(f"program op {name!r} exists already {how}: choose another name{remedy}")


def add_op(op: Op) -> None:
    """Add an op to the language (``nn.program.register_op`` calls this with its implementation)."""
    # the same op again is harmless (a plugin imported again, e.g. from an export); a built-in never is
    if op.name in STRUCTURAL or (op.name in OPS and OPS[op.name] != op):
        raise op_taken(op.name, "(built in)" if op.name in STRUCTURAL else "with other signatures or kind")
    if op.kind not in PLUGIN_KINDS:
        raise ProgramError(f"program op kind {op.kind!r} is not one a plugin may add: {', '.join(PLUGIN_KINDS)}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", op.name) or op.name in INPUTS or op.name == "const":
        raise ProgramError(f"program op name {op.name!r} must be a plain identifier (letters, digits, _), not an "
                           "input or 'const'")
    OPS[op.name] = op
    _generation[0] += 1


def remove_op(name: str) -> None:
    """Remove an op a plugin added (the built-ins stay)."""
    if name in STRUCTURAL:
        raise ProgramError(f"program op {name!r} is built in and cannot be removed")
    if OPS.pop(name, None) is not None:
        _generation[0] += 1


def generation() -> int:
    return _generation[0]


# The prefixes of ops that registered components give, and the gene field each reads.
COMPONENT_PREFIXES = {"s": "similarity", "t": "temperature_mode", "w": "normalization", "kmix": "normalization",
                      "g": "gating", "gi": "gating"}
# ops that read other positions than their own (a program needs one to mix tokens)
MIXING_KINDS = ("time", "mix")


class Grammar:
    """The ops of the language: the built-in ones and those the registered components give.

    ``options``: the registered option names by gene field (``genes.OPTIONS``); ``kernels``: the
    normalizations that are kernel forms (``genes.KERNEL_NORMALIZATIONS``)."""

    def __init__(self, options: Mapping[str, Sequence[str]], kernels: Iterable[str]):
        kernels = set(kernels)
        made = [_op(f"s.{name}", "score", "H,H->S") for name in options["similarity"]]
        made += [_op(f"t.{name}", "temperature", "S->S", "H->H") for name in options["temperature_mode"]]
        made += [_op(f"kmix.{name}", "mix", "H,H,H->H") if name in kernels else _op(f"w.{name}", "weight", "S->W")
                 for name in options["normalization"]]
        for name in options["gating"]:
            if name != "none":
                made += [_op(f"g.{name}", "gate", "X->X"), _op(f"gi.{name}", "gate", "X->X")]
        self.ops = {**OPS, **{op.name: op for op in made}}

    def op(self, name: str) -> Op:
        found = self.ops.get(name)
        if found is None:
            raise ProgramError(f"unknown program op {name!r}: valid ops are {', '.join(sorted(self.ops))}")
        return found

    def type_of(self, node: Node, memo: dict | None = None, *, projected: bool = True, root: bool = True) -> str:
        """The type of ``node``; ProgramError naming the first node that does not type-check.
        ``memo`` collects {(text, projected): type}; ``projected``: whether q, k, v exist here (not
        inside pin's first argument); ``root``: whether ``node`` is a program's root (pin's place)."""
        memo = {} if memo is None else memo
        key = (node.text, projected)
        if key in memo:
            return memo[key]
        if node.op == "const":
            result = "C"
        elif not node.args and node.op in INPUTS:
            if not projected and node.op != "x":
                raise ProgramError(f"{node.op} inside pin's first argument: the projections read that argument, so it "
                                   "is built from x alone")
            result = INPUTS[node.op]
        else:
            op = self.op(node.op)
            if op.kind == "root" and not root:
                raise ProgramError(f"pin(...) stands only at the root of a program, not inside {node.text}")
            types = [self.type_of(a, memo, projected=projected and not (op.kind == "root" and i == 0), root=False)
                     for i, a in enumerate(node.args)]
            result = "C" if op.fold is not None and all(t == "C" for t in types) else op.result(types)
            if result is None:
                wanted = " or ".join("(" + ", ".join(a) + ")" for a, _ in op.signatures)
                raise ProgramError(f"{node.op} takes {wanted}, not ({', '.join(types)}), in {node.text}")
        memo[key] = result
        return result

    def check(self, program: "Program") -> None:
        kind = self.type_of(program.root)
        if kind != "X":
            raise ProgramError(f"a program returns the block's output (type X, e.g. o(...)), not {kind}: "
                               f"{program.root.text}")


# -- programs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """A program: its root node. Equal and hashed by its text."""

    root: Node

    @property
    def text(self) -> str:
        return self.root.text

    def __str__(self) -> str:
        return self.text

    def nodes(self) -> list:
        """Each distinct node once, inputs first, the root last."""
        return self.root.walk()

    def ops(self) -> list:
        """The op nodes (no inputs, no constants), children before parents."""
        return [n for n in self.nodes() if n.args]

    @property
    def size(self) -> int:
        return len(self.ops())


_TOKEN = re.compile(r"\s*(?:(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|(?P<name>[A-Za-z_][\w.]*)|(?P<punct>[(),]))")


def parse(text: str, grammar: Grammar) -> Program:
    """Read a program from its text; ProgramError (one line) when it is no well-typed program."""
    check_argument("grammar", grammar, Grammar, "a Grammar (genes.program_grammar())")
    if isinstance(text, Program):
        grammar.check(text)
        return text
    if not isinstance(text, str) or not text.strip():
        raise ProgramError(f"cannot read a program from {text!r}: write one like o(mix(w.softmax(t.fixed(s.dot(q,k))),v))")
    depth = deepest = 0
    for char in text:  # nesting is checked before the recursive reader: a deep program is one line
        depth += (char == "(") - (char == ")")
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH or len(text) > MAX_TEXT:
        raise ProgramError(f"program of {len(text)} characters nested {deepest} deep: programs nest at most "
                           f"{MAX_DEPTH} deep in at most {MAX_TEXT} characters")
    tokens, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ProgramError(f"cannot read program {text!r} at {text[pos:pos + 12]!r}: ops are names, arguments go in "
                               "parentheses separated by commas")
        kind, value = m.lastgroup, m.group(m.lastgroup)
        if kind == "number" and (not math.isfinite(float(value)) or re.match(r"[A-Za-z_]", text[m.end():m.end() + 1])):
            word = re.match(r"\s*[^(),\s]*", text[m.start():]).group().strip()
            raise ProgramError(f"cannot read the constant {word!r} in program {text!r}: "
                               "constants are finite decimal numbers such as 0.5, -2 or 1e-3")
        tokens.append((kind, value))
        pos = m.end()
    node, i = _read(tokens, 0, text)
    if i != len(tokens):
        raise ProgramError(f"cannot read program {text!r}: unexpected {tokens[i][1]!r} after the root expression")
    program = Program(node)
    grammar.check(program)
    return program


def _read(tokens, i, text):
    if i >= len(tokens):
        raise ProgramError(f"cannot read program {text!r}: it ends in the middle of an expression")
    kind, value = tokens[i]
    if kind == "number":
        return const(float(value)), i + 1
    if kind != "name":
        raise ProgramError(f"cannot read program {text!r}: expected an op or an input, found {value!r}")
    if i + 1 < len(tokens) and tokens[i + 1] == ("punct", "("):
        args, i = [], i + 2
        while True:
            arg, i = _read(tokens, i, text)
            args.append(arg)
            if i < len(tokens) and tokens[i] == ("punct", ","):
                i += 1
                continue
            if i < len(tokens) and tokens[i] == ("punct", ")"):
                return Node(value, tuple(args)), i + 1
            raise ProgramError(f"cannot read program {text!r}: {value}( is not closed")
    if value not in INPUTS:
        raise ProgramError(f"unknown input {value!r} in program {text!r}: the inputs are x, q, k, v (an op needs "
                           "parentheses)")
    return Node(value), i + 1


# -- canonical form -------------------------------------------------------------------------------
CLIP = 1e4  # every elementwise result lies in [-CLIP, CLIP]


def canonical(program: Program, grammar: Grammar) -> Program:
    """The canonical form: constants folded, x+0, x*1, x-0 and x/1 dropped, double negation
    cancelled, commutative arguments ordered by text, pin dropped when nothing reads q, k or v."""
    memo: dict[str, Node] = {}
    root = _canon(program.root, memo)
    if root.op == "pin" and not any(n.op in ("q", "k", "v") and not n.args for n in root.args[1].walk()):
        root = root.args[1]
    result = Program(root)
    grammar.check(result)
    return result


def _canon(node: Node, memo: dict) -> Node:
    if node.text not in memo:
        memo[node.text] = _simplify(node.op, tuple(_canon(a, memo) for a in node.args)) if node.args else node
    return memo[node.text]


def _simplify(op: str, args: tuple) -> Node:
    values = [a.value for a in args]
    fold = OPS[op].fold if op in OPS else None
    if fold is not None and all(a.op == "const" for a in args):
        return const(max(-CLIP, min(CLIP, fold(*values))))
    if op in ("add", "max", "mul") and args[0].op == "const" and args[1].op != "const":
        args = (args[1], args[0])  # the constant second, then the identities below
    if op in ("add", "sub") and args[1].op == "const" and args[1].value == 0:
        return args[0]
    if op == "mul" and args[1].op == "const" and args[1].value == 1:
        return args[0]
    if op == "neg" and args[0].op == "neg":
        return args[0].args[0]
    if OPS.get(op) is not None and OPS[op].commutative and args[1].op != "const":
        args = tuple(sorted(args, key=lambda a: a.text))
    return Node(op, args)


def mixes_tokens(program: Program, grammar: Grammar) -> bool:
    """Whether the program reads another position than each query's own (an op along time or a mixing op)."""
    return any(n.args and grammar.op(n.op).kind in MIXING_KINDS for n in program.nodes())


# -- what the search draws from -----------------------------------------------------------------------
@dataclass(frozen=True)
class ProgramSpace:
    """The programs a search draws: at most ``max_nodes`` op nodes, built from ``ops`` (op names;
    empty: every op of the grammar). Random programs must mix tokens (``mixes_tokens``). ``edits``:
    the weight of each edit kind a mutation draws (``EDITS``; empty: ``DEFAULT_EDITS``)."""

    max_nodes: int = MAX_NODES
    ops: tuple = ()
    edits: tuple = ()  # (kind, weight) pairs

    def __post_init__(self):
        if isinstance(self.max_nodes, bool) or not isinstance(self.max_nodes, int) or not 3 <= self.max_nodes <= 64:
            raise UserError(f"program max_nodes {self.max_nodes!r} must be an integer in [3, 64]",
                            setting="search_space")
        object.__setattr__(self, "ops", tuple(dict.fromkeys(self.ops or ())))
        edits = dict(self.edits or DEFAULT_EDITS)
        for kind, weight in edits.items():
            if kind not in EDITS:
                raise UserError(f"unknown program edit {kind!r}: valid edits are {', '.join(EDITS)}",
                                setting="search_space")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
                raise UserError(f"program edit {kind} has weight {weight!r}: give a number >= 0", setting="search_space")
        if not any(edits.values()):
            raise UserError("every program edit has weight 0: give at least one a positive weight, e.g. "
                            "edits: {time: 3, any: 1}", setting="search_space")
        object.__setattr__(self, "edits", tuple(edits.items()))

    @classmethod
    def from_dict(cls, data, grammar: Grammar) -> "ProgramSpace":
        if data in (None, True):
            data = {}
        if not isinstance(data, Mapping):
            raise UserError(f"search_space program {data!r} must be a mapping such as {{max_nodes: 12, ops: [...]}}",
                            setting="search_space")
        unknown = sorted(set(data) - {"max_nodes", "ops", "edits"})
        if unknown:
            raise UserError(f"unknown program space key {unknown[0]!r}: valid keys are max_nodes, ops, edits",
                            setting="search_space")
        edits = data.get("edits") or {}
        if not isinstance(edits, Mapping):
            raise UserError(f"search_space program edits {edits!r} must be a mapping of edit kind: weight such as "
                            "{time: 3, gate: 2, any: 1}", setting="search_space")
        ops = data.get("ops") or ()
        if isinstance(ops, str):
            ops = [o.strip() for o in ops.split(",") if o.strip()]
        if not isinstance(ops, (list, tuple)) or not all(isinstance(o, str) for o in ops):
            raise UserError(f"search_space program ops {data.get('ops')!r} must be a list of op names such as "
                            "[o, mix, w.softmax, s.dot, dconv3]", setting="search_space")
        for name in ops:
            grammar.op(name)
        space = cls(max_nodes=data.get("max_nodes", MAX_NODES), ops=tuple(ops), edits=tuple(edits.items()))
        missing = [o for o in ("o", "mix") if space.ops and o not in space.ops and "kmix" not in space.ops]
        if missing:
            raise UserError(f"the program space's ops lack {', '.join(missing)}: a program needs o(...) and a mixing "
                            "op (mix or kmix)", setting="search_space")
        random_program(_random.Random(0), space, grammar)  # a space that cannot draw is refused now, not mid-search
        return space

    def to_dict(self) -> dict:
        edits = dict(self.edits)
        return {"max_nodes": self.max_nodes, "ops": list(self.ops), **({} if edits == DEFAULT_EDITS else {"edits": edits})}

    def allowed(self, grammar: Grammar) -> dict:
        names = self.ops or tuple(grammar.ops)
        return {n: grammar.op(n) for n in names}

    def admits(self, program: Program, grammar: Grammar) -> str | None:
        """Why the space does not hold ``program`` (one line), or None."""
        if program.size > self.max_nodes:
            return f"program {program.text} has {program.size} op nodes, more than max_nodes {self.max_nodes}"
        allowed = self.allowed(grammar)
        outside = [n.op for n in program.ops() if n.op not in allowed]
        if outside:
            return f"program {program.text} uses {outside[0]}, which the space's ops do not list"
        return None


MAX_TRIES = 200  # edits that fail a check are tried again with the same rng
# a draw of the default space mixes tokens about 1 time in 25; 5,000 tries fail with probability
# below 1e-80 there, and a space that cannot draw at all is refused when it is read (from_dict)
DRAW_TRIES = 5000


def _check_operands(rng, space, grammar) -> None:
    """TypeError naming a search operator's argument of the wrong type (it would fail deep inside)."""
    if rng is not _random:  # the random module itself: what the genes' operators pass when given no rng
        check_argument("rng", rng, _random.Random, "a random.Random")
    check_argument("space", space, ProgramSpace, "a ProgramSpace")
    check_argument("grammar", grammar, Grammar, "a Grammar (genes.program_grammar())")


def random_program(rng: _random.Random, space: ProgramSpace, grammar: Grammar) -> Program:
    """A random well-typed program of the space that mixes tokens (deterministic for a seeded rng)."""
    _check_operands(rng, space, grammar)
    ops = _OpTable(space.allowed(grammar))
    for _ in range(DRAW_TRIES):
        budget = rng.randint(3, space.max_nodes)
        node = _grow(rng, "X", budget, ops, depth=0)
        # canonical form never adds a mixing op: a draw without one is refused before the costly checks
        if node is None or not any(n.args and ops[n.op].kind in MIXING_KINDS for n in node.walk()):
            continue
        program = _valid(Program(node), space, grammar)
        if program is not None and mixes_tokens(program, grammar):
            return program
    raise UserError(f"the program space (at most {space.max_nodes} nodes, ops {', '.join(space.ops) or 'all'}) draws no "
                    f"program that mixes tokens in {DRAW_TRIES} tries: allow a mixing op (mix with a w.* op, kmix) or "
                    "an op along time, or more nodes", setting="search_space")


class _OpTable(dict):
    """A space's ops by name, with the producers of each type kept (``_producers``)."""

    def __init__(self, ops: Mapping[str, Op]):
        super().__init__(ops)
        self.producers: dict = {}


def _producers(ops: _OpTable, wanted: str):
    """(op name, argument types) of every op that can give a ``wanted`` value, in table order
    (kept per table: a draw asks this thousands of times)."""
    if wanted in ops.producers:
        return ops.producers[wanted]
    out = []
    for op in ops.values():
        if op.kind == "root":
            continue
        for args, result in op.signatures:
            if any(a == "C" for a in args) or (result == "T" and wanted not in ("X", "H", "S")):
                continue
            concrete = _result(result, [wanted if a == "T" else a for a in args]) if result == "T" else result
            if _fits(concrete, wanted):
                out.append((op.name, tuple(wanted if a == "T" else a for a in args)))
                break
    ops.producers[wanted] = out
    return out


def _grow(rng, wanted: str, budget: int, ops, depth: int):
    """A random node of type ``wanted`` with about ``budget`` op nodes (None when none fits)."""
    leaves = [name for name, t in INPUTS.items() if _fits(t, wanted)]
    if wanted == "C":
        return const(rng.choice((-1.0, -0.5, 0.5, 1.0, 2.0)))
    if budget <= 0 or depth > 8:
        return Node(rng.choice(leaves)) if leaves else None
    producers = _producers(ops, wanted)
    if wanted == "X" and depth == 0:  # the root: the output of heads, possibly gated
        producers = [p for p in producers if p[0] in ("o",) or ops[p[0]].kind in ("gate", "learned")] or producers
    if wanted == "W":
        producers = [p for p in producers if ops[p[0]].kind == "weight"]
    if not producers:
        return Node(rng.choice(leaves)) if leaves else None
    if leaves and rng.random() < 0.25:
        return Node(rng.choice(leaves))
    name, args = rng.choice(producers)
    share = (budget - 1) // len(args)
    children = []
    for a in args:
        child = _grow(rng, a, share, ops, depth + 1)
        if child is None:
            return None
        children.append(child)
    return Node(name, tuple(children))


def _valid(program: Program, space: ProgramSpace, grammar: Grammar) -> Program | None:
    try:
        program = canonical(program, grammar)
    except ProgramError:
        return None
    return None if space.admits(program, grammar) else program


def _replace(node: Node, target: str, new: Node) -> Node:
    """``node`` with every occurrence of the subtree whose text is ``target`` replaced by ``new``."""
    if node.text == target:
        return new
    if not node.args:
        return node
    return Node(node.op, tuple(_replace(a, target, new) for a in node.args), node.value)


def _typed_nodes(program: Program, grammar: Grammar) -> list:
    """(node, type) of every node of the program but the root's pin projection input."""
    memo: dict = {}
    grammar.type_of(program.root, memo)
    types = {text: t for (text, projected), t in memo.items() if projected}
    return [(n, types[n.text]) for n in program.nodes() if n.text in types]


MUTATIONS = ("replace", "insert", "delete", "rewire", "constant")  # what the generic edit ("any") does


def _any_edit(program: Program, rng, ops, grammar: Grammar):
    """The generic edit: replace an op, insert or delete a node, rewire an input or change a
    constant, at a uniformly drawn node: ``(node, new subtree)`` or None when the draw does not apply."""
    nodes = _typed_nodes(program, grammar)
    kind = rng.choice(MUTATIONS)
    node, wanted = rng.choice(nodes)
    new = None
    if kind == "replace" and node.args:
        types = [grammar.type_of(a) for a in node.args]
        same = [o.name for o in ops.values() if o.name != node.op and o.kind != "root" and o.result(types)
                and _fits(o.result(types), wanted)]
        new = Node(rng.choice(same), node.args) if same else None
    elif kind == "insert" and wanted != "C":
        wrappers = [(name, args) for name, args in _producers(ops, wanted) if any(_fits(wanted, a) for a in args)]
        if wrappers:
            name, args = rng.choice(wrappers)
            slot = rng.choice([i for i, a in enumerate(args) if _fits(wanted, a)])
            children = [node if i == slot else _grow(rng, a, 1, ops, 1) for i, a in enumerate(args)]
            new = None if any(c is None for c in children) else Node(name, tuple(children))
    elif kind == "delete" and node.args:
        same = [a for a in node.args if _fits(grammar.type_of(a), wanted)]
        new = rng.choice(same) if same else None
    elif kind == "rewire" and not node.args and node.op != "const":
        others = [n for n, t in nodes if _fits(t, wanted) and n.text != node.text and "pin" not in n.text]
        new = rng.choice(others) if others else None
    elif kind == "constant" and node.op == "const":
        new = _nudged(node, rng)
    return None if new is None else (node, new)


def _wrap(program: Program, rng, ops, names: Sequence[str], wrappers: Sequence[str]):
    """Wrap one of the nodes whose op is in ``names`` (present in the program) in one of ``wrappers``
    (allowed by the space): ``(node, wrapped)`` or None."""
    targets = [n for n in program.nodes() if n.op in names]
    choices = [w for w in wrappers if w in ops]
    if not targets or not choices:
        return None
    node = rng.choice(targets)
    return node, Node(rng.choice(choices), (node,))


def _swap(program: Program, rng, ops, prefix: str):
    """Replace one op named ``prefix``* by another such op the space allows: ``(node, new)`` or None."""
    targets = [n for n in program.nodes() if n.op.startswith(prefix)]
    if not targets:
        return None
    node = rng.choice(targets)
    others = [name for name in ops if name.startswith(prefix) and name != node.op]
    return (node, Node(rng.choice(others), node.args)) if others else None


def _second_path(program: Program, rng, ops, grammar: Grammar):
    """Mix two attention paths: the heads' value under ``o`` added to a second, standard path
    (softmax attention, or causal linear attention where softmax is there already)."""
    heads = [n.args[0] for n in program.nodes() if n.op == "o"]
    if not heads or "add" not in ops:
        return None
    node = rng.choice(heads)
    paths = [parse(text, grammar).root for text, needs in (
        ("o(mix(w.softmax(t.fixed(s.dot(q,k))),v))", ("mix", "w.softmax", "t.fixed", "s.dot")),
        ("o(kmix(elu1(q),elu1(k),v))", ("kmix", "elu1"))) if all(o in ops for o in needs)]
    paths = [p.args[0] for p in paths if p.args[0].text not in node.text]
    return (node, Node("add", (node, rng.choice(paths)))) if paths else None


def _delete(program: Program, rng, grammar: Grammar):
    options = deletions(program, grammar)
    return rng.choice(options)[:2] if options else None


def _constant(program: Program, rng):
    constants = [n for n in program.nodes() if n.op == "const"]
    if not constants:
        return None
    node = rng.choice(constants)
    return node, _nudged(node, rng)


def _nudged(node: Node, rng) -> Node:
    """A constant's new value: halved, doubled or negated, or a fresh draw in [-2, 2]."""
    return const(node.value * rng.choice((0.5, 2.0, -1.0)) if rng.random() < 0.5 else rng.uniform(-2, 2))


# The edit kinds a mutation draws, by name (docs/programs.md): each gives (node, its replacement), or
# None where it does not apply to the program. All are checked the same way after (canonical form,
# the space, tokens mixed), so every edit is well-typed and causal by construction.
TIME_OPS = ("shift", "dconv2", "dconv3", "dconv4", "decay")
EDITS = {
    "time": lambda p, rng, ops, g: _wrap(p, rng, ops, ("q", "k", "v"), TIME_OPS),  # token mixing on q, k or v
    "gate": lambda p, rng, ops, g: _wrap(p, rng, ops, ("mix", "kmix", "v"), ("sgate",)),  # a sigmoid gate on heads or v
    "weighting": lambda p, rng, ops, g: _swap(p, rng, ops, "w."),  # softmax -> sparsemax, sigmoid, ...
    "qk": lambda p, rng, ops, g: _wrap(p, rng, ops, ("q", "k"), ("scale", "bias", "l2n", "rmsn")),
    "temperature": lambda p, rng, ops, g: _swap(p, rng, ops, "t."),
    "paths": _second_path,
    "delete": lambda p, rng, ops, g: _delete(p, rng, g),
    "constant": lambda p, rng, ops, g: _constant(p, rng),
    "any": _any_edit,
}
DEFAULT_EDITS = {"time": 3, "gate": 2, "weighting": 1, "qk": 1, "temperature": 1, "paths": 1, "delete": 1,
                 "constant": 1, "any": 2}


def edit(program: Program, rng: _random.Random, space: ProgramSpace, grammar: Grammar) -> tuple[str, Program]:
    """One edit of the program, its kind drawn by the space's ``edits`` weights: ``(kind, child)``,
    the child canonical, inside the space, mixing tokens and other than the parent; tried again with
    the same rng until one is (``("none", program)`` after MAX_TRIES). A space whose only edit is
    ``any`` draws exactly what 0.5's mutation drew."""
    _check_operands(rng, space, grammar)
    ops = _OpTable(space.allowed(grammar))
    kinds = [(k, w) for k, w in space.edits if w > 0]
    for _ in range(MAX_TRIES):
        kind = kinds[0][0] if len(kinds) == 1 else rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        found = EDITS[kind](program, rng, ops, grammar)
        if found is None:
            continue
        child = _child(program, *found, space, grammar)
        if child is not None and child != program:
            return kind, child
    return "none", program


def _child(program: Program, node: Node, new: Node, space: ProgramSpace, grammar: Grammar) -> Program | None:
    """``program`` with ``node`` replaced by ``new``, canonical, if it is in the space and mixes tokens."""
    try:
        child = _valid(Program(_replace(program.root, node.text, new)), space, grammar)
    except ProgramError:
        return None
    return child if child is not None and mixes_tokens(child, grammar) else None


def mutate(program: Program, rng: _random.Random, space: ProgramSpace, grammar: Grammar) -> Program:
    """One edit of the program (``edit``), the child alone."""
    return edit(program, rng, space, grammar)[1]


FEATURES = {  # what ``census`` counts, each a test of one program
    "softmax over a dot product": lambda p: any(n.op == "w.softmax" and any(m.op == "s.dot" for m in n.walk())
                                                for n in p.nodes()),
    "token-by-token weights (mix)": lambda p: any(n.op == "mix" for n in p.nodes()),
    "kernel form (kmix)": lambda p: any(n.op.startswith("kmix") for n in p.nodes()),
    "an op along time": lambda p: any(n.op in TIME_OPS or n.op in ("cumsum", "cummean", "sdecay") for n in p.nodes()),
    "a gate": lambda p: any(n.op in ("sgate",) or n.op.startswith(("g.", "gi.")) for n in p.nodes()),
}


def census(drawn: Iterable[Program]) -> dict:
    """The share of ``drawn`` programs with each of ``FEATURES`` and their mean size: what a
    generator or a mutation produces (``benchmarks/program_census.py``)."""
    drawn = list(drawn)
    n = len(drawn) or 1
    return {"n": len(drawn), "mean_op_nodes": sum(p.size for p in drawn) / n,
            **{name: sum(map(test, drawn)) / n for name, test in FEATURES.items()}}


def crossover(a: Program, b: Program, rng: _random.Random, space: ProgramSpace, grammar: Grammar) -> Program:
    """Subtree crossover: a node of ``a`` replaced by a subtree of ``b`` of the same type (tried
    again with the same rng until the child is valid and new; ``a`` after MAX_TRIES)."""
    _check_operands(rng, space, grammar)
    mine, theirs = _typed_nodes(a, grammar), _typed_nodes(b, grammar)
    for _ in range(MAX_TRIES):
        node, wanted = rng.choice(mine)
        donors = [n for n, t in theirs if _fits(t, wanted) and n.op != "pin"]
        if not donors:
            continue
        child = _child(a, node, rng.choice(donors), space, grammar)
        if child is not None and child not in (a, b):
            return child
    return a


def deletions(program: Program, grammar: Grammar) -> list:
    """Each way to remove one op node: the node replaced by one of its arguments of its own type
    (``dconv3(q)`` -> ``q``; ``mix(W,v)`` -> ``v``), as ``(node, argument, program)`` in node order,
    each resulting program once (an op with no argument of its type cannot be removed alone)."""
    out, seen = [], {program.text}
    for node, wanted in _typed_nodes(program, grammar):
        for arg in node.args:
            if arg.op == "const" or not _fits(grammar.type_of(arg, projected=True), wanted):
                continue
            try:
                child = canonical(Program(_replace(program.root, node.text, arg)), grammar)
            except ProgramError:
                continue
            if child.text not in seen:
                seen.add(child.text)
                out.append((node, arg, child))
    return out


# -- the named programs ------------------------------------------------------------------------------
def classic_program(similarity: str, normalization: str, gating: str, temperature: str, *,
                    kernels: Iterable[str] = ("linear", "favor")) -> str:
    """The program text of a classic gene's four components (built-in similarities): what
    ``nn.attention.EvolvedAttention`` computes for them, written in the language."""
    prepared = {"dot": ("q", "k"), "cosine": ("l2n(q)", "l2n(k)")}
    if normalization in set(kernels):
        if similarity not in prepared:
            raise ProgramError(f"kernel normalization {normalization} needs a dot-product similarity, not {similarity}")
        q, k = prepared[similarity]
        heads = f"kmix.{normalization}(t.{temperature}({q}),{k},v)"
    else:
        scores = f"s.{similarity}(q,k)"
        heads = f"mix(w.{normalization}(t.{temperature}({scores})),v)"
    out = f"o({heads})"
    if gating == "input_gate":
        return f"pin(gi.input_gate(x),{out})"
    return out if gating == "none" else f"g.{gating}({out})"


KNOWN_PROGRAMS = {  # named forms, documented in docs/programs.md (each parses with the built-in grammar)
    "softmax attention": "o(mix(w.softmax(t.fixed(s.dot(q,k))),v))",
    "gated attention (a sigmoid gate on each head's output, Qiu et al. 2025)":
        "o(sgate(mix(w.softmax(t.fixed(s.dot(q,k))),v)))",
    "sigmoid attention (no row normalisation, a learned score bias)":
        "o(mix(w.none(sigmoid(bias(t.fixed(s.dot(q,k))))),v))",
    "causal linear attention (elu + 1 features, running sums)": "o(kmix(elu1(q),elu1(k),v))",
    "depthwise-convolution attention (Primer's MDHA: width-3 convolutions on q, k, v)":
        "o(mix(w.softmax(t.fixed(s.dot(dconv3(q),dconv3(k)))),dconv3(v)))",
    "decayed attention (RetNet-like: scores decayed by a learned rate per head, no softmax)":
        "o(mix(w.none(sdecay(t.fixed(s.dot(q,k)))),v))",
    "squared-ReLU attention (row-normalised)": "o(mix(w.relu_norm(sqrelu(t.fixed(s.dot(q,k)))),v))",
}
