"""Running a registered study (``studies.study``): its stages in order, each into its own folder,
its results copied into the results folder; its status; its decision by the plan's rules and its
report, from the result files alone; and the check of a document's generated tables.

``run_study`` calls ``evo-attention`` commands through ``command`` (argv -> exit status): the CLI
passes its own ``main`` (one process); the default starts ``python -m evo_attention.cli``. Every
command resumes from its run store, so a killed run trains nothing twice; a sub-run is done when its
result file is in the results folder, a computed stage when its file is.

The stores stay on the machine that trained (only the results are committed). A stage that reads an
earlier run's store (``{out:STAGE}``, e.g. ``validate --from-run``) on a machine without it first
rebuilds it: that run's search commands again, the same seeds, so the same trainings; the rebuilt
evaluations must equal the committed ones, value for value, or the stage stops (never a silent
substitute).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from evo_attention.studies import results as res
from evo_attention.studies.plan import amendment_time
from evo_attention.studies.study import (CONDITION, EDGE_RULE, NEGATIVE, POSITIVE, TRAINING, Runs, Stage, Study,
                                         baseline_rate, check_registered, command_flags, done_glob, flatten, genes_of,
                                         read_json, read_registration, run_dir, stage_commands, stage_file,
                                         substitute, word_rules, write_result)
from evo_attention.util.errors import UserError
from evo_attention.util.format import utc_now

SKIP_DIRS = {"model", "models", "checkpoints", "export"}  # saved weights and exports stay in out


# ------------------------------------------------------------------------------------------ running


def run_study(study: Study, command: Callable[[list[str]], int] | None = None, *, stages: list[str] | None = None,
              log: Callable[[str], None] = print) -> list[str]:
    """Run every stage that is not done, in order (or only ``stages``), each into its own folder
    under out and its results into results; a killed run resumes (the commands resume from their
    stores, finished sub-runs are skipped). Returns the stages run."""
    check_registered(study)
    command = command or (lambda argv: subprocess.run([sys.executable, "-m", "evo_attention.cli", *argv]).returncode)
    runs = Runs(study)
    chosen = [study.stage(n) for n in stages] if stages else study.stages
    ran = []
    with contextlib.chdir(study.root):
        for stage in chosen:
            if runs.state(stage)[0] == "done":
                continue
            log(f"study {study.name}: stage {stage.name} ({stage.kind})")
            (_train if stage.trains else _compute)(study, runs, stage, command, log)
            ran.append(stage.name)
    return ran


def commands(study: Study, runs: Runs, stage: Stage, combo: dict, gpu: bool = False,
             reads: list | None = None) -> list[tuple[dict, list, Path]]:
    """The ``evo-attention`` command lines of one sub-run of a training stage (with the plan's
    gpu_flags on a ``device: gpu`` stage where ``gpu``), each with its command's entry; the other
    runs whose stores they read (``{out:STAGE}``) are added to ``reads`` as (stage, its combo)."""
    def resolve(kind: str, target: str) -> str:  # a {kind:stage} reference
        source = study.stage(target)
        if runs.state(source)[0] != "done" and kind != "out":
            raise UserError(f"stage {source.name} is not done: run it first (study run --stage {source.name})")
        other = runs.match(source, combo) if source.spec.get("each") else {}
        if kind == "out":
            if reads is not None and source.trains:
                reads.append((source, other))
            return study.rel(study.raw["out"], run_dir(source, other, runs.env))
        if kind == "results":
            name = run_dir(source, other, runs.env) if source.trains else stage_file(source, other, runs.env)
            return study.rel(study.raw["results"], name)
        file = stage_file(source, other, runs.env)
        if kind == "rate":
            selected = read_json(study.results(file))
            if selected["at_edge"] and study.raw.get("edge_rule", "refuse") == "refuse":
                raise UserError(f"the rate {selected['selected']} that stage {source.name} selected is at an edge of "
                                f"its grid {selected['rates']}: {EDGE_RULE}")
            return selected["selected"]
        if kind == "plan":
            return study.rel(study.raw["results"], file)
        if kind == "lr":
            lr = study.results(file).with_suffix(".lr")
            if not lr.is_file():
                raise UserError(f"stage {source.name} writes no rate (give it rate_of)")
            return lr.read_text().strip()
        raise UserError(f"{{{kind}:{target}}} is not a reference")

    env = {**runs.env, **combo}
    env["out"] = own = study.rel(study.raw["out"], run_dir(stage, combo, runs.env))
    device = substitute(str(stage.spec.get("device", "cpu")), env)
    out = []
    for c in stage_commands(stage):
        argv = [str(a) for a in flatten(substitute(c["run"], env, resolve))]
        if device == "gpu" and gpu and argv[0] in TRAINING:
            argv += [str(a) for a in study.raw.get("gpu_flags") or []]
        out.append((c, argv, Path(command_flags(argv).get("--out") or own)))
    return out


def _train(study: Study, runs: Runs, stage: Stage, command, log) -> None:
    import torch

    gpu = torch.cuda.is_available()
    for combo in runs.combos(stage):
        if runs.done(stage, combo):
            continue
        reads: list = []
        lines = commands(study, runs, stage, combo, gpu, reads)
        for other, other_combo in reads:
            _rebuild(study, runs, other, other_combo, command, log)
        for c, argv, target in lines:
            if c["done"] and target.is_dir() and any(target.glob(c["done"])):
                continue  # finished before a kill: its store and files are there
            if c["done"] is None and argv[0] == "export" and target.exists():
                continue
            _call(command, argv, target, log, f"stage {stage.name}")
        _collect(study, stage, combo, runs.env)
    if stage.kind == "tune":
        means, lower = {}, True
        for combo in runs.combos(stage):
            folder = study.results(run_dir(stage, combo, runs.env))
            payload = read_json(sorted(folder.glob(done_glob(stage)))[0])
            means[combo["rate"]], lower = payload["baseline"]["mean"], payload.get("lower_is_better", True)
        selected = {**res.select_rate(means, lower), "created_at": utc_now()}
        write_result(study.results(stage_file(stage, {}, runs.env)), selected)


def _call(command, argv: list, target: Path, log, where: str) -> None:
    """One command (a search whose store is there resumes it); a failure stops the run in one line."""
    if argv[0] == "search" and (target / "run.db").exists() and "--resume" not in argv:
        argv.insert(1, "--resume")
    log(f"  evo-attention {' '.join(argv)}")
    code = command(argv)
    if code == 130:
        raise KeyboardInterrupt
    if code:
        raise UserError(f"{where}: `evo-attention {' '.join(argv[:2])} ...` ended with status {code}; its finished "
                        "trainings are kept: fix the cause and run the study again")


# what a training's record holds that the same trial gives again anywhere (times and ids do not)
SAME = ("role", "generation", "gene", "seed", "status", "steps", "val_loss", "val_perplexity", "eval_tokens")


def _rebuild(study: Study, runs: Runs, stage: Stage, combo: dict, command, log) -> None:
    """The store of a done run of ``stage`` that a later stage reads, its searches run again where they did not
    finish here (see the module's text); its evaluations must equal the committed ones on ``SAME``, in any order."""
    rel = run_dir(stage, combo, runs.env)
    if not runs.done(stage, combo):
        return
    searches = [(c, argv, target) for c, argv, target in commands(study, runs, stage, combo) if argv[0] == "search"]
    committed = study.results(rel) / "evaluations.csv"
    if not searches or not committed.is_file():
        if (study.out(rel) / "run.db").exists():
            return  # nothing committed to hold it to: the store that trained it
        raise UserError(f"the store of stage {stage.name}'s run {rel} is not on this machine and no search of the "
                        f"stage with its committed evaluations.csv rebuilds it: run the study where it was trained")
    ran = False
    for c, argv, target in searches:
        if not any(target.glob(c["done"])):
            if not ran:
                log(f"  the store of {rel} is not on this machine: its search again, the same seeds")
            _call(command, argv, target, log, f"rebuilding the store of {rel}")
            ran = True

    def rows(path: Path, roles=None) -> list:
        with open(path, newline="") as f:
            return sorted(tuple(r.get(k, "") for k in SAME) for r in csv.DictReader(f)
                          if not roles or r["role"] in roles)

    old = rows(committed)  # on the search's roles: a later validation's trainings join the store (and its file)
    roles = {r[0] for r in old}
    new = sorted(r for _, _, target in searches if (target / "evaluations.csv").is_file()
                 for r in rows(target / "evaluations.csv", roles))
    if old != new:
        diff = next((f"{a} against {b}" for a, b in zip(old, new) if a != b), f"{len(old)} against {len(new)} rows")
        raise UserError(f"the store of {rel} differs from its committed evaluations ({', '.join(SAME)}: {diff}): "
                        "its trainings do not repeat on this machine; the stages that read it need the machine that "
                        "trained it, or the stage again from its start (remove its results)")
    if ran:
        log(f"  rebuilt {rel}: its {len(new)} trainings equal the committed ones")


def _collect(study: Study, stage: Stage, combo: dict, env: dict) -> None:
    """The sub-run's small files into the results: each store's times (times.json beside it), every
    JSON file and evaluations.csv (no saved model, export or checkpoint), the done file last."""
    rel = run_dir(stage, combo, env)
    source, dest = study.out(rel), study.results(rel)
    for db in source.rglob("run.db"):
        write_result(db.parent / "times.json", res.run_times(db.parent))
    files = [p for p in source.rglob("*") if p.is_file() and (p.suffix == ".json" or p.name == "evaluations.csv")
             and not SKIP_DIRS & set(p.relative_to(source).parts[:-1])
             and p.name not in ("vocab.json", "tokenizer.json")
             and p.stat().st_size < 2_000_000]
    done = set(source.glob(done_glob(stage)))
    for p in sorted(files, key=lambda p: p in done):
        target = dest / p.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, target)


