#!/usr/bin/env python
"""A hostile sweep of the command-line tool and the Python API: bad, contradictory and destructive
input, each case run alone (one process at a time), judged by what a careful user expects.

    python benchmarks/hostile_sweep.py --json docs/results/hostile/hostile-sweep.json
    python benchmarks/hostile_sweep.py --only 'prog-|api-' --keep-fixtures   # a subset, reusing fixtures
    python benchmarks/hostile_sweep.py --list

Expectations:

- ``refused``: a non-zero exit, no ``Traceback`` in stdout or stderr, and stderr's last non-empty
  line one line of the form ``evo-attention[ COMMAND]: error: ...`` (optionally naming one of
  ``names``);
- ``ok``: exit 0 and no ``Traceback``;
- ``ok-or-refused``: the right answer is ambiguous; either of the above passes and the sweep
  records which;
- ``api-refused``: a ``python -c`` snippet whose call must raise TypeError, ValueError or UserError
  with a message naming the argument (one of ``names``), never another exception type;
- ``api-ok``: the snippet's call must not raise.

Every case may carry post-checks (a file still there and unchanged, a store still holding its
rows, a warning said). Trainings are tiny (16-dim, 1 layer, 3 steps), every case has a 300 s limit,
and everything is written under the scratch directory (default /tmp/hostile/sweep), which is the
working directory of every command (so a default ``runs/...`` lands there too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

EXE = shutil.which("evo-attention") or "evo-attention"
TIMEOUT = 300
MODEL = ["--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "3"]
STUDY = ["--preset", "quick", *MODEL, "--quiet"]  # validate, ablate, compare, baseline, fitness-check
SEARCH = [*STUDY, "--population", "2", "--generations", "1", "--elite", "1", "--keep-models", "0", "--no-check"]
CURVE = [*MODEL, "--data", "mqar", "--quiet"]
ERROR_LINE = re.compile(r"^evo-attention(?: [\w-]+)*: error: \S")
API_ERRORS = {"TypeError", "ValueError", "UserError"}
GATE = "dot|softmax|output_gate|fixed|bias|0.10"
SPARSE = "dot|sparsemax|none|fixed|bias|0.10"
VANILLA_PROG = "o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"


def prog_with_v(v_expr: str) -> str:
    """The vanilla program with its values computed by ``v_expr``."""
    return f"prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),{v_expr}))"


# --------------------------------------------------------------------------------------------- cases

class Case:
    def __init__(self, name, area, *, cmd=None, py=None, expect="refused", setup=None, post=(), names=(),
                 why="", special=None, timeout=TIMEOUT, ulimit_kb=None):
        self.name, self.area, self.cmd, self.py, self.expect = name, area, cmd, py, expect
        self.ulimit_kb = ulimit_kb  # run under ulimit -v (kB): cases that could take the machine's memory
        self.setup, self.post, self.names, self.why, self.special = setup, list(post), tuple(names), why, special
        self.timeout = timeout


CASES: list[Case] = []


def case(*args, **kwargs):
    CASES.append(Case(*args, **kwargs))


class Ctx(dict):
    """Format values: {case} the case's own directory, {fix_NAME} a fixture, {scratch}."""

    def __missing__(self, key):
        raise KeyError(f"no such placeholder {key!r}")


def fmt(ctx: Ctx, item: str) -> str:
    return item.format_map(ctx) if isinstance(item, str) else str(item)


# ------------------------------------------------------------------------------------- file helpers

