"""A registered study: one plan file (YAML) that names its questions, their stages, seed blocks,
budgets, margins, families and decision words; registered before any result, run stage by stage,
amended only before the results an amendment changes, and reported from its result files alone.

The plan's keys are ``TOP_KEYS`` (docs/studies.md has the whole schema and an example): ``root``
(what paths are relative to, where commands run), ``out`` (stores and every file a command writes, a
folder per stage), ``results`` (the small files copied from out: what report reads), ``vars`` (part
of the registration) and ``settings`` (where and how it runs: ``run --set``), both ``{name}`` in
stages, ``gpu_flags`` (for a ``device: gpu`` stage's trainings where CUDA is present) and
``questions`` (``QUESTION_KEYS``): seed ``blocks`` and ``search_seeds`` (no two questions share one),
``stages`` in order (``KINDS``, each its own folder or file), report's ``tables``, the ``sources`` the
decision reads, and the rules of its ``words`` (per entity) and ``answers`` (the first that holds).

The registration (``PLAN.registration.json`` beside the plan, committed with it) records the plan's
hash, a fingerprint of every stage and question, the tool's version and the repository's commit;
``amend`` appends the changed fingerprints with the time and a note, and refuses a change to a stage
(or a question's decision) whose results exist. ``run`` refuses a plan whose stages or decisions
differ from the last recorded ones, and an amendment dated after the results it changes. Amendment
times follow ``studies.plan``'s rule (an ISO time, never in the future).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from evo_attention.studies.plan import amendment_time, family_values, fingerprint, load_plan, read_plan_yaml
from evo_attention.studies.results import ABOVE, BASELINE_ITSELF, BELOW, TREND_WORDS, check_rule
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.jsonio import write_json
from evo_attention.util.version import __version__

KINDS = ("command", "tune", "plan", "versus", "family", "strategies", "rediscovery", "reliability", "suite")
# the plan's shape, checked once at load (``_shape``) before its rules: what each key's value must be; a
# stage's number may be text, a {name} of its each, checked as a number once substituted (``_stage_values``)
TEXT, LIST, MAP, NUMBER, FLAG = "text", "a list", "a mapping", "a number", "true or false"
VALUE = "text, a number or a list"  # a var's or a setting's
_TYPES = {TEXT: str, LIST: list, MAP: dict, NUMBER: (int, float, str), FLAG: bool, VALUE: (str, int, float, list)}
TEXTS = (LIST, TEXT)  # (LIST or MAP, the shape of each entry)


@dataclass(frozen=True)
class Keys:
    """A mapping of a plan: what it is (``noun``), the keys it needs (``a|b``: one of them) and each key's shape."""
    noun: str
    needs: tuple
    shapes: dict


TOP_KEYS = Keys("a study plan", ("study", "out", "results", "questions"), {
    "study": TEXT, "title": TEXT, "description": TEXT, "root": TEXT, "out": TEXT, "results": TEXT, "report": TEXT,
    "vars": (MAP, VALUE), "settings": (MAP, VALUE), "gpu_flags": LIST, "edge_rule": TEXT, "amendments": LIST,
    "questions": MAP})
QUESTION_KEYS = Keys("a question", ("stages",), {
    "title": TEXT, "blocks": LIST, "search_seeds": LIST, "stages": (LIST, MAP), "sources": (MAP, TEXT),
    "tables": (LIST, Keys("a table", ("file", "table"), {"file": TEXT, "table": TEXT, "title": TEXT})),
    "words": MAP, "answers": MAP})
RULE = Keys("a rule", ("say",), {"say": TEXT, "if": TEXTS})
STAGE_KEYS = {"name": TEXT, "kind": TEXT, "dir": TEXT, "each": MAP, "device": TEXT, "note": TEXT, "done": TEXT,
              "file": TEXT}
KIND_KEYS = {  # kind -> (the keys it needs besides its name, its own keys' shapes)
    "command": (("command|commands",), {"command": LIST, "commands": LIST}),
    "tune": (("command", "grid"), {"command": LIST, "grid": LIST}),
    "plan": (("genes_of|genes", "seeds", "margin"), {
        "genes_of": TEXT, "genes": TEXTS, "top": NUMBER, "rate_of": TEXT, "margin": NUMBER, "alpha": NUMBER,
        "seeds": NUMBER, "seed_block": NUMBER}),
    "versus": (("genes_of", "reference_file", "reference", "margin"),
               {"genes_of": TEXT, "reference_file": TEXT, "reference": TEXT, "margin": NUMBER}),
    "family": (("gene", "cells"), {"gene": TEXT, "cells": (MAP, TEXT), "against": TEXT, "margin": NUMBER,
                                   "trend": MAP, "trend_only": FLAG}),
    "strategies": (("searches",), {"searches": TEXT, "reference": TEXT, "margin": NUMBER}),
    "rediscovery": (("searches",), {"searches": TEXTS, "describe": TEXTS, "reference": TEXT, "features": TEXTS,
                                    "rediscovered_if": LIST, "bar": NUMBER, "solve_at": NUMBER}),
    "reliability": (("validations",), {"validations": TEXTS}),
    "suite": (("suite",), {"suite": TEXT, "data_seed": NUMBER})}
# of a computed stage, checked by _stage_values: studies.plan's family fields, and whole numbers (name, least)
STAGE_WHOLE = (("top", 1), ("data_seed", 0))
STAGE_NUMBERS = ("margin", "alpha", "seeds", "seed_block", *(name for name, _ in STAGE_WHOLE))
TRAINING = ("validate", "baseline", "train", "search", "curve", "compare", "transfer", "ablate")
DONE = {"validate": "validation*.json", "search": "final_results.json", "baseline": "result.json",
        "train": "result.json", "curve": "curve.json", "compare": "compare*.json", "transfer": "transfer*.json",
        "ablate": "ablation*.json"}