def _compute(study: Study, runs: Runs, stage: Stage, command, log) -> None:
    edge = study.raw.get("edge_rule", "refuse")

    def read(file: str) -> dict:
        payload = read_json(study.results(file.split("#")[0]))
        if payload is None:
            raise UserError(f"stage {stage.name} reads {study.rel(study.raw['results'], file)}, which does not exist "
                            "yet: run the stages before it")
        return payload

    for combo in runs.combos(stage):
        if runs.done(stage, combo):
            continue
        s = {k: substitute(v, {**runs.env, **combo}) for k, v in stage.spec.items()}
        file = stage_file(stage, combo, runs.env)
        if stage.kind == "plan":
            picked = genes_of(read(s["genes_of"]), s["genes_of"], edge) if s.get("genes_of") else []
            genes = picked[:int(s["top"])] if s.get("top") is not None else picked
            genes += [g for g in s.get("genes") or [] if g not in genes]
            plan = {"name": Path(file).stem, "description": f"study {study.name}: written by stage {stage.name} by its "
                    "registered rule", "comparisons": genes, "margin": float(s.get("margin", 0.01)),
                    "alpha": float(s.get("alpha", 0.05)), "test": "rule", "seeds": int(s["seeds"]),
                    "seed_block": None if s.get("seed_block") is None else int(s["seed_block"]), "amendments": []}
            _write_yaml(study.results(file), plan, width=1000)
            if s.get("rate_of"):
                study.results(file).with_suffix(".lr").write_text(baseline_rate(read(s["rate_of"]), s["rate_of"], edge)
                                                                  + "\n")
            continue
        if stage.kind == "versus":
            out = res.versus(read(s["genes_of"]), read(s["reference_file"]), s["reference"], float(s["margin"]))
            out["files"] = [s["genes_of"], s["reference_file"]]
        elif stage.kind == "family":
            cells = {n: res.matched_pair(read(f), s["gene"], f, s.get("against", "matched"))
                     for n, f in s["cells"].items()}
            out = {"gene": s["gene"], "margin": float(s.get("margin", 0.01)),
                   "files": [f"{n}={f}" for n, f in s["cells"].items()]}
            if not s.get("trend_only"):
                out["family"] = res.family(cells, out["margin"])
            if s.get("trend"):
                out["trend"] = res.trend(cells, {n: float(v) for n, v in s["trend"].items()})
        elif stage.kind == "strategies":
            found = res.collect_strategies(study.results(s["searches"]))
            out = res.compare_strategies(found, s.get("reference", "random"), float(s.get("margin", 0.01)))
        elif stage.kind == "rediscovery":
            found = [res.search_features(p) for g in s["searches"] for p in sorted(study.results().glob(g))
                     if p.is_dir()]
            described = [res.search_features(p, need_evaluations=False) for g in s.get("describe") or []
                         for p in sorted(study.results().glob(g)) if p.is_dir()]
            out = {"searches": found, **res.rediscovery(found, s.get("reference", "random"), s.get("features") or res.TESTED),
                   "described": described}
            if s.get("rediscovered_if") is not None:
                out["outcome"] = res.rediscovered(found, s["rediscovered_if"], s.get("bar"), s.get("solve_at"))
        elif stage.kind == "reliability":
            files = [p for g in s["validations"] for p in sorted(study.results().glob(g)) if p.is_file()]
            if not files:
                raise UserError(f"stage {stage.name}: no validation matches {', '.join(s['validations'])}")
            out = {**res.reliability([json.loads(p.read_text()) for p in files]),
                   "files": [str(p.relative_to(study.results())) for p in files]}
        else:  # suite: a suite with a data seed on every point (its other examples)
            import yaml

            from evo_attention.data.suites import SUITE_DIR, shipped_suites

            name = str(s["suite"])
            source = SUITE_DIR / f"{name}.yaml" if name in shipped_suites() else Path(name)
            suite = yaml.safe_load(source.read_text())
            seed = int(s.get("data_seed", 1))
            suite = dict(suite, suite=f"{suite['suite']}-data{seed}",
                         points=[dict(p, seed=seed) for p in suite["points"]])
            _write_yaml(study.results(file), suite)
            continue
        # the time of its making: what study.made_time reads (a copy's file times are not)
        write_result(study.results(file), {**out, "created_at": utc_now()})