def write(path: Path | str, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def copy_fixture(ctx: Ctx, fixture: str, dest: str = "run") -> Path:
    target = Path(ctx["case"]) / dest
    shutil.copytree(ctx[f"fix_{fixture}"], target, symlinks=True)
    return target


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` but the lock and SQLite's side files; run.db by its rows."""
    out = {}
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = str(path.relative_to(root))
        if path.name in ("run.lock", "run.db-shm", "run.db-wal"):
            continue
        if path.name == "run.db":
            out[rel] = f"rows={store_rows(path)}"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def store_rows(db: Path) -> int | str:
    try:
        conn = sqlite3.connect(f"{Path(db).resolve().as_uri()}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute("SELECT count(*) FROM evaluations").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"unreadable ({exc})"


# post-checks: each a function (ctx, result) -> None (fine) or a problem (str)

def snapshot(key: str, rel: str):
    """A setup step: remember the digests of ``{case}/rel`` under ``key``."""
    def step(ctx):
        ctx[f"snap_{key}"] = file_digests(Path(ctx["case"]) / rel)
    return step


def unchanged(key: str, rel: str):
    def check(ctx, res):
        before = ctx[f"snap_{key}"]
        after = file_digests(Path(ctx["case"]) / rel)
        lost = sorted(set(before) - set(after))
        changed = sorted(k for k in before if k in after and before[k] != after[k])
        problems = []
        if lost:
            problems.append(f"files lost in {rel}: {', '.join(lost[:6])}")
        if changed:
            problems.append(f"files changed in {rel}: {', '.join(changed[:6])}")
        return "; ".join(problems) or None
    return check


def exists(rel: str):
    def check(ctx, res):
        return None if (Path(ctx["case"]) / rel).exists() else f"{rel} no longer exists"
    return check


def absent(rel: str):
    def check(ctx, res):
        return f"{rel} was created" if (Path(ctx["case"]) / rel).exists() else None
    return check


def stderr_has(*words: str, label: str = ""):
    def check(ctx, res):
        text = (res["stderr"] + res["stdout"]).lower()
        return None if any(w.lower() in text for w in words) else \
            f"output does not say {label or ' / '.join(words)}"
    return check


def not_in_message(text: str, why: str):
    """The error line must not contain ``text`` (a wrong flag, an internal value, advice the docs rule out)."""
    def check(ctx, res):
        return f"the message contains {text!r}: {why}" if text in (res.get("last_line") or "") else None
    return check


def rows_are(rel: str, n: int):
    def check(ctx, res):
        rows = store_rows(Path(ctx["case"]) / rel)
        return None if rows == n else f"{rel} holds {rows} rows, expected {n}"
    return check


def file_size_is(rel: str, key: str):
    def check(ctx, res):
        path = Path(ctx["case"]) / rel
        if not path.exists():
            return f"{rel} was deleted"
        return None if path.stat().st_size == ctx[key] else f"{rel} changed size ({ctx[key]} -> {path.stat().st_size})"
    return check


def suggested_flags_exist(ctx, res):
    """Where the error line suggests 'evo-attention CMD ... --flag', CMD must have --flag."""
    line = res.get("last_line") or ""
    for cmd, flag in re.findall(r"evo-attention ([\w-]+) [^()]*?(--[\w-]+)", line):
        helptext = subprocess.run([EXE, cmd, "--help"], capture_output=True, text=True).stdout
        if flag not in helptext:
            return f"the message suggests 'evo-attention {cmd} ... {flag}', but {cmd} has no {flag}"
    return None


# ---------------------------------------------------------------------------------------- fixtures

def build_fixtures(fix: Path, cwd: Path, reuse: bool) -> dict[str, str]:
    """Small result directories of each kind, made once and copied by the cases that change them."""
    specs = {
        "search": ["search", *SEARCH, "--out", "{p}"],
        "searchk": ["search", *[a for a in SEARCH], "--keep-models", "1", "--out", "{p}"],
        "validate": ["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--out", "{p}"],
        "ablate": ["ablate", *STUDY, "--gene", GATE, "--seeds", "2", "--out", "{p}"],
        "compare": ["compare", *STUDY, "--configs", "baseline,linear", "--out", "{p}"],
        "curve": ["curve", *CURVE, "--genes", "baseline,linear", "--knob", "pairs=2,4", "--out", "{p}"],
        "model": ["baseline", *STUDY, "--save-model", "--out", "{p}"],
        "exp_sa": ["export", "--from-run", "{searchk}", "--out", "{p}"],
        "exp_hf": ["export", "--from-run", "{searchk}", "--format", "hf", "--out", "{p}"],
        "exp_hfa": ["export", "--from-run", "{searchk}", "--format", "hf-attention", "--out", "{p}"],
        "searchv": ["search", *SEARCH, "--out", "{p}"],
    }
    paths = {name: str(fix / name) for name in specs}
    for name, argv in specs.items():
        path = Path(paths[name])
        if reuse and path.exists() and any(path.iterdir()):
            continue
        if path.exists():
            shutil.rmtree(path)
        argv = [a.format(p=path, **paths) for a in argv]
        res = subprocess.run([EXE, *argv], capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT)
        if res.returncode:
            raise SystemExit(f"fixture {name} failed ({res.returncode}): {' '.join(argv)}\n{res.stderr[-2000:]}")
        print(f"fixture {name}: {path}", flush=True)
    # a search whose store also holds a validation (validate --from-run)
    sv = Path(paths["searchv"])
    if not (sv / "validation.json").exists():
        argv = ["validate", "--from-run", str(sv), "--top", "1", "--seeds", "2", "--quiet"]
        res = subprocess.run([EXE, *argv], capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT)
        if res.returncode:
            raise SystemExit(f"fixture searchv's validation failed: {res.stderr[-2000:]}")
    return paths


# ------------------------------------------------------------------------------------------ running

def tail_lines(text: str, n: int = 3) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-n:]


def run_process(argv, cwd, timeout, env=None):
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
        rc, out, err, timed_out = proc.returncode, proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as exc:
        rc, timed_out = None, True
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    return {"rc": rc, "stdout": out, "stderr": err, "timed_out": timed_out,
            "seconds": round(time.monotonic() - start, 2)}


API_WRAPPER = """\
import sys, math
try:
    import torch
    from evo_attention import *
    from evo_attention import AttentionGene, Config, TinyTransformer, EvolvedAttention, train_and_evaluate
    from evo_attention import run_fitness_check, UserError
    from evo_attention.data import load_data
    from evo_attention.data.suites import load_suite
    def tiny_config(**kw):
        base = dict(d_model=16, n_heads=2, n_layers=1, vocab_size=16, max_seq_len=16, train_steps=3, batch_size=4,
                    eval_steps=1, data="recall", device="cpu")
        base.update(kw)
        return Config(**base)
    def tiny_data():
        return load_data("recall", vocab_size=16, seq_len=16, num_pairs=2, train_examples=64, eval_examples=32)
    gene = AttentionGene.vanilla()
    cfg = tiny_config()
except BaseException as exc:
    print("SETUP-FAILED", type(exc).__name__, str(exc).replace("\\n", " ")[:400])
    raise SystemExit(0)
try:
{body}
    print("RESULT NOEXC")
except BaseException as exc:
    kind = "api-error" if isinstance(exc, (TypeError, ValueError)) else "other"
    print("RESULT EXC", type(exc).__name__, kind, "::", str(exc).replace("\\n", " ")[:600])
"""


def api_argv(snippet: str) -> list[str]:
    body = "\n".join("    " + line for line in snippet.strip().splitlines())
    return [sys.executable, "-c", API_WRAPPER.format(body=body)]


def judge(c: Case, res: dict) -> tuple[str, str, str]:
    """(verdict, why, outcome): outcome is refused, ok, api-..., timeout or crash."""
    text = res["stdout"] + res["stderr"]
    last = tail_lines(res["stderr"], 1)
    res["last_line"] = last[0] if last else ""
    if res["timed_out"]:
        return "fail", f"did not end within {c.timeout} s", "timeout"
    if c.py is not None:
        line = next((l for l in res["stdout"].splitlines() if l.startswith(("RESULT", "SETUP-FAILED"))), None)
        if line is None or line.startswith("SETUP-FAILED"):
            return "fail", f"the snippet did not report (rc {res['rc']}): {line or tail_lines(text, 2)}", "crash"
        if line == "RESULT NOEXC":
            outcome = "api-ok"
            if c.expect == "api-ok":
                return "pass", "no exception, as expected", outcome
            if c.expect == "api-ok-or-refused":
                return "pass", "no exception (accepted)", outcome
            return "fail", "accepted: no exception raised", outcome
        parts = line.split(" ", 5)
        etype, kind, msg = (parts[2], parts[3], parts[5]) if len(parts) == 6 else ("?", "other", line)
        outcome = f"api-{etype}"
        res["exception"] = f"{etype}: {msg}"
        if c.expect == "api-ok":
            return "fail", f"raised {etype}: {msg[:200]}", outcome
        if etype not in API_ERRORS and kind != "api-error":
            return "fail", f"raised {etype} (expected TypeError/ValueError/UserError): {msg[:200]}", outcome
        if c.names and not any(n.lower() in msg.lower() for n in c.names):
            return "fail", f"{etype} does not name {' / '.join(c.names)}: {msg[:200]}", outcome
        subclass = "" if etype in API_ERRORS else " (a ValueError/TypeError subclass)"
        return "pass", f"{etype}{subclass}: {msg[:160]}", outcome
    tb = "Traceback (most recent call last)" in text
    leaked = [l for l in res["stderr"].splitlines() if re.search(r"\.py:\d+: \w*Warning", l)]
    if leaked and not res["timed_out"]:
        return "fail", f"exit {res['rc']}; a Python warning with its source path reached the output: " \
                       f"{leaked[0][:200]}", "warning"
    if res["rc"] == 0:
        outcome = "ok"
        if tb:
            return "fail", "exit 0 but a Traceback was printed", outcome
        if c.expect in ("ok", "ok-or-refused"):
            return "pass", "exit 0" + (" (accepted)" if c.expect == "ok-or-refused" else ""), outcome
        return "fail", "accepted (exit 0) where a refusal was expected", outcome
    outcome = "refused"
    if tb:
        return "fail", f"exit {res['rc']} with a Traceback: {res['last_line'][:200]}", "crash"
    if not ERROR_LINE.match(res["last_line"]):
        return "fail", f"exit {res['rc']} but the last stderr line is not one 'evo-attention: error:' line: " \
                       f"{res['last_line'][:200]!r}", "crash"
    if c.expect == "ok":
        return "fail", f"refused (exit {res['rc']}) where it should run: {res['last_line'][:200]}", outcome
    if c.names and not any(n.lower() in res["last_line"].lower() for n in c.names):
        return "fail", f"the message does not name {' / '.join(c.names)}: {res['last_line'][:200]}", outcome
    return "pass", f"refused (exit {res['rc']})", outcome


def run_case(c: Case, ctx: Ctx, cwd: Path) -> dict:
    case_dir = Path(ctx["scratch"]) / "cases" / c.name
    if case_dir.exists():
        unfreeze(case_dir)
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    ctx = Ctx(ctx)
    ctx["case"] = str(case_dir)
    record = {"name": c.name, "area": c.area, "expect": c.expect, "why_expected": c.why}
    try:
        for step in ([c.setup] if callable(c.setup) else list(c.setup or [])):
            step(ctx)
        if c.special:
            out = c.special(ctx, cwd)
            record.update(out)
            return record
        if c.py is not None:
            argv = api_argv(c.py)
            record["command"] = ["python", "-c", c.py.strip()]
        else:
            argv = [EXE, *[fmt(ctx, a) for a in (c.cmd(ctx) if callable(c.cmd) else c.cmd)]]
            record["command"] = ["evo-attention", *argv[1:]]
        if c.ulimit_kb:
            argv = ["bash", "-c", f'ulimit -v {c.ulimit_kb}; exec "$@"', "bash", *argv]
            record["command"] = [f"(ulimit -v {c.ulimit_kb};", *record["command"], ")"]
        res = run_process(argv, cwd, c.timeout)
        verdict, why, outcome = judge(c, res)
        problems = []
        for check in c.post:
            try:
                problem = check(ctx, res)
            except Exception as exc:  # noqa: BLE001 - a post-check that cannot run is a failure
                problem = f"post-check {getattr(check, '__name__', 'check')} failed: {type(exc).__name__}: {exc}"
            if problem:
                problems.append(problem)
        if problems:
            verdict = "fail"
            why = (why + "; " if why else "") + "; ".join(problems)
        record.update(exit_code=res["rc"], seconds=res["seconds"], stderr_tail=tail_lines(res["stderr"], 3),
                      stdout_tail=tail_lines(res["stdout"], 2) if res["rc"] or c.py else [],
                      outcome=outcome, verdict=verdict, why=why)
        if "exception" in res:
            record["exception"] = res["exception"]
    finally:
        for cleanup in ctx.get("cleanups", []):
            cleanup()
        unfreeze(case_dir)
    return record


# ------------------------------------------------------------------------------ read-only directory

def freeze(path: Path) -> None:
    """Make ``path`` read-only even for root: chmod -w, then chattr +i on every file and folder."""
    subprocess.run(["chmod", "-R", "a-w", str(path)], check=True)
    subprocess.run(["chattr", "-R", "+i", str(path)], check=False, capture_output=True)


def unfreeze(path: Path) -> None:
    if path.exists():
        subprocess.run(["chattr", "-R", "-i", str(path)], check=False, capture_output=True)
        subprocess.run(["chmod", "-R", "u+w", str(path)], check=False, capture_output=True)


# ------------------------------------------------------------------------------------- kill/resume

def kill_resume(extra: list[str], label: str, population: int = 2, kill_at: int = 3, kills: int = 1):
    """An uninterrupted search against the same search SIGKILLed mid-run and resumed: equal results."""
    def special(ctx, cwd):
        base = [*STUDY[:-1], "--steps", "20", "--population", str(population), "--generations", "3", "--elite", "1",
                "--keep-models", "0", "--no-check", "--quiet", *extra]
        case_dir = Path(ctx["case"])
        full, killed = case_dir / "full", case_dir / "killed"
        t0 = time.monotonic()
        cmd_full = [EXE, "search", *base, "--out", str(full)]
        r_full = run_process(cmd_full, cwd, TIMEOUT)
        planned = store_rows(full / "run.db") if (full / "run.db").exists() else None
        kill_rows = []
        for k in range(kills):  # the first start, then (kills > 1) resumes that are killed too
            argv = [EXE, "search", *base, "--out", str(killed)] if k == 0 else \
                [EXE, "search", "--resume", "--no-check", "--out", str(killed), "--quiet"]
            proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            deadline = time.monotonic() + TIMEOUT
            target = kill_at * (k + 1)
            while proc.poll() is None and time.monotonic() < deadline:
                rows = store_rows(killed / "run.db") if (killed / "run.db").exists() else 0
                if isinstance(rows, int) and rows >= target:
                    os.killpg(proc.pid, signal.SIGKILL)
                    kill_rows.append(rows)
                    break
                time.sleep(0.2)
            proc.wait()
        killed_at = kill_rows[0] if len(kill_rows) == kills else None
        cmd_resume = [EXE, "search", "--resume", "--no-check", "--out", str(killed), "--quiet"]
        r_resume = run_process(cmd_resume, cwd, TIMEOUT)
        verdict, why = "pass", ""
        problems = []
        if r_full["rc"] != 0:
            problems.append(f"the uninterrupted run failed ({r_full['rc']}): {tail_lines(r_full['stderr'], 1)}")
        if killed_at is None:
            problems.append("the run ended before it could be killed (no kill happened)")
        if r_resume["rc"] != 0 or "Traceback" in r_resume["stderr"]:
            problems.append(f"the resume failed ({r_resume['rc']}): {tail_lines(r_resume['stderr'], 2)}")
        compared = {}
        if not problems:
            a = json.loads((full / "final_results.json").read_text())
            b = json.loads((killed / "final_results.json").read_text())
            for key in ("best_gene", "best_perplexity", "best_generation", "history", "top_5", "counts"):
                if key == "counts":
                    same = {k: v for k, v in (a.get(key) or {}).items() if "second" not in k} == \
                           {k: v for k, v in (b.get(key) or {}).items() if "second" not in k}
                else:
                    same = a.get(key) == b.get(key)
                compared[key] = same
                if not same:
                    problems.append(f"{key} differs: uninterrupted {json.dumps(a.get(key))[:300]} vs resumed "
                                    f"{json.dumps(b.get(key))[:300]}")
        if problems:
            verdict, why = "fail", "; ".join(problems)
        else:
            why = f"killed after {' and '.join(map(str, kill_rows))} of {planned} stored rows; resumed result equals " \
                  f"the uninterrupted one " \
                  f"({', '.join(compared)})"
        return {"command": ["evo-attention", "search", *base, "--out", "DIR",
                            f"; kill -9 at >= {kill_at} stored rows (x{kills}, resuming between); ",
                            "evo-attention", "search", "--resume", "--no-check", "--out", "DIR", "--quiet"],
                "exit_code": r_resume["rc"], "seconds": round(time.monotonic() - t0, 2),
                "stderr_tail": tail_lines(r_resume["stderr"], 3), "outcome": label, "verdict": verdict, "why": why,
                "killed_after_rows": kill_rows, "rows_uninterrupted": planned}
    return special


# ---------------------------------------------------------------------------------------- the cases

def live_search(ctx):
    """A setup step: a slow search running in {case}/run (ended by the case's cleanup, by its pid)."""
    run = Path(ctx["case"]) / "run"
    argv = [EXE, "search", *STUDY[:-1], "--steps", "400", "--population", "4", "--generations", "3", "--elite", "1",
            "--keep-models", "0", "--no-check", "--quiet", "--out", str(run)]
    proc = subprocess.Popen(argv, cwd=ctx["cwd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def stop():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ctx.setdefault("cleanups", []).append(stop)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = store_rows(run / "run.db") if (run / "run.db").exists() else 0
        if isinstance(rows, int) and rows >= 1:
            break
        time.sleep(0.3)
    ctx["live_rows"] = store_rows(run / "run.db")
    ctx["live_proc"] = proc


def live_rows_kept(ctx, res):
    rows = store_rows(Path(ctx["case"]) / "run" / "run.db")
    alive = ctx["live_proc"].poll() is None
    problems = []
    if not isinstance(rows, int) or rows < ctx["live_rows"]:
        problems.append(f"the live run's store went from {ctx['live_rows']} rows to {rows}")
    if not alive:
        problems.append("the live search is no longer running")
    return "; ".join(problems) or None


def setup_files(**files):
    """A setup step writing {case}/NAME files (text may use {case} and fixtures)."""
    def step(ctx):
        for name, text in files.items():
            write(Path(ctx["case"]) / name.replace("__", "."), text.replace("{case}", ctx["case"]))
    return step


def define_cases() -> None:
    S = SEARCH
    # ---------------------------------------------------------------- 1. overwrite across kinds
    area = "overwrite / data loss"
    for kind in ("validate", "ablate", "compare", "curve"):
        case(f"ow-search-overwrite-{kind}-dir", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
             setup=[lambda ctx, k=kind: copy_fixture(ctx, k), snapshot("r", "run")],
             post=[unchanged("r", "run"), suggested_flags_exist],
             why=f"a {kind} directory is not a search: --overwrite must not delete its store or results")
    case("ow-search-into-validate-dir", area, cmd=["search", *S, "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "validate"), snapshot("r", "run")], post=[unchanged("r", "run")])
    case("ow-search-resume-validate-dir", area, cmd=["search", "--resume", "--out", "{case}/run", "--quiet"],
         setup=[lambda ctx: copy_fixture(ctx, "validate"), snapshot("r", "run")], post=[unchanged("r", "run")])
    case("ow-search-overwrite-saved-model", area, cmd=["search", *S, "--out", "{case}/run/model", "--overwrite"],
         setup=[lambda ctx: copy_fixture(ctx, "model"), snapshot("r", "run")], post=[unchanged("r", "run")],
         why="a saved model directory (baseline --save-model's OUT/model) is never replaced by a search")
    case("ow-search-into-saved-model", area, cmd=["search", *S, "--out", "{case}/run/model"],
         setup=[lambda ctx: copy_fixture(ctx, "model"), snapshot("r", "run")], post=[unchanged("r", "run")],
         why="documented: no output goes into a directory that holds a saved model (model.safetensors)")
    case("ow-search-into-hf-export", area, cmd=["search", *S, "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "exp_hf"), snapshot("r", "run")], post=[unchanged("r", "run")],
         why="documented: no output goes into a directory that holds a saved model (model.safetensors)")
    case("ow-validate-into-saved-model", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--out", "{case}/run/model"],
         setup=[lambda ctx: copy_fixture(ctx, "model"), snapshot("r", "run")], post=[unchanged("r", "run")])
    case("ow-curve-into-hf-export", area,
         cmd=["curve", *CURVE, "--genes", "baseline,linear", "--knob", "pairs=2,4", "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "exp_hf"), snapshot("r", "run")], post=[unchanged("r", "run")])
    case("ow-search-overwrite-baseline-out", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
         setup=[lambda ctx: copy_fixture(ctx, "model"), snapshot("r", "run")], post=[unchanged("r", "run")],
         expect="ok-or-refused", why="a baseline's output (result.json, model/): refused or left intact")
    case("ow-search-overwrite-hf-export", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
         setup=[lambda ctx: copy_fixture(ctx, "exp_hf"), snapshot("r", "run")], post=[unchanged("r", "run")],
         why="an export (model.safetensors) is never replaced by a search")

    def results_copy(ctx):
        """A folder with a validation's and a compare's result files, but no store (a results/ folder)."""
        d = Path(ctx["case"]) / "run"
        d.mkdir()
        for fixture, names in (("validate", ("validation.json", "validation.md")),
                               ("compare", ("compare_results.json", "compare.md"))):
            for n in names:
                shutil.copy(Path(ctx[f"fix_{fixture}"]) / n, d / n)
    case("ow-search-into-foreign-results", area, cmd=["search", *S, "--out", "{case}/run"],
         setup=[results_copy, snapshot("r", "run")], expect="ok-or-refused", post=[unchanged("r", "run")],
         why="a folder of other commands' result files (no store): either refused or left intact")
    case("ow-search-overwrite-foreign-results", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
         setup=[results_copy, snapshot("r", "run")], expect="ok-or-refused", post=[unchanged("r", "run")],
         why="--overwrite replaces a search; other commands' result files must survive or be refused")

    def search_plus_notes(ctx):
        d = copy_fixture(ctx, "search")
        write(d / "my-notes.txt", "precious notes\n")
    case("ow-search-overwrite-search-keeps-user-file", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
         setup=[search_plus_notes], expect="ok-or-refused",
         post=[exists("run/my-notes.txt"), stderr_has("delete", label="what --overwrite deletes")],
         why="--overwrite replaces the run; a file the user put there is not the run's")
    case("ow-search-overwrite-search", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
         setup=[lambda ctx: copy_fixture(ctx, "search")], expect="ok",
         post=[stderr_has("deleted", label="that the earlier search is deleted"), rows_are("run/run.db", 3)],
         why="replacing a search by a search is allowed and says what it deletes")
    def no_stale_validation(ctx, res):
        run = Path(ctx["case"]) / "run"
        if res["rc"] != 0:
            return None
        stale = (run / "validation.json").exists() and "Validated:" in (run / "report.md").read_text()
        return ("the old run's validation.json (its trainings deleted with the old store) is left in the new run, "
                "and the new run's report.md presents it as this run's validation ('Validated: ...')") if stale else None
    case("ow-search-overwrite-search-with-validation", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
         setup=[lambda ctx: copy_fixture(ctx, "searchv")], expect="ok-or-refused", post=[no_stale_validation],
         why="the store also holds a validate --from-run's trainings and validation.json: the new run must not "
             "report the old run's validation as its own")
    case("ow-search-no-overwrite-on-search", area, cmd=["search", *S, "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")], post=[unchanged("r", "run")],
         names=("resume", "overwrite"))
    case("ow-resume-and-overwrite", area, cmd=["search", *S, "--out", "{case}/run", "--resume", "--overwrite"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")], post=[unchanged("r", "run")],
         why="--resume and --overwrite contradict each other")
    for src, fmt_, label in (("exp_hf", "standalone", "standalone-over-hf"), ("exp_sa", "hf", "hf-over-standalone"),
                             ("exp_hfa", "standalone", "standalone-over-hf-attention"),
                             ("exp_hf", "hf-attention", "hf-attention-over-hf"),
                             ("exp_sa", "hf-attention", "hf-attention-over-standalone"),
                             ("validate", "standalone", "standalone-over-validate"),

                             ("search", "standalone", "standalone-over-search-run")):
        case(f"ow-export-{label}", area,
             cmd=["export", "--from-run", "{fix_searchk}", "--format", fmt_, "--out", "{case}/out"],
             setup=[lambda ctx, s=src: copy_fixture(ctx, s, "out"), snapshot("o", "out")],
             post=[unchanged("o", "out")], why="an export replaces only an earlier export of its own format")
    case("ow-export-hf-over-saved-model", area,
         cmd=["export", "--from-run", "{fix_searchk}", "--format", "hf", "--out", "{case}/out/model"],
         setup=[lambda ctx: copy_fixture(ctx, "model", "out"), snapshot("o", "out")],
         post=[unchanged("o", "out")], why="export refuses any other model directory (documented)")
    case("ow-export-hf-into-baseline-out", area,
         cmd=["export", "--from-run", "{fix_searchk}", "--format", "hf", "--out", "{case}/out"],
         setup=[lambda ctx: copy_fixture(ctx, "model", "out"), snapshot("o", "out")], expect="ok-or-refused",
         post=[unchanged("o", "out")], why="a baseline's output folder (result.json, model/): refused or left intact")
    case("ow-export-same-format-again", area,
         cmd=["export", "--from-run", "{fix_searchk}", "--format", "hf", "--out", "{case}/out"],
         setup=[lambda ctx: copy_fixture(ctx, "exp_hf", "out")], expect="ok",
         why="an earlier export of the same format is written again (documented)")

    def searchk_copy(ctx):
        copy_fixture(ctx, "searchk")
        snapshot("r", "run")(ctx)
    case("ow-export-into-run-models", area,
         cmd=["export", "--from-run", "{case}/run", "--out", "{case}/run/models"], setup=[searchk_copy],
         post=[unchanged("r", "run")], why="models/ is part of the run (the kept models)")
    case("ow-export-into-kept-model", area,
         cmd=lambda ctx: ["export", "--from-run", "{case}/run", "--out",
                          str(next((Path(ctx["case"]) / "run" / "models").iterdir()))],
         setup=[searchk_copy], post=[unchanged("r", "run")], why="the model it exports is its input")
    case("ow-export-into-run-checkpoints", area,
         cmd=["export", "--from-run", "{case}/run", "--out", "{case}/run/checkpoints"], setup=[searchk_copy],
         post=[unchanged("r", "run")], why="checkpoints/ is part of the run directory (rebuilt from its store)")
    case("ow-export-into-run-dir", area, cmd=["export", "--from-run", "{case}/run", "--out", "{case}/run"],
         setup=[searchk_copy], post=[unchanged("r", "run")])
    case("ow-validate-into-search-dir", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")], post=[unchanged("r", "run")],
         why="without --from-run, validate keeps its own store: a search's store is not its kind")
    case("ow-curve-into-compare-dir", area,
         cmd=["curve", *CURVE, "--genes", "baseline,linear", "--knob", "pairs=2,4", "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "compare"), snapshot("r", "run")], post=[unchanged("r", "run")])
    case("ow-compare-into-ablate-dir", area,
         cmd=["compare", *STUDY, "--configs", "baseline,linear", "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "ablate"), snapshot("r", "run")], post=[unchanged("r", "run")])
    case("ow-baseline-save-model-into-search", area, cmd=["baseline", *STUDY, "--save-model", "--out", "{case}/run"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")], post=[unchanged("r", "run")])
    case("ow-report-compare-out-is-input", area,
         cmd=["report", "{case}/a", "{fix_search}", "--out", "{case}/a"],
         setup=[lambda ctx: copy_fixture(ctx, "search", "a"), snapshot("a", "a")], post=[unchanged("a", "a")])
    case("ow-optuna-journal-onto-run-db", area,
         cmd=["report", "{case}/run", "--optuna-journal", "{case}/run/run.db"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")],
         post=[unchanged("r", "run"), rows_are("run/run.db", 3)])
    case("ow-optuna-journal-onto-results-json", area,
         cmd=["report", "{case}/run", "--optuna-journal", "{case}/run/final_results.json"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")], post=[exists("run/final_results.json")])
    case("ow-live-run-overwrite", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"], setup=[live_search],
         post=[live_rows_kept], names=("process", "in use"),
         why="documented: --overwrite of a live run is refused naming the holder")
    case("ow-live-run-resume", area, cmd=["search", "--resume", "--out", "{case}/run", "--quiet"], setup=[live_search],
         post=[live_rows_kept], names=("process", "in use"))
    case("ow-live-run-status", area, cmd=["status", "{case}/run"], setup=[live_search], expect="ok",
         post=[live_rows_kept, stderr_has("running", label="that the run is running")])
    case("ow-export-rank-zero", area, cmd=["export", "--from-run", "{fix_searchk}", "--rank", "0", "--out", "{case}/out"],
         names=("rank",))
    case("ow-export-rank-beyond-kept", area,
         cmd=["export", "--from-run", "{fix_searchk}", "--rank", "9", "--out", "{case}/out"], names=("rank", "9"))
    case("ow-export-from-run-without-models", area,
         cmd=["export", "--from-run", "{fix_search}", "--out", "{case}/out"], names=("keep-models", "model"))
    case("ow-validate-from-run-validate-dir", area,
         cmd=["validate", "--from-run", "{case}/run", "--seeds", "2", "--quiet"],
         setup=[lambda ctx: copy_fixture(ctx, "validate"), snapshot("r", "run")], post=[unchanged("r", "run")],
         names=("search", "validate"))
    case("ow-optuna-journal-is-directory", area, cmd=["report", "{case}/run", "--optuna-journal", "{case}/jdir"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), lambda ctx: write(Path(ctx["case"]) / "jdir" / "keep.txt", "k\n")],
         post=[exists("jdir/keep.txt")], names=("jdir", "journal"))
    case("ow-out-empty-string", area, cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--out", ""])
    case("ow-out-is-a-file", area, cmd=["search", *S, "--out", "{case}/file.txt"],
         setup=[setup_files(file__txt="keep me\n"), snapshot("c", ".")], post=[unchanged("c", ".")])
    case("ow-out-under-a-file", area, cmd=["compare", *STUDY, "--configs", "baseline", "--out", "{case}/file.txt/sub"],
         setup=[setup_files(file__txt="keep me\n")])

    # ---------------------------------------------------------------- 2. program text
    area = "program text"
    B = ["baseline", *STUDY, "--out", "{case}/out", "--gene"]
    case("prog-control-vanilla-program", area, cmd=[*B, "prog=" + VANILLA_PROG], expect="ok",
         why="control: the vanilla program trains")
    case("prog-deep-shift-300", area, cmd=[*B, prog_with_v("shift(" * 300 + "v" + ")" * 300)],
         expect="ok-or-refused", why="300 nested shifts: train it or refuse it in one line, never a RecursionError")
    case("prog-deep-neg-3001", area, cmd=[*B, prog_with_v("neg(" * 3001 + "v" + ")" * 3001)],
         expect="ok-or-refused", why="canonical form drops neg(neg(a)): deep recursion must not crash")
    case("prog-deep-scale-1500-search", area,
         cmd=["search", *S, "--out", "{case}/run", "--start-from", prog_with_v("scale(" * 1500 + "v" + ")" * 1500)],
         expect="ok-or-refused", why="a huge program through --start-from")
    case("prog-huge-add-chain", area,
         cmd=[*B, prog_with_v("add(shift(" * 400 + "v" + "),v)" * 400)],
         expect="ok-or-refused", why="a 800-op program: a size limit or a training, in one piece")
    long_list = ",".join([GATE, SPARSE, "dot|softmax|none|learned|bias|0.10", "dot|entmax15|none|fixed|bias|0.10",
                          "cosine|softmax|none|fixed|bias|0.10", "dot|relu_norm|none|fixed|bias|0.10",
                          "dot|sigmoid|none|fixed|bias|0.10", "dot|softmax|highway|fixed|bias|0.10"])
    case("prog-start-from-long-gene-list", area, cmd=["search", *S, "--out", "{case}/run", "--start-from", long_list],
         expect="ok", why=f"eight valid gene strings ({len(long_list)} characters) through --start-from")
    case("prog-init-from-long-text", area, cmd=["search", *S, "--out", "{case}/run", "--init-from", "x" * 300],
         names=("init-from",), why="a 300-character --init-from that is no directory: one line")
    case("prog-unclosed-paren", area, cmd=[*B, "prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),v)"], names=("prog", "paren", ")"))
    case("prog-extra-close-paren", area, cmd=[*B, "prog=" + VANILLA_PROG + ")"])
    case("prog-const-1e400", area, cmd=[*B, prog_with_v("mul(v,1e400)")],
         why="1e400 is infinite in floating point: a non-finite constant is refused, not silently clipped")
    case("prog-const-inf", area, cmd=[*B, prog_with_v("mul(v,inf)")])
    case("prog-const-nan", area, cmd=[*B, prog_with_v("add(v,nan)")])
    case("prog-const-hex", area, cmd=[*B, prog_with_v("mul(v,0x10)")], why="0x10 is not a number of the language")
    case("prog-const-neg-zero", area, cmd=[*B, prog_with_v("add(v,-0)")], expect="ok-or-refused")
    case("prog-const-1e-400", area, cmd=[*B, prog_with_v("mul(v,1e-400)")], expect="ok-or-refused",
         why="underflows to 0: mul(v,0)")
    case("prog-unknown-op", area, cmd=[*B, prog_with_v("frobnicate(v)")], names=("frobnicate",))
    case("prog-wrong-arity", area, cmd=[*B, "prog=o(mix(w.softmax(t.fixed(s.dot(q,k)))))"], names=("mix",))
    case("prog-wrong-type", area, cmd=[*B, "prog=o(mix(s.dot(q,k),v))"], names=("mix",))
    case("prog-root-not-x", area, cmd=[*B, "prog=mix(w.softmax(t.fixed(s.dot(q,k))),v)"])
    case("prog-empty", area, cmd=[*B, "prog="], names=("prog",))
    case("prog-shift-negative-arg", area, cmd=[*B, prog_with_v("shift(v,-1)")],
         why="a shift towards the future is not expressible: refused as wrong arity")
    case("prog-unknown-input", area, cmd=[*B, prog_with_v("future_v")])
    case("prog-with-spaces", area, cmd=[*B, "prog=o( mix( w.softmax(t.fixed(s.dot(q, k))), v ) )"],
         expect="ok-or-refused")
    case("prog-beside-components", area, cmd=[*B, "dot|sparsemax|output_gate|learned|prog=" + VANILLA_PROG],
         expect="ok-or-refused", why="a program with non-default components: rule program-replaces-components")
    case("prog-validate-genes-unclosed", area,
         cmd=["validate", *STUDY, "--seeds", "2", "--out", "{case}/out", "--genes", "prog=o(mix(v"])
    case("prog-start-from-unclosed", area, cmd=["search", *S, "--out", "{case}/run", "--start-from", "prog=o(mix(v"],
         post=[absent("run/run.db")])
    for label, yaml_value, exp in (("false", "false", "ok-or-refused"), ("ops-int", "{ops: 5}", "refused"),
                                   ("max-nodes-0", "{max_nodes: 0}", "refused"),
                                   ("max-nodes-negative", "{max_nodes: -3}", "refused"),
                                   ("max-nodes-float", "{max_nodes: 2.5}", "refused"),
                                   ("max-nodes-huge", "{max_nodes: 1000000000}", "ok-or-refused"),
                                   ("ops-unknown", "{ops: [o, frobnicate]}", "refused"),
                                   ("ops-empty", "{ops: []}", "refused"),
                                   ("unknown-key", "{max_nodez: 12}", "refused"),
                                   ("string", "'o(mix(v'", "refused")):
        case(f"prog-config-program-{label}", area,
             cmd=["search", *S, "--out", "{case}/run", "--config", "{case}/c.yaml"],
             setup=[setup_files(c__yaml=f"search_space:\n  program: {yaml_value}\n")], expect=exp,
             why="search_space.program from a --config file")
    case("prog-config-start-from-bad", area, cmd=["search", *S, "--out", "{case}/run", "--config", "{case}/c.yaml"],
         setup=[setup_files(c__yaml="start_from: 'prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),v)'\n")],
         names=("start_from", "c.yaml", "prog"))

    # ---------------------------------------------------------------- 3. config and flag values
    area = "config / flags"
    O = ["--out", "{case}/run"]
    flag_cases = [
        ("steps-negative", ["--steps", "-5"], "refused", ("steps",)),
        ("steps-zero", ["--steps", "0"], "refused", ("steps",)),
        ("steps-huge", ["--steps", "10000000000"], "refused", ("steps",)),
        ("steps-float", ["--steps", "3.5"], "refused", ("steps",)),
        ("population-zero", ["--population", "0"], "refused", ("population",)),
        ("population-negative", ["--population", "-2"], "refused", ("population",)),
        ("elite-equals-population", ["--population", "2", "--elite", "2"], "ok-or-refused", ("elite",)),
        ("elite-above-population", ["--population", "2", "--elite", "3"], "refused", ("elite",)),
        ("elite-negative", ["--elite", "-1"], "refused", ("elite",)),
        ("generations-zero", ["--generations", "0"], "ok-or-refused", ("generations",)),
        ("seed-negative", ["--seed", "-1"], "refused", ("seed",)),
        ("seed-huge", ["--seed", "99999999999999999999"], "refused", ("seed",)),
        ("seed-max-boundary", ["--seed", str(2**63 - 1)], "ok-or-refused", ("seed",)),
        ("elite-seeds-zero", ["--elite-seeds", "0"], "refused", ("elite-seeds",)),
        ("elite-seeds-multiobjective", ["--elite-seeds", "3", "--objectives", "perplexity,params"], "refused",
         ("elite-seeds", "objectives")),
        ("elite-seeds-halving", ["--elite-seeds", "3", "--fidelity", "halving"], "refused", ("elite-seeds", "fidelity")),
        ("start-from-nonsense", ["--start-from", "nonsense"], "refused", ("start-from", "nonsense")),
        ("start-from-empty-dir", ["--start-from", "{case}/empty"], "refused", ("start-from", "empty")),
        ("start-from-validate-dir", ["--start-from", "{fix_validate}"], "refused", ("start-from", "validate")),
        ("start-from-run-k-zero", ["--start-from", "{fix_search}:0"], "refused", ("start-from", ":0", "0")),
        ("init-from-and-start-from", ["--init-from", "{fix_search}", "--start-from", "vanilla"], "refused",
         ("init-from", "start-from")),
        ("init-from-nonexistent", ["--init-from", "{case}/nope"], "refused", ("init-from", "nope")),
        ("strategy-unknown", ["--strategy", "annealing"], "refused", ("strategy", "annealing")),
        ("data-unknown", ["--data", "imagenet"], "refused", ("data", "imagenet")),
        ("data-mqar-pairs-negative", ["--data", "mqar:pairs=-1"], "refused", ("pairs",)),
        ("data-mqar-pairs-text", ["--data", "mqar:pairs=abc"], "refused", ("pairs",)),
        ("data-mqar-unknown-knob", ["--data", "mqar:bogus=3"], "refused", ("bogus",)),
        ("data-mad-unknown-task", ["--data", "mad:unknown"], "refused", ("unknown",)),
        ("data-mqar-seqlen-huge", ["--data", "mqar", "--seq-len", "2000000"], "refused", ("seq",)),
        ("lr-zero", ["--lr", "0"], "ok-or-refused", ("lr",)),
        ("lr-negative", ["--lr", "-1"], "refused", ("lr",)),
        ("lr-nan", ["--lr", "nan"], "refused", ("lr",)),
        ("lr-inf", ["--lr", "inf"], "refused", ("lr",)),
        ("workers-zero", ["--workers", "0"], "refused", ("workers",)),
        ("workers-negative", ["--workers", "-2"], "refused", ("workers",)),
        ("device-cuda-on-cpu", ["--device", "cuda"], "refused", ("cuda", "device")),
        ("device-cuda7", ["--device", "cuda:7"], "refused", ("cuda", "device")),
        ("device-unknown", ["--device", "tpu"], "refused", ("tpu", "device")),
        ("precision-fp8", ["--precision", "fp8"], "refused", ("precision",)),
        ("heads-not-dividing", ["--d-model", "15", "--heads", "2"], "refused", ("heads", "d-model", "d_model")),
        ("heads-zero", ["--heads", "0"], "refused", ("heads",)),
        ("dropout-above-one", ["--dropout", "1.5"], "refused", ("dropout",)),
        ("batch-size-zero", ["--batch-size", "0"], "refused", ("batch-size",)),
        ("vocab-size-zero", ["--vocab-size", "0"], "refused", ("vocab",)),
        ("mutation-rate-above-one", ["--mutation-rate", "2"], "refused", ("mutation-rate",)),
        ("crossover-rate-negative", ["--crossover-rate", "-0.5"], "refused", ("crossover-rate",)),
        ("keep-models-negative", ["--keep-models", "-1"], "refused", ("keep-models",)),
        ("objectives-not-perplexity-first", ["--objectives", "params"], "refused", ("objectives",)),
        ("objectives-unknown", ["--objectives", "perplexity,beauty"], "refused", ("beauty", "objectives")),
        ("max-params-text", ["--max-params", "lots"], "refused", ("max-params",)),
        ("max-params-zero", ["--max-params", "0"], "refused", ("max-params",)),
        ("halving-eta-one", ["--fidelity", "halving", "--halving-eta", "1"], "refused", ("eta",)),
        ("halving-rungs-zero", ["--fidelity", "halving", "--halving-rungs", "0"], "refused", ("rungs",)),
        ("short-conv-nine", ["--short-conv", "9"], "refused", ("short-conv",)),
        ("warmup-fraction-two", ["--lr-schedule", "cosine", "--warmup-fraction", "2"], "refused", ("warmup",)),
        ("eval-steps-negative", ["--eval-steps", "-1"], "refused", ("eval-steps",)),
        ("genome-unknown", ["--genome", "per_head"], "refused", ("genome", "per_head")),
        ("baseline-gene-bogus", ["--baseline-gene", "dot|bogus"], "refused", ("bogus", "baseline")),
        ("plugin-missing", ["--plugin", "no_such_plugin_module_xyz"], "refused", ("no_such_plugin_module_xyz",)),
        ("precision-fp16-on-cpu", ["--precision", "fp16"], "refused", ("fp16",)),
        ("data-dir-on-recall", ["--data-dir", "{case}"], "refused", ("data-dir",)),
    ]
    wrong_flag = {"start-from-empty-dir": "--init-from", "start-from-validate-dir": "--init-from"}
    for label, flags, exp, names in flag_cases:
        post = [absent("run/run.db")] if exp == "refused" else []
        if label in wrong_flag:
            post.append(not_in_message(wrong_flag[label], "the user typed --start-from, not that flag "
                                                          "(reliability.md: messages speak in the words the user wrote)"))
        setup = [lambda ctx: (Path(ctx["case"]) / "empty").mkdir()] if "{case}/empty" in flags else None
        case(f"flag-{label}", area, cmd=["search", *S, *O, *flags], expect=exp, names=names if exp == "refused" else (),
             post=post, setup=setup)
    vocab_huge = ["search", *S, *O, "--data", "mqar:vocab=99999999"]
    case("flag-data-mqar-vocab-huge-ulimit-4g", area, cmd=vocab_huge, ulimit_kb=4_000_000, names=("vocab",),
         post=[absent("run/run.db")], why="documented: refused by the memory estimate, also under ulimit -v 4000000")
    case("flag-data-mqar-vocab-huge-ulimit-17g", area, cmd=vocab_huge, ulimit_kb=17_000_000, names=("vocab",),
         post=[stderr_has("needs about", label="a refusal by the estimate before the build ('needs about ...'), "
                                                "not a failed allocation after it"), absent("run/run.db")],
         why="the memory estimate must refuse before the build whatever the limit. Before commit cb623c6 the same "
             "command without a limit grew to 23 GB RSS on this 23 GB machine and was killed by the kernel's OOM "
             "killer after 198 s (exit -9, no message, run/run.db left behind), and under a 17 GB limit it failed "
             "after 102 s ('could not be built (the allocation failed)'); the limit keeps the sweep safe should it "
             "regress")
    case("flag-validate-seed-at-max", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--seed", str(2**63 - 1), *O],
         expect="ok-or-refused", why="seeds seed+1 .. seed+N pass 2^63-1: a one-line refusal or a run, no traceback")
    case("flag-search-seed-at-max-with-check", area,
         cmd=["search", *STUDY, "--population", "2", "--generations", "1", "--elite", "1", "--keep-models", "0", *O,
              "--seed", str(2**63 - 1)],
         expect="ok-or-refused", why="the fresh-seed check at the end trains seeds above the search seed")
    case("flag-precision-fp16-nothing-created", area, cmd=["search", *S, "--out", "{case}/new/run", "--precision", "fp16"],
         post=[absent("new")], why="documented: refused before the run directory is created")
    case("flag-validate-seed-block-huge", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--seed-block", "9999999999999999", *O],
         names=("seed-block", "seed"))
    case("flag-validate-seed-block-negative", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--seed-block", "-1", *O], names=("seed-block",))
    case("flag-validate-lr-grid-nonsense", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--lr-grid", "fast,slow", *O], names=("lr-grid",))
    case("flag-validate-lr-grid-negative", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--lr-grid", "1e-3,-1", *O], names=("lr-grid",))
    case("flag-validate-lr-grid-empty", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--lr-grid", ",", *O], names=("lr-grid",))
    case("flag-validate-seeds-zero", area, cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "0", *O],
         names=("seeds",))
    case("flag-validate-confidence-one", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--confidence", "1", *O], names=("confidence",))
    case("flag-validate-margin-negative", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--margin", "-1%", *O], names=("margin",))
    case("flag-validate-margin-negative-equals", area,
         cmd=["validate", *STUDY, "--genes", SPARSE, "--seeds", "2", "--margin=-1%", *O], names=("margin",),
         why="the same value as --margin=-1% (argparse reads '--margin -1%' as a missing value)")
    case("flag-validate-genes-empty-entry", area, cmd=["validate", *STUDY, "--genes", f"{SPARSE},,", "--seeds", "2", *O],
         expect="ok-or-refused")
    case("flag-curve-knob-malformed", area, cmd=["curve", *CURVE, "--genes", "baseline", "--knob", "pairs", *O],
         names=("knob",))
    case("flag-curve-knob-unknown", area, cmd=["curve", *CURVE, "--genes", "baseline", "--knob", "colour=1,2", *O],
         names=("colour",))
    case("flag-compare-configs-unknown", area, cmd=["compare", *STUDY, "--configs", "baseline,warp_drive", *O],
         names=("warp_drive",))

    # config files
    for label, text, exp, names in (
            ("unknown-key", "populaton_size: 4\n", "refused", ("populaton_size",)),
            ("duplicate-key", "population_size: 2\npopulation_size: 3\n", "refused", ("population_size",)),
            ("float-population-overridden", "population_size: 4.5\n", "ok-or-refused", ()),
            ("list-not-mapping", "- population_size\n- 3\n", "refused", ("c.yaml", "mapping")),
            ("yaml-syntax", "population_size: [2\n", "refused", ("c.yaml",)),
            ("empty-file", "", "ok-or-refused", ()),
            ("suite-and-data", "suite: mad-cpu\ndata: recall\n", "refused", ("suite", "data")),
            ("bool-seed", "seed: true\n", "refused", ("seed",)),
            ("lr-string", "learning_rate: fast\n", "refused", ("learning_rate",)),
            ("search-space-empty-list", "search_space: {normalization: []}\n", "refused", ("normalization",))):
        case(f"config-{label}", area, cmd=["search", *S, *O, "--config", "{case}/c.yaml"],
             setup=[setup_files(c__yaml=text)], expect=exp, names=names if exp == "refused" else ())
    case("config-float-population", area,
         cmd=["search", *STUDY, "--generations", "1", "--elite", "1", "--keep-models", "0", "--no-check", *O,
              "--config", "{case}/c.yaml"],
         setup=[setup_files(c__yaml="population_size: 4.5\n")], names=("population_size", "c.yaml"),
         why="documented example: 'population_size must be a positive integer, got 4.5 (... config file c.yaml)'")
    case("config-missing-file", area, cmd=["search", *S, *O, "--config", "{case}/nope.yaml"], names=("nope.yaml",))
    case("config-is-directory", area, cmd=["search", *S, *O, "--config", "{case}"], names=("config",))

    # suites
    good_point = "  - task: mqar\n    knobs: {seq_len: 16, vocab: 16, pairs: 2, train_examples: 64, eval_examples: 32}\n"
    SU = ["search", *S, *O, "--suite", "{case}/s.yaml"]
    case("suite-control-valid", "suite files", cmd=SU, expect="ok",
         setup=[setup_files(s__yaml=f"suite: tiny\nsteps: 3\npoints:\n{good_point}")], why="control: a valid suite runs")
    for label, text, names in (
            ("duplicate-key", f"suite: tiny\nsteps: 3\nsteps: 4\npoints:\n{good_point}", ("steps",)),
            ("unknown-key", f"suite: tiny\nstepz: 3\npoints:\n{good_point}", ("stepz",)),
            ("unknown-point-key", f"suite: tiny\nsteps: 3\npoints:\n{good_point}    colour: red\n", ("colour",)),
            ("weight-zero", f"suite: tiny\nsteps: 3\npoints:\n{good_point}    weight: 0\n", ("weight",)),
            ("weight-negative", f"suite: tiny\nsteps: 3\npoints:\n{good_point}    weight: -1\n", ("weight",)),
            ("language-no-data-dir", "suite: tiny\nsteps: 3\npoints:\n  - task: text\n    knobs: {seq_len: 16}\n",
             ("data_dir",)),
            ("language-weight-zero", "suite: tiny\nsteps: 3\npoints:\n" + good_point +
             "  - task: text\n    data_dir: /work/shared/data/shakespeare\n    tokenizer: byte\n"
             "    knobs: {seq_len: 16}\n    weight: 0\n", ("weight",)),
            ("bad-knob", "suite: tiny\nsteps: 3\npoints:\n  - task: mqar\n    knobs: {seq_len: 16, vocab: 16, pairs: -4}\n",
             ("pairs",)),
            ("unknown-knob", "suite: tiny\nsteps: 3\npoints:\n  - task: mqar\n"
                             "    knobs: {seq_len: 16, vocab: 16, colour: 3}\n", ("colour",)),
            ("unknown-task", "suite: tiny\nsteps: 3\npoints:\n  - task: chess\n", ("chess",)),
            ("no-points", "suite: tiny\nsteps: 3\npoints: []\n", ("points",)),
            ("no-name", f"steps: 3\npoints:\n{good_point}", ("suite",)),
            ("steps-zero", f"suite: tiny\nsteps: 0\npoints:\n{good_point}", ("steps",)),
            ("duplicate-labels", "suite: tiny\nsteps: 3\npoints:\n" + good_point + "    label: a\n"
             + good_point.replace("pairs: 2", "pairs: 3") + "    label: a\n", ("label",)),
            ("not-yaml", "suite: [tiny\n", ("s.yaml",))):
        extra = {"unknown-key": [not_in_message("valid keys: --suite", "the file's key is 'suite'; the list names a "
                                                                       "flag in its place")],
                 "not-yaml": [not_in_message("--suite: [tiny", "the file holds 'suite: [tiny': the quoted YAML text "
                                                               "is rewritten with a flag's name")],
                 "language-no-data-dir": [not_in_message("got None", "the key is missing; say so, not 'None' "
                                                                     "(reliability.md: never 'it has None')")]}
        case(f"suite-{label}", "suite files", cmd=SU, setup=[setup_files(s__yaml=text)], names=names,
             post=[absent("run/run.db"), *extra.get(label, [])])
    case("suite-is-directory", "suite files", cmd=["search", *S, *O, "--suite", "{case}"], names=("suite",))
    case("suite-with-data", "suite files", cmd=["search", *S, *O, "--suite", "mad-cpu", "--data", "mqar"],
         names=("data", "suite"))

    # ---------------------------------------------------------------- 4. plans and studies
    area = "plans / studies"
    plan = (f"name: p\ncomparisons: ['{SPARSE}']\nmargin: 0.01\nalpha: 0.05\ntest: rule\nseeds: 2\n")
    V = ["validate", *STUDY, *O, "--plan"]
    case("plan-control-valid", area, cmd=[*V, "{case}/plan.yaml"], setup=[setup_files(plan__yaml=plan + "amendments: []\n")],
         expect="ok", why="control: a valid plan runs")
    case("plan-is-directory", area, cmd=[*V, "{case}"], names=("plan",))
    case("plan-missing-file", area, cmd=[*V, "{case}/nope.yaml"], names=("nope.yaml",))
    case("plan-duplicate-key", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan + "margin: 0.02\n")], names=("margin",))
    case("plan-amendment-in-future", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan + "amendments:\n  - time: 2099-01-01T00:00:00+00:00\n"
                                              "    reason: from the future\n    margin: 0.02\n")],
         names=("future", "2099", "amendment"))
    case("plan-amendment-bad-time", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan + "amendments:\n  - time: yesterday\n    reason: r\n    margin: 0.02\n")],
         names=("time", "yesterday"))
    case("plan-empty-comparisons", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan.replace(f"['{SPARSE}']", "[]"))], names=("comparisons",))
    case("plan-negative-margin", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan.replace("margin: 0.01", "margin: -0.01"))], names=("margin",))
    case("plan-alpha-two", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan.replace("alpha: 0.05", "alpha: 2"))], names=("alpha",))
    case("plan-seeds-zero", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan.replace("seeds: 2", "seeds: 0"))], names=("seeds",))
    case("plan-unknown-test", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan.replace("test: rule", "test: vibes"))], names=("test", "vibes"))
    case("plan-bad-gene", area, cmd=[*V, "{case}/plan.yaml"],
         setup=[setup_files(plan__yaml=plan.replace(SPARSE, "dot|bogus"))], names=("bogus",))
    case("plan-family-change-after-results", area, cmd=[*V, "{case}/plan2.yaml"],
         setup=[setup_files(plan__yaml=plan + "amendments: []\n",
                            plan2__yaml=plan.replace("margin: 0.01", "margin: 0.02") + "amendments: []\n"),
                lambda ctx: subprocess.run([EXE, *[fmt(ctx, a) for a in [*V, "{case}/plan.yaml"]]], cwd=ctx["cwd"],
                                           capture_output=True, timeout=TIMEOUT),
                snapshot("r", "run")],
         post=[unchanged("r", "run")], names=("amendment",), why="documented: a family change needs an amendment")
    case("curve-plan-with-genes", area,
         cmd=["curve", *CURVE, *O, "--plan", "{case}/cp.yaml", "--genes", "baseline"],
         setup=[setup_files(cp__yaml="name: c\ngenes: [baseline, linear]\nknob: pairs=2,4\nseeds: 2\n"
                                     "solve_threshold: 0.9\nalpha: 0.05\ntest: fisher\n")],
         names=("genes", "plan"), why="documented: --genes beside --plan is refused")
    case("study-run-nonexistent-plan", area, cmd=["study", "run", "{case}/nope.yaml"], names=("nope.yaml",))
    case("study-status-directory", area, cmd=["study", "status", "{case}"], names=("plan", "case"))
    case("study-report-nonexistent-plan", area, cmd=["study", "report", "{case}/nope.yaml"], names=("nope.yaml",))
    case("study-run-unregistered", area, cmd=["study", "run", "{case}/plan.yaml"],
         setup=[lambda ctx: shutil.copy(Path(__file__).resolve().parents[1] / "docs" / "study-example.yaml",
                                        Path(ctx["case"]) / "plan.yaml")],
         names=("regist",), post=[absent("runs")])
    case("study-register-outside-git", area, cmd=["study", "register", "{case}/plan.yaml"],
         setup=[lambda ctx: shutil.copy(Path(__file__).resolve().parents[1] / "docs" / "study-example.yaml",
                                        Path(ctx["case"]) / "plan.yaml")],
         names=("git", "allow-dirty", "commit"), post=[absent("plan.registration.json")])
    case("study-register-a-suite-file", area, cmd=["study", "register", "{case}/s.yaml", "--allow-dirty"],
         setup=[setup_files(s__yaml=f"suite: tiny\nsteps: 3\npoints:\n{good_point}")], names=("study",))
    case("study-run-set-malformed", area, cmd=["study", "run", "{case}/plan.yaml", "--set", "workers"],
         setup=[lambda ctx: shutil.copy(Path(__file__).resolve().parents[1] / "docs" / "study-example.yaml",
                                        Path(ctx["case"]) / "plan.yaml")], names=("set", "workers"))
    FC = ["fitness-check", *STUDY, *O]
    case("fitness-control-valid", area, cmd=[*FC, "--seeds", "2", "--lr", "1e-3"], expect="ok",
         why="control: a tiny fitness check runs")
    case("fitness-seeds-one", area, cmd=[*FC, "--seeds", "1", "--lr", "1e-3"], names=("seeds",))
    case("fitness-seeds-zero", area, cmd=[*FC, "--seeds", "0", "--lr", "1e-3"], names=("seeds",))
    case("fitness-lr-negative", area, cmd=[*FC, "--seeds", "2", "--lr", "-1"], names=("lr",))
    for label, spec, names in (("equals", "=", ("improvement",)), ("empty-gene", "x=", ("improvement", "x=")),
                               ("nonsense-gene", "x=nonsense", ("nonsense",)),
                               ("unknown-name", "teleport", ("teleport",)),
                               ("dangling-greater", f"x={GATE}>", ("improvement", ">")),
                               ("same-gene", f"x={GATE}>{GATE}", ("improvement", "same", "x"))):
        case(f"fitness-improvement-{label}", area, cmd=[*FC, "--seeds", "2", "--lr", "1e-3", "--improvement", spec],
             names=names)
    case("fitness-evaluations-zero", area, cmd=[*FC, "--seeds", "2", "--lr", "1e-3", "--evaluations", "0"],
         names=("evaluations",))
    case("fitness-evaluations-text", area, cmd=[*FC, "--seeds", "2", "--lr", "1e-3", "--evaluations", "a,b"],
         names=("evaluations",))

    # ---------------------------------------------------------------- 5. resume and store
    area = "resume / store"

    def damaged(mode):
        def step(ctx):
            d = copy_fixture(ctx, "search")
            db = d / "run.db"
            for side in ("run.db-wal", "run.db-shm"):
                (d / side).unlink(missing_ok=True)
            data = bytearray(db.read_bytes())
            if mode == "truncate":
                data = data[: len(data) // 3]
            elif mode == "garbage-middle":
                for i in range(2048, min(len(data), 2048 + 4096)):
                    data[i] = (i * 131 + 7) % 256
            elif mode == "garbage-all":
                data = bytearray(os.urandom(len(data)))
            elif mode == "empty":
                data = bytearray()
            db.write_bytes(bytes(data))
            ctx["db_size"] = len(data)
        return step

    for mode in ("truncate", "garbage-middle", "garbage-all", "empty"):
        exp = "ok-or-refused" if mode == "empty" else "refused"
        case(f"store-resume-{mode}", area, cmd=["search", "--resume", "--out", "{case}/run", "--quiet"],
             setup=[damaged(mode)], expect="refused", names=("run.db", "run") if mode != "empty" else (),
             post=[file_size_is("run/run.db", "db_size")], why="a damaged store: one line naming it, never deleted")
        case(f"store-status-{mode}", area, cmd=["status", "{case}/run"], setup=[damaged(mode)], expect=exp,
             post=[file_size_is("run/run.db", "db_size")])
        case(f"store-report-{mode}", area, cmd=["report", "{case}/run"], setup=[damaged(mode)], expect=exp,
             post=[file_size_is("run/run.db", "db_size")])
    case("store-search-no-flag-on-damaged", area, cmd=["search", *S, "--out", "{case}/run"],
         setup=[damaged("garbage-all")],
         post=[file_size_is("run/run.db", "db_size"),
               not_in_message("--overwrite", "reliability.md, run.db damaged: 'Nothing advises deleting it', and "
                                             "--overwrite deletes it (--resume, also advised, is refused as damaged)")])
    case("store-validate-from-damaged-run", area,
         cmd=["validate", "--from-run", "{case}/run", "--top", "1", "--seeds", "2", "--quiet"],
         setup=[damaged("garbage-middle")], post=[file_size_is("run/run.db", "db_size")])
    case("store-search-overwrite-damaged-validate", area, cmd=["search", *S, "--out", "{case}/run", "--overwrite"],
         setup=[lambda ctx: copy_fixture(ctx, "validate"),
                lambda ctx: (Path(ctx["case"]) / "run" / "run.db").write_bytes(os.urandom(8192)),
                snapshot("r", "run")],
         expect="ok-or-refused", post=[exists("run/validation.json")],
         why="a validate directory whose store is damaged: --overwrite of a search must not delete the validation")
    case("store-run-db-is-directory", area, cmd=["search", "--resume", "--out", "{case}/run", "--quiet"],
         setup=[lambda ctx: (Path(ctx["case"]) / "run" / "run.db").mkdir(parents=True)], names=("run.db",),
         why="run.db is a folder: the message should name it (not advise a search that is then refused)")
    case("store-run-db-is-directory-new-search", area, cmd=["search", *S, "--out", "{case}/run"],
         setup=[lambda ctx: (Path(ctx["case"]) / "run" / "run.db").mkdir(parents=True)], names=("run.db",),
         why="run.db is a folder: the message should name it (not advise --resume, which says there is no run)")
    case("resume-empty-dir", area, cmd=["search", "--resume", "--out", "{case}/run", "--quiet"],
         setup=[lambda ctx: (Path(ctx["case"]) / "run").mkdir()], names=("resume", "run"))
    case("resume-nonexistent-dir", area, cmd=["search", "--resume", "--out", "{case}/nope", "--quiet"],
         names=("nope",), post=[absent("nope")])
    case("resume-contradicting-population", area,
         cmd=["search", "--resume", "--out", "{case}/run", "--population", "5", "--quiet"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")], names=("population",),
         post=[unchanged("r", "run")])
    case("resume-other-keep-models", area,
         cmd=["search", "--resume", "--out", "{case}/run", "--keep-models", "3", "--quiet"],
         setup=[lambda ctx: copy_fixture(ctx, "search"), snapshot("r", "run")], names=("keep-models",),
         post=[unchanged("r", "run")], why="documented: another K on --resume is refused")
    case("resume-finished-run", area, cmd=["search", "--resume", "--out", "{case}/run", "--quiet"],
         setup=[lambda ctx: copy_fixture(ctx, "search")], expect="ok-or-refused", post=[rows_are("run/run.db", 3)],
         why="the run finished (started with --no-check): resuming it trains nothing, and ends with the "
             "uninterrupted run's result")
    case("resume-finished-run-no-check", area, cmd=["search", "--resume", "--no-check", "--out", "{case}/run", "--quiet"],
         setup=[lambda ctx: copy_fixture(ctx, "search")], expect="ok-or-refused", post=[rows_are("run/run.db", 3)],
         why="control for resume-finished-run: the same with --no-check repeated")
    case("status-nonexistent", area, cmd=["status", "{case}/nope"], names=("nope",))
    case("status-no-store", area, cmd=["status", "{case}"], names=("run", "store", "case"))
    case("status-a-file", area, cmd=["status", "{case}/f.txt"], setup=[setup_files(f__txt="x\n")],
         names=("not a directory", "is a file"),
         why="f.txt is a file: say so (advising 'search --out f.txt' leads to a refusal: not a directory)")
    case("status-validate-dir", area, cmd=["status", "{case}/run"], setup=[lambda ctx: copy_fixture(ctx, "validate")],
         expect="ok-or-refused")
    case("status-json-damaged", area, cmd=["status", "--json", "{case}/run"], setup=[damaged("garbage-middle")],
         post=[file_size_is("run/run.db", "db_size")])
    case("report-nonexistent", area, cmd=["report", "{case}/nope"], names=("nope",), post=[absent("nope")])
    case("report-no-store", area, cmd=["report", "{case}"], names=("run", "store", "case"))
    case("report-compare-study-with-search", area, cmd=["report", "{fix_search}", "{fix_compare}", "--out", "{case}/cmp"],
         names=("compare", "kind", "study"), why="documented: a study's store beside a search is refused")

    def readonly_run(ctx):
        d = copy_fixture(ctx, "search")
        ctx["snap_r"] = file_digests(d)
        freeze(d)
    case("readonly-report-journal-inside", area, cmd=["report", "{case}/run", "--optuna-journal", "{case}/run/optuna.log"],
         setup=[readonly_run], post=[unchanged("r", "run")],
         why="read-only run directory (chmod -w and chattr +i, as root): one line, nothing lost")
    case("readonly-report-journal-elsewhere", area, cmd=["report", "{case}/run", "--optuna-journal", "{case}/j.log"],
         setup=[readonly_run], expect="ok-or-refused", post=[unchanged("r", "run")],
         why="the journal's place is writable, the report's (the run directory) is not")
    case("readonly-report", area, cmd=["report", "{case}/run"], setup=[readonly_run], post=[unchanged("r", "run")],
         names=("write", "read-only", "permission", "writ"))
    case("readonly-status", area, cmd=["status", "{case}/run"], setup=[readonly_run], expect="ok",
         post=[unchanged("r", "run")], why="documented: status reads a run on read-only media")
    case("readonly-resume", area, cmd=["search", "--resume", "--out", "{case}/run", "--quiet"], setup=[readonly_run],
         post=[unchanged("r", "run")])
    case("readonly-validate-from-run", area,
         cmd=["validate", "--from-run", "{case}/run", "--top", "1", "--seeds", "2", "--quiet"], setup=[readonly_run],
         post=[unchanged("r", "run")])

    # ---------------------------------------------------------------- 6. the Python API
    area = "python API"
    api = [
        ("api-control-train", "data = tiny_data()\nrec = train_and_evaluate(gene, cfg, data)\nassert rec.status == 'ok', rec.status",
         "api-ok", ()),
        ("api-parse-int", "AttentionGene.parse(5)", "api-refused", ("text", "gene", "str")),
        ("api-parse-none", "AttentionGene.parse(None)", "api-refused", ("text", "gene", "str")),
        ("api-parse-list", "AttentionGene.parse(['dot', 'softmax'])", "api-refused", ("text", "gene", "str")),
        ("api-parse-bogus-component", "AttentionGene.parse('dot|bogus|none|fixed')", "api-refused", ("bogus",)),
        ("api-parse-empty", "AttentionGene.parse('')", "api-refused", ("gene", "empty", "''")),
        ("api-parse-deep-program", "AttentionGene.parse('prog=o(mix(w.softmax(t.fixed(s.dot(q,k))),' + 'neg(' * 5001 + 'v' + ')' * 5001 + '))')",
         "api-ok-or-refused", ("prog", "deep", "nodes", "size")),
        ("api-mutate-string", "gene.mutate('0.3')", "api-refused", ("mutation_rate",)),
        ("api-mutate-above-one", "gene.mutate(1.5)", "api-refused", ("mutation_rate",)),
        ("api-mutate-nan", "gene.mutate(float('nan'))", "api-refused", ("mutation_rate",)),
        ("api-mutate-rng-int", "gene.mutate(0.3, rng=5)", "api-refused", ("rng",)),
        ("api-crossover-string", "gene.crossover('x')", "api-refused", ("other",)),
        ("api-crossover-none", "gene.crossover(None)", "api-refused", ("other",)),
        ("api-random-space-string", "AttentionGene.random(space='big')", "api-refused", ("space",)),
        ("api-model-gene-int", "TinyTransformer(cfg, 5)", "api-refused", ("gene",)),
        ("api-model-spec-string", "TinyTransformer('cfg', gene)", "api-refused", ("spec", "config")),
        ("api-model-too-many-genes", "TinyTransformer(cfg, [gene, gene, gene])", "api-refused", ("gene", "layer")),
        ("api-model-1d-input", "m = TinyTransformer(cfg, gene)\nm(torch.randint(0, 16, (8,)))", "api-refused",
         ("shape", "dim", "[B, T]", "batch", "input", "idx")),
        ("api-model-float-input", "m = TinyTransformer(cfg, gene)\nm(torch.rand(2, 8))", "api-refused",
         ("dtype", "integer", "long", "token", "input", "idx")),
        ("api-model-too-long", "m = TinyTransformer(cfg, gene)\nm(torch.randint(0, 16, (2, 64)))", "api-refused",
         ("max_seq_len", "length", "seq", "positions")),
        ("api-model-token-out-of-vocab", "m = TinyTransformer(cfg, gene)\nm(torch.full((2, 8), 99))", "api-refused",
         ("vocab", "token", "99")),
        ("api-attention-heads-zero", "EvolvedAttention(32, 0, gene)", "api-refused", ("n_heads",)),
        ("api-attention-gene-int", "EvolvedAttention(32, 4, 5)", "api-refused", ("gene",)),
        ("api-attention-not-divisible", "EvolvedAttention(30, 4, gene)", "api-refused", ("d_model", "n_heads")),
        ("api-attention-float-dmodel", "EvolvedAttention(32.0, 4, gene)", "api-refused", ("d_model",)),
        ("api-attention-2d-input", "a = EvolvedAttention(32, 4, gene)\na(torch.randn(2, 32))", "api-refused",
         ("shape", "dimension", "input", "[B, T")),
        ("api-attention-wrong-width", "a = EvolvedAttention(32, 4, gene)\na(torch.randn(2, 8, 16))", "api-refused",
         ("d_model", "32", "16", "shape", "width")),
        ("api-train-data-string", "train_and_evaluate(gene, cfg, 'recall')", "api-refused", ("data",)),
        ("api-train-config-string", "train_and_evaluate(gene, 'cfg', tiny_data())", "api-refused", ("config",)),
        ("api-train-gene-int", "train_and_evaluate(7, cfg, tiny_data())", "api-refused", ("gene",)),
        ("api-train-seed-string", "train_and_evaluate(gene, cfg, tiny_data(), seed='1')", "api-refused", ("seed",)),
        ("api-train-steps-zero", "train_and_evaluate(gene, cfg, tiny_data(), steps=0)", "api-refused", ("steps",)),
        ("api-train-steps-negative", "train_and_evaluate(gene, cfg, tiny_data(), steps=-5)", "api-refused", ("steps",)),
        ("api-train-eval-split", "train_and_evaluate(gene, cfg, tiny_data(), eval_split='train')", "api-refused",
         ("eval_split", "train")),
        ("api-train-vocab-mismatch", "train_and_evaluate(gene, tiny_config(vocab_size=4), tiny_data())", "api-ok-or-refused",
         ("vocab",)),
        ("api-config-population-string", "Config(population_size='3')", "api-refused", ("population_size",)),
        ("api-config-elite-seeds-bool", "Config(elite_seeds=True)", "api-refused", ("elite_seeds",)),
        ("api-config-unknown-field", "Config(populaton_size=3)", "api-refused", ("populaton_size",)),
        ("api-config-lr-nan", "Config(learning_rate=float('nan'))", "api-refused", ("learning_rate",)),
        ("api-config-seed-negative", "Config(seed=-1)", "api-refused", ("seed",)),
        ("api-config-elite-above-population", "Config(population_size=2, elite_size=5)", "api-refused",
         ("elite_size", "population_size")),
        ("api-config-steps-float", "Config(train_steps=2.5)", "api-refused", ("train_steps",)),
        ("api-config-search-space-string", "Config(search_space='all')", "api-refused", ("search_space",)),
        ("api-fitness-config-string", "run_fitness_check('cfg')", "api-refused", ("config",)),
        ("api-fitness-seeds-one", "run_fitness_check(cfg, tiny_data(), seeds=1, lr=1e-3)", "api-refused", ("seeds",)),
        ("api-fitness-seeds-string", "run_fitness_check(cfg, tiny_data(), seeds='3', lr=1e-3)", "api-refused", ("seeds",)),
        ("api-fitness-evaluations-int", "run_fitness_check(cfg, tiny_data(), seeds=2, lr=1e-3, evaluations=5)",
         "api-refused", ("evaluations",)),
        ("api-fitness-evaluations-text", "run_fitness_check(cfg, tiny_data(), seeds=2, lr=1e-3, evaluations=['x'])",
         "api-refused", ("evaluations",)),
        ("api-fitness-improvement-equals", "run_fitness_check(cfg, tiny_data(), seeds=2, lr=1e-3, improvements=['='])",
         "api-refused", ("improvement",)),
        ("api-fitness-lr-negative", "run_fitness_check(cfg, tiny_data(), seeds=2, lr=-1)", "api-refused", ("lr",)),
        ("api-fitness-data-string", "run_fitness_check(cfg, 'recall', seeds=2, lr=1e-3)", "api-refused", ("data",)),
        ("api-fitness-lr-grid-string", "run_fitness_check(cfg, tiny_data(), seeds=2, lr_grid='1e-3')", "api-refused",
         ("lr_grid",)),
        ("api-load-suite-directory", "load_suite('/tmp')", "api-refused", ("suite", "/tmp")),
        ("api-load-suite-int", "load_suite(5)", "api-refused", ("suite", "name")),
        ("api-load-suite-none", "load_suite(None)", "api-refused", ("suite", "name")),
        ("api-register-op-bad-signature",
         "from evo_attention import register_op\nregister_op('zz', 'H=>H', 'learned', apply=lambda c, z: z, build=lambda s: None)",
         "api-refused", ("signature", "H=>H")),
        ("api-register-op-bad-kind",
         "from evo_attention import register_op\nregister_op('zz', 'H->H', 'magic', apply=lambda c, z: z)",
         "api-refused", ("kind", "magic")),
        ("api-register-normalization-not-callable",
         "from evo_attention import register_normalization\nregister_normalization('zz')(5)", "api-refused",
         ("callable", "function", "zz", "5")),
        ("api-load-data-bogus", "load_data('imagenet')", "api-refused", ("imagenet",)),
        ("api-load-data-seq-len-string", "load_data('recall', seq_len='16')", "api-refused", ("seq_len",)),
    ]
    for name, body, exp, names in api:
        case(name, area, py=body, expect=exp, names=names)

    # ---------------------------------------------------------------- 7. kill and resume
    area = "kill / resume"
    case("kill-resume-ga", area, special=kill_resume([], "kill-resume"),
         why="SIGKILL mid-run, --resume: final_results equal to an uninterrupted run")
    case("kill-resume-ga-population-4-twice", area, special=kill_resume([], "kill-resume", population=4, kill_at=3, kills=2),
         why="population 4 x 3 generations, SIGKILLed twice (the start and the first resume), then resumed")
    case("kill-resume-climb-racing", area, special=kill_resume(["--strategy", "climb", "--elite-seeds", "2"], "kill-resume"),
         why="the same with the climb strategy and racing (--elite-seeds 2)")


# ---------------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=False, help="write the results here")
    parser.add_argument("--scratch", default="/tmp/hostile/sweep")
    parser.add_argument("--only", help="a regular expression: run the cases whose name matches")
    parser.add_argument("--keep-fixtures", action="store_true", help="reuse fixtures already built in --scratch")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    define_cases()
    names = [c.name for c in CASES]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise SystemExit(f"duplicate case names: {sorted(dupes)}")
    if args.list:
        for c in CASES:
            print(f"{c.area:24} {c.name:48} {c.expect}")
        print(len(CASES), "cases")
        return 0
    cases = [c for c in CASES if not args.only or re.search(args.only, c.name)]
    scratch = Path(args.scratch)
    if scratch.exists() and not args.keep_fixtures:
        unfreeze(scratch)
        shutil.rmtree(scratch)
    (scratch / "cwd").mkdir(parents=True, exist_ok=True)
    # a cache of its own (tokenizations, probes, fitness checks): the sweep leaves the user's cache as it was
    os.environ["EVO_ATTENTION_CACHE_DIR"] = str(scratch / "cache")
    cwd = scratch / "cwd"
    t0 = time.monotonic()
    fixtures = build_fixtures(scratch / "fix", cwd, args.keep_fixtures)
    ctx = Ctx(scratch=str(scratch), cwd=str(cwd), **{f"fix_{k}": v for k, v in fixtures.items()})
    results = []
    for i, c in enumerate(cases, 1):
        rec = run_case(c, ctx, cwd)
        results.append(rec)
        mark = "PASS" if rec.get("verdict") == "pass" else "FAIL"
        print(f"[{i}/{len(cases)}] {mark} {c.name} ({rec.get('seconds', 0)} s): {rec.get('why', '')[:220]}", flush=True)
    failures = [r for r in results if r.get("verdict") != "pass"]
    summary = {"cases": len(results), "passes": len(results) - len(failures), "failures": len(failures),
               "seconds": round(time.monotonic() - t0, 1),
               "by_area": {a: {"cases": sum(r["area"] == a for r in results),
                               "failures": sum(r["area"] == a and r.get("verdict") != "pass" for r in results)}
                           for a in dict.fromkeys(r["area"] for r in results)}}
    print(f"\n{summary['cases']} cases: {summary['passes']} pass, {summary['failures']} fail "
          f"({summary['seconds']} s)")
    for r in failures:
        print(f"  FAIL {r['name']}: {r.get('why', '')[:300]}")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        version = subprocess.run([EXE, "--version"], capture_output=True, text=True).stdout.strip()
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1]).stdout.strip()
        out.write_text(json.dumps({
            "what": "hostile sweep of the evo-attention CLI and Python API (benchmarks/hostile_sweep.py)",
            "version": version, "commit": commit, "python": platform.python_version(),
            "machine": platform.machine(), "user_is_root": os.geteuid() == 0,
            "summary": summary, "cases": results}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