_REF = re.compile(r"\{([A-Za-z_][\w-]*)(?::([^{}]+))?\}")
# [all|some|no] NAME[ENTITY] is [not] WORD: NAME a source or a table of words; [ENTITY] one of its entries
# every word an entry of a source can be (``study_run.verdicts``): a paired or solve-rate verdict, a
# transfer's, a trend, a reliability's side of 0, a rediscovery rate against its bar
POSITIVE, NEGATIVE = "positive", "negative"  # a reliability file's pooled interval beyond 0 (else undetermined)
SOURCE_WORDS = frozenset({stats.PAIRED_BETTER, stats.PAIRED_WORSE, stats.EQUIVALENT, stats.UNDETERMINED, stats.TOO_FEW,
                          stats.SOLVED_MORE, stats.SOLVED_LESS, stats.REFERENCE, stats.NO_ADVANTAGE, stats.NO_RELATIVE,
                          stats.HOLDS, stats.SHRINKS, stats.VANISHES, stats.REVERSES, *TREND_WORDS, POSITIVE, NEGATIVE,
                          ABOVE, BELOW, BASELINE_ITSELF})
EDGE_RULE = "the edge rule asks for an amendment that widens the grid (a new tuning stage) first"
CONDITION = re.compile(r"^(?:(all|some|no)\s+)?([^\s\[]+)(?:\[([^\]]+)\])?\s+is\s+(not\s+)?(.+)$")


def _rule(path, rule: str, what: str) -> UserError:
    return UserError(f"study plan {path} breaks the rule '{rule}': {what}")


def _fail(path, what: str) -> UserError:
    return UserError(f"study plan {path}: {what}")


@dataclass
class Stage:
    name: str
    question: str
    index: int
    spec: dict  # as written, the plan's vars substituted

    @property
    def kind(self) -> str:
        return self.spec.get("kind", "command")

    @property
    def trains(self) -> bool:
        return self.kind in ("command", "tune")


@dataclass
class Study:
    path: Path
    root: Path
    raw: dict
    stages: list[Stage] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.raw["study"])

    @property
    def questions(self) -> dict:
        return self.raw["questions"]

    def rel(self, *parts) -> str:
        """A path relative to the root, as commands and documents name it (an absolute ``out`` or
        ``results`` stays absolute)."""
        kept = [str(p) for p in parts if str(p) not in ("", ".")]
        joined = "/".join(p.strip("/") for p in kept)
        return "/" + joined if kept and kept[0].startswith("/") else joined

    def out(self, rel: str = "") -> Path:
        return self.root / self.raw["out"] / rel

    def results(self, rel: str = "") -> Path:
        return self.root / self.raw["results"] / rel

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise UserError(f"study {self.name} has no stage {name!r}: its stages are "
                        f"{', '.join(s.name for s in self.stages)}")


# ------------------------------------------------------------------------------------------ values


def _text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def substitute(value, env: dict, resolve: Callable | None = None):
    """``{name}`` replaced from ``env`` in strings, lists (a list value, alone in its string, becomes
    that list) and mappings; ``{kind:arg}`` by ``resolve`` (left as written without one, as is an
    unknown name)."""
    if isinstance(value, dict):
        return {k: substitute(v, env, resolve) for k, v in value.items()}
    if isinstance(value, list):  # a list value stays a nested list: flatten splices it into a command
        return [substitute(item, env, resolve) for item in value]
    if not isinstance(value, str):
        return value
    whole = _REF.fullmatch(value)
    if whole and not whole[2] and isinstance(env.get(whole[1]), list):
        return substitute(env[whole[1]], env, resolve)

    def one(m: re.Match) -> str:
        if m[2] is None:
            return _text(env[m[1]]) if m[1] in env and not isinstance(env[m[1]], (list, dict)) else m[0]
        return resolve(m[1], m[2]) if resolve else m[0]

    return _REF.sub(one, value)


def _number(value):
    """A number written as text (a substituted ``{block}``) as the number it is."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def flatten(args) -> list:
    return [x for a in args for x in (flatten(a) if isinstance(a, list) else [a])]


def command_flags(argv: list) -> dict[str, str]:
    """A command's flags as its command line reads them, ``--flag value`` or ``--flag=value`` (the last
    given wins; a flag without a value: ""): the one reader of every rule that reads a stage's command."""
    out = {}
    for i, a in enumerate(map(str, argv)):
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            nxt = str(argv[i + 1]) if i + 1 < len(argv) else ""
            out[name] = value if eq else "" if nxt.startswith("--") else nxt
    return out


# ------------------------------------------------------------------------------------------ loading


def load_study(path, settings: dict | None = None) -> Study:
    """The study plan in ``path``, checked against its shape and its own rules (one-line UserError naming
    the key or the rule)."""
    path = Path(path)
    raw = read_plan_yaml(path, lambda why: _fail(path, why))
    if not isinstance(raw, dict):
        raise _fail(path, "must be a mapping that names its study (study: NAME), out, results and questions")
    _keys(path, "", raw, TOP_KEYS)
    for i, item in enumerate(raw.get("amendments") or []):  # amendments written in the plan: notes with their time
        if not isinstance(item, dict) or "time" not in item or not str(item.get("reason") or "").strip():
            raise _fail(path, f"amendment {i + 1} needs its time and its reason (time: ISO time, reason: text)")
        amendment_time(item["time"], path, i, lambda why: _fail(path, why))
    if raw.get("edge_rule", "refuse") not in ("refuse", "note"):
        raise _fail(path, "edge_rule is refuse (a rate selected at an edge of its grid stops what reads it) or note")
    vars_ = raw.get("vars") or {}
    given = {**(raw.get("settings") or {}), **(settings or {})}
    study = Study(path, (path.parent / str(raw.get("root", "."))).resolve(), raw, settings=given)
    for qname, q in raw["questions"].items():
        _shape(path, f"question {qname}", q, QUESTION_KEYS)
        for i, spec in enumerate(q["stages"], 1):
            spec = substitute(spec, vars_)
            kind, name = spec.get("kind", "command"), spec.get("name")
            where = f"stage {name}" if isinstance(name, str) and name else f"question {qname}: stage #{i}"
            if kind not in KINDS:
                raise _fail(path, f"{where}: kind {kind!r} is not known: use {', '.join(KINDS)}")
            needs, shapes = KIND_KEYS[kind]
            _shape(path, where, spec, Keys(f"a {kind} stage", ("name", *needs), {**STAGE_KEYS, **shapes}))
            study.stages.append(Stage(name, str(qname), len(study.stages), spec))
    _check_rules(study)
    return study


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shape(path, where: str, value, shape) -> None:
    """Refuse ``value`` (``where`` names it) unless it has ``shape``: a type (``_TYPES``), ``(LIST or MAP, the
    shape of each entry)`` or ``Keys``; None stands for a key not given."""
    if value is None:
        return
    kind = _kind(shape)
    if not isinstance(value, _TYPES[kind]):
        raise _fail(path, f"{where} must be {kind}, not {_brief(value)}")
    if isinstance(shape, Keys):
        _keys(path, f"{where}: ", value, shape)
    elif isinstance(shape, tuple):
        for key, item in value.items() if kind == MAP else enumerate(value, 1):
            _shape(path, f"{where}.{key}" if kind == MAP else f"{where} #{key}", item, shape[1])


