"""Generated tasks that separate mechanisms: MQAR (Zoology) and the MAD synthetic tasks.

Every task is offline and deterministic: the same knobs and seed give the same tensors in every
process (each split draws from its own generator, seeded by sha256 of task, seed and split). Only
*answer positions* are scored: targets are ``IGNORE_INDEX`` everywhere else, and the number of
answers per example follows from the knobs (``answers_per_example``).

Data names (``load_data`` / ``--data``): a registered task's name, then its knobs inline:
``mqar:pairs=8,queries=4``, ``mad:selective_copy:seq_len=64,copy=16``, a plugin's ``delayed_copy:delay=2``.
Knobs also come from the task options mapping (Config ``recall``, ``TaskSpec.options``); a knob
given in both places must agree. ``seq_len`` and ``vocab`` not given as knobs come from
``load_data``'s ``seq_len`` and ``vocab_size`` (None: the task's default). ``seed`` (in the
options) picks the data. ``train_examples=0`` trains on an endless stream
(``SyntheticData.train_batches``). ``describe()`` states the chance accuracy and, where the task
has one, the no-recall accuracy (``Task.no_recall``).

What each task isolates is its class's ``capability``; ``docs/tasks.md`` has the layouts with
examples. Adding a task: one ``Task`` subclass registered with ``@register_task("name")``.
``TASKS`` is that registry and nothing else lists tasks, so a registered task is at once a data
name, a suite point's ``task:`` and a ``curve`` task. A name is a lower-case word or
``FAMILY:WORD``, never a dataset's name (``base.name_taken``) nor both a word and a family.
Registering changes no existing data.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from evo_attention.data.base import (IGNORE_INDEX, SPLITS, ExampleData, check_generated_memory, check_positive,
                                     fingerprint_of, name_taken, seeded_generator)
from evo_attention.data.recall import random_subsets
from evo_attention.data.vocab import Vocab
from evo_attention.util.errors import UserError
from evo_attention.util.memory import refuse_failed_allocation

FORMAT_VERSION = 1  # bump when the generated data changes: it is part of the fingerprint
PAD_ID = 0  # every task's id 0: padding / filler; its targets are never scored


# -- knobs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Knob:
    """One setting of a task: its name, kind (``int``, ``fraction`` in [0, 1), ``power`` in (0, 1],
    ``choice`` among ``choices``) and, for ints, the least allowed value."""

    name: str
    kind: str
    help: str
    minimum: int = 1
    choices: tuple[str, ...] = ()

    @property
    def allowed(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        return {"int": f"an integer >= {self.minimum}", "fraction": "a number in [0, 1)",
                "power": "a number in (0, 1]"}[self.kind]

    def convert(self, value: Any, task: str) -> int | float:
        """``value`` (a Python value, or the text of an inline knob) as this knob's type; UserError
        saying what is allowed otherwise."""
        out = value
        if self.kind == "choice":
            out = value.strip() if isinstance(value, str) else None
        elif isinstance(value, str):
            text = value.strip()
            try:
                out = int(text) if self.kind == "int" and re.fullmatch(r"[+-]?\d+", text) else float(text)
            except ValueError:
                out = None
        if isinstance(out, numbers.Real) and not isinstance(out, bool):  # numpy's numbers as Python's
            out = int(out) if isinstance(out, numbers.Integral) else float(out)
        number = isinstance(out, (int, float)) and not isinstance(out, bool)
        ok = out in self.choices if self.kind == "choice" else number
        if ok and self.kind == "int":
            if isinstance(out, float) and out.is_integer() and not isinstance(value, str):
                out = int(out)  # YAML 16.0
            ok = isinstance(out, int) and out >= self.minimum
        elif ok and self.kind == "fraction":
            ok, out = math.isfinite(out) and 0 <= out < 1, float(out)
        elif ok and self.kind == "power":
            ok, out = math.isfinite(out) and 0 < out <= 1, float(out)
        if not ok:
            raise UserError(f"{task} knob {self.name}={value!r} is not allowed: {self.name} must be {self.allowed}",
                            setting="data")
        return out


COMMON_KNOBS = (
    Knob("seq_len", "int", "the model's input window T (each example is T + 1 tokens)", minimum=2),
    Knob("vocab", "int", "token ids in all, special tokens included (the model's vocabulary)", minimum=4),
    Knob("train_examples", "int", "examples in the train split; 0: a fresh batch every step (an endless stream)",
         minimum=0),
    Knob("eval_examples", "int", "examples in each evaluation split (valid, test)"),
)
COMMON_DEFAULTS = {"seq_len": 64, "train_examples": 10_000, "eval_examples": 1_000}


def split_generator(task: str, seed: int, split: str) -> torch.Generator:
    """A CPU generator seeded from (task, seed, split) by sha256: independent streams."""
    return seeded_generator(f"evo-attention/synthetic/v{FORMAT_VERSION}/{task}/{seed}/{split}")


def _too_small(task: str, what: str, fix: str) -> UserError:
    return UserError(f"{task}: {what}; {fix}", setting="data")


# -- the tasks ------------------------------------------------------------------------------------
class Task:
    """A generated task: its knobs, their defaults (``defaults`` gives every knob one, ``vocab``
    included), the checks between them (``resolve``), the token layout and the generator. ``k`` is
    always the full dict of resolved knob values.

    A subclass defines ``symbols(k)`` (``k["vocab"]`` names; id 0 is padding, never scored),
    ``answers_per_example(k)``, ``chance(k)`` (an accuracy in [0, 1]) and ``generate(n, k, generator, seed)``
    -> ``(x, y)``, two int64 tensors ``[n, k["seq_len"]]`` drawn from ``generator`` alone, ``y`` IGNORE_INDEX but at
    the ``answers_per_example`` answer positions of each row, whose targets are ids >= 1."""

    name: str = ""  # set by register_task
    capability: str = ""
    knobs: tuple[Knob, ...] = ()
    defaults: dict = {}  # None: derived from the other knobs by ``resolve``
    # peak memory while the splits are generated, per token of every example (measured ~23 bytes:
    # the examples, their targets and the generator's scratch); tasks with more scratch say so
    bytes_per_token: int = 24

    @property
    def all_knobs(self) -> tuple[Knob, ...]:
        return COMMON_KNOBS + self.knobs

    def knob(self, name: str, where: str = "") -> Knob:
        for knob in self.all_knobs:
            if knob.name == name:
                return knob
        valid = ", ".join(k.name for k in self.all_knobs)
        raise UserError(f"unknown knob {name!r} for {self.name}{where}; valid knobs: {valid}", setting="data")

    def resolve(self, k: dict) -> dict:
        """Fill derived defaults; run the checks."""
        return k

    def symbols(self, k: dict) -> list[str]:
        raise NotImplementedError

    def answers_per_example(self, k: dict) -> int:
        raise NotImplementedError

    def chance(self, k: dict) -> float:
        raise NotImplementedError

    def no_recall(self, k: dict) -> float | None:
        """The accuracy of the best answer that looks nothing up: the value the example's pairs hold
        most often (what a model gets that knows which tokens are the example's answers but not
        which goes with the asked key); None where the task has no such level."""
        return None

    def identity(self, k: dict) -> dict:
        """The knobs that make the data's identity (its settings and fingerprint): all of them,
        except knobs added later at the value that gives the data they gave before."""
        return k

    def generate(self, n: int, k: dict, generator: torch.Generator, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


TASKS: dict[str, Task] = {}  # every generated task by name, in registration order (register_task)
TASK_NAME = re.compile(r"[a-z][a-z0-9_]*(:[a-z][a-z0-9_]*)?")
HOOKS = ("symbols", "answers_per_example", "chance", "generate")  # what a Task subclass must define


def is_family(word: str) -> bool:
    """Whether ``word`` is the FAMILY of registered ``FAMILY:WORD`` tasks (``mad``)."""
    return any(task.startswith(word + ":") for task in TASKS)


def register_task(name: str, task: type[Task] | None = None):
    """Make the ``Task`` subclass ``task`` the generated task ``name`` (setting its ``name``):
    ``@register_task("name")`` on the class or ``register_task("name", cls)``; returns the class.
    Registering the same class under the same name again does nothing."""
    if task is None:
        return lambda cls: register_task(name, cls)

    def refuse(why: str) -> UserError:
        return UserError(f"register_task({name!r}): {why}")

    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise refuse("a task name is a lower-case word of letters, digits and _ (delayed_copy), or FAMILY:WORD")
    head = name.split(":")[0]
    if name_taken(head):
        raise refuse(f"{head!r} is taken by a dataset: choose another name")
    if (":" in name and head in TASKS) or (":" not in name and is_family(name)):
        raise refuse(f"{head!r} would be both a task and a family of tasks (FAMILY:WORD): choose another name")
    if not (isinstance(task, type) and issubclass(task, Task)):
        raise refuse(f"{task!r} is not a subclass of evo_attention.data.synthetic.Task")
    if name in TASKS:
        if type(TASKS[name]) is task:
            return task
        raise refuse(f"the name is registered already by {type(TASKS[name]).__name__}: choose another name")
    other = [n for n, t in TASKS.items() if type(t) is task]
    if other:
        raise refuse(f"{task.__name__} is registered already as {other[0]!r}: register a subclass")
    missing = [hook for hook in HOOKS if getattr(task, hook) is getattr(Task, hook)]
    if missing:
        raise refuse(f"{task.__name__} does not define {', '.join(missing)}")
    knobs = [knob.name for knob in COMMON_KNOBS + tuple(task.knobs)]
    defaults = {**COMMON_DEFAULTS, **task.defaults}
    bad = [k for k in knobs if k not in defaults] or [k for k in defaults if k not in knobs]
    if bad:
        raise refuse(f"knob {bad[0]!r} of {task.__name__} needs both a Knob in knobs and an entry in defaults "
                     "(None: derived in resolve)")
    converted = {}
    for knob in COMMON_KNOBS + tuple(task.knobs):  # a default passes the checks a given value passes, and is used
        value = defaults[knob.name]  # as converted (2.0 for an integer knob as 2)
        try:
            converted[knob.name] = value if value is None else knob.convert(value, name)
        except UserError:
            raise refuse(f"the default {knob.name}={value!r} of {task.__name__} is not allowed: {knob.name} must be "
                         f"{knob.allowed}; fix its defaults") from None
    task.defaults = {k: converted[k] for k in task.defaults}
    task.name = name
    TASKS[name] = task()
    return task


def unregister_task(name: str) -> None:
    """Remove the generated task ``name`` (for tests); nothing when it is not registered."""
    TASKS.pop(name, None)


class KeyValueTask(Task):
    """A task of keys and values: the ids after its special tokens (``specials``) split into a lower
    half of keys and an upper half of values (for an even vocab, Zoology's split)."""

    SPECIALS_TEXT = "<pad>"  # the special tokens, as the refusal of a vocab too small names them

    def specials(self, k) -> list[str]:
        return ["<pad>"]

    def alphabet(self, k) -> tuple[int, int]:
        """(keys, values)."""
        vocab, reserved = k["vocab"], len(self.specials(k))
        rest = vocab - reserved
        if rest < 2:
            raise _too_small(self.name, f"vocab {vocab} leaves no room for keys and values after {reserved} special "
                             f"tokens ({self.SPECIALS_TEXT})", f"raise vocab to at least {reserved + 2}")
        return rest // 2, rest - rest // 2

    def symbols(self, k):
        keys, values = self.alphabet(k)
        return self.specials(k) + [f"k{i}" for i in range(keys)] + [f"v{i}" for i in range(values)]

    def chance(self, k):
        return 1 / self.alphabet(k)[1]


@functools.lru_cache(maxsize=256)
def no_lookup_accuracy(pairs: int, values: int) -> float:
    """The accuracy of the best answer that looks nothing up, when an example holds ``pairs`` values
    drawn uniformly with replacement from ``values`` symbols and the asked pair is uniform among
    them: answer the value the example holds most often, right with E[its count] / pairs.

    E[max count] = sum over m >= 1 of P(max count >= m); P(max count <= m) is pairs! / values**pairs
    times the coefficient of x**pairs in (sum_{j <= m} x**j / j!) ** values (balls into bins). With
    x = a * y, a = (pairs!) ** (1 / pairs) / values, it is the coefficient of y**pairs itself, a
    number near 1; the largest intermediate one is about exp(pairs / e), finite for pairs up to
    about 1900."""
    import numpy as np

    P, V = pairs, values
    log_a = math.lgamma(P + 1) / P - math.log(V)
    j = np.arange(P + 1)
    base = np.exp(j * log_a - np.array([math.lgamma(i + 1) for i in j]))  # a ** j / j!
    expected = 0.0
    for m in range(P):  # P(max count <= m) for m = 0 .. P - 1; P(max count <= P) = 1
        power, result, n = np.where(j <= m, base, 0.0), np.eye(1, P + 1)[0], V
        while n:  # power ** V by squaring, truncated at degree P
            if n & 1:
                result = np.convolve(result, power)[: P + 1]
            power = np.convolve(power, power)[: P + 1]
            n >>= 1
        expected += 1.0 - float(result[P])  # P(max count >= m + 1)
    return expected / P


def _targets(full: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """y for x = full[:, :-1]: IGNORE_INDEX except at ``pos`` [B, n], where it is the next token."""
    y = torch.full((full.shape[0], full.shape[1] - 1), IGNORE_INDEX, dtype=torch.long)
    y.scatter_(1, pos, full.gather(1, pos + 1))
    return y


@register_task("mqar")
class MQAR(KeyValueTask):
    """The layouts are the module docstring's; id 0 is <fill>."""

    capability = "content-based lookup of many associations at once (multi-query associative recall)"
    knobs = (Knob("pairs", "int", "key-value pairs at the start of each example"),
             Knob("queries", "int", "queried keys per example (each pair at most once; default: pairs)"),
             Knob("power", "power", "query slot j is drawn with weight (j + 1) ** (power - 1); 1: uniform"),
             Knob("layout", "choice", "kv: a query shows 'k v', values may repeat; zoology: a query shows the key "
                                      "only, values distinct per example", choices=("kv", "zoology")),
             Knob("filler", "choice", "what fills the rest of the window: zero (<fill>) or random ids "
                                      "(default: zero for kv, random for zoology)", choices=("zero", "random")))
    defaults = {"vocab": 64, "pairs": 8, "queries": None, "power": 0.01, "layout": "kv", "filler": None}
    LEGACY = {"layout": "kv", "filler": "zero"}  # the data before these knobs existed: not in its identity
    SPECIALS_TEXT = "<fill>"

    def resolve(self, k):
        if k["queries"] is None:
            k["queries"] = k["pairs"]
        if k["filler"] is None:
            k["filler"] = "random" if k["layout"] == "zoology" else "zero"
        P, Q, T, V = k["pairs"], k["queries"], k["seq_len"], k["vocab"]
        keys, _ = self.alphabet(k)
        if Q > P:
            raise _too_small(self.name, f"queries {Q} exceeds pairs {P} (each query asks a different pair)", "lower queries")
        if keys < P:  # then values (V - 1 - keys >= keys) are enough for distinct values too
            raise _too_small(self.name, f"vocab {V} has only {keys} keys for pairs {P}", f"raise vocab to at least {2 * P + 1}")
        if 2 * P + 2 * Q > T + 1:
            raise _too_small(self.name, f"seq_len {T} is too short for pairs {P} and queries {Q}",
                             f"raise seq_len to at least {2 * P + 2 * Q - 1}")
        return k

    def identity(self, k):
        return {key: value for key, value in k.items() if self.LEGACY.get(key, object()) != value}

    def specials(self, k):
        return ["<fill>"]

    def answers_per_example(self, k):
        return k["queries"]

    def no_recall(self, k):
        # the most frequent of the example's values: 1/P when they are distinct
        return 1 / k["pairs"] if k["layout"] == "zoology" else no_lookup_accuracy(k["pairs"], self.alphabet(k)[1])

    def generate(self, n, k, generator, seed):
        P, Q, T, V = k["pairs"], k["queries"], k["seq_len"], k["vocab"]
        zoology = k["layout"] == "zoology"
        num_keys, num_values = self.alphabet(k)
        keys = random_subsets(n, num_keys, P, generator) + 1
        if zoology:
            values = random_subsets(n, num_values, P, generator) + 1 + num_keys
        else:
            values = torch.randint(num_values, (n, P), generator=generator) + 1 + num_keys
        asked = random_subsets(n, P, Q, generator)
        slots = (T + 1 - 2 * P) // 2
        weights = (torch.arange(slots, dtype=torch.float64) + 1) ** (k["power"] - 1)
        chunk = max(1, 2**20 // slots)  # bound the [chunk, slots] weights each draw expands
        slot = torch.cat([torch.multinomial(weights.expand(min(chunk, n - r), slots), Q, replacement=False,
                                            generator=generator) for r in range(0, n, chunk)])
        pos = 2 * P + 2 * slot  # each query key's position; its answer is the target there
        full = torch.full((n, T + 1), PAD_ID, dtype=torch.long)
        full[:, 0: 2 * P: 2], full[:, 1: 2 * P: 2] = keys, values
        full.scatter_(1, pos, keys.gather(1, asked))
        if zoology:  # the input after a query key is filler; the value is only the target
            x = full[:, :-1].contiguous()
            y = torch.full((n, T), IGNORE_INDEX, dtype=torch.long)
            y.scatter_(1, pos, values.gather(1, asked))
        else:
            full.scatter_(1, pos + 1, values.gather(1, asked))
            x, y = full[:, :-1].contiguous(), _targets(full, pos)
        if k["filler"] == "random":  # every id, <fill> and keys and values included, as Zoology draws it
            noise = torch.randint(V, x.shape, generator=generator)
            x = torch.where(x == PAD_ID, noise, x)
        return x, y


@register_task("mad:in_context_recall")
class InContextRecall(KeyValueTask):
    """The recall family (module docstring): the noisy and fuzzy variants are settings of this
    generator."""

    capability = "in-context recall: look up the value of a key given earlier in the sequence"
    knobs = (Knob("pairs", "int", "distinct keys in each example's dictionary (default: min(possible keys, "
                                  "half of the pairs that fit))"),)
    defaults = {"vocab": 16, "pairs": None}
    bytes_per_token = 64  # measured ~59: the query region is drawn whole
    SPECIALS_TEXT = "<pad> and the noise symbols"

    # the settings the generator reads (overridden by the noisy and fuzzy variants)
    def key_len(self, k):
        return k.get("key_len", 1)

    def value_len(self, k):
        return k.get("value_len", 1)

    def noise_vocab(self, k):
        return k.get("noise_vocab", 0)

    def noise_tokens(self, k) -> int:
        """Noise tokens per example."""
        return round(k.get("noise", 0.0) * (k["seq_len"] + 1))

    def specials(self, k):
        return ["<pad>"] + [f"<noise{i}>" for i in range(self.noise_vocab(k))]

    def items(self, k) -> int:
        """Key-value items per example (dictionary and queries)."""
        return (k["seq_len"] + 1 - self.noise_tokens(k)) // (self.key_len(k) + self.value_len(k))

    def resolve(self, k):
        T, V = k["seq_len"], k["vocab"]
        keys, _ = self.alphabet(k)
        possible = keys ** self.key_len(k)
        M = self.items(k)
        if k["pairs"] is None:
            k["pairs"] = max(1, min(possible, M // 2))
        P = k["pairs"]
        if P > possible:
            raise _too_small(self.name, f"vocab {V} gives {possible} distinct keys for pairs {P}",
                             f"raise vocab{self._or('key_len')} or lower pairs")
        if M - P < 1:
            raise _too_small(self.name, f"seq_len {T} fits {M} key-value items, not pairs {P} plus at least one query",
                             f"raise seq_len or lower pairs{self._or('noise', 'key_len', 'value_len')}")
        return k

    def _or(self, *names) -> str:
        """``" (or a, b)"`` of those ``names`` that are knobs of this task: a fix names only knobs it has."""
        own = [name for name in names if any(knob.name == name for knob in self.knobs)]
        return f" (or {', '.join(own)})" if own else ""

    def answers_per_example(self, k):
        return (self.items(k) - k["pairs"]) * self.value_len(k)

    def no_recall(self, k):
        # one-token values drawn with replacement: the dictionary's most frequent value
        return no_lookup_accuracy(k["pairs"], self.alphabet(k)[1]) if self.value_len(k) == 1 else None

    def generate(self, n, k, generator, seed):
        T, P = k["seq_len"], k["pairs"]
        kl, vl, N, M = self.key_len(k), self.value_len(k), self.noise_tokens(k), self.items(k)
        Q, L = M - P, kl + vl
        num_keys, num_values = self.alphabet(k)
        key_off = 1 + self.noise_vocab(k)
        value_off = key_off + num_keys
        # the dictionary: P distinct keys (as numbers < num_keys ** kl, then as kl digits), their values
        index = random_subsets(n, num_keys ** kl, P, generator)
        digits = torch.stack([(index // num_keys ** (kl - 1 - d)) % num_keys for d in range(kl)], -1)  # [n, P, kl]
        values = torch.randint(num_values, (n, P, vl), generator=generator)
        asked = torch.randint(P, (n, Q), generator=generator)  # dictionary entry of each query
        entry = torch.cat([torch.arange(P).expand(n, P), asked], 1)  # [n, M]
        tokens = torch.cat([digits.gather(1, entry[..., None].expand(n, M, kl)) + key_off,
                            values.gather(1, entry[..., None].expand(n, M, vl)) + value_off], -1)  # [n, M, L]
        # where the items and the noise tokens go: N of the M + N places are noise, in random order
        is_noise = torch.zeros((n, M + N), dtype=torch.bool)
        if N:
            is_noise.scatter_(1, random_subsets(n, M + N, N, generator), True)
        lengths = torch.where(is_noise, 1, L)
        starts = lengths.cumsum(1) - lengths
        item_starts = starts[~is_noise].view(n, M)
        full = torch.full((n, T + 1), PAD_ID, dtype=torch.long)
        full.scatter_(1, (item_starts[..., None] + torch.arange(L)).view(n, M * L), tokens.view(n, M * L))
        if N:
            noise = torch.randint(self.noise_vocab(k), (n, N), generator=generator) + 1
            full.scatter_(1, starts[is_noise].view(n, N), noise)
        # scored: each query's value tokens, predicted from the token before each
        pos = (item_starts[:, P:, None] + kl - 1 + torch.arange(vl)).view(n, Q * vl)
        return full[:, :-1].contiguous(), _targets(full, pos)


@register_task("mad:noisy_recall")
class NoisyRecall(InContextRecall):
    capability = "in-context recall among irrelevant tokens: look up keys while ignoring noise"
    knobs = InContextRecall.knobs + (
        Knob("noise", "fraction", "fraction of each example's T + 1 tokens that are noise (rounded)"),
        Knob("noise_vocab", "int", "distinct noise symbols"))
    defaults = {"vocab": 16, "pairs": None, "noise": 0.2, "noise_vocab": 4}


@register_task("mad:fuzzy_recall")
class FuzzyRecall(InContextRecall):
    capability = "in-context recall with multi-token keys and values: match a key spread over several tokens"
    knobs = InContextRecall.knobs + (Knob("key_len", "int", "tokens per key"),
                                     Knob("value_len", "int", "tokens per value (every one is scored)"))
    defaults = {"vocab": 16, "pairs": None, "key_len": 2, "value_len": 1}

    def resolve(self, k):
        keys, _ = self.alphabet(k)
        if keys ** k["key_len"] > 2**62:
            raise _too_small(self.name, f"{keys} key symbols ** key_len {k['key_len']} is too many keys to number",
                             "lower key_len")
        return super().resolve(k)


class ContentTask(Task):
    """A task over content symbols after a few special tokens (``SPECIALS``): copying and compression."""

    SPECIALS: tuple[str, ...] = ()

    def check_content(self, k):
        if k["vocab"] - len(self.SPECIALS) < 2:
            raise _too_small(self.name, f"vocab {k['vocab']} leaves fewer than 2 content symbols after "
                                        f"{len(self.SPECIALS)} special tokens", f"raise vocab to at least {len(self.SPECIALS) + 2}")
        return k

    def symbols(self, k):
        return list(self.SPECIALS) + [f"c{i}" for i in range(k["vocab"] - len(self.SPECIALS))]

    def chance(self, k):
        return 1 / (k["vocab"] - len(self.SPECIALS))


@register_task("mad:selective_copy")
class SelectiveCopy(ContentTask):
    capability = "selective copying: keep the content tokens among noise and reproduce them in order"
    knobs = (Knob("copy", "int", "content tokens to copy (the rest of the first seq_len - copy positions is noise)"),)
    defaults = {"vocab": 16, "copy": 16}
    SPECIALS = ("<pad>", "<noise>", "<copy>")

    def resolve(self, k):
        T, c = k["seq_len"], k["copy"]
        if 2 * c > T:
            raise _too_small(self.name, f"seq_len {T} is too short for copy {c} (a region of at least copy tokens, "
                                        "then copy answer positions)", f"raise seq_len to at least {2 * c} or lower copy")
        return self.check_content(k)

    def answers_per_example(self, k):
        return k["copy"]

    def generate(self, n, k, generator, seed):
        T, c = k["seq_len"], k["copy"]
        region = T - c
        where = random_subsets(n, region, c, generator).sort(1).values
        content = torch.randint(k["vocab"] - 3, (n, c), generator=generator) + 3
        x = torch.full((n, T), 1, dtype=torch.long)  # <noise>
        x.scatter_(1, where, content)
        x[:, region:] = 2  # <copy>: the j-th marker asks for the j-th content token
        y = torch.full((n, T), IGNORE_INDEX, dtype=torch.long)
        y[:, region:] = content
        return x, y


@register_task("mad:compression")
class Compression(ContentTask):
    capability = "compression: carry a whole sequence and decode it, in order, at the final positions"
    knobs = (Knob("tokens", "int", "tokens to compress and reproduce (default: seq_len // 2)"),)
    defaults = {"vocab": 16, "tokens": None}
    SPECIALS = ("<pad>", "<compress>")

    def resolve(self, k):
        T = k["seq_len"]
        if k["tokens"] is None:
            k["tokens"] = T // 2
        if 2 * k["tokens"] > T:
            raise _too_small(self.name, f"seq_len {T} is too short for tokens {k['tokens']} (the sequence, then as many "
                                        "answer positions)", f"raise seq_len to at least {2 * k['tokens']} or lower tokens")
        return self.check_content(k)

    def answers_per_example(self, k):
        return k["tokens"]

    def generate(self, n, k, generator, seed):
        T, m = k["seq_len"], k["tokens"]
        content = torch.randint(k["vocab"] - 2, (n, m), generator=generator) + 2
        x = torch.full((n, T), PAD_ID, dtype=torch.long)
        x[:, :m], x[:, m: 2 * m] = content, 1  # the sequence, then <compress> markers
        y = torch.full((n, T), IGNORE_INDEX, dtype=torch.long)
        y[:, m: 2 * m] = content
        return x, y


@register_task("mad:memorization")
class Memorization(KeyValueTask):
    capability = "memorization: a fixed key -> value table learned into the parameters (context cannot help)"
    knobs = (Knob("pairs", "int", "distinct keys per example (default: min(keys, (seq_len + 1) // 2))"),)
    defaults = {"vocab": 64, "pairs": None}

    def resolve(self, k):
        T, V = k["seq_len"], k["vocab"]
        keys, _ = self.alphabet(k)
        if k["pairs"] is None:
            k["pairs"] = min(keys, (T + 1) // 2)
        P = k["pairs"]
        if P > keys:
            raise _too_small(self.name, f"vocab {V} has only {keys} keys for pairs {P} (keys never repeat in an example)",
                             f"raise vocab to at least {2 * P + 1} or lower pairs")
        if 2 * P > T + 1:
            raise _too_small(self.name, f"seq_len {T} is too short for pairs {P}", f"raise seq_len to at least {2 * P - 1}")
        return k

    def answers_per_example(self, k):
        return k["pairs"]

    def table(self, k, seed: int) -> torch.Tensor:
        """The value id of every key id (index: key id - 1); the same in every split."""
        keys, values = self.alphabet(k)
        return torch.randint(values, (keys,), generator=split_generator(self.name, seed, "table")) + 1 + keys

    def generate(self, n, k, generator, seed):
        T, P = k["seq_len"], k["pairs"]
        keys, _ = self.alphabet(k)
        chosen = random_subsets(n, keys, P, generator)
        full = torch.full((n, T + 1), PAD_ID, dtype=torch.long)
        full[:, 0: 2 * P: 2] = chosen + 1
        full[:, 1: 2 * P: 2] = self.table(k, seed)[chosen]
        return full[:, :-1].contiguous(), _targets(full, torch.arange(0, 2 * P, 2).expand(n, P))


# -- data names -----------------------------------------------------------------------------------
def task_names() -> str:
    """The registered tasks as a data name starts, for messages: ``mqar, mad:TASK, ...``."""
    return ", ".join(dict.fromkeys(t.split(":")[0] + ":TASK" if ":" in t else t for t in TASKS))


def is_synthetic(name) -> bool:
    """Whether ``name`` names a generated task (``TASK[:...]`` for a registered TASK, ``FAMILY[:...]``
    for a family of them, such as ``mad``)."""
    head = name.split(":")[0] if isinstance(name, str) else None
    return head is not None and (head in TASKS or is_family(head))


def parse_data_name(name: str) -> tuple[str, dict[str, str]]:
    """``(task, inline knobs as text)`` of a data name; UserError for a malformed one."""
    task, sep, rest = name.partition(":")
    if task not in TASKS and not is_family(task):
        raise UserError(f"unknown generated task {task!r} in data {name!r}; valid tasks: {task_names()}",
                        setting="data")
    if task not in TASKS:  # a family: the task is its next word
        head, family = task, [t.split(":", 1)[1] for t in TASKS if t.startswith(task + ":")]
        word, sep, rest = rest.partition(":")
        if not word.strip():
            raise UserError(f"data {name!r} names no {head.upper()} task: use {head}:TASK[:knob=value,...] with TASK "
                            f"one of {', '.join(family)}", setting="data")
        task = f"{head}:{word.strip()}"
        if task not in TASKS:
            raise UserError(f"unknown {head.upper()} task {word.strip()!r} in data {name!r}; valid tasks: "
                            f"{', '.join(family)}", setting="data")
    knobs: dict[str, str] = {}
    if not sep:
        return task, knobs
    for item in rest.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UserError(f"knob {item.strip()!r} in data {name!r} is not knob=value: write {task}:knob=value,...",
                            setting="data")
        if key in knobs:
            raise UserError(f"knob {key!r} is given twice in data {name!r}: give it once", setting="data")
        knobs[key] = value
    return task, knobs


def convert_knobs(task: str, values: Mapping[str, Any], where: str = "") -> dict:
    """``values`` checked against ``task``'s knobs (unknown name or bad value: one-line UserError)."""
    definition = TASKS[task]
    return {key: definition.knob(key, where).convert(value, task) for key, value in values.items()}


def check_synthetic_name(name: str) -> None:
    """UserError unless ``name`` is a valid task name with valid inline knobs (their values alone;
    checks between knobs need seq_len and vocab, known when the data is built)."""
    task, inline = parse_data_name(name)
    convert_knobs(task, inline, where=f" (in data {name!r})")


def resolve_knobs(task: str, knobs: Mapping[str, Any]) -> dict:
    """Every knob of ``task``: ``knobs`` (checked) over the defaults, derived ones filled, the
    checks between them run."""
    definition = TASKS[task]
    given = convert_knobs(task, {key: value for key, value in knobs.items() if value is not None})  # None: default
    resolved = {**COMMON_DEFAULTS, **definition.defaults, **given}
    return definition.resolve(resolved)


def given_knobs(name: str, *, seq_len: int | None = None, vocab_size: int | None = None,
                options: Mapping[str, Any] | None = None) -> tuple[str, dict]:
    """``(task, knobs)`` of a data name: the inline knobs, then ``options`` (the task options
    mapping, without the data seed), then ``seq_len`` / ``vocab_size`` for those two knobs; each
    value checked, the task's defaults and the checks between knobs not yet applied
    (``resolve_knobs`` does both)."""
    task, inline = parse_data_name(name)
    knobs = convert_knobs(task, inline, where=f" (in data {name!r})")
    for key, value in convert_knobs(task, dict(options or {}), where=" (in the task options)").items():
        if key in knobs and knobs[key] != value:
            raise UserError(f"knob {key} is given twice for {name!r}: {knobs[key]} in the data name and {value} in the "
                            "task options; give it once", setting="data")
        knobs[key] = value
    for key, value in (("seq_len", seq_len), ("vocab", vocab_size)):
        if key not in knobs and value is not None:
            knobs[key] = value
    return task, knobs


def synthetic_data(name: str, *, seq_len: int | None = None, vocab_size: int | None = None, seed: int = 0,
                   options: Mapping[str, Any] | None = None) -> "SyntheticData":
    """The dataset a data name gives: inline knobs, then ``options`` (the task options mapping),
    then ``seq_len`` / ``vocab_size`` for those two knobs, then the task's defaults."""
    task, knobs = given_knobs(name, seq_len=seq_len, vocab_size=vocab_size, options=options)
    return SyntheticData(task, seed=seed, name=name, **knobs)


def data_name(task: str, knobs: Mapping[str, Any]) -> str:
    """The inline data name of ``task`` with ``knobs`` (sorted), e.g. ``mqar:pairs=8,seq_len=64``."""
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}", setting="data")
    if not knobs:
        return task
    return task + ":" + ",".join(f"{key}={knobs[key]!r}" if isinstance(knobs[key], float) else f"{key}={knobs[key]}"
                                 for key in sorted(knobs))


# -- the dataset ----------------------------------------------------------------------------------
def chance_of(task: Task, k: dict, hook: str = "chance") -> float | None:
    """``task.chance(k)`` (or ``task.no_recall(k)``, which may be None: no such level); a UserError naming
    the task where it is not a number in [0, 1] (an accuracy: a plugin's nan or 5.0 would be recorded
    as the data's level)."""
    level = getattr(task, hook)(k)
    if level is None and hook == "no_recall":
        return None
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 <= level <= 1:
        raise UserError(f"task {task.name}: {hook}() returned {level!r}, not an accuracy in [0, 1]: see the contract "
                        "of evo_attention.data.synthetic.Task", setting="data")
    return float(level)


def check_task_memory(name: str, task: Task, k: dict) -> tuple:
    """``data.base.check_generated_memory`` of ``task`` at knobs ``k``, in its knobs' names."""
    knob = f"the knob {task.name}:{{}}=N, or {{}} where the knob is not given"
    return check_generated_memory(
        f"the generated task {name}", examples=k["train_examples"] + 2 * k["eval_examples"], seq_len=k["seq_len"],
        vocab=k["vocab"], bytes_per_token=task.bytes_per_token,
        vocab_fix=(f"lower its vocab ({knob.format('vocab', 'vocab_size')})", "vocab_size"),
        length_fix=(f"lower its seq_len ({knob.format('seq_len', 'max_seq_len')}) or its train_examples / "
                    "eval_examples knobs", "max_seq_len"))


class SyntheticData(ExampleData):
    """A generated task as a TaskData; all splits are generated on construction.

    ``SyntheticData("mad:selective_copy", seq_len=64, copy=16, seed=0)``: knobs by name (see the
    module docstring), the rest at the task's defaults. ``name`` is the data name the dataset is
    known by (default: the task); the fingerprint depends on the task, every knob, the seed and the
    format version, not on how the name was spelled.
    """

    def __init__(self, task: str, *, seed: int = 0, name: str | None = None, **knobs):
        if task not in TASKS:
            raise UserError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}", setting="data")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise UserError(f"seed must be an integer, got {seed!r}")
        self.task = TASKS[task]
        self.knobs = resolve_knobs(task, knobs)
        k = self.knobs
        self.name = name or task
        self.seed = seed
        refused = check_task_memory(self.name, self.task, k)  # before the vocabulary or any split is built
        self.vocab_size, self.seq_len, self.pad_id = k["vocab"], k["seq_len"], PAD_ID
        self.settings = {"task": task, **self.task.identity(k), "seed": seed, "format_version": FORMAT_VERSION}
        self.fingerprint = fingerprint_of({"name": "synthetic", **self.settings})
        self.answers_per_example, self.chance = self.task.answers_per_example(k), chance_of(self.task, k)
        self.no_recall = chance_of(self.task, k, "no_recall")
        self.stream = k["train_examples"] == 0  # an endless stream: no fixed train split
        with refuse_failed_allocation(*refused):
            self.vocab = Vocab(self.task.symbols(k))
            if len(self.vocab) != self.vocab_size:  # a plugin's task can break it: a bug, said as generate's are
                raise UserError(f"task {self.task.name}: symbols() named {len(self.vocab)} ids, not vocab "
                                f"{self.vocab_size}: see the contract of evo_attention.data.synthetic.Task",
                                setting="data")
            self.data = {}
            for split in SPLITS:
                if split == "train" and self.stream:
                    empty = torch.empty((0, self.seq_len), dtype=torch.long)
                    self.data[split] = (empty, empty.clone())
                    continue
                n = k["train_examples"] if split == "train" else k["eval_examples"]
                self.data[split] = self._checked(self.task.generate(n, k, split_generator(task, seed, split), seed), n)

    def _checked(self, made, n: int, where: str = ""):
        """``made``, or a UserError naming the task where its ``generate`` broke the contract of ``Task``
        (a plugin's bug would otherwise be recorded against every gene that trains on it)."""
        x, y = made if isinstance(made, tuple) and len(made) == 2 else (None, None)
        shape, answers, vocab = (n, self.seq_len), self.answers_per_example, self.vocab_size
        if not (torch.is_tensor(x) and torch.is_tensor(y)):
            problem = "not a pair (x, y) of tensors"
        elif x.dtype != torch.long or y.dtype != torch.long or x.shape != shape or y.shape != shape:
            problem = f"x {x.dtype} {tuple(x.shape)} and y {y.dtype} {tuple(y.shape)}, not int64 {shape}"
        elif n == 0:
            problem = None
        else:
            scored = y != IGNORE_INDEX
            targets = y[scored]
            low, high = torch.aminmax(x)
            outside = low < 0 or high >= vocab or (targets.numel() and (targets.min() < 0 or targets.max() >= vocab))
            problem = (f"ids or targets outside [0, {vocab}) (targets elsewhere are IGNORE_INDEX, {IGNORE_INDEX})"
                       if outside else f"scored targets equal to the pad id {PAD_ID}, which is never scored (make them "
                       f"IGNORE_INDEX, {IGNORE_INDEX}, or answer with ids >= 1)" if bool((targets == PAD_ID).any())
                       else f"rows without exactly {answers} scored target(s) (answers_per_example)"
                       if bool((scored.sum(1) != answers).any()) else None)
        if problem is not None:
            raise UserError(f"task {self.task.name}: generate({n}, ...){where} returned {problem}: see the contract of "
                            "evo_attention.data.synthetic.Task", setting="data")
        return x, y

    def train_batches(self, batch_size: int, generator: torch.Generator):
        """The fixed train split in shuffled batches (``TaskData.train_batches``), or, with
        ``train_examples=0``, a fresh batch every step: an endless stream from a generator seeded by
        (task, data seed, a number drawn from ``generator``), independent of the evaluation splits'
        generators. Each batch depends only on that stream, so a resumed training that replays its
        steps gets the same batches."""
        if not self.stream:
            return super().train_batches(batch_size, generator)
        check_positive("batch_size", batch_size)
        draw = int(torch.randint(2**62, (1,), generator=generator))
        stream = split_generator(self.task.name, self.seed, f"stream-{draw}")

        def batches():  # each checked as the splits are: ~40 us a batch (0.2% of a quick-preset step on a CPU)
            while True:
                yield self._checked(self.task.generate(batch_size, self.knobs, stream, self.seed), batch_size,
                                    " for a train_examples=0 stream batch")

        return batches()

    def scored_tokens(self, split: str) -> int:
        """Answers in ``split``: examples x answers per example (the generator scores exactly these)."""
        return self.num_eval_items(self.check_split(split)) * self.answers_per_example

    def describe(self) -> dict:
        return {
            **super().describe(),
            "task": self.task.name,
            "capability": self.task.capability,
            "examples": {s: self.num_eval_items(s) for s in SPLITS},
            **({"train_stream": True} if self.stream else {}),
            "answers_per_example": self.answers_per_example,
            "scored_tokens": {s: self.scored_tokens(s) for s in SPLITS},
            "chance_accuracy": self.chance,
            **({} if self.no_recall is None else {"no_recall_accuracy": self.no_recall}),
            "settings": self.settings,
        }