def _write_yaml(path: Path, payload: dict, **options) -> None:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(payload, sort_keys=False, **options))


# ------------------------------------------------------------------------------------------ status


def status(study: Study) -> list[str]:
    record = read_registration(study)
    lines = [f"study {study.name} ({study.path})"]
    if record is None:
        lines.append("not registered")
    else:
        lines.append(f"registered {record['registered']} at commit {str(record['commit'])[:12]} with evo-attention "
                     f"{record['version']}" + (f" (after its results: {record['after_results']})"
                                               if record.get("after_results") else "")
                     + f"; {len(record['amendments'])} amendment(s)")
        try:
            check_registered(study)
        except UserError as exc:  # what run and report refuse, shown beside the stages
            lines.append(f"run and report refuse it: {exc}")
    runs = Runs(study)
    for qname in study.questions:
        lines.append(f"{qname}:")
        for stage in (s for s in study.stages if s.question == qname):
            state, n, total = runs.state(stage)
            count = f" ({n}/{total})" if total > 1 else ""
            devices = sorted({substitute(str(stage.spec.get("device", "cpu")), {**runs.env, **c})
                              for c in runs.combos(stage) or [{}]})
            device = f", {'/'.join(devices)}" if devices != ["cpu"] else ""
            lines.append(f"  {stage.name} [{stage.kind}{device}]: {state}{count}")
    return lines


