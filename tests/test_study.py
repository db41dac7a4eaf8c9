"""``evo-attention study``: a registered study as one plan file (studies.study, studies.study_run).

Study 3 (docs/findings3/study3.yaml) reproduces every generated table and answer of docs/findings.md
from its committed files without training; plans that break their own rules are refused in one line
naming the rule; a plan changed after results without an amendment, and an amendment after the
results it changes, are refused; a tiny plan runs end to end, resumes after a kill without training
anything twice, is amended and reported."""

import csv
import io
import json
import os
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from evo_attention.cli import build_parser, main
from evo_attention.report.studies.study_tables import BLOCK
from evo_attention.search.store import RunStore
from evo_attention.studies.study import Runs, amend, check_registered, genes_of, load_study, parts, register
from evo_attention.studies.study_run import (check_document, commands, decide, report, run_study, status,
                                             unwritten_tables)
from evo_attention.util.errors import UserError

REPO = Path(__file__).resolve().parents[1]
STUDY3 = REPO / "docs" / "findings3" / "study3.yaml"
FINDINGS = REPO / "docs" / "findings.md"
GATE = "dot|softmax|output_gate|fixed|bias|0.10"
TINY = ["--data", "recall", "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2",
        "--batch-size", "4", "--eval-batch-size", "16", "--eval-steps", "2", "--quiet"]  # conftest's STUDY_FLAGS


def _blocks(text: str) -> set:
    return {(m["file"], m["table"], m["body"]) for m in BLOCK.finditer(text) if m["file"].startswith("docs/findings3/")}


def test_study3_report_reproduces_every_table_and_answer_of_findings_md():
    plan = load_study(STUDY3)
    text = report(plan)
    findings = FINDINGS.read_text(encoding="utf-8")
    assert len(_blocks(findings)) == 21 and _blocks(text) == _blocks(findings)
    assert check_document(plan, FINDINGS) == []
    assert (REPO / "docs" / "findings3" / "report.md").read_text(encoding="utf-8") == text  # committed: current
    decision = decide(plan)
    assert decision["D1"]["answers"] == {"answer": "not shown"} and len(decision["D1"]["words"]) == 3
    for words in decision["D1"]["words"].values():  # each of the 3 programs
        assert words == {"on-the-suite": "not shown better than softmax (worse)", "wikitext": "does not carry (worse)",
                         "wikitext-gate": "does not beat the gate", "shakespeare": "does not carry (worse)",
                         "shakespeare-gate": "does not beat the gate", "d1": "not shown"}
    assert decision["D2"]["answers"] == {"answer": "undetermined"}
    assert decision["D3"]["answers"] == {"answer": "no difference shown"}
    assert {w["feature"] for w in decision["D3"]["words"].values()} == {"no difference shown"}
    assert {c: w["gate"] for c, w in decision["D4"]["words"].items()} == {
        "tpp2": "helps", "tpp6": "undetermined", "tpp12": "undetermined", "seed": "undetermined"}
    trend = "the gate's advantage shrinks with tokens per parameter"
    assert decision["D4"]["answers"] == {"answer": "undetermined", "trend": trend}
    # the same words as the study's answers in docs/findings.md
    answers = {line[4:6]: line for line in findings.split("## Study 3: the answers")[1].splitlines()
               if line.startswith("- **D")}
    for q in ("D1", "D2", "D3", "D4"):
        assert f": {decision[q]['answers']['answer']}" in answers[q] and f"**{q}, answer: " in text
    assert f"**{trend}**" in findings and "each is not shown better\nthan softmax (`worse`)" in findings
    assert "no program carries to either corpus; each does not carry\n(worse)" in findings


def test_study3_runs_as_one_command_and_trains_nothing_its_files_hold_every_result():
    plan = load_study(STUDY3)

    def never(argv):
        raise AssertionError(f"trained: {argv}")

    assert run_study(plan, never, log=lambda line: None) == []
    assert all(line.endswith(("done", "done (2/2)", "done (3/3)", "done (4/4)", "done (6/6)", "done (20/20)"))
               for line in status(plan)[2:] if line.startswith("  "))


def test_every_command_of_study3_is_one_the_cli_takes():
    plan, parser = load_study(STUDY3), build_parser()
    runs, count = Runs(plan), 0
    for stage in (s for s in plan.stages if s.trains):
        for combo in runs.combos(stage):
            for _, argv, _ in commands(plan, runs, stage, combo, gpu=True):
                parser.parse_args(argv)
                count += 1
                on_gpu = stage.name.startswith("d1-validate") or combo.get("cell") == "seed"
                assert ("--device" in argv) == on_gpu, argv  # the CUDA rule: gpu_flags where a GPU is present
    assert count == 6 + 1 + 2 + 3 * 2 + 4 + 4 + 20 * 2 + 4 * 3


def test_the_example_plan_of_docs_studies_md_keeps_its_rules_and_its_commands_parse():
    plan, parser = load_study(REPO / "docs" / "study-example.yaml"), build_parser()
    assert [s.name for s in plan.stages] == ["tune", "plan", "verdict", "cells", "family"]
    runs = Runs(plan)
    for stage in (s for s in plan.stages if s.trains and s.name != "verdict"):  # the verdict reads a written plan
        for combo in runs.combos(stage):
            for _, argv, _ in commands(plan, runs, stage, combo):
                parser.parse_args(argv)


def test_study_check_finds_a_table_edited_by_hand_and_one_left_out(tmp_path, capsys):
    plan = load_study(STUDY3)
    text = FINDINGS.read_text(encoding="utf-8")
    doc = tmp_path / "findings.md"
    doc.write_text(text.replace("| 4e-3 | 0.9235 | **yes** |", "| 4e-3 | 0.9236 | **yes** |"))
    assert check_document(plan, doc) == [f"{doc}: docs/findings3/d1-rate/selected.json table=suite-rate differs from "
                                         "its file"]
    start = text.index("<!-- generated: docs/findings3/d3/rediscovery.json")
    doc.write_text(text[:start] + text[text.index("<!-- end generated -->", start) + 22:])
    assert check_document(plan, doc) == [f"{doc}: no table rediscovery of docs/findings3/d3/rediscovery.json"]
    assert main(["study", "check", str(STUDY3), str(doc)]) == 1
    assert "no table rediscovery" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ rules


def _write(path: Path, plan: dict) -> Path:
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def _command(name: str, *args, dir=None, **more) -> dict:
    return {"name": name, **({"dir": dir} if dir else {}), **more,
            "command": ["validate", "--genes", GATE, *TINY, *args, "--out", "{out}"]}


def _question(stages: list, blocks=(1,), **more) -> dict:
    return {"blocks": list(blocks), "stages": stages, "sources": {"v": f"{stages[-1].get('dir', stages[-1]['name'])}"
                                                                        "/validation.json"},
            "answers": {"answer": [{"say": "the gate helps", "if": ["v is better"]}, {"say": "undetermined"}]}, **more}


