"""A run as an Optuna study in a journal file, for optuna-dashboard (``report RUN --optuna-journal FILE``).

``write_optuna_journal(run_dir, path)`` writes into a new journal file (Optuna's ``JournalStorage`` over
``JournalFileBackend``, which ``optuna-dashboard FILE`` shows) one study for the search, named after the run
directory (its trainings, the baseline's, a multi-fidelity run's rungs and the genes refused before training),
and one per study the run holds besides (``RUN:validate``, ``RUN:ablate``, ...), so the search study's best
trial and best-so-far line are the search's own. Like every output it is a view of the run store, written
again each time, never read back by a search. An existing file is replaced only if it is an Optuna journal
(``is_journal``); a run store, a live run's file or any other file is refused, naming it
(``util.files.check_output``).

- One trial per stored evaluation, in store order, then one per gene refused before training. User
  attributes: ``gene`` (key and ``str``), ``role``, ``generation``, ``id``, ``status``, ``steps``, ``seed``,
  ``error``, and the measures caps read (``params``, ``flops_per_step``, ``latency_ms``, ``peak_memory_mb``).
- Parameters: one categorical per gene field (per layer for a per-layer genome: ``L1.similarity``, ...), its
  choices the run's whole ``search_space`` with any option seen beyond it, as the gene key writes them
  (``bias``, ``0.10``, ``rope:ntk:4``); an axis never varied (one choice) is left out, and so are the four
  components of a program gene (its program is the parameter ``program``).
- Times: a trial completes when the store took its record (``created_at``) and starts ``time_s`` earlier.
- Intermediate values: the trial's curve as perplexities by step: its ``val_curve`` where it has one, else its
  training curve (exp of each interval's mean loss).
- Values: the run's objectives (perplexity first), every direction minimize; they name the study's metrics.
- States: a finished full-budget training is COMPLETE; a failed one (diverged, out of memory, an error) FAIL;
  a multi-fidelity training stopped at a lower rung PRUNED, its perplexity the intermediate value at its
  step; a gene refused before training FAIL.
- Constraints (a run with caps): every trial's excess over each cap (``value / limit - 1``; above 0: broken,
  0 where unknown) in the system attribute ``constraints`` (read by Optuna's samplers and optuna-dashboard)
  and the user attributes ``constraints`` and ``constraint_names``, so the dashboard marks infeasible trials.
- A suite run (meta ``suite``): one trial per gene (the baseline first, then the search genes as
  ``summary.suite_view`` ranks them), its value the suite accuracy, direction maximize; COMPLETE once the
  gene trained on every point (and not every point failed), else FAIL; user attributes ``accuracy:LABEL``
  per point and ``failed_points``.
"""

from __future__ import annotations

import datetime
import math
import os
import warnings
from collections import Counter
from contextlib import suppress
from pathlib import Path

from evo_attention.genes import ALL_FIELDS, AXIS_FIELDS, AttentionGene, SearchSpace
from evo_attention.report.summary import field_labels, gene_info, layer_keys, objectives_of, option_labels, suite_view
from evo_attention.search import constraints as caps
from evo_attention.search.fidelity import RUNG_ROLE
from evo_attention.search.store import RunStore
from evo_attention.search.tpe import constraint_attrs, import_optuna
from evo_attention.train.record import objective_values, usable_metric
from evo_attention.util.errors import UserError
from evo_attention.util.files import check_output
from evo_attention.util.format import finite_or_none

MEASURES = ("params", "flops_per_step", "latency_ms", "peak_memory_mb")


