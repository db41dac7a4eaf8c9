"""A registered family: a study plan, written before the study runs, that fixes what it will test.

A plan file (YAML; docs/validation.md has examples) names the family's fields (``STUDIES``): a
validation's comparisons (Holm's family against the baseline), equivalence ``margin`` (relative on
perplexity and bits, in units on loss and accuracy), ``alpha``, ``test`` and ``seeds`` (optionally a
``seed_block``); a curve's (``load_plan(path, study="curve")``) ``genes`` (the reference: the one named
``baseline``, else the first), ``knob``, ``seeds``, ``solve_threshold``, ``alpha`` and solve-rate
``test``. ``amendments`` change the family after results exist, each with its ``time``, ``reason`` and
the fields it changes.

``validate --plan FILE`` (``curve --plan FILE``) loads it, checks it against the results already in
its output place (``check_registration``, before anything trains) and records it in the result
(``StudyPlan.record``). Once a result exists, the family changes only by appended amendments, each
dated between that result and now: a family chosen after seeing results is not the family the error
rate was promised for.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from evo_attention.genes import AttentionGene
from evo_attention.report.attachments import CURVE_RESULTS, output_stem
from evo_attention.util.errors import UserError
from evo_attention.util.yamlio import DuplicateKey, unique_key_loader

TESTS = ("rule",)  # the verdict rule of util.stats (stats.TEST_RULE)
CURVE_TESTS = ("fisher", "barnard")  # the exact tests of two solve rates (util.stats.SOLVE_TESTS)
# per study: the family's fields (the first `required` of them must be given) and the result file
STUDIES = {
    "validation": {"fields": ("comparisons", "margin", "alpha", "test", "seeds", "seed_block"), "required": 5},
    "curve": {"fields": ("genes", "knob", "seeds", "solve_threshold", "alpha", "test"), "required": 6},
}
FAMILY_FIELDS = tuple(dict.fromkeys(f for study in STUDIES.values() for f in study["fields"]))


def _fail(path, message: str) -> UserError:
    return UserError(f"plan {path}: {message}", setting="plan")


@dataclass(frozen=True)
class StudyPlan:
    """A plan as loaded: its file, name, registered family (``base``) and the amendments in order."""

    path: str
    name: str
    base: Mapping[str, Any]
    amendments: tuple[Mapping[str, Any], ...] = ()
    study: str = "validation"

    def family(self, amendments: int | None = None) -> dict:
        """The family after the first ``amendments`` amendments (None: all of them)."""
        family = dict(self.base)
        for amendment in self.amendments[:amendments]:
            family.update({k: v for k, v in amendment.items() if k in FAMILY_FIELDS})
        return family

    @property
    def comparisons(self) -> list[str]:
        return list(self.family()["comparisons"])

    def record(self) -> dict:
        """What a result keeps of its plan."""
        family = self.family()
        return {"file": self.path, "name": self.name, "family": family, "fingerprint": fingerprint(family),
                "amendments": [dict(a) for a in self.amendments]}

    def results_file(self, out_dir: str | os.PathLike, eval_split: str = "valid") -> Path:
        """Where this plan's study writes its result in ``out_dir``."""
        return Path(out_dir) / CURVE_RESULTS if self.study == "curve" else validation_file(out_dir, eval_split)


def fingerprint(family: Mapping) -> str:
    return hashlib.sha256(json.dumps(family, sort_keys=True).encode()).hexdigest()[:16]