def _study(questions: dict, **more) -> dict:
    return {"study": "tiny", "out": "runs", "results": "results", "edge_rule": "note", **more, "questions": questions}


@pytest.mark.parametrize("questions, rule", [
    ({"Q1": _question([_command("a", "--seeds", 2, "--seed-block", 1)]),
      "Q2": _question([_command("b", "--seeds", 2, "--seed-block", 1)], blocks=(1, 2))},
     "the rule 'two questions may not share a seed block': block 1 is Q1's and Q2's"),
    ({"Q1": _question([_command("a", "--seeds", 2, "--seed-block", 1)], search_seeds=[7]),
      "Q2": _question([_command("b", "--seeds", 2, "--seed-block", 2)], blocks=(2,), search_seeds=[7])},
     "two questions may not share a search seed"),
    ({"Q1": _question([_command("a", "--seeds", 2, "--seed-block", 3)])}, "seeds come from the question's blocks"),
    ({"Q1": _question([_command("a", "--seeds", 2)])}, "draws the default seeds"),
    ({"Q1": _question([_command("a", "--seeds", 2, "--seed-block", 1, "--lr", "{rate:b}"),
                       _command("b", "--seeds", 2, "--seed-block", 1)])},
     "'a stage reads only earlier stages' results': stage a reads b"),
    ({"Q1": _question([_command("a", "--seed-block", 1), _command("b", "--seed-block", 1, dir="a")])},
     "each stage writes its own folder or file"),
    ({"Q1": {**_question([_command("a", "--seed-block", 1)]),
             "answers": {"answer": [{"say": "x", "if": ["v is better"]}]}}},
     "a decision always answers"),
    ({"Q1": _question([_command("a", "--seed-block", 1),
                       _command("b", "--seed-block", 1, dir="b/{k}", each={"k": [1, 2]}),
                       _command("a", "--seed-block", 1, dir="c")])},
     "'one name per stage': two stages are named a"),
])
def test_a_plan_that_breaks_its_own_rules_is_refused_in_one_line_naming_the_rule(tmp_path, capsys, questions, rule):
    path = _write(tmp_path / "plan.yaml", _study(questions))
    with pytest.raises(UserError, match="breaks the rule") as caught:
        load_study(path)
    assert rule in str(caught.value) and "\n" not in str(caught.value)
    assert main(["study", "status", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("evo-attention: error: study plan") and rule in err


FAMILY = {"kind": "family", "gene": GATE, "against": "baseline", "cells": {"c": "v/validation.json"}}
VERSUS = {"kind": "versus", "genes_of": "v/validation.json", "reference_file": "v/validation.json", "reference": GATE}
PLAN = {"kind": "plan", "genes_of": "v/validation.json", "seeds": 2, "seed_block": 1, "margin": 0.01}


def _computed(tmp_path: Path, **stage) -> Path:
    """A plan whose computed stage ``s`` (``stage``: its kind and keys) reads the validation of stage ``v``."""
    first = _command("v", "--seeds", 2, "--seed-block", 1)
    question = _question([first, {"name": "s", **stage}], sources={"v": "v/validation.json"})
    return _write(tmp_path / "plan.yaml", _study({"Q1": question}))


def test_a_plan_stages_bad_alpha_is_said_of_the_study_plan_not_of_a_plan_flag(tmp_path, capsys):
    path = _computed(tmp_path, **PLAN, alpha=1.5)
    assert main(["study", "status", str(path)]) == 2
    assert capsys.readouterr().err == (f"evo-attention: error: study plan {path}: stage s: alpha 1.5 must be a number "
                                       "in (0, 0.5)\n")


def test_a_study_plan_s_bad_amendment_time_is_said_of_the_study_plan_not_of_a_plan_flag(tmp_path, capsys):
    question = _question([_command("v", "--seeds", 2, "--seed-block", 1)])
    path = _write(tmp_path / "plan.yaml", _study({"Q1": question}, amendments=[{"time": "soon", "reason": "x"}]))
    assert main(["study", "status", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"evo-attention: error: study plan {path}: amendment 1 has time 'soon'")


@pytest.mark.parametrize("stage, says", [
    ({**FAMILY, "margin": "abc"}, "margin 'abc' must be a number in (0, 0.5)"),
    ({**FAMILY, "margin": 0}, "margin 0 must be a number in (0, 0.5)"),
    ({**FAMILY, "margin": -0.01}, "margin -0.01 must be a number in (0, 0.5)"),
    ({**FAMILY, "margin": 0.9}, "margin 0.9 must be a number in (0, 0.5)"),
    ({"kind": "family", "cells": {"c": "v/validation.json"}}, "a family stage fixes its gene (text)"),
    ({**FAMILY, "cells": ["v/validation.json"]}, "cells must be a mapping"),
    ({**FAMILY, "trend": {"c": 1}}, "trend must map at least two of its cells to a positive level"),
    ({**FAMILY, "cells": {"a": "v/validation.json", "b": "v/validation.json"}, "trend": {"a": 1, "b": "x"}},
     "trend must map at least two of its cells"),
    ({**FAMILY, "cells": {"a": "v/validation.json", "b": "v/validation.json"}, "trend": {"a": 1, "z": 2}},
     "trend must map at least two of its cells"),
    ({**FAMILY, "cells": {"a": "v/validation.json", "b": "v/validation.json"}, "trend": {"a": 0, "b": 2}},
     "trend must map at least two of its cells"),
    ({**VERSUS, "margin": 0.5}, "margin 0.5 must be a number in (0, 0.5)"),
    (VERSUS, "a versus stage fixes its margin"),
    ({"kind": "strategies", "searches": "v", "margin": 0}, "margin 0 must be a number in (0, 0.5)"),
    ({**PLAN, "top": "abc"}, "top 'abc' must be a whole number >= 1"),
    ({**PLAN, "top": 0}, "top 0 must be a whole number >= 1"),
    ({**PLAN, "top": -1}, "top -1 must be a whole number >= 1"),
    ({**PLAN, "top": 1.5}, "top 1.5 must be a whole number >= 1"),
    ({"kind": "suite", "suite": "mad-cpu", "data_seed": "three"}, "data_seed 'three' must be a whole number >= 0"),
    ({"kind": "suite", "data_seed": 1}, "a suite stage fixes its suite"),
    ({"kind": "suite", "suite": "nosuch-suite.yaml"}, "unknown suite '{root}/nosuch-suite.yaml': shipped suites are"),
])
def test_a_value_of_a_computed_stage_that_run_would_fail_on_is_refused_at_register(tmp_path, capsys, stage, says):
    path, says = _computed(tmp_path, **stage), says.format(root=tmp_path)
    with pytest.raises(UserError) as caught:
        load_study(path)
    assert str(caught.value).startswith(f"study plan {path}: stage s: {says}") and "\n" not in str(caught.value)
    assert main(["study", "register", "--allow-dirty", str(path)]) == 2
    assert capsys.readouterr().err == f"evo-attention: error: {caught.value}\n"
    assert not (tmp_path / "plan.registration.json").exists()


EXAMPLE = yaml.safe_load((REPO / "docs" / "study-example.yaml").read_text())


def _q(plan: dict, name: str) -> dict:
    return plan["questions"][name]


@pytest.mark.parametrize("change, says", [
    (lambda p: p.update(settings=[1]), "settings must be a mapping, not [1]"),
    (lambda p: p.update(vars=3), "vars must be a mapping, not 3"),
    (lambda p: p["vars"].update(model={"a": 1}), "vars.model must be text, a number or a list, not {'a': 1}"),
    (lambda p: p.update(out=["runs"]), "out must be text, not ['runs']"),
    (lambda p: _q(p, "Q1").update(sources=["verdict"]), "question Q1: sources must be a mapping, not ['verdict']"),
    (lambda p: _q(p, "Q1").update(tables={"file": "verdict/validation.json", "table": "verdicts"}),
     "question Q1: tables must be a list, not {'file': 'verdict/validation.json', 'table': 'verdicts'}"),
    (lambda p: _q(p, "Q1").update(tables=[{"table": "verdicts"}]), "question Q1: tables #1: a table fixes its file "
                                                                   "(text)"),
    (lambda p: _q(p, "Q2")["stages"].append({"name": "arms", "kind": "strategies"}),
     "stage arms: a strategies stage fixes its searches (text)"),
    (lambda p: _q(p, "Q2")["stages"].append({"name": "r", "kind": "rediscovery"}),
     "stage r: a rediscovery stage fixes its searches (a list)"),
    (lambda p: _q(p, "Q1")["stages"].append({"name": "vs", "kind": "versus", "genes_of": "tune/validation.json",
                                             "margin": 0.01}),
     "stage vs: a versus stage fixes its reference_file (text)"),
    (lambda p: _q(p, "Q1")["stages"][1].update(genes=GATE), f"stage plan: genes must be a list, not {GATE!r}"),
    (lambda p: _q(p, "Q1")["stages"][1].pop("genes_of"),
     "stage plan: a plan stage fixes its genes_of (text) or genes (a list)"),
    (lambda p: _q(p, "Q1")["answers"]["answer"][0].update({"if": "verdict is better"}),
     "question Q1, answer answer #1: if must be a list, not 'verdict is better'"),
    (lambda p: _q(p, "Q2")["words"].update(over=["cells"]), "question Q2: words.over must be text, not ['cells']"),
    (lambda p: _q(p, "Q1")["stages"][2].update(name=5), "question Q1: stage #3: name must be text, not 5"),
    (lambda p: _q(p, "Q2")["stages"][0]["command"].append("--x={model}"),
     "stage cells: {model} is a list: it stands only alone, as a whole word"),
])
def test_a_plan_of_the_wrong_shape_is_refused_by_every_command_in_one_line_naming_the_key(tmp_path, capsys, change,
                                                                                          says):
    plan = yaml.safe_load(yaml.safe_dump(EXAMPLE))
    change(plan)
    path = _write(tmp_path / "plan.yaml", plan)
    with pytest.raises(UserError) as caught:
        load_study(path)
    assert str(caught.value) == f"study plan {path}: {says}"
    for action in (["status"], ["register", "--allow-dirty"], ["amend", "--note", "x"], ["run"]):
        assert main(["study", *action, str(path)]) == 2
        assert capsys.readouterr().err == f"evo-attention: error: {caught.value}\n"


def _git(root: Path, *args) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=root, check=True,
                   capture_output=True)


def _committed(root: Path, plan: dict) -> Path:
    path = _write(root / "plan.yaml", plan)
    _git(root, "init", "-q")
    _git(root, "add", "plan.yaml")
    _git(root, "commit", "-qm", "the plan")
    return path


def test_registration_before_results_a_change_without_amendment_and_a_late_amendment_are_refused(tmp_path):
    stages = [_command("a", "--seeds", 2, "--seed-block", 1), _command("b", "--seeds", 2, "--seed-block", 1)]
    plan = _study({"Q1": _question(stages)})
    path = _write(tmp_path / "plan.yaml", plan)
    with pytest.raises(UserError, match="not committed"):  # outside a repository
        register(load_study(path))
    path = _committed(tmp_path, plan)
    (tmp_path / "results" / "a").mkdir(parents=True)
    (tmp_path / "results" / "a" / "validation.json").write_text("{}")  # stage a's result, made before registering
    os.utime(tmp_path / "results" / "a" / "validation.json", (time.time() - 3600, time.time() - 3600))
    with pytest.raises(UserError, match="stage a has results already"):
        register(load_study(path))
    record = register(load_study(path), after_results="a test: its result was there first")
    assert record["commit"] and not record["dirty"] and record["version"]
    with pytest.raises(UserError, match="registered already"):
        register(load_study(path))
    assert check_registered(load_study(path))
    # stage b has no results: changed without an amendment, refused; with one, taken
    plan["questions"]["Q1"]["stages"][1]["command"][-5] = 3
    _write(path, plan)
    with pytest.raises(UserError, match="differs from its registration in stage b and no amendment records it"):
        run_study(load_study(path), lambda argv: 0)
    assert amend(load_study(path), "three seeds for b")["amendments"][0]["changed"] == ["stage b"]
    assert check_registered(load_study(path))
    # the places (root, out, results) once anything has run: moved without an amendment or with one, refused
    for part, moved in (("root", {"root": "elsewhere"}), ("study", {"results": "elsewhere"})):
        _write(path, {**plan, **moved})
        with pytest.raises(UserError, match=f"differs from its registration in {part} and"):
            check_registered(load_study(path))
        with pytest.raises(UserError, match=f"changes {part}, whose results exist"):
            amend(load_study(path), "the results elsewhere")
    # stage a has results: an amendment of it comes after them, refused
    plan["questions"]["Q1"]["stages"][0]["command"][-5] = 3
    _write(path, plan)
    with pytest.raises(UserError, match="changes stage a, whose results exist"):
        amend(load_study(path), "three seeds for a")
    with pytest.raises(UserError, match="no amendment records it"):
        report(load_study(path))
    # an amendment recorded by hand, dated after the results it changes
    ledger = path.with_name("plan.registration.json")
    record = json.loads(ledger.read_text())
    record["amendments"].append({"time": "2099-01-01T00:00:00+00:00", "note": "late", "parts": parts(load_study(path)),
                                 "changed": ["stage a"]})
    ledger.write_text(json.dumps(record))
    with pytest.raises(UserError, match="in the future"):
        check_registered(load_study(path))
    record["amendments"][-1]["time"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    ledger.write_text(json.dumps(record))
    with pytest.raises(UserError, match="changes stage a, whose results were made before it"):
        check_registered(load_study(path))


def test_a_change_without_amendment_names_every_part_it_changes(tmp_path):
    stages = [_command(name, "--seeds", 2, "--seed-block", 1) for name in "abc"]
    plan = _study({"Q1": _question(stages)})
    register(load_study(_committed(tmp_path, plan)))
    for stage in stages:
        stage["command"][-5] = 3
    path = _write(tmp_path / "plan.yaml", plan)
    with pytest.raises(UserError, match="differs from its registration in stage a, stage b, stage c and no amendment"):
        run_study(load_study(path), lambda argv: 0)


def test_when_results_were_made_is_the_time_their_files_record_not_a_clone_s_file_times(tmp_path):
    stages = [_command("a", "--seeds", 2, "--seed-block", 1), _command("b", "--seeds", 2, "--seed-block", 1)]
    plan = _study({"Q1": _question(stages)})
    path = _committed(tmp_path, plan)
    record = register(load_study(path))
    now = time.time()
    hour = lambda h: datetime.fromtimestamp(now - h * 3600, timezone.utc).isoformat(timespec="seconds")
    folder = tmp_path / "results" / "a"  # stage a's files as a clone holds them: made hours ago, file times now
    folder.mkdir(parents=True)
    (folder / "validation.json").write_text(json.dumps({"created_at": hour(3)}))
    (folder / "times.json").write_text(json.dumps({"roles": {"validate": {"first_stored": hour(4)}}}))
    (folder / "evaluations.csv").write_text(f"id,created_at\n1,{hour(5)}\n2,{hour(2)}\n")
    (folder / "validation.md").write_text("records no time: its file time counts")
    assert Runs(load_study(path)).results_time(load_study(path).stage("a")) == hour(5)
    plan["questions"]["Q1"]["stages"][0]["command"][-5] = 3
    _write(path, plan)
    record["amendments"].append({"time": hour(1), "note": "by hand, after the results",
                                 "parts": parts(load_study(path)), "changed": ["stage a"]})
    path.with_name("plan.registration.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match="changes stage a, whose results were made before it") as caught:
        check_registered(load_study(path))
    assert f"({hour(5)})" in str(caught.value)
    assert "run and report refuse it: amendment 1" in "\n".join(status(load_study(path)))


def test_a_plain_training_s_result_records_when_it_was_made(tmp_path):
    """A baseline stage's result.json recorded no time, so a clone's file times dated its results."""
    from evo_attention.studies.study import made_time

    assert main(["baseline", *TINY, "--quiet", "--out", str(tmp_path / "b")]) == 0
    result = tmp_path / "b" / "result.json"
    made = json.loads(result.read_text())["created_at"]
    os.utime(result, (time.time() + 7200, time.time() + 7200))  # a copy made later
    assert made_time([tmp_path / "b"]) == datetime.fromisoformat(made).isoformat(timespec="seconds")


def test_a_rate_selected_at_an_edge_of_its_grid_stops_what_reads_it(tmp_path):
    plan = _study({"Q1": {"blocks": [1, 2], "stages": [
        {"name": "rate", "kind": "tune", "grid": ["1e-3", "2e-3"],
         "command": ["validate", "--genes", GATE, *TINY, "--seed-block", 1, "--lr", "{rate}", "--out", "{out}"]},
        _command("cells", "--seed-block", 2, "--lr", "{rate:rate}")],
        "answers": {"answer": [{"say": "nothing to say"}]}}}, edge_rule="refuse")
    path = _committed(tmp_path, plan)
    register(load_study(path))
    for rate in ("1e-3", "2e-3"):
        (tmp_path / "results" / "rate" / rate).mkdir(parents=True)
        (tmp_path / "results" / "rate" / rate / "validation.json").write_text("{}")
    (tmp_path / "results" / "rate" / "selected.json").write_text(json.dumps(
        {"rates": ["1e-3", "2e-3"], "baseline_mean": {"1e-3": 3.0, "2e-3": 2.0}, "selected": "2e-3", "at_edge": True}))
    with pytest.raises(UserError, match="the edge rule asks for an amendment that widens the grid"):
        run_study(load_study(path), lambda argv: pytest.fail(f"ran {argv}"), log=lambda line: None)


# ------------------------------------------------------------------------------------------ end to end


def _tiny_plan() -> dict:
    tiny = {"Q1": {"title": "does the gate help on recall, each gene at its own rate?", "blocks": [1], "stages": [
        {"name": "tune", "command": ["validate", "--genes", GATE, "{tiny}", "--lr-grid", "1e-3,2e-3", "--tuning-seeds",
                                     2, "--seeds", 2, "--seed-block", 1, "--out", "{out}"]},
        {"name": "plan", "kind": "plan", "genes_of": "tune/validation.json", "rate_of": "tune/validation.json",
         "seeds": 2, "seed_block": 1, "margin": 0.01},
        {"name": "verdict", "command": ["validate", "--plan", "{plan:plan}", "--lr", "{lr:plan}", "{tiny}",
                                        "--out", "{out}"]}],
        "tables": [{"file": "verdict/validation.json", "table": "verdicts"}],
        "sources": {"verdict": "verdict/validation.json"},
        "answers": {"answer": [{"say": "the gate helps", "if": ["verdict is better"]}, {"say": "undetermined"}]}},
        "Q2": {"title": "does the gate help at two budgets (Holm over both)?", "blocks": [2, 4], "stages": [
            {"name": "rate", "kind": "tune", "grid": ["1e-3", "2e-3"],  # its own block: the rate's selection seeds
             "command": ["validate", "--genes", GATE, "{tiny}", "--seeds", 2, "--seed-block", 4, "--lr", "{rate}",
                         "--out", "{out}"]},
            {"name": "cells", "each": {"steps": [2, 3]}, "dir": "cells/{steps}",
             "command": ["validate", "--genes", GATE, "{tiny}", "--steps", "{steps}", "--seeds", 2, "--seed-block", 2,
                         "--lr", "{rate:rate}", "--out", "{out}"]},
            {"name": "family", "kind": "family", "gene": GATE, "against": "baseline", "margin": 0.01,
             "cells": {"short": "cells/2/validation.json", "long": "cells/3/validation.json"}}],
            "tables": [{"file": "family/family.json", "table": "d4-family"}],
            "sources": {"cells": "family/family.json"},
            "words": {"over": "cells", "gate": [{"say": "helps", "if": ["cells is better"]}, {"say": "undetermined"}]},
            "answers": {"answer": [{"say": "the gate helps", "if": ["all gate is helps"]}, {"say": "undetermined"}]}}}
    return _study(tiny, vars={"tiny": TINY})


def _trainings(folder: Path) -> int:
    with RunStore.open(folder, readonly=True) as store:
        return len(store.evaluations())


def test_a_tiny_study_runs_end_to_end_resumes_after_a_kill_is_amended_and_reported(tmp_path, capsys):
    plan = _tiny_plan()
    path = _committed(tmp_path, plan)
    assert main(["study", "run", str(path)]) == 2  # not registered yet
    assert "is not registered" in capsys.readouterr().err
    assert main(["study", "register", str(path)]) == 0
    # one stage, then a kill after its trainings and before its results were kept
    assert main(["study", "run", str(path), "--stage", "tune", "--quiet"]) == 0
    trained = _trainings(tmp_path / "runs" / "tune")
    assert trained == 2 * 2 * 2 + 2 * 2  # 2 genes x 2 rates x 2 tuning seeds, then 2 genes x 2 seeds
    assert (tmp_path / "results" / "tune" / "validation.json").is_file()
    for f in (tmp_path / "results" / "tune").iterdir():
        f.unlink()
    assert "tune [command]: partly" in "\n".join(status(load_study(path)))
    assert main(["study", "run", str(path), "--quiet"]) == 0
    assert _trainings(tmp_path / "runs" / "tune") == trained  # no finished training repeated
    assert all(line.endswith(("done", "done (2/2)")) for line in status(load_study(path)) if line.startswith("  "))
    written = yaml.safe_load((tmp_path / "results" / "plans" / "plan.yaml").read_text())
    assert written["seed_block"] == 1 and written["comparisons"][0].startswith(GATE + "|lr=")
    assert json.loads((tmp_path / "results" / "rate" / "selected.json").read_text())["rates"] == ["1e-3", "2e-3"]
    assert (tmp_path / "results" / "cells" / "3" / "times.json").is_file()
    assert all("created_at" in json.loads((tmp_path / "results" / f).read_text())  # a copy keeps when they were made
               for f in ("rate/selected.json", "family/family.json"))
    # run again: nothing left to do
    before = {d: _trainings(d.parent) for d in (tmp_path / "runs").rglob("run.db")}
    assert run_study(load_study(path), lambda argv: pytest.fail(f"ran {argv}"), log=lambda line: None) == []
    assert before == {d: _trainings(d.parent) for d in (tmp_path / "runs").rglob("run.db")}
    # amend: a new cell is taken (no results of it yet); a change of the cells that ran is refused
    plan["questions"]["Q2"]["stages"].insert(2, {**plan["questions"]["Q2"]["stages"][1], "name": "more",
                                                 "each": {"steps": [4]}, "dir": "more/{steps}"})
    _write(path, plan)
    assert main(["study", "amend", str(path), "--note", "a cell at 4 steps"]) == 0
    cells = plan["questions"]["Q2"]["stages"][1]["command"]
    cells[cells.index("--seeds") + 1] = 3
    _write(path, plan)
    capsys.readouterr()
    assert main(["study", "amend", str(path), "--note", "3 seeds, not 2"]) == 2
    assert "changes stage cells, whose results exist" in capsys.readouterr().err
    cells[cells.index("--seeds") + 1] = 2
    _write(path, plan)
    assert main(["study", "report", str(path)]) == 0
    text = (tmp_path / "results" / "report.md").read_text()
    assert "1 amendment(s)" in text and "a cell at 4 steps" in text and "more (not started)" in text
    assert "**Q1, answer: " in text and "**Q2, answer: " in text
    assert "<!-- generated: results/family/family.json table=d4-family -->" in text
    # eval_steps 2 scored part of each split: said under the validation's table and under the family computed from two
    assert text.count("Partial evaluation: eval_steps 2 cut the evaluation short") == 2
    assert main(["study", "check", str(path), str(tmp_path / "results" / "report.md")]) == 0
    (tmp_path / "a_file").write_text("")  # --out a folder, or under a file: one line each, nothing written
    for out, says in ((tmp_path / "results", "is a folder: give the file the report goes to"),
                      (tmp_path / "a_file" / "report.md", "a_file is not a directory")):
        assert main(["study", "report", str(path), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err
    (tmp_path / "results" / "family" / "family.json").unlink()  # a table shown whose file is gone: no file gives it
    assert main(["study", "check", str(path), str(tmp_path / "results" / "report.md")]) == 1
    assert "results/family/family.json table=d4-family is shown, but that file is not written" in \
        capsys.readouterr().err
    # a new question whose decision reads results that exist (another question's) is no amendment
    plan["questions"]["Q3"] = {"blocks": [3], "stages": [
        {"name": "later", "command": ["validate", "--genes", GATE, "{tiny}", "--seeds", 2, "--seed-block", 3,
                                      "--out", "{out}"]}],
        "sources": {"v": "tune/validation.json"},
        "answers": {"answer": [{"say": "the gate helps", "if": ["v is better"]}, {"say": "undetermined"}]}}
    _write(path, plan)
    assert main(["study", "amend", str(path), "--note", "a question over the tuning"]) == 2
    assert "the amendment changes question Q3, whose results exist" in capsys.readouterr().err


def test_baseline_matched_to_a_gene_trains_the_width_validate_match_params_gives_it(tmp_path, capsys):
    from evo_attention.data import data_from_config
    from evo_attention.genes import AttentionGene
    from evo_attention.nn.matching import matched_baseline
    from evo_attention.train.config import Config

    assert main(["baseline", "--matched-to", GATE, *TINY, "--out", str(tmp_path / "x")]) == 2  # --ffn: one width
    assert "--matched-to sets the feed-forward width: drop --ffn" in capsys.readouterr().err
    flags = [f for i, f in enumerate(TINY) if f != "--ffn" and (i == 0 or TINY[i - 1] != "--ffn")]
    assert main(["baseline", "--matched-to", GATE, *flags, "--out", str(tmp_path / "m")]) == 0
    config = Config.from_dict(json.loads((tmp_path / "m" / "result.json").read_text())["config"])
    data = data_from_config(config)
    spec = config.replace(d_ff=None).model.with_data(data.vocab_size, data.seq_len)
    assert config.d_ff == matched_baseline(spec, AttentionGene.parse(GATE))["ffn_dim"] != spec.ffn_dim


STUDY4 = REPO / "docs" / "findings4" / "study4.yaml"


def test_study4_keeps_its_rules_and_every_command_is_one_the_cli_takes():
    plan, parser = load_study(STUDY4), build_parser()
    runs, count = Runs(plan), 0
    for stage in (s for s in plan.stages if s.trains and s.name not in ("e2-tune", "e2-lm")):  # these read written plans
        for combo in runs.combos(stage) or []:  # e2-export: one per gene of a file E1 writes
            for _, argv, _ in commands(plan, runs, stage, combo):
                parser.parse_args(argv)
                count += 1
                if argv[0] == "search":  # every search starts from the vanilla gene
                    assert argv[argv.index("--start-from") + 1] == "vanilla", argv
    e1 = REPO / "docs" / "findings4" / "e1-lm" / "rediscovery.json"  # e2-export: 4 commands per better winner
    exports = len(genes_of(json.loads(e1.read_text()), "e1-lm")) if e1.exists() else 0
    assert count == 10 * 2 + 10 * 2 + 30 * 2 + 10 + 4 * exports
    # E3's arms train the same number of genes: the climb 4 per generation, the GA and the sampler 4 then 3
    arms = next(s for s in plan.stages if s.name == "e3").spec["each"]["strategy"]
    sizes = {a["strategy"]: dict(zip(a["budget"][::2], a["budget"][1::2])) for a in arms}
    budget = {n: s["--population"] * s["--generations"] if n == "climb"
              else s["--population"] + (s["--generations"] - 1) * (s["--population"] - s["--elite"])
              for n, s in sizes.items()}
    assert budget == {"ga": 16, "climb": 16, "neighbours": 16}


def test_study4_tables_in_findings_md_equal_their_files_and_only_unwritten_ones_may_be_absent(tmp_path):
    """Study 4 is checked as it runs: every table its written files give is in findings.md, equal to
    them; a table whose file its stages have not written yet may be absent, and no other."""
    plan = load_study(STUDY4)
    assert check_document(plan, FINDINGS) == []
    assert (REPO / "docs" / "findings4" / "report.md").read_text(encoding="utf-8") == report(plan)  # current
    unwritten = unwritten_tables(plan)
    assert all(not (REPO / f).exists() for f, _ in unwritten)
    doc = tmp_path / "findings.md"
    doc.write_text("no tables\n")
    shown = {(plan.rel(plan.raw["results"], t["file"]), t["table"])
             for q in plan.raw["questions"].values() for t in q.get("tables", [])}
    written = sorted(shown - set(unwritten))
    assert check_document(plan, doc) == [f"{doc}: no table {t} of {f}" for f, t in written]


def test_an_answer_may_name_one_entry_of_a_source(tmp_path):
    files = tmp_path / "results" / "arms"
    files.mkdir(parents=True)
    files.joinpath("strategies.json").write_text(json.dumps({"search_seeds": [1, 2], "comparisons": {
        "climb": {"verdict": "better"}, "neighbours": {"verdict": "worse"}}}))
    plan = {"study": "s", "out": "runs", "results": "results", "questions": {"E3": {
        "blocks": [1], "search_seeds": [1],
        "stages": [{"name": "e3", "dir": "e3/{strategy}-1", "each": {"strategy": ["ga", "climb", "neighbours"]},
                    "command": ["search", "--strategy", "{strategy}", "--seed", 1, *TINY, "--out", "{out}"]},
                   {"name": "arms", "kind": "strategies", "searches": "e3", "reference": "ga",
                    "file": "arms/strategies.json"}],
        "sources": {"arms": "arms/strategies.json"},
        "answers": {"evolution": [{"say": "helps", "if": ["arms[neighbours] is worse"]}, {"say": "undetermined"}],
                    "population": [{"say": "the GA is better", "if": ["arms[climb] is worse"]}, {"say": "no"}]}}}}
    study = load_study(_write(tmp_path / "plan.yaml", plan))
    assert decide(study)["E3"]["answers"] == {"evolution": "helps", "population": "no"}
    plan["questions"]["E3"]["answers"]["evolution"][0]["if"] = ["arms[ga] is worse"]
    with pytest.raises(UserError, match="arms has no entry 'ga'"):
        decide(load_study(_write(tmp_path / "plan.yaml", plan)))
    plan["questions"]["E3"]["answers"]["evolution"][0]["if"] = ["some arms[climb] is worse"]
    with pytest.raises(UserError, match=r"is not NAME\[ENTITY\] is \[not\] WORD"):
        load_study(_write(tmp_path / "plan.yaml", plan))
    plan["questions"]["E3"]["answers"]["evolution"][0]["if"] = ["arms[climb] is wrose"]  # would never hold
    with pytest.raises(UserError, match=r"'arms\[climb\] is wrose': arms never says 'wrose'; it says above, .*worse$"):
        load_study(_write(tmp_path / "plan.yaml", plan))
    plan["questions"]["E3"]["words"] = {"over": "arms", "side": [{"say": "ahead", "if": ["arms is better"]},
                                                                 {"say": "not ahead"}]}
    plan["questions"]["E3"]["answers"]["evolution"][0]["if"] = ["some side is ahaed"]
    with pytest.raises(UserError, match=r"side never says 'ahaed'; it says ahead, not ahead$"):
        load_study(_write(tmp_path / "plan.yaml", plan))
    plan["questions"]["E3"]["answers"]["evolution"][0]["if"] = ["some side is ahead"]
    assert decide(load_study(_write(tmp_path / "plan.yaml", plan)))["E3"]["answers"]["evolution"] == "helps"


def test_a_plan_stage_picks_the_best_validated_winners_of_a_rediscovery_and_absolute_folders_stay_absolute(tmp_path):
    picks = tmp_path / "results" / "e1"
    picks.mkdir(parents=True)
    searches = [{"winner": w, "validated": {"verdict": v, "relative": r, "metric": "val_perplexity"}}
                for w, v, r in (("a", "better", -0.02), ("b", "worse", 0.01), ("c", "better", -0.05), ("d", "better", -0.01))]
    picks.joinpath("rediscovery.json").write_text(json.dumps({"features": {}, "searches": searches}))
    plan = {"study": "s", "out": str(tmp_path / "runs"), "results": "results", "questions": {"E2": {
        "blocks": [3], "search_seeds": [3], "stages": [
            {"name": "x", "dir": "x/climb-3", "command": ["search", "--seed", 3, *TINY, "--out", "{out}"]},
            {"name": "e1", "kind": "rediscovery", "searches": ["x/*"], "file": "e1/rediscovery.json"},
                                  {"name": "pick", "kind": "plan", "genes_of": "e1/rediscovery.json", "top": 2,
                                   "genes": [GATE], "seeds": 2, "seed_block": 3, "margin": 0.01}],
        "sources": {"e1": "e1/rediscovery.json"}, "answers": {"answer": [{"say": "-"}]}}}}
    study = load_study(_write(tmp_path / "plan.yaml", plan))
    assert study.rel(study.raw["out"], "a/b") == f"{tmp_path}/runs/a/b"  # not made relative to the root
    register(study, allow_dirty=True, after_results="a made-up rediscovery file")
    assert run_study(study, lambda argv: pytest.fail(f"ran {argv}"), stages=["pick"], log=lambda line: None) == ["pick"]
    written = yaml.safe_load((tmp_path / "results" / "plans" / "pick.yaml").read_text())
    assert written["comparisons"] == ["c", "a", GATE]  # better only, the largest improvement first, then the gate
    # on an accuracy the relative change is not computed: the largest difference comes first
    accuracy = [{"winner": w, "validated": {"verdict": "better", "relative": None, "difference": d,
                                            "metric": "suite_accuracy"}} for w, d in (("x", 0.1), ("y", 0.3))]
    assert genes_of({"features": {}, "searches": accuracy}, "e1") == ["y", "x"]


def test_winners_kept_by_their_validation_are_not_confirmed_on_the_seeds_it_took(tmp_path, capsys):
    plan = {"study": "s", "out": "runs", "results": "results", "questions": {"Q1": {
        "blocks": [401, 402], "search_seeds": [401], "stages": [
            {"name": "s", "dir": "s/{seed}", "each": {"seed": [401]}, "commands": [
                ["search", *TINY, "--seed", "{seed}", "--out", "{out}"],
                ["validate", "--from-run", "{out}", "--top", 1, "--seeds", 2, "--seed-block", "run"]]},
            {"name": "r", "kind": "rediscovery", "searches": ["s/*"]},
            {"name": "p", "kind": "plan", "genes_of": "r/rediscovery.json", "seeds": 4, "seed_block": 401,
             "margin": 0.01},
            {"name": "v", "command": ["validate", "--plan", "{plan:p}", *TINY, "--out", "{out}"]}],
        "sources": {"v": "v/validation.json"}, "answers": {"answer": [{"say": "-"}]}}}}
    path = _write(tmp_path / "plan.yaml", plan)
    rule = ("breaks the rule 'winners are validated on seeds they were not selected on': stage v validates on seeds "
            "1802001..1802004, and its genes were selected on seed 1802001 (stage r, by stage s's validation)")
    with pytest.raises(UserError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        load_study(path)
    assert main(["study", "status", str(path)]) == 2 and rule in capsys.readouterr().err
    plan["questions"]["Q1"]["stages"][2]["seed_block"] = 402  # seeds they were not selected on
    load_study(_write(tmp_path / "plan.yaml", plan))
    plan["questions"]["Q1"]["stages"][3] = {  # each winner on its own, on the block its validation took
        "name": "v", "dir": "v/{index}", "each": {"g": {"genes_of": "r/rediscovery.json"}},
        "command": ["validate", "--genes", "{g}", *TINY, "--seed-block", 401, "--out", "{out}"]}
    plan["questions"]["Q1"]["sources"] = {"r": "r/rediscovery.json"}
    with pytest.raises(UserError, match="stage v validates on seeds 1802001..1803000, and its genes were selected"):
        load_study(_write(tmp_path / "plan.yaml", plan))


def test_a_rate_a_tune_stage_selected_is_not_validated_on_the_seeds_it_was_selected_on(tmp_path, capsys):
    """A tune stage selects its rate by the baseline's mean on the seeds its command trains: a validation at that
    rate, by reference or through the --from-run search that took it, gives its verdicts on another block; a
    grid's own rate (its tuning seeds) and a rate written out stay free to take the tuning's block."""
    tune = {"name": "t", "kind": "tune", "grid": ["1e-3", "2e-3"], "command": [
        "validate", "--genes", GATE, *TINY, "--seeds", 2, "--seed-block", 1, "--lr", "{rate}", "--out", "{out}"]}
    search = ["search", *TINY, "--seed", 7, "--lr", "{rate:t}", "--out", "{out}"]

    def plan(block, *lr, run="{out:s}", joined=False) -> Path:  # joined: the --flag=value spelling
        given = [f"--from-run={run}", f"--seed-block={block}"] if joined else ["--from-run", run, "--seed-block", block]
        validate = ["validate", *given, "--top", 1, "--seeds", 2, *lr]
        stages = ([tune, {"name": "s", "command": search}, {"name": "v", "command": [*validate, "--out", "{out}"]}]
                  if run != "{out}" else [tune, {"name": "v", "commands": [search, validate]}])
        plan = _study({"Q1": _question(stages, blocks=(1, 2), search_seeds=[7])})  # a file each: all are loaded
        return _write(tmp_path / f"plan{len(list(tmp_path.glob('*.yaml')))}.yaml", plan)

    rule = ("breaks the rule 'winners are validated on seeds they were not selected on': stage v validates on seeds "
            "1002001..1002002, and its rate was selected on seed 1002001 (stage t's tuning on block 1)")
    for path in (plan(1, "--lr", "{rate:t}"), plan(1), plan(1, run="{out}"),  # by reference, through the search
                 plan(1, "--lr={rate:t}", joined=True), plan(1, joined=True), plan(1, "--lr={rate:t}")):
        with pytest.raises(UserError, match=rule.replace("(", r"\(").replace(")", r"\)") + ": give it seeds"):
            load_study(path)
    assert main(["study", "status", str(path)]) == 2
    err = capsys.readouterr().err
    assert rule in err and err.count("\n") == 1
    for path in (plan(2, "--lr", "{rate:t}"), plan(2), plan(1, "--lr", "1e-3"),
                 plan(1, "--lr-grid", "1e-3,2e-3", "--tuning-seeds", 2)):
        load_study(path)
    # where a command writes, --out=DIR as --out DIR: what run resumes and collects from
    study = load_study(_write(tmp_path / "out.yaml", _study({"Q1": _question([{"name": "a", "command": [
        "validate", "--genes", GATE, *TINY, "--seed-block", 1, "--out={out}/sub"]}])})))
    assert [t for _, _, t in commands(study, Runs(study), study.stage("a"), {})] == [Path("runs/a/sub")]


def test_an_each_value_that_a_var_would_shadow_is_refused(tmp_path):
    plan = _study({"Q1": _question([_command("a", "--seeds", 2, "--seed-block", 1, dir="a/{k}",
                                             each={"k": [{"k": 1, "size": [1]}]})])})
    plan["vars"] = {"size": [2]}
    with pytest.raises(UserError, match="each names 'size', which is also a var of the plan"):
        load_study(_write(tmp_path / "plan.yaml", plan))


def test_a_report_reads_stage_states_from_the_result_files_alone(tmp_path):
    """A run folder under ``out`` (only the training machine has one) makes ``status`` say partly; the
    report, which a fresh clone must rebuild the same, still says not started."""
    study = load_study(_write(tmp_path / "plan.yaml", _study({"Q1": _question([_command(
        "a", "--seeds", 2, "--seed-block", 1)])})))
    (tmp_path / "runs" / "a").mkdir(parents=True)
    assert "  a [command]: partly" in status(study)
    assert "Stages: a (not started)." in report(study)


def test_a_done_file_inside_a_sub_folder_marks_its_run_done(tmp_path):
    """``done: hf-model/result.json`` (study 4's export stage) names a file one folder down: the run is
    done once that file is in the results, not before (a name alone would never match it)."""
    stage = _command("a", "--seeds", 2, "--seed-block", 1, done="hf-model/result.json")
    study = load_study(_write(tmp_path / "plan.yaml", _study({"Q1": _question([stage])})))
    runs, stage = Runs(study), study.stages[0]
    (tmp_path / "results" / "a" / "hf-model").mkdir(parents=True)
    assert runs.state(stage, files_only=True) == ("not started", 0, 1)
    (tmp_path / "results" / "a" / "hf-model" / "result.json").write_text("{}")
    assert runs.state(stage, files_only=True) == ("done", 1, 1)


def test_a_store_that_is_not_on_this_machine_is_rebuilt_by_its_search_and_must_equal_its_results(tmp_path):
    """A fresh clone has the results, not the stores: a stage that reads an earlier search's store
    (``validate --from-run {out:s}``) first runs that search again with its seeds; the rebuilt
    trainings equal the committed ones, or the stage stops and says where they differ."""
    search = ["search", "--data", "recall", "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32",
              "--steps", "2", "--batch-size", "4", "--eval-batch-size", "16", "--eval-steps", "2", "--strategy",
              "climb", "--start-from", "vanilla", "--population", "2", "--generations", "2",
              "--keep-models", "0", "--no-check", "--seed", 1, "--quiet", "--out", "{out}"]
    later = ["validate", "--from-run", "{out:s}", "--top", 1, "--seeds", 2, "--seed-block", 2, "--quiet",
             "--out", "{out}"]
    questions = {"Q1": _question([{"name": "s", "command": search}], search_seeds=[1]),
                 "Q2": _question([{"name": "v", "command": later}], blocks=(2,))}
    questions["Q1"]["sources"] = {"v": "s/final_results.json"}
    path = _committed(tmp_path, _study(questions))
    register(load_study(path))
    assert run_study(load_study(path), stages=["s"], log=lambda line: None) == ["s"]
    committed = (tmp_path / "results" / "s" / "evaluations.csv").read_text()
    shutil.rmtree(tmp_path / "runs")  # another machine: the results only
    said = []
    assert run_study(load_study(path), stages=["v"], log=said.append) == ["v"]
    n = len(committed.splitlines()) - 1
    assert n >= 3 and f"  rebuilt s: its {n} trainings equal the committed ones" in said
    assert (tmp_path / "results" / "v" / "validation.json").is_file()
    assert (tmp_path / "results" / "s" / "evaluations.csv").read_text() == committed  # the results untouched
    # a rebuild killed before its search ended (the store there, its result not yet): it resumes
    trained = _trainings(tmp_path / "runs" / "s")
    (tmp_path / "runs" / "s" / "final_results.json").unlink()
    shutil.rmtree(tmp_path / "results" / "v")
    said.clear()
    assert run_study(load_study(path), stages=["v"], log=said.append) == ["v"]
    assert any(" search --resume " in line for line in said)
    assert f"  rebuilt s: its {n} trainings equal the committed ones" in said
    assert _trainings(tmp_path / "runs" / "s") == trained  # none again: v's are in s's store too
    # a committed value the trainings do not repeat: the stage stops, naming the run
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "results" / "v" / "validation.json").unlink()
    rows = list(csv.DictReader(io.StringIO(committed)))
    rows[0]["val_loss"] = "9.0"
    with open(tmp_path / "results" / "s" / "evaluations.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(UserError, match="the store of s differs from its committed evaluations"):
        run_study(load_study(path), stages=["v"], log=lambda line: None)


@pytest.mark.parametrize("plan", ["docs/findings3/study3.yaml", "docs/findings4/study4.yaml"])
def test_every_word_the_committed_studies_sources_say_is_one_a_rule_may_name(plan):
    """SOURCE_WORDS, against which a plan's conditions are checked, holds every word real result files give."""
    from evo_attention.studies.study import SOURCE_WORDS
    from evo_attention.studies.study_run import verdicts

    study = load_study(REPO / plan)
    said = set()
    for q in study.questions.values():
        for file in (q.get("sources") or {}).values():
            path, _, part = file.partition("#")
            said |= set(verdicts(json.loads(study.results(path).read_text()), part).values())
    assert said and said <= SOURCE_WORDS, said - SOURCE_WORDS


@pytest.mark.parametrize("command, says", [
    (["validat", "--seed-block", 1, "--out", "{out}"], "invalid choice: 'validat'"),
    (["search", "--stepz", 2, "--seed", 1, "--out", "{out}"], "unrecognized arguments: --stepz 2"),
    (["search", "--lr", "fast", "--seed", 1, "--out", "{out}"], "argument --lr: invalid"),
])
def test_a_command_the_command_line_cannot_read_is_refused_at_registration_and_run(tmp_path, capsys, command, says):
    plan = _write(tmp_path / "plan.yaml", {"study": "s", "out": "runs", "results": "results", "questions": {"Q": {
        "blocks": [1], "search_seeds": [1], "stages": [{"name": "a", "dir": "a", "command": command}],
        "answers": {"a": [{"say": "x"}]}}}})
    for action in ("register", "run"):
        assert main(["study", action, *(["--allow-dirty"] if action == "register" else []), str(plan)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evo-attention: error: stage a: `evo-attention ") and says in err and "\n" not in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "plan.registration.json").exists()


def test_a_stage_sees_only_its_own_plugins(tmp_path, capfd):
    (tmp_path / "plug.py").write_text("import torch\nfrom evo_attention import register_normalization, row_normalize\n"
                                      "@register_normalization('study_plug')\ndef plug(scores, mask):\n"
                                      "    return row_normalize(torch.relu(scores.float()), mask).to(scores.dtype)\n")
    gene = "dot|study_plug|none|fixed"
    stages = [{**_command("with", "--seeds", 2, "--seed-block", 1, "--plugin", "plug.py")},
              {**_command("without", "--seeds", 2, "--seed-block", 1)}]
    for stage in stages:
        stage["command"][stage["command"].index("--genes") + 1] = gene
    path = _committed(tmp_path, _study({"Q1": _question(stages)}))
    _git(tmp_path, "add", "plug.py")
    _git(tmp_path, "commit", "-qm", "the plugin")
    assert main(["study", "register", str(path)]) == 0
    # each stage runs in a process of its own: the second, which names no plugin, cannot use the first's
    assert main(["study", "run", str(path), "--quiet"]) != 0
    assert (tmp_path / "results" / "with" / "validation.json").is_file()
    assert not (tmp_path / "results" / "without" / "validation.json").exists()
    assert "unknown normalization 'study_plug'" in capfd.readouterr().err  # the stage's own process said it
