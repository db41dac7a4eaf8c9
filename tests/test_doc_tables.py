"""Every generated table in the docs equals what its committed result file gives
(benchmarks/doc_tables.py): a number edited by hand, or a result file changed without
regenerating the doc, fails here. (The study tables' own tests: tests/test_study_results.py.)"""

import importlib.util
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _doc_tables():
    spec = importlib.util.spec_from_file_location("doc_tables", REPO / "benchmarks" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_generated_tables_equal_their_result_files():
    assert _doc_tables().run(check=True) == []


def test_a_number_changed_by_hand_is_found(tmp_path):
    tables = _doc_tables()
    source = REPO / "docs" / "results" / "validate-wikitext-small" / "validation.json"
    (tmp_path / "docs" / "results").mkdir(parents=True)
    shutil.copy(source, tmp_path / "docs" / "results" / "v.json")
    body = tables.TABLES["verdicts"](json.loads(source.read_text()))
    marker = "<!-- generated: docs/results/v.json table=verdicts -->\n"
    doc = tmp_path / "docs" / "x.md"
    doc.write_text("text\n" + marker + body + "<!-- end generated -->\n")
    assert tables.run(check=True, root=tmp_path) == []
    number = next(cell for cell in body.split("|") if "±" in cell).strip()  # a mean ± sd cell
    doc.write_text(doc.read_text().replace(number, number.replace("±", "+-"), 1))
    assert tables.run(check=True, root=tmp_path) == ["docs/x.md: docs/results/v.json table=verdicts"]
    tables.run(check=False, root=tmp_path)  # regenerating restores the file's numbers
    assert tables.run(check=True, root=tmp_path) == [] and number in doc.read_text()