def _kind(shape) -> str:
    return MAP if isinstance(shape, Keys) else shape[0] if isinstance(shape, tuple) else shape


def _keys(path, where: str, value: dict, keys: Keys) -> None:
    """``value``'s keys against ``keys``: none unknown, none it needs missing (or empty), each of its shape."""
    unknown = sorted(str(k) for k in set(value) - set(keys.shapes))
    if unknown:
        raise _fail(path, f"{where}unknown key {unknown[0]!r}: {keys.noun} holds {', '.join(sorted(keys.shapes))}")
    for need in (n.split("|") for n in keys.needs):
        if all(value.get(k) in (None, "", [], {}) for k in need):
            either = " or ".join(f"{k} ({_kind(keys.shapes[k])})" for k in need)
            raise _fail(path, f"{where}{keys.noun} fixes its {either}")
    for key, item in value.items():
        _shape(path, f"{where}{key}", item, keys.shapes[key])


def _combos(stage: Stage, reader: Callable | None = None) -> list[dict] | None:
    """The sub-runs of a stage: one mapping of values per combination of its ``each`` (None while a
    ``genes_of`` it expands over does not exist yet)."""
    each = dict(stage.spec.get("each") or {})
    if stage.kind == "tune":
        each = {"rate": [_text(r) for r in stage.spec["grid"]], **each}
    combos = [{}]
    for var, values in each.items():
        if isinstance(values, dict):
            genes = reader(values["genes_of"]) if reader else ["GENE"]
            if genes is None:
                return None
            items = [{var: g, "index": i} for i, g in enumerate(genes)]
        else:
            items = [dict(v) if isinstance(v, dict) else {var: v} for v in values]
        combos = [{**c, **item} for c in combos for item in items]
    return combos


def run_dir(stage: Stage, combo: dict, env: dict) -> str:
    if stage.kind == "tune":  # a rate's run in the stage's folder, beside the selection
        return substitute(str(stage.spec.get("dir", stage.name)) + "/{rate}", {**env, **combo})
    default = stage.name
    if stage.spec.get("each") and "dir" not in stage.spec:
        default += "/" + "-".join("{" + v + "}" for v in stage.spec["each"])
    return substitute(str(stage.spec.get("dir", default)), {**env, **combo})


def stage_file(stage: Stage, combo: dict, env: dict) -> str:
    default = {"plan": "plans/{stage}.yaml", "suite": "{stage}.yaml", "tune": "{dir}/selected.json"}.get(
        stage.kind, "{dir}/" + stage.kind + ".json")
    if stage.kind == "plan" and stage.spec.get("each"):
        default = "plans/{stage}-" + "-".join("{" + v + "}" for v in stage.spec["each"]) + ".yaml"
    base = str(stage.spec.get("dir", stage.name))
    return substitute(str(stage.spec.get("file", default)), {**env, **combo, "stage": stage.name, "dir": base})


def stage_commands(stage: Stage) -> list[dict]:
    """The stage's commands, each ``{"run": argv template, "done": glob or None}``."""
    items = stage.spec.get("commands") or ([stage.spec["command"]] if "command" in stage.spec else [])
    out = []
    for item in (i if isinstance(i, dict) else {"run": i} for i in items):
        run = item.get("run")
        if not isinstance(run, list) or not run:
            raise UserError(f"stage {stage.name}: a command is a list of words (evo-attention's subcommand first)")
        out.append({"run": run, "name": str(run[0]), "done": item.get("done") or DONE.get(str(run[0]))})
    return out


def done_glob(stage: Stage) -> str:
    """What marks a sub-run of a training stage done in the results (its last collected command's file)."""
    if stage.spec.get("done"):
        return str(stage.spec["done"])
    kept = [c["done"] for c in stage_commands(stage) if c["done"] and c["done"].endswith((".json", ".csv"))]
    return kept[-1] if kept else "*.json"


def _inputs(stage: Stage, combo: dict, env: dict) -> list[str]:
    """The result files (globs) a computed stage reads, relative to the results."""
    s = {k: substitute(v, {**env, **combo}) for k, v in stage.spec.items()}
    found = [s[key] for key in ("genes_of", "reference_file", "rate_of") if s.get(key)]
    found += list((s.get("cells") or {}).values()) + list(s.get("validations") or [])  # a family's, a reliability's
    if stage.kind == "strategies":
        found.append(s["searches"].rstrip("/") + "/*")
    if stage.kind == "rediscovery":
        found += list(s.get("searches") or []) + list(s.get("describe") or [])
    return found + [v["genes_of"] for v in (stage.spec.get("each") or {}).values() if isinstance(v, dict)]


def _refs(stage: Stage) -> list[tuple[str, str]]:
    """The ``{kind:stage}`` references of a training stage's commands."""
    text = json.dumps([c["run"] for c in stage_commands(stage)])
    return [(m[1], m[2]) for m in _REF.finditer(text) if m[2]]


# what a reference stands for when a command is checked before its stage ran: a rate, or a path
_STAND_INS = {"lr": "0.001", "rate": "0.001"}


def command_lines(study: Study) -> list[tuple[str, list[str]]]:
    """``(stage, argv)`` of every command the plan runs, its references replaced by stand-ins (a
    rate, a path): what the command line parses when the plan is registered or run."""
    lines = []
    for stage in (s for s in study.stages if s.trains):
        for combo in _combos(stage) or []:  # None: a genes_of file not written yet
            for c in stage_commands(stage):
                argv = flatten(substitute(c["run"], {**study.settings, **combo, "out": "OUT"}))
                lines.append((stage.name, [_REF.sub(lambda m: _STAND_INS.get(m[1], "REF") if m[2] else m[0], _text(a))
                                           for a in argv]))
    return lines


