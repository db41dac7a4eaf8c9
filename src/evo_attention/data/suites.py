"""Suites: named lists of task x difficulty points, kept as YAML data (``data/suites/*.yaml``).

    suite = load_suite("mad-cpu")            # a shipped suite, or the path of a YAML file
    for point in suite.points:
        point.label, point.data, point.options, point.steps   # 'recall', 'mad:in_context_recall:...', {}, 600
        task = point.load()                                    # its SyntheticData

The file format is ``docs/tasks.md``'s ("The format"): a name (``suite``), ``points`` and optional
``description``, ``budget``, default ``steps``, ``model`` settings (``MODEL_KEYS``) and ``defaults``
(knobs of every point whose task has them; a point's own win). A point has a ``task`` (a registered
task, or a corpus: a language point) and ``knobs``, and optionally a unique ``label``, ``steps``, a
data ``seed`` and a ``weight``; a gene's score is the weighted mean of its points' accuracies.

A point names its data completely (``seq_len`` and ``vocab`` must be set), so it means the same data
whatever the run's Config; the suite's ``model`` settings and steps win over a run's. Loading checks
everything a point's data needs without generating data; errors are one line naming the file and
the point. ``point.data`` is the inline data name (knobs sorted, defaults included), accepted by
``load_data`` and ``--data``; ``point.options`` holds the rest of the task options (the data seed).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evo_attention.data.synthetic import TASKS, data_name, resolve_knobs, synthetic_data
from evo_attention.util.errors import UserError
from evo_attention.util.yamlio import DuplicateKey, unique_key_loader

SUITE_DIR = Path(__file__).resolve().parent / "suites"
SUITE_KEYS = ("suite", "description", "budget", "steps", "model", "defaults", "points")
MODEL_KEYS = ("short_conv",)  # model settings a suite may fix for its trainings
POINT_KEYS = ("label", "task", "knobs", "steps", "seed", "weight", "data_dir", "tokenizer")
REQUIRED_KNOBS = ("seq_len", "vocab")
CORPORA = ("text", "wikitext2")  # a language point's task: a corpus (data.corpus)
CORPUS_KNOBS = ("seq_len", "vocab")  # a language point's knobs: its context, the vocabulary of a word tokenizer
CORPUS_KEYS = ("data_dir", "tokenizer")  # what only a language point takes


def shipped_suites() -> tuple[str, ...]:
    """The names of the suites shipped with the package (``data/suites/NAME.yaml``)."""
    return tuple(sorted(p.stem for p in SUITE_DIR.glob("*.yaml")))


@dataclass(frozen=True)
class SuitePoint:
    """One task x difficulty point of a suite."""

    label: str
    task: str  # a registered task: 'mqar', 'mad:TASK' or a plugin's (data.synthetic.register_task); or a corpus
    knobs: dict = field(hash=False)  # as the suite gives them (defaults included), checked
    steps: int | None = None  # training steps the suite gives this point
    seed: int | None = None  # data seed, when the suite gives one
    model: dict = field(default_factory=dict, hash=False)  # the suite's model settings (MODEL_KEYS)
    weight: float = 1.0  # its weight in the suite's score
    data_dir: str | None = None  # a language point's corpus directory
    tokenizer: str | None = None  # a language point's tokenizer (None: word)

    @property
    def language(self) -> bool:
        return self.task in CORPORA

    @property
    def data(self) -> str:
        """The data name (``load_data`` / ``--data``) with every knob inline; a corpus's name."""
        return self.task if self.language else data_name(self.task, self.knobs)

    @property
    def options(self) -> dict:
        """The task options besides the data name: the data seed, when given."""
        return {} if self.seed is None else {"seed": self.seed}

    def settings(self) -> dict:
        """The Config settings that make a training on this point (over a run's other settings):
        its data name, its task options (only these: a run's own options belong to its own data),
        the suite's model settings and, when the suite gives them, its steps. Every training on a
        point is a Trial of the Config these give, so it is cached like any other."""
        out = {"data": self.data, "recall": dict(self.options), **self.model}
        if self.language:
            out.update(data_dir=self.data_dir, tokenizer=self.tokenizer or "word", max_seq_len=self.knobs["seq_len"],
                       vocab_size=self.knobs.get("vocab"))
        if self.steps is not None:
            out["train_steps"] = self.steps
        return out

    def load(self):
        """This point's dataset (a language point's corpus is read, or taken from the cache)."""
        if self.language:
            from evo_attention.data import load_data

            return load_data(self.task, data_dir=self.data_dir, tokenizer=self.tokenizer or "word",
                             seq_len=self.knobs["seq_len"], vocab_size=self.knobs.get("vocab"))
        return synthetic_data(self.data, seed=0 if self.seed is None else self.seed)