# ------------------------------------------------------------------------------------------ decision


def verdicts(payload: dict, part: str = "") -> dict[str, str]:
    """entity -> verdict of a result file: a validation's or a versus file's genes (recipe parts left
    out), a family's cells, a trend (``#trend``: grows, shrinks or none), strategies, solve rates."""
    if part == "trend" or ("trend" in payload and "family" not in payload):
        return {"trend": res.trend_verdict(payload["trend"])}
    if "family" in payload:
        return {cell: row["verdict"] for cell, row in payload["family"].items()}
    if "pooled" in payload:  # a reliability file: the side of zero its interval lies on
        low, high = payload["pooled"]["ci_low"], payload["pooled"]["ci_high"]
        return {"rank correlation": POSITIVE if low is not None and low > 0 else
                NEGATIVE if high is not None and high < 0 else "undetermined"}
    if "search_seeds" in payload:
        return {name: row["verdict"] for name, row in payload["comparisons"].items()}
    if "features" in payload:
        words = {"solves more often": "better", "solves less often": "worse"}
        rows = payload["comparisons"]
        out = {(f if len(rows) == 1 else f"{n}: {f}"): words.get(c["verdict"], "undetermined")
               for n, cs in rows.items() for f, c in cs.items()}
        rates = (payload.get("outcome") or {}).get("rates") or {}
        out.update({("rediscovered" if len(rates) == 1 else f"{n}: rediscovered"): r["verdict"]
                    for n, r in rates.items()})
        return out
    genes = payload["genes"]
    rows = genes.items() if isinstance(genes, dict) else ((g["gene"], g) for g in genes)
    return {re.sub(r"\|lr=[^|]*", "", name): row.get("verdict") for name, row in rows}