def _outputs(study: Study, stage: Stage, env: dict) -> list[str]:
    combos = _combos(stage) or []
    if stage.trains:
        outs = [run_dir(stage, c, env) for c in combos]
        return outs + ([stage_file(stage, {}, env)] if stage.kind == "tune" else [])
    files = [stage_file(stage, c, env) for c in combos]
    return files + [str(Path(f).with_suffix(".lr")) for f in files if stage.kind == "plan"]


def _prefix(p: str) -> str:
    return re.split(r"[*?\[{]", p, maxsplit=1)[0]


def _reads(path: str, output: str) -> bool:
    """Whether an input ``path`` (``_inputs``: a file or glob, a ``#part`` after it) reads what a stage writes at
    ``output`` (an ``_outputs`` entry's ``_prefix``, no trailing /): that output, a file in it, or a glob's
    fixed part leading to it."""
    file = path.split("#")[0]
    pre = _prefix(file)
    return bool(pre) and (pre == output or pre.startswith(output + "/") or (file != pre and output.startswith(pre)))


def _check_rules(study: Study) -> None:
    path, env = study.path, {**study.settings}
    owners: dict[tuple[str, int], str] = {}  # (blocks or search_seeds, value) -> question
    for qname, q in study.questions.items():
        for key, what in (("blocks", "two questions may not share a seed block"),
                          ("search_seeds", "two questions may not share a search seed")):
            values = q.get(key) or []
            if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                       for v in values):
                raise _fail(path, f"question {qname}: {key} must be a list of whole numbers >= 0")
            for v in values:
                if (key, v) in owners:
                    raise _rule(path, what, f"{key[:-1].replace('_', ' ')} {v} is {owners[(key, v)]}'s and {qname}'s")
                owners[(key, v)] = qname
    written: dict[str, str] = {}
    for stage in study.stages:
        spec, q = stage.spec, study.questions[stage.question]
        earlier = {s.name: s for s in study.stages[:stage.index]}
        if stage.name in earlier:
            raise _rule(path, "one name per stage", f"two stages are named {stage.name}")
        if spec.get("device", "cpu") not in ("cpu", "gpu") and "{" not in str(spec.get("device")):
            raise _rule(path, "a stage runs on cpu, or gpu where present", f"stage {stage.name} asks for "
                                                                           f"{spec.get('device')!r}")
        each = spec.get("each") or {}
        if not isinstance(each, dict) or not all(isinstance(v, list) and v or isinstance(v, dict) and "genes_of" in v
                                                 for v in each.values()):
            raise _fail(path, f"stage {stage.name}: each is a mapping of name -> a list of values (or "
                              "{genes_of: FILE})")
        for var, values in each.items():
            if isinstance(values, list) and any(isinstance(v, dict) and var not in v for v in values):
                raise _fail(path, f"stage {stage.name}: each {var}: a mapping among its values names its own {var}")
            each_names = {var}.union(*(v for v in values if isinstance(v, dict))) if isinstance(values, list) else {var}
            shadowed = sorted(each_names & set(study.raw.get("vars") or {}))
            if shadowed:  # vars are substituted first: the each value would never be used
                raise _fail(path, f"stage {stage.name}: each names {shadowed[0]!r}, which is also a var of the plan: "
                                  "rename one of them")
        if stage.kind == "tune" and not (isinstance(spec.get("grid"), list) and len(spec["grid"]) >= 2):
            raise _fail(path, f"stage {stage.name}: a tune stage needs its grid (a list of at least 2 rates)")
        if stage.kind == "rediscovery" and spec.get("rediscovered_if") is not None:
            try:
                check_rule(spec["rediscovered_if"], spec.get("bar"))
            except UserError as exc:
                raise _fail(path, f"stage {stage.name}: {exc}") from None
        if stage.kind == "family":
            _check_family(path, stage.name, spec["cells"], spec.get("trend"))
        # seeds come from the question's blocks and search seeds
        for combo in _combos(stage) or []:
            local = {**env, **combo}
            family = _stage_values(study, stage, local)
            if family.get("seed_block") is not None and family["seed_block"] not in (q.get("blocks") or []):
                raise _rule(path, "seeds come from the question's blocks",
                            f"stage {stage.name} takes block {family['seed_block']}, not one of {stage.question}'s")
            for c in stage_commands(stage) if stage.trains else []:
                argv = [_text(a) for a in flatten(substitute(c["run"], {**local, "out": "OUT"}))]
                unknown = [m[1] for a in argv for m in _REF.finditer(str(a)) if not m[2]]
                if unknown:  # a list stands only as a whole word (spliced into the command)
                    listed = unknown[0] in {**(study.raw.get("vars") or {}), **local}
                    raise _fail(path, f"stage {stage.name}: {{{unknown[0]}}} is " + (
                        "a list: it stands only alone, as a whole word" if listed
                        else "not a variable of the plan (vars, settings, each)"))
                _check_seeds(study, stage, q, argv)
        # what a stage reads comes from earlier stages
        for kind, target in _refs(stage) if stage.trains else []:
            if kind not in ("out", "results", "rate", "plan", "lr"):
                raise _fail(path, f"stage {stage.name}: {{{kind}:{target}}} is not a reference (out, results, rate, "
                                  "plan, lr)")
            if target not in earlier:
                raise _rule(path, "a stage reads only earlier stages' results",
                            f"stage {stage.name} reads {target}, which is not an earlier stage")
        owned = [_prefix(p).rstrip("/") for s in earlier.values() for p in _outputs(study, s, env)]
        for combo in _combos(stage) or []:
            for p in _inputs(stage, combo, env):
                if not any(_reads(p, o) for o in owned):
                    raise _rule(path, "a stage reads only earlier stages' results",
                                f"stage {stage.name} reads {p}, which no earlier stage writes")
        for out in _outputs(study, stage, env):
            for other, owner in written.items():
                nested = stage.trains and study.stage(owner).trains and (
                    _prefix(out).startswith(_prefix(other).rstrip("/") + "/")
                    or _prefix(other).startswith(_prefix(out).rstrip("/") + "/"))
                if out == other or nested:
                    raise _rule(path, "each stage writes its own folder or file",
                                f"stages {owner} and {stage.name} both write {out}")
            written[out] = stage.name
    _check_decisions(study)
    _check_selection(study)