@dataclass(frozen=True)
class Suite:
    name: str
    points: tuple[SuitePoint, ...]
    description: str = ""
    budget: str = ""
    source: str = ""  # the file it was read from

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.points)

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(p.weight for p in self.points)

    def point(self, label: str) -> SuitePoint:
        for p in self.points:
            if p.label == label:
                return p
        raise UserError(f"suite {self.name} has no point {label!r}; its points: {', '.join(self.labels)}")


def load_suite(name_or_path: str | os.PathLike) -> Suite:
    """A shipped suite by name (``mad-cpu``, ``mad-paper``) or a suite YAML file by path; one-line
    UserError for anything malformed."""
    import yaml

    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"suite must be a shipped suite's name or the path of a suite file, not {name_or_path!r} "
                        f"({type(name_or_path).__name__})")
    text = str(name_or_path)
    shipped = shipped_suites()
    if text in shipped:
        path = SUITE_DIR / f"{text}.yaml"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise UserError(f"unknown suite {text!r}: shipped suites are {', '.join(shipped)}, or give the path of a "
                            "YAML file in the format of docs/tasks.md", setting="suite")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=unique_key_loader())
    except DuplicateKey as dup:
        raise UserError(f"suite file {path.name} sets {dup.key} twice (lines {dup.first} and {dup.second}): keep one "
                        "of them (YAML would silently take the last)") from None
    except yaml.YAMLError as error:
        mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise UserError(f"suite file {path.name} is not valid YAML{where}: {problem or ' '.join(str(error).split())}"
                        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"suite {path}: cannot be read ({error})", setting="suite") from None
    return parse_suite(raw, source=str(path))


def parse_suite(raw: Any, source: str = "<suite>") -> Suite:
    """A ``Suite`` from the parsed YAML ``raw`` (checked as ``load_suite`` describes)."""
    where = Path(source).name

    def fail(message: str) -> UserError:  # no setting: the words are the file's own keys, never flags
        return UserError(f"suite file {where}: {message}")

    if not isinstance(raw, dict):
        raise fail(f"the file must be a mapping with keys {', '.join(SUITE_KEYS)}, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in SUITE_KEYS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r}; valid keys: {', '.join(SUITE_KEYS)}")
    name = raw.get("suite")
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"suite file {where} has no name: add a line 'suite: my-tasks' (the name its results are "
                        "shown under)")
    for key in ("description", "budget"):
        if not isinstance(raw.get(key, ""), str):
            raise fail(f"{key} must be text, got {raw[key]!r}")
    default_steps = _steps(raw.get("steps"), fail, "steps")
    model = raw.get("model") or {}
    if not isinstance(model, dict):
        raise fail(f"model must be a mapping of setting: value ({', '.join(MODEL_KEYS)}), got {model!r}")
    bad = [k for k in model if k not in MODEL_KEYS]
    if bad:
        raise fail(f"model: {bad[0]!r} is not a setting a suite may fix; valid: {', '.join(MODEL_KEYS)}")
    # the values are checked where the settings live, when a point's Config is built (train.suite)
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise fail(f"defaults must be a mapping of knob: value, got {defaults!r}")
    points_raw = raw.get("points")
    if not isinstance(points_raw, list) or not points_raw:
        raise fail("points must be a non-empty list of points (each with task: and knobs:)")

    points, labels, datas = [], {}, {}
    used_defaults = set()
    for i, item in enumerate(points_raw, 1):
        if not isinstance(item, dict):
            raise fail(f"point {i} must be a mapping with keys {', '.join(POINT_KEYS)}, got {item!r}")
        bad = [k for k in item if k not in POINT_KEYS]
        if bad:
            raise fail(f"point {i}: unknown key {bad[0]!r}; valid keys: {', '.join(POINT_KEYS)}")
        task = item.get("task")
        if not isinstance(task, str) or (task not in TASKS and task not in CORPORA):
            raise fail(f"point {i}: task {task!r} is not a task; valid tasks: {', '.join(TASKS)}, or a corpus: "
                       f"{', '.join(CORPORA)}")
        own = item.get("knobs") or {}
        if not isinstance(own, dict):
            raise fail(f"point {i} ({task}): knobs must be a mapping of knob: value, got {own!r}")
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise fail(f"point {i} ({task}): weight must be a positive number, got {weight!r}")
        if task in CORPORA:
            steps = _steps(item.get("steps"), fail, f"point {i} steps")
            key, shown = _language_key(i, item, own, fail)
            knobs, seed = dict(own), None
        else:
            stray = [k for k in CORPUS_KEYS if k in item]
            if stray:
                raise fail(f"point {i} ({task}): {stray[0]} applies to a language point (task "
                           f"{' or '.join(CORPORA)}), not to a generated task")
            names = {k.name for k in TASKS[task].all_knobs}
            applied = {k: v for k, v in defaults.items() if k in names}
            used_defaults.update(applied)
            knobs = {**applied, **own}
            missing = [k for k in REQUIRED_KNOBS if k not in knobs]
            if missing:
                raise fail(f"point {i} ({task}): set {' and '.join(missing)} (in the point's knobs or the defaults): "
                           "a point names its data completely")
            try:
                resolved = resolve_knobs(task, knobs)  # names, values and the checks between knobs
            except UserError as error:
                raise fail(f"point {i}: {error}") from None
            knobs = {k: resolved[k] for k in knobs}  # typed (16.0 -> 16), as given
            steps = _steps(item.get("steps"), fail, f"point {i} steps")
            seed = item.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise fail(f"point {i} ({task}): seed must be an integer, got {seed!r}")
            key, shown = (task, tuple(sorted(resolved.items())), seed or 0), None  # the same data, however spelled
        label = item.get("label")
        if label is None or (not label and task in CORPORA):  # a language point: any empty label
            short = task.split(":")[-1]
            label = short if short not in labels else f"{short}-{i}"
        if not isinstance(label, str) or not label.strip() or any(c.isspace() for c in label):
            raise fail(f"point {i} ({task}): label must be a word without spaces, got {label!r}")
        if label in labels:
            raise fail(f"points {labels[label]} and {i} have the same label {label!r}: give each point its own label")
        point = SuitePoint(label=label, task=task, knobs=knobs, steps=steps if steps is not None else default_steps,
                           seed=seed, model=dict(model), weight=float(weight), data_dir=item.get("data_dir"),
                           tokenizer=item.get("tokenizer"))
        if key in datas:
            raise fail(f"points {datas[key]} and {i} are the same data ({shown or point.data}): remove one")
        labels[label], datas[key] = i, i
        points.append(point)
    unused = [k for k in defaults if k not in used_defaults]
    if unused:
        raise fail(f"default knob {unused[0]!r} is a knob of no point's task")
    return Suite(name=name.strip(), points=tuple(points), description=raw.get("description", "").strip(),
                 budget=raw.get("budget", "").strip(), source=source)