def journal_storage(path: str | os.PathLike):
    """Optuna's ``JournalStorage`` over a journal file (``JournalFileBackend``; before 4.0 ``JournalFileStorage``)."""
    optuna = import_optuna("optuna_journal")
    try:
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # Optuna 3.x
        from optuna.storages import JournalFileStorage as JournalFileBackend
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental in some versions
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def is_journal(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an Optuna journal: its first line is a JSON object with an ``op_code``."""
    import json

    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 16)
        return isinstance(entry := json.loads(first), dict) and "op_code" in entry
    except (OSError, ValueError):
        return False


def journal_path(path: str | os.PathLike) -> Path:
    """``path`` if a journal may be written there (new, or an Optuna journal it replaces); else a UserError
    naming ``optuna_journal`` and what is there, or that Optuna is missing."""
    import_optuna("optuna_journal")
    return check_output(path, "optuna_journal", kind="an Optuna journal", directory=False, own=is_journal)


def _user_attrs(record, info: dict) -> dict:
    attrs = {"gene": info["key"], "str": info["str"], "role": record.get("role"), "generation": record.get("generation"),
             "id": record.get("id"), "status": str(record.get("status")), "steps": record.get("steps"),
             "seed": record.get("seed")}
    if record.get("error"):
        attrs["error"] = str(record["error"])[:500]
    attrs.update({name: finite_or_none(record.get(name)) for name in MEASURES})
    return {k: v for k, v in attrs.items() if v is not None}


def write_optuna_journal(run_dir: str | os.PathLike, path: str | os.PathLike) -> dict:
    """Write the run in ``run_dir`` into the journal file ``path`` (see the module docstring); returns
    ``{"path", "study", "studies", "trials", "states"}``."""
    optuna = import_optuna("optuna_journal")
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    path = journal_path(path)
    with RunStore.open(run_dir, readonly=True) as store:
        config = store.config() or {}
        evaluations = store.evaluations()
        limits = (store.get_meta(caps.META_LIMITS) or {}).get("limits") or {}
        never = list(store.get_meta(caps.META_INFEASIBLE) or [])
        suite = store.get_meta("suite")
    if suite:
        evaluations = _suite_trials(suite_view(suite, evaluations, config.get("seed")))
    objectives = objectives_of(config)
    names = list(limits) if limits or never else []
    budget = int(config.get("train_steps") or 0)
    keys = [str(r.get("gene")) for r in evaluations] + [str(e["gene"]) for e in never]
    n_layers = max((len(layer_keys(k)) for k in keys), default=1)
    labels = {key: _used_fields(key, field_labels(key, n_layers)) for key in dict.fromkeys(keys)}
    space = space_labels(config.get("search_space"))
    choices: dict[str, list] = {}
    for fields in labels.values():
        for name, value in fields.items():
            choices.setdefault(name, list(space.get(name.partition(".")[2] if name.startswith("L") else name, [])))
            if value not in choices[name]:
                choices[name].append(value)
    unused = {name for name, options in choices.items() if len(options) == 1
              and name.rpartition(".")[2] in AXIS_FIELDS}  # an axis the run never varied
    distributions = {name: CategoricalDistribution(tuple(options)) for name, options in choices.items()
                     if name not in unused}
    labels = {key: {k: v for k, v in fields.items() if k not in unused} for key, fields in labels.items()}

    def trial(state, key: str, attrs: dict, extra: dict, **given):
        """``create_trial`` of the gene ``key`` (its parameters): the constraint attributes ``extra`` with the
        trial's own user attributes ``attrs``."""
        extra = {**extra, "user_attrs": {**attrs, **extra.get("user_attrs", {})}}
        return create_trial(state=state, params=labels[key], distributions={n: distributions[n] for n in labels[key]},
                            **given, **extra)

    trials, roles = [], []
    for record in evaluations:
        key = str(record.get("gene"))
        attrs = _user_attrs(record, gene_info(key))
        excess = caps.record_excess(record, limits) if names else {}
        extra = constraint_attrs(names, [float(excess.get(n, 0.0)) for n in names]) if names else {}
        perplexity = usable_metric(record)
        if suite:
            accuracy = record["suite_accuracy"]
            made = trial(TrialState.FAIL if accuracy is None else TrialState.COMPLETE, key,
                         {**attrs, **record["attrs"]}, {}, values=None if accuracy is None else [accuracy])
        elif perplexity is None:
            made = trial(TrialState.FAIL, key, attrs, extra)
        elif record.get("role") == RUNG_ROLE or (record.get("budget") and int(record.get("steps") or 0) < budget):
            made = trial(TrialState.PRUNED, key, attrs, extra,
                         intermediate_values={int(record.get("steps") or 0): perplexity})
        else:
            made = trial(TrialState.COMPLETE, key, attrs, extra,
                         values=[v if math.isfinite(v) else math.inf for v in objective_values(record, objectives)])
        if not suite:
            _timed(made, record)
            if made.state == TrialState.COMPLETE:
                made.intermediate_values = curve_values(record)
        trials.append(made)
        roles.append(SEARCH_ROLES.get(record.get("role") or "search", record.get("role")))
    for entry in never:
        key = str(entry["gene"])
        info = gene_info(key)
        attrs = {"gene": info["key"], "str": info["str"], "role": "search", "generation": entry.get("generation"),
                 "status": "infeasible", "error": "refused before training: "
                 + caps.violations_text(entry.get("violations") or {}),
                 "params": entry.get("params"), "flops_per_step": entry.get("flops")}
        excess = caps.excess(entry, limits)
        trials.append(trial(TrialState.FAIL, key, {k: v for k, v in attrs.items() if v is not None},
                            constraint_attrs(names, [float(excess.get(n, 0.0)) for n in names])))
        roles.append("search")

    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    study_name = Path(run_dir).resolve().name or "evo-attention"
    studies: dict[str, int] = {}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # metric names are experimental in some versions
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            storage = journal_storage(partial)
            for role in dict.fromkeys(["search", *roles]):  # the search's study even without a trial, then each role's
                mine = [t for t, r in zip(trials, roles) if r == role]
                study = optuna.create_study(storage=storage, study_name=study_name if role == "search" else
                                            f"{study_name}:{role}",
                                            directions=["maximize" if suite else "minimize"] * len(objectives))
                if hasattr(study, "set_metric_names"):
                    study.set_metric_names(list(objectives))
                for key, value in (("run_dir", str(Path(run_dir).resolve())), ("role", role),
                                   ("objectives", list(objectives)), ("strategy", config.get("strategy"))):
                    study.set_user_attr(key, value)
                if names:
                    study.set_user_attr("constraints", {n: limits[n].get("limit") for n in names})
                study.add_trials(mine)
                studies[study.study_name] = len(mine)
        os.replace(partial, path)
    except OSError as exc:  # no permission, a read-only file system, a place like /proc that takes no new file
        raise UserError(f"cannot write the Optuna journal {path} ({exc.strerror or exc}): choose a writable place for "
                        "optuna_journal", setting="optuna_journal") from None
    finally:
        with suppress(OSError):  # a read-only place: nothing was written there
            partial.unlink(missing_ok=True)
            Path(f"{partial}.lock").unlink(missing_ok=True)
    states = dict(Counter(trial.state.name for trial, role in zip(trials, roles) if role == "search"))
    return {"path": path, "study": study_name, "studies": studies, "trials": studies.get(study_name, 0),
            "states": states}


SEARCH_ROLES = {"search": "search", "baseline": "search", RUNG_ROLE: "search"}  # the roles of the search's study


def _used_fields(key: str, fields: dict) -> dict:
    """A gene's parameters less the components a program gene does not use (per layer too)."""
    if "prog=" not in key:
        return fields
    unused = {"similarity", "normalization", "gating", "temperature_mode"}
    return {name: value for name, value in fields.items() if name.rpartition(".")[2] not in unused}


def space_labels(search_space) -> dict[str, list[str]]:
    """Each gene field's options in a run's search space as the gene key writes them (none where they cannot be
    read here, e.g. a plugin's not loaded)."""
    try:
        space = SearchSpace.from_dict(search_space or {})
    except (UserError, ValueError):
        return {}
    vanilla = AttentionGene.vanilla()
    out: dict[str, list[str]] = {}
    for name in ALL_FIELDS:
        labels = []
        for option in space.options(name):
            try:
                label = option_labels(vanilla.replace(**{name: option}).key)[name]
            except (UserError, ValueError, TypeError):
                continue
            if label not in labels:
                labels.append(label)
        out[name] = labels
    return out


def _timed(trial, record) -> None:
    """The trial's start and completion: when the store took the record, less its training time."""
    try:
        end = datetime.datetime.fromisoformat(str(record.get("created_at")))
    except ValueError:
        return
    seconds = finite_or_none(record.get("time_s")) or 0.0
    end = end.astimezone().replace(tzinfo=None)  # Optuna keeps naive local times
    trial.datetime_start = end - datetime.timedelta(seconds=seconds)
    trial.datetime_complete = end


def curve_values(record) -> dict[int, float]:
    """A trial's intermediate values: its validation curve, else its training curve, as perplexities by step."""
    curve = record.get("val_curve") or record.get("curve") or []
    return {int(step): math.exp(min(float(loss), 700.0)) for step, loss in curve if math.isfinite(float(loss))}


def _suite_trials(view: dict) -> list[dict]:
    """The trials of a suite run as record-like rows: one per gene, the baseline first."""
    rows = []
    for role, row in ([("baseline", view["baseline"])] if view.get("baseline") else []) + [
            ("search", r) for r in view["genes"]]:
        ok = row["suite_accuracy"] is not None and not row["all_failed"]
        points = {f"accuracy:{label}": p["accuracy"] for label, p in row["points"].items() if p["accuracy"] is not None}
        rows.append({"gene": row["gene"], "role": role, "generation": row["generation"], "id": row["id"],
                     "status": "ok" if ok else "failed" if row["all_failed"] else "missing",
                     "suite_accuracy": row["suite_accuracy"] if ok else None,
                     "attrs": {**points, "failed_points": ",".join(row["failed"])}})
    return rows