def _check_family(path, name: str, cells, trend) -> None:
    """A family stage's cells (cell -> result file) and trend (at least two of its cells -> a positive
    level, read on log2), which run reads only after every training."""
    if not isinstance(cells, dict) or not cells:
        raise _fail(path, f"stage {name}: cells must be a mapping: cell -> the result file it reads")
    if trend is None:
        return

    def level(value) -> bool:
        try:
            return not isinstance(value, bool) and math.isfinite(float(value)) and float(value) > 0
        except (TypeError, ValueError):
            return False
    if not isinstance(trend, dict) or len(trend) < 2 or any(c not in cells or not level(v) for c, v in trend.items()):
        raise _fail(path, f"stage {name}: trend must map at least two of its cells to a positive level (cell: "
                          f"level), not {trend!r}")


def _stage_values(study: Study, stage: Stage, env: dict) -> dict:
    """The numbers a computed stage fixes, checked as studies.plan checks a family's (margin and alpha in
    (0, 0.5), whatever the stage's kind), and a suite stage's suite (a shipped one, or a file under the
    root, where run reads it), said of the study plan: what ``run`` would fail on, or misread, is refused
    at load, naming the stage and the key."""
    if stage.kind == "suite":
        from evo_attention.data.suites import load_suite, shipped_suites

        name = str(substitute(stage.spec["suite"], env))
        try:
            load_suite(name if name in shipped_suites() else study.root / name)
        except UserError as exc:
            raise _fail(study.path, f"stage {stage.name}: {exc}") from None
    values = {k: _number(substitute(v, env)) for k, v in stage.spec.items() if k in STAGE_NUMBERS and v is not None}
    return family_values(values, study.path, f"stage {stage.name}: ", fail=lambda why: _fail(study.path, why),
                         whole=STAGE_WHOLE)


def _check_seeds(study: Study, stage: Stage, q: dict, argv: list) -> None:
    if not argv or argv[0] not in TRAINING:
        return
    path = study.path
    blocks, searches = q.get("blocks") or [], q.get("search_seeds") or []
    block, seed, plan = map(command_flags(argv).get, ("--seed-block", "--seed", "--plan"))
    rule = "seeds come from the question's blocks"
    if plan is not None and block is None and not plan.startswith("{plan:"):  # a plan file of the user's: its block
        block = load_plan(study.root / plan).family().get("seed_block")
        block = None if block is None else str(block)
        if block is None:
            raise _rule(path, rule, f"stage {stage.name}: the plan {plan} names no seed_block")
    if block is not None:
        if block == "run":
            if not set(searches) <= set(blocks) or not searches:
                raise _rule(path, rule, f"stage {stage.name} takes --seed-block run, but {stage.question}'s search "
                                        "seeds are not all among its blocks")
        elif not block.isdigit() or int(block) not in blocks:
            raise _rule(path, rule, f"stage {stage.name} takes block {block}, not one of {stage.question}'s "
                                    f"({', '.join(map(str, blocks)) or 'none'})")
    elif seed is not None:
        from evo_attention.studies.common import seed_block_base

        bases = {seed_block_base(b) for b in blocks}
        if not seed.lstrip("-").isdigit() or (int(seed) not in searches
                                              and (argv[0] == "search" or int(seed) not in bases)):
            raise _rule(path, rule, f"stage {stage.name} takes --seed {seed}, neither a search seed of "
                                    f"{stage.question} nor the base of one of its blocks")
    elif plan is None:
        raise _rule(path, rule, f"stage {stage.name}: `{' '.join(map(str, argv[:2]))} ...` draws the default seeds: "
                                "give --seed-block K (or --seed S) of the question's")


def _rate_from(flag: dict, run, stage: str) -> str | None:
    """The stage whose rate a command trains at: a tune stage's (``--lr {rate:T}``), or where ``--lr`` gives
    none, its ``--from-run`` run's stage (``OUT``: its own); None for a grid or a number."""
    if "--lr-grid" in flag:
        return None
    if "--lr" in flag:
        lr = _REF.fullmatch(flag["--lr"])
        return lr[2] if lr and lr[1] == "rate" else None
    return run[2] if run else stage if flag.get("--from-run") == "OUT" else None