def _holds(cond: str, tables: dict, entity: str | None) -> bool:
    quant, name, named, negate, word = CONDITION.match(cond).groups()
    values = tables[name]
    if named is not None:
        if named not in values:
            raise UserError(f"{cond!r}: {name} has no entry {named!r}: its entries are {', '.join(values) or 'none'}")
        return (values[named] == word.strip()) != bool(negate)
    if quant is None:
        if entity is None and len(values) != 1:
            raise UserError(f"{cond!r}: {name} has {len(values)} entries: say all, some or no")
        value = values.get(entity) if entity is not None else next(iter(values.values()))
        return (value == word.strip()) != bool(negate)
    hits = [(v == word.strip()) != bool(negate) for v in values.values()]
    return {"all": all(hits), "some": any(hits), "no": not any(hits)}[quant]


def _say(rules: list, tables: dict, entity: str | None) -> str:
    for r in rules:
        if all(_holds(str(c), tables, entity) for c in r.get("if") or []):
            return substitute(str(r["say"]), {k: v.get(entity, "-") for k, v in tables.items()} if entity else {})
    raise AssertionError("the last rule holds")  # pragma: no cover (checked when the plan is loaded)


def decide(study: Study) -> dict:
    """Per question: the words of each entity and each answer by the plan's rules, from the result
    files alone; a question with a source not yet written answers "not run"."""
    out = {}
    for qname, q in study.questions.items():
        tables, missing = {}, []
        for name, file in (q.get("sources") or {}).items():
            path, _, part = file.partition("#")
            payload = read_json(study.results(path))
            if payload is None:
                missing.append(file)
            else:
                tables[name] = verdicts(payload, part)
        if missing:
            out[qname] = {"words": {}, "answers": {a: "not run" for a in q["answers"]}, "missing": missing}
            continue
        entities = list(tables.get((q.get("words") or {}).get("over"), {}))
        for table, rules in word_rules(q).items():  # in order: a table may read the ones before it
            tables[table] = {e: _say(rules, tables, e) for e in entities}
        words = {e: {t: tables[t][e] for t in word_rules(q)} for e in entities}
        out[qname] = {"words": words, "answers": {a: _say(rules, tables, None) for a, rules in q["answers"].items()},
                      "missing": []}
    return out


# ------------------------------------------------------------------------------------------ report