def _language_key(i: int, item: dict, knobs: dict, fail) -> tuple:
    """Point ``i``, a corpus (``CORPORA``), checked as far as can be without reading the corpus (its
    reading says the rest, in one line): (its data's identity, how a message names that data)."""
    task = item["task"]
    bad = [k for k in knobs if k not in CORPUS_KNOBS]
    if bad:
        raise fail(f"point {i} ({task}): knob {bad[0]!r} is not a knob of a corpus; valid: {', '.join(CORPUS_KNOBS)}")
    for knob, value in knobs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise fail(f"point {i} ({task}): {knob} must be an integer >= 2, got {value!r}")
    if "seq_len" not in knobs:
        raise fail(f"point {i} ({task}): set knobs: {{seq_len: N}}, the point's context: a point names its data "
                   "completely")
    data_dir = item.get("data_dir")
    if task == "text" and data_dir is None:
        raise fail(f"point {i} ({task}): add data_dir, the directory of the corpus's text files")
    if data_dir is not None and (not isinstance(data_dir, str) or not data_dir.strip()):
        raise fail(f"point {i} ({task}): data_dir must name the corpus directory, got {data_dir!r}")
    tokenizer = item.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, str):
        raise fail(f"point {i} ({task}): tokenizer must be a name such as byte or word, got {tokenizer!r}")
    if "vocab" in knobs and tokenizer is not None and tokenizer.strip().lower() != "word":
        raise fail(f"point {i} ({task}): knob vocab is the vocabulary of the word tokenizer; tokenizer {tokenizer} "
                   "makes its own: drop vocab")
    if item.get("seed") is not None:
        raise fail(f"point {i} ({task}): a corpus has no data seed; leave seed out")
    return (task, data_dir, tokenizer or "word", tuple(sorted(knobs.items()))), f"{task} in {data_dir}"


def _steps(value, fail, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(f"{what} must be an integer >= 1, got {value!r}")
    return value