def _check_selection(study: Study) -> None:
    """Winners are validated on seeds they were not selected on: a ``validate``'s seeds share none with the
    seeds the genes it reads were picked on, through every stage it reads (and the stages those read): a
    search picks its winners on its seed, and a rediscovery keeps those whose validation beside the search
    said better, so that validation's seeds picked them too. A rate is selected too: a tune stage's on the seeds
    its command trains, so a validation at that rate (``--lr {rate:T}``, or without ``--lr`` a ``--from-run``
    run's rate) takes none of them; a grid's tuning seeds lie apart from every verdict seed by construction.
    A validation without a number of seeds may take any of its block's verdict seeds."""
    from evo_attention.studies.common import TUNING_OFFSET, seed_block_base

    env, picked, measured, searched = study.settings, {}, {}, {}  # stage -> {seed: by what}, its seeds, its searches
    tuned: dict[str, dict] = {}  # stage -> {seed: by what}: the seeds the rate it trains at was selected on
    outs = {s.name: [_prefix(o).rstrip("/") for o in _outputs(study, s, env)] for s in study.stages}
    for stage in study.stages:
        inputs = [p for c in _combos(stage) or [] for p in _inputs(stage, c, env)]
        reads = {t for _, t in _refs(stage)} if stage.trains else set()
        reads |= {s.name for s in study.stages[:stage.index] for p in inputs for o in outs[s.name] if _reads(p, o)}
        mine = {k: v for r in reads for k, v in picked.get(r, {}).items()}
        if stage.kind == "rediscovery":
            mine.update({k: f"stage {stage.name}, by stage {r}'s validation" for r in reads for k in measured[r]})
        seeds = measured.setdefault(stage.name, set())
        for combo in _combos(stage) or []:
            local, own = {**env, **combo}, set()
            if stage.kind == "plan" and stage.spec.get("seed_block") is not None:
                base = seed_block_base(int(_number(substitute(stage.spec["seed_block"], local))))
                seeds |= set(range(base + 1, base + int(_number(substitute(stage.spec["seeds"], local))) + 1))
            for c in stage_commands(stage) if stage.trains else []:
                argv = [_text(a) for a in flatten(substitute(c["run"], {**local, "out": "OUT"}))]
                flag = command_flags(argv)
                if argv[0] == "search" and flag.get("--seed", "").isdigit():
                    own.add(int(flag["--seed"]))
                    mine[int(flag["--seed"])] = f"stage {stage.name}'s search"
                run = _REF.fullmatch(flag.get("--from-run", ""))
                rate = tuned.get(_rate_from(flag, run, stage.name), {})
                tuned.setdefault(stage.name, {}).update({} if stage.kind == "tune" else rate)
                if argv[0] != "validate" and stage.kind != "tune":
                    continue
                plan, block, n = flag.get("--plan", ""), flag.get("--seed-block"), flag.get("--seeds", "")
                ref = _REF.fullmatch(plan) or run
                if argv[0] in ("baseline", "train", "search"):  # one training on its --seed
                    now = {int(flag["--seed"])} if flag.get("--seed", "").isdigit() else set()
                elif _REF.fullmatch(plan):  # a plan stage's file: its seeds
                    now = measured.get(ref[2], set())
                else:
                    if plan:
                        family = load_plan(study.root / plan).family()
                        block, n = family.get("seed_block"), str(family.get("seeds"))
                    runs = own or searched.get(ref[2] if ref else "", set())
                    bases = ([seed_block_base(b) for b in runs] if block == "run" else [seed_block_base(int(block))]
                             if str(block).isdigit() else [int(flag["--seed"])] if flag.get("--seed", "").isdigit()
                             else [])
                    count = int(n) if n.isdigit() else TUNING_OFFSET  # seeds auto, or as many as decide
                    now = {b + i for b in bases for i in range(1, count + 1)}
                if stage.kind == "tune":
                    on = f" on block {block}" if str(block).isdigit() else ""
                    tuned[stage.name].update({k: f"stage {stage.name}'s tuning{on}" for k in now})
                if argv[0] != "validate":
                    continue
                seeds |= now
                for what, by in (("its genes were", mine), ("its rate was", rate)):
                    shared = sorted(now & set(by))
                    if shared:
                        raise _rule(study.path, "winners are validated on seeds they were not selected on",
                                    f"stage {stage.name} validates on seeds {min(now)}..{max(now)}, and {what} "
                                    f"selected on seed {shared[0]} ({by[shared[0]]}): give it seeds of another block")
            searched.setdefault(stage.name, set()).update(own)
        picked[stage.name] = mine


def word_rules(q: dict) -> dict:
    return {k: v for k, v in (q.get("words") or {}).items() if k != "over"}


def _check_decisions(study: Study) -> None:
    path = study.path
    rule = "a decision reads its question's sources"
    outputs = [_outputs(study, s, study.settings) for s in study.stages]
    for qname, q in study.questions.items():
        sources = q.get("sources") or {}
        for name, file in list(sources.items()) + [(t.get("file"), t.get("file")) for t in q.get("tables") or []]:
            file = str(file or "").split("#")[0]
            if not any(_writes(stage_outputs, [file]) for stage_outputs in outputs):
                raise _rule(path, "tables and sources are stage results", f"question {qname} reads {file}, which no "
                                                                         "stage writes")
        for t in q.get("tables") or []:
            from evo_attention.report.studies.study_tables import TABLES

            if t.get("table") not in TABLES:
                raise _fail(path, f"question {qname}: table {t.get('table')!r} is not known: use {', '.join(TABLES)}")
        words = q.get("words") or {}
        _shape(path, f"question {qname}: words.over", words.get("over"), TEXT)
        if words and words.get("over") not in sources:
            raise _rule(path, rule, f"question {qname}: words are over {words.get('over')!r}, not one of its sources")
        says = {name: SOURCE_WORDS for name in sources}  # name -> the words it can say (None: any)
        groups = [(f"words {t}", rules, False) for t, rules in word_rules(q).items()]
        groups += [(f"answer {a}", rules, True) for a, rules in (q.get("answers") or {}).items()]
        if not q.get("answers"):
            raise _fail(path, f"question {qname} gives no answers (answers: name -> rules, the last without if)")
        for where, rules, answer in groups:
            _shape(path, f"question {qname}, {where}", rules, (LIST, RULE))
            if not rules:
                raise _fail(path, f"question {qname}, {where}: a list of rules, each with its say")
            if rules[-1].get("if"):
                raise _rule(path, "a decision always answers", f"question {qname}, {where}: the last rule has no if")
            for r in rules:
                for cond in r.get("if") or []:
                    m = CONDITION.match(str(cond))
                    if not m or m[2] not in says or (m[1] and not answer) or (m[1] and m[3]):
                        raise _rule(path, rule, f"question {qname}, {where}: {cond!r} is not NAME[ENTITY] is [not] WORD "
                                                f"(NAME: {', '.join(sorted(says))}; all/some/no in answers, "
                                                "without [ENTITY])")
                    if says[m[2]] is not None and m[5].strip() not in says[m[2]]:  # a misspelt word never holds
                        raise _rule(path, rule, f"question {qname}, {where}: {cond!r}: {m[2]} never says "
                                                f"{m[5].strip()!r}; it says {', '.join(sorted(says[m[2]]))}")
            if not answer:
                said = {str(r["say"]) for r in rules}
                says[where.split(" ", 1)[1]] = None if any("{" in w for w in said) else said