def report(study: Study) -> str:
    """The study's report (markdown): per question its stages, its tables (each a generated block naming its
    file, then ``partial_note`` of that file and of those it was computed from) and its words and answers by the
    plan's rules, from the result files alone."""
    from evo_attention.report.studies.common import partial_note
    from evo_attention.report.studies.study_tables import block, render
    from evo_attention.util.format import code, markdown_table

    record = check_registered(study) if read_registration(study) is not None else None
    runs, decisions = Runs(study), decide(study)
    plan = Path(os.path.relpath(study.path.resolve(), study.root)).as_posix()
    lines = [f"# {study.raw.get('title') or study.name}", ""]
    if record is None:
        lines.append(f"Plan `{plan}`, **not registered**.")
    else:
        lines.append(f"Plan `{plan}` (sha256 {record['sha256'][:12]}), registered "
                     f"{record['registered']} at commit {str(record['commit'])[:12]} with evo-attention "
                     f"{record['version']}" + (f", after its results: {record['after_results']}"
                                               if record.get("after_results") else "")
                     + f"; {len(record['amendments'])} amendment(s) by `study amend`.")
        for a in record["amendments"]:
            lines.append(f"- amendment of {a['time']}: {a['note']} (changes {', '.join(a['changed'])})")
    for a in study.raw.get("amendments") or []:
        reason = " ".join(str(a["reason"]).split())
        lines.append(f"- amendment of {amendment_time(a['time'], study.path, 0)} (in the plan): {reason}")
    lines += ["", "Every table is generated from the file it names (`evo-attention study check PLAN DOC` compares a "
              "document's tables with their files); every answer follows from the plan's decision rules.", ""]
    for qname, q in study.questions.items():
        lines += [f"## {qname}" + (f": {q['title']}" if q.get("title") else ""), ""]
        states = []
        for stage in (s for s in study.stages if s.question == qname):
            state, n, total = runs.state(stage, files_only=True)
            states.append(f"{stage.name} ({state}{f', {n}/{total}' if total > 1 and state != 'done' else ''})")
        lines += ["Stages: " + ", ".join(states) + ".", ""]
        for t in q.get("tables") or []:
            path = study.rel(study.raw["results"], t["file"])
            payload = read_json(study.results(t["file"]))
            if t.get("title"):
                lines += [f"**{t['title']}**", ""]
            lines += [block(path, t["table"], render(t["table"], payload)) if payload is not None
                      else f"*{path}: not run.*", ""]
            # a computed file (versus, family, reliability) is as partial as the result files it names
            sources = [payload or {}] + [read_json(study.results(str(f).rpartition("=")[2])) or {}
                                         for f in (payload or {}).get("files") or ()]
            lines += [n for note in dict.fromkeys(map(partial_note, sources)) if note for n in (note, "")]
        decision = decisions[qname]
        if decision["missing"]:
            lines += [f"Not answered yet: {', '.join(decision['missing'])} not written.", ""]
        if decision["words"]:
            names = list(word_rules(q))
            rows = [[code(e)] + [row[n] for n in names] for e, row in decision["words"].items()]
            over = (q.get("words") or {}).get("over", "")
            lines += [markdown_table([over] + names, rows, "l" * (len(names) + 1)), ""]
        for name, word in decision["answers"].items():
            lines += [f"**{qname}, {name}: {word}.**", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def check_document(study: Study, doc) -> list[str]:
    """Where ``doc``'s generated tables of the plan's files differ from what the files give, and the
    plan's tables of written files ``doc`` lacks (a study still running has files not written yet:
    ``unwritten_tables``; a table ``doc`` shows of such a file differs)."""
    from evo_attention.report.studies.study_tables import BLOCK, render

    try:
        text = Path(doc).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UserError(f"cannot read the document {doc} ({reason}): give the markdown file whose tables to check") \
            from None
    unwritten = set(unwritten_tables(study))
    wanted = set(_plan_tables(study)) - unwritten
    seen, differ = set(), []
    for m in BLOCK.finditer(text):
        key = (m["file"], m["table"])
        if key in unwritten:  # numbers no file gives
            differ.append(f"{doc}: {m['file']} table={m['table']} is shown, but that file is not written")
        if key not in wanted:
            continue
        seen.add(key)
        payload = read_json(study.root / m["file"])
        if payload is None or render(m["table"], payload) != m["body"]:
            differ.append(f"{doc}: {m['file']} table={m['table']} differs from its file")
    differ += [f"{doc}: no table {t} of {f}" for f, t in sorted(wanted - seen)]
    return differ


def _plan_tables(study: Study) -> list[tuple[str, str]]:
    """(file, table) of each table the plan's questions show, the file relative to the root."""
    return [(study.rel(study.raw["results"], t["file"]), t["table"]) for q in study.questions.values()
            for t in q.get("tables") or []]


def unwritten_tables(study: Study) -> list[tuple[str, str]]:
    """The plan's tables whose result file is not written yet (their stages have not run)."""
    return [(f, t) for f, t in _plan_tables(study) if not (study.root / f).is_file()]