def amendment_time(value, path, i: int, fail=None) -> str:
    """The ISO time (UTC) of amendment ``i``'s ``value``; ``fail(why)`` makes the UserError (a validate
    plan's by default, which names the --plan flag)."""
    fail = fail or (lambda why: _fail(path, why))
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            raise fail(f"amendment {i + 1} has time {value!r}: give an ISO time such as "
                       "2025-06-01T12:00:00+00:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    if moment > datetime.now(timezone.utc):
        raise fail(f"amendment {i + 1} is dated {moment.isoformat(timespec='seconds')}, in the future: an "
                   "amendment carries the time it was written")
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds")


def family_values(values: Mapping, path, where: str, study: str = "validation", fail=None, whole=()) -> dict:
    """The checked family fields of ``values`` (the plan's or an amendment's); ``fail(why)`` makes the
    UserError of each fault, in the caller's words (default: a plan file's, naming ``--plan``); ``whole``:
    more fields that are whole numbers, as ``(name, least)``."""
    out = {}
    fail = fail or (lambda why: _fail(path, why))
    if "genes" in values:
        items = values["genes"]
        if not isinstance(items, list) or len(items) < 2 or not all(isinstance(g, str) and g.strip() for g in items):
            raise fail(f"{where}genes must be a list of at least two names or gene strings (the reference: "
                       "the one named baseline, else the first)")
        if len(set(items)) != len(items):
            raise fail(f"{where}genes must be distinct")
        out["genes"] = [g.strip() for g in items]
    if "knob" in values:
        from evo_attention.studies.curves import parse_knob

        try:
            name, knob_values = parse_knob(str(values["knob"]))
        except UserError as exc:
            raise fail(f"{where}{exc}") from None
        out["knob"] = f"{name}={','.join(knob_values)}"
    if "solve_threshold" in values:
        value = values["solve_threshold"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise fail(f"{where}solve_threshold {value!r} must be an accuracy in (0, 1]")
        out["solve_threshold"] = float(value)
    if "comparisons" in values:
        items = values["comparisons"]
        if not isinstance(items, list) or not items:
            raise fail(f"{where}comparisons must be a non-empty list of gene keys")
        keys = []
        for item in items:
            try:
                keys.append(AttentionGene.parse(str(item)).key)
            except UserError as exc:
                raise fail(f"{where}comparison {item!r}: {exc}") from None
        if len(set(keys)) != len(keys) or AttentionGene.vanilla().key in keys:
            raise fail(f"{where}comparisons must be distinct genes other than the baseline")
        out["comparisons"] = keys
    for name, low, high in (("margin", 0.0, 0.5), ("alpha", 0.0, 0.5)):
        if name in values:
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
                raise fail(f"{where}{name} {value!r} must be a number in ({low:g}, {high:g})")
            out[name] = float(value)
    if "test" in values:
        tests = CURVE_TESTS if study == "curve" else TESTS
        if values["test"] not in tests:
            what = "an exact test of two solve rates" if study == "curve" else "the verdict rule"
            raise fail(f"{where}test {values['test']!r} is not known: use {', '.join(tests)} ({what})")
        out["test"] = values["test"]
    for name, low in (("seeds", 2), ("seed_block", 0), *whole):
        if name in values and values[name] is not None:
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise fail(f"{where}{name} {value!r} must be a whole number >= {low}")
            out[name] = value
    return out


def read_plan_yaml(path: str | os.PathLike, fail) -> Any:
    """The YAML of a plan file (a key given twice refused); ``fail(why)`` makes the UserError of each
    fault (a directory, a duplicate key, an unreadable file, not YAML), in the caller's words."""
    import yaml

    if Path(path).is_dir():
        raise fail("is a directory: give the path of the plan's YAML file")
    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=unique_key_loader())
    except DuplicateKey as exc:
        raise fail(f"sets {exc.key} twice (lines {exc.first} and {exc.second}): keep one of them") from None
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise fail(f"is not YAML: {str(exc).splitlines()[0]}") from None


def load_plan(path: str | os.PathLike, study: str = "validation") -> StudyPlan:
    """The plan of a ``study`` (validation or curve) in ``path``; UserError (naming ``plan``) for a
    file that is missing, not YAML, or holds an unknown key, a bad value, or an amendment without
    its time or reason."""
    raw = read_plan_yaml(path, lambda why: _fail(path, why))
    fields = STUDIES[study]["fields"]
    required = fields[:STUDIES[study]["required"]]
    if not isinstance(raw, dict):
        raise _fail(path, f"must be a mapping with {', '.join(required)}")
    known = {"name", "description", "amendments", *fields}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _fail(path, f"unknown key {unknown[0]!r}: a {study} plan holds {', '.join(sorted(known))}")
    missing = [k for k in required if k not in raw]
    if missing:
        raise _fail(path, f"names no {missing[0]}: a {study} plan fixes {', '.join(required)} before it runs")
    base = {**({"seed_block": None} if "seed_block" in fields else {}), **family_values(raw, path, "", study)}
    amendments = []
    if not isinstance(raw.get("amendments") or [], list):
        raise _fail(path, f"amendments {raw['amendments']!r} must be a list of amendments (each: time, reason, and "
                          "the changed fields)")
    for i, item in enumerate(raw.get("amendments") or []):
        if not isinstance(item, dict) or "time" not in item or not str(item.get("reason") or "").strip():
            raise _fail(path, f"amendment {i + 1} needs its time and its reason (time: ISO time, reason: text)")
        extra = sorted(set(item) - {"time", "reason", *fields})
        if extra:
            raise _fail(path, f"amendment {i + 1}: unknown key {extra[0]!r}")
        amendments.append({"time": amendment_time(item["time"], path, i), "reason": str(item["reason"]).strip(),
                           **family_values(item, path, f"amendment {i + 1}: ", study)})
    return StudyPlan(str(path), str(raw.get("name") or Path(path).stem), base, tuple(amendments), study)


def validation_file(out_dir: str | os.PathLike, eval_split: str = "valid", kind: str = "validation") -> Path:
    """Where a validation (or another study's ``kind``: ablation, transfer) on ``eval_split`` writes its result
    in ``out_dir``."""
    return Path(out_dir) / f"{output_stem(kind, eval_split)}.json"


def check_unplanned(earlier_file: Path) -> None:
    """Refuse a study without a plan whose result would replace ``earlier_file`` (a validation's
    ``validation_file``, a curve's ``CURVE_RESULTS``) where that holds a registered plan's result: the
    plan allows that change only by an amendment."""
    try:
        recorded = json.loads(earlier_file.read_text()).get("plan")
    except (OSError, ValueError, AttributeError):
        return
    if recorded:
        raise UserError(f"{earlier_file} holds the result of the registered family {recorded.get('name')!r}: run "
                        "it with its plan (the family changes only by an amendment), or use another out",
                        setting=("plan", "out"))


def check_registration(plan: StudyPlan, out_dir: str | os.PathLike, eval_split: str = "valid",
                       now: datetime | None = None) -> None:
    """Refuse to run ``plan`` into ``out_dir`` when results there were made under another family
    that the plan does not amend (see the module's text); nothing there: nothing to check."""
    earlier_file = plan.results_file(out_dir, eval_split)
    if not earlier_file.exists():
        return
    try:
        earlier = json.loads(earlier_file.read_text())
    except (OSError, ValueError):
        raise UserError(f"{earlier_file} cannot be read: a plan cannot be checked against it; use another out",
                        setting=("plan", "out")) from None
    recorded = earlier.get("plan")
    if not recorded:
        raise UserError(f"{earlier_file} holds results made without a plan: a registered family starts before "
                        "its results; use another out", setting=("plan", "out"))
    done = len(recorded.get("amendments") or [])
    if [dict(a) for a in plan.amendments[:done]] != list(recorded.get("amendments") or []):
        raise UserError(f"the plan's first {done} amendment(s) differ from those its results in {earlier_file} were "
                        "made under: earlier amendments stay as they were; append a new one", setting="plan")
    if recorded.get("fingerprint") == fingerprint(plan.family()):
        return
    change = ("the plan's family differs from the one its results in "
              f"{earlier_file} were made under (fingerprint {recorded.get('fingerprint')})")
    if len(plan.amendments) <= done or fingerprint(plan.family(done)) != recorded.get("fingerprint"):
        raise UserError(f"{change}: a family changes after results exist only by a new amendment appended to the "
                        "plan file (amendments: - time: ISO time, reason: why, and the changed fields); earlier "
                        "amendments and the registered family stay as they were", setting="plan")
    then = earlier.get("created_at")
    since = then and datetime.fromisoformat(then).astimezone(timezone.utc).isoformat(timespec="seconds")
    now = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    for amendment in plan.amendments[done:]:
        if (since and amendment["time"] < since) or amendment["time"] > now:
            raise UserError(f"{change}: its amendment of {amendment['time']} must be dated between those results "
                            f"({then}) and now ({now})", setting="plan")