# ------------------------------------------------------------------------------------------ results


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def genes_of(payload: dict, where: str, edge_rule: str = "refuse") -> list[str]:
    """The genes a validation file validated, each at its selected rate (``GENE|lr=R``) where the
    file has a learning-rate grid; a selection at an edge of the grid is refused (the edge rule)."""
    grid = payload.get("grid")
    if "features" in payload and "searches" in payload:  # a rediscovery file: its validated-better winners, best first
        better = [s["validated"] | {"winner": s["winner"]} for s in payload["searches"]
                  if (s.get("validated") or {}).get("verdict") == "better"]
        # the largest improvement first: a loss's relative change (most negative), an accuracy's difference (largest)
        better.sort(key=lambda v: -v["difference"] if str(v.get("metric")).endswith("accuracy") else v["relative"])
        return list(dict.fromkeys(v["winner"] for v in better))
    if not grid:
        return [g["gene"] for g in payload["genes"]]
    if grid.get("at_edge") and edge_rule == "refuse":
        raise UserError(f"{where}: selected rates at an edge of the grid ({', '.join(grid['at_edge'])}): {EDGE_RULE}")
    return [f"{g}|lr={v['selected']:g}" for g, v in grid["genes"].items() if not v.get("baseline")]


def baseline_rate(payload: dict, where: str, edge_rule: str = "refuse") -> str:
    grid = payload.get("grid") or {}
    row = next((v for v in (grid.get("genes") or {}).values() if v.get("baseline")), None)
    if row is None:
        raise UserError(f"{where}: no baseline on a learning-rate grid")
    if row.get("at_edge") and edge_rule == "refuse":
        raise UserError(f"{where}: the baseline's selected rate is at an edge of the grid: {EDGE_RULE}")
    return f"{row['selected']:g}"


class Runs:
    """The sub-runs of a study's stages, where their files lie, and whether they are done."""

    def __init__(self, study: Study):
        self.study, self.env = study, dict(study.settings)

    def genes(self, file: str):
        payload = read_json(self.study.results(file))
        return None if payload is None else genes_of(payload, file, self.study.raw.get("edge_rule", "refuse"))

    def combos(self, stage: Stage):
        return _combos(stage, self.genes)

    def match(self, stage: Stage, combo: dict) -> dict:
        """The sub-run of ``stage`` that agrees with ``combo`` on the values they share."""
        found = [c for c in self.combos(stage) or []
                 if all(c[k] == combo[k] for k in c if k in combo and k != "index")]
        if len(found) != 1:
            raise UserError(f"stage {stage.name}: {len(found)} of its runs match {_text(combo) or 'this one'}: name "
                            "one by the values the two stages share")
        return found[0]

    def done(self, stage: Stage, combo: dict) -> bool:
        if stage.trains:
            folder = self.study.results(run_dir(stage, combo, self.env))
            return folder.is_dir() and any(folder.glob(done_glob(stage)))  # a glob may name a sub-folder's file
        return self.study.results(stage_file(stage, combo, self.env)).is_file()

    def state(self, stage: Stage, files_only: bool = False) -> tuple[str, int, int]:
        """``(state, done, total)``: done, partly, not started or waiting (its sub-runs not known yet).
        ``files_only``: from the result files alone (a report), not also from the run folders under
        ``out``, which only the machine that trains has."""
        combos = self.combos(stage)
        if combos is None:
            return "waiting", 0, 0
        n = sum(self.done(stage, c) for c in combos)
        selection = stage.kind != "tune" or self.study.results(stage_file(stage, {}, self.env)).is_file()
        whole = n == len(combos) and selection
        begun = n or (not files_only and stage.trains and any(self.study.out(run_dir(stage, c, self.env)).exists()
                                                              for c in combos))
        return ("done" if whole else "partly" if begun else "not started"), n, len(combos)

    def results_time(self, stage: Stage) -> str | None:
        """When the stage's earliest result (or its first training's folder) was made; None: none yet."""
        rels = [run_dir(stage, c, self.env) if stage.trains else stage_file(stage, c, self.env)
                for c in self.combos(stage) or []]
        roots = (self.study.results, self.study.out) if stage.trains else (self.study.results,)
        return made_time([root(rel) for rel in rels for root in roots])


def made_time(paths: list[Path]) -> str | None:
    """When the earliest file at ``paths`` (files, or folders searched through) was made, by the time it
    records, since a clone or a copy resets modification times: a result's ``created_at``, a store's
    first stored training (``times.json``), a training's ``created_at`` (``evaluations.csv``, a plain
    training's ``result.json``). Only a file that records none (a generated plan, rate or suite, a store, a
    figure) counts by its modification time: when it was made where it was made, later in a copy."""
    times = []
    for f in (f for p in paths for f in ([p] if p.is_file() else p.rglob("*") if p.is_dir() else [])):
        if not f.is_file():
            continue
        recorded = []
        try:
            if f.name == "evaluations.csv":
                with open(f, newline="") as handle:
                    recorded = [r.get("created_at") for r in csv.DictReader(handle)]
            elif f.suffix == ".json" and f.stat().st_size < 2_000_000:
                payload = json.loads(f.read_text())
                roles = payload.get("roles") if isinstance(payload, dict) else None
                recorded = [payload.get("created_at")] if isinstance(payload, dict) else []
                recorded += [r.get("first_stored") for r in roles.values()] if isinstance(roles, dict) else []
        except (OSError, ValueError, AttributeError):
            pass
        found = [_utc(t) for t in recorded if t]
        found = [t for t in found if t] or [datetime.fromtimestamp(f.stat().st_mtime, timezone.utc)]
        times.append(min(found))
    return min(times).isoformat(timespec="seconds") if times else None


def _utc(text) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


# ------------------------------------------------------------------------------------------ registration


def registration_path(study: Study) -> Path:
    return study.path.with_name(study.path.stem + ".registration.json")


def parts(study: Study) -> dict:
    """A fingerprint of every part a registration fixes: each stage, each question's decision, the places."""
    out = {"study": fingerprint({k: study.raw.get(k) for k in ("out", "results", "gpu_flags", "edge_rule")}),
           "root": fingerprint(study.raw.get("root", ".")),  # out and results lie under it
           **{f"stage {stage.name}": fingerprint(stage.spec) for stage in study.stages}}
    for qname, q in study.questions.items():
        decision = {k: v for k, v in q.items() if k not in ("stages", "title", "tables")}
        out[f"question {qname}"] = fingerprint(substitute(decision, study.raw.get("vars") or {}))
    return out


def _git(study: Study, *args) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=study.path.parent, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def read_registration(study: Study) -> dict | None:
    path = registration_path(study)
    if not path.is_file():
        return None
    payload = read_json(path)
    if not isinstance(payload, dict) or "parts" not in payload:
        raise UserError(f"{path} is not a study registration: restore it from the repository")
    return payload


def _last(record: dict) -> dict:
    """What a registration recorded last: its last amendment, else the registration itself."""
    return record["amendments"][-1] if record["amendments"] else record


def _now(now: datetime | None) -> str:
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat(timespec="seconds")


def register(study: Study, *, allow_dirty: bool = False, after_results: str | None = None,
             now: datetime | None = None) -> dict:
    """Record the plan before any result: its hash, its parts' fingerprints, the tool's version and the
    repository's commit (refused for a plan with uncommitted changes unless ``allow_dirty``, and where
    a stage already has results unless ``after_results`` says why)."""
    if read_registration(study) is not None:
        raise UserError(f"{study.path} is registered already ({registration_path(study).name}): change it with "
                        "study amend")
    commit = _git(study, "rev-parse", "HEAD")
    dirty = commit is None or bool(_git(study, "status", "--porcelain", "--", study.path.name))
    if dirty and not allow_dirty:
        raise UserError(f"{study.path} has changes that are not committed (or lies outside a git repository): commit "
                        "the plan first, or register it with --allow-dirty")
    runs = Runs(study)
    started = [s.name for s in study.stages if runs.results_time(s)]
    if started and not after_results:
        raise UserError(f"stage {started[0]} has results already: a study is registered before its results (say why "
                        "with --after-results REASON for a plan written after them)")
    record = {"plan": study.path.name, "registered": _now(now), "sha256": _sha(study), "version": __version__,
              "commit": commit, "dirty": dirty, "after_results": after_results or None, "parts": parts(study),
              "root": study.raw.get("root", "."), "outputs": _outputs_record(study), "amendments": []}
    write_result(registration_path(study), record)
    return record


def _sha(study: Study) -> str:
    return hashlib.sha256(study.path.read_bytes()).hexdigest()


def write_result(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, payload)


def _changed(before: dict, after: dict) -> list[str]:
    # a record made before the root was registered has no root part: its root is not compared
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and (k in before or k != "root"))


def _touches(study: Study, part: str, runs: Runs, record: dict | None = None) -> str | None:
    """When the results a changed part would change were made (None: none yet); with the registration's
    ``record``, also those of a stage removed since its last record (the folders and files it wrote)."""
    kind, _, name = part.partition(" ")
    if kind == "stage":
        if any(s.name == name for s in study.stages):
            return runs.results_time(study.stage(name))
        return record and made_time([study.root / p for p in (_last(record).get("outputs") or {}).get(name, [])])
    if kind == "question":  # a decision changes with the results it reads: its stages', or another question's
        files = [str(f or "").split("#")[0] for f in (study.questions.get(name, {}).get("sources") or {}).values()]
        stages = [s for s in study.stages if s.question == name or _writes(_outputs(study, s, study.settings), files)]
    else:
        stages = study.stages
    times = [t for s in stages if (t := runs.results_time(s))]
    if kind in ("study", "root") and record:  # a moved place: the results where the last record put them count too
        last = _last(record)
        root = study.path.parent / str(last.get("root", study.raw.get("root", ".")))
        times += [t for t in [made_time([root / p for paths in (last.get("outputs") or {}).values() for p in paths])]
                  if t]
    return min(times) if times else None


def _writes(outputs: list[str], files: list[str]) -> bool:
    """Whether a stage's ``outputs`` (``_outputs``) write one of ``files`` (an output, or a file in an
    output folder)."""
    return any(file == o or file.startswith(_prefix(o).rstrip("/") + "/") for o in outputs for file in files)


def amend(study: Study, note: str, now: datetime | None = None) -> dict:
    """Record a change of the plan (the parts that differ from the last recorded ones) with its time
    and ``note``; refused where the change would change results that exist."""
    record = read_registration(study)
    if record is None:
        raise UserError(f"{study.path} is not registered: register it first (study register)")
    if not str(note or "").strip():
        raise UserError("an amendment needs its note: what changed and why (--note)")
    current = parts(study)
    changed = _changed(_last(record)["parts"], current)
    if not changed:
        raise UserError(f"{study.path} has not changed since its last record: nothing to amend")
    time = _now(now)
    runs = Runs(study)
    for part in changed:
        made = _touches(study, part, runs, record)
        if made:
            raise UserError(f"the amendment changes {part}, whose results exist (since {made}): an amendment comes "
                            "before the results it changes; add a new stage instead")
    record["amendments"].append({"time": time, "note": str(note).strip(), "sha256": _sha(study), "parts": current,
                                 "root": study.raw.get("root", "."), "outputs": _outputs_record(study),
                                 "changed": changed})
    write_result(registration_path(study), record)
    return record


def _outputs_record(study: Study) -> dict:
    """Where each stage writes (results and out, relative to the root): a removed stage's results are found."""
    out = {}
    for s in study.stages:
        paths = [_prefix(p).rstrip("/") for p in _outputs(study, s, study.settings)]
        out[s.name] = [study.rel(study.raw[k], p) for p in paths if p for k in ("results", "out")]
    return out


def check_registered(study: Study) -> dict:
    """Refuse an unregistered plan, a plan whose parts differ from the last recorded ones, and an
    amendment dated after the results it changes."""
    record = read_registration(study)
    if record is None:
        raise UserError(f"{study.path} is not registered: run study register {study.path} first (it records the "
                        "plan before any result)")
    changed = _changed(_last(record)["parts"], parts(study))
    if changed:
        raise UserError(f"the plan differs from its registration in {', '.join(changed)} and no amendment records "
                        "it: run study amend PLAN --note WHY (refused once its results exist)")
    runs = Runs(study)
    for i, amendment in enumerate(record["amendments"]):
        where = registration_path(study)  # an ISO time, never in the future
        amendment_time(amendment["time"], where, i, lambda why: _fail(where, why))
        for part in amendment["changed"]:
            made = _touches(study, part, runs)
            if made and made < amendment["time"]:
                raise UserError(f"amendment {i + 1} ({amendment['time']}) changes {part}, whose results were made "
                                f"before it ({made}): an amendment comes before the results it changes")
    return record
