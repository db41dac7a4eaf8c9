"""The documentation: the README is a front door that fits on a few screens, and docs/ builds as a
site with MkDocs in strict mode (no broken page, link, anchor or nav entry; no link to a folder)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "pip install torch==2.13.0" in text and "python3 -m pytest -q" in text  # what CI runs
    for link in ("docs/guide.md", "docs/programs.md", "docs/findings.md"):
        assert link in text and (REPO / link).is_file()


def test_the_front_pages_count_the_studies_findings_reports():
    count = (REPO / "docs" / "findings.md").read_text().split("\n\n")[1].split()[0]  # "Four studies of the tool"
    assert f"{count} studies of the tool by the tool are reported" in (REPO / "README.md").read_text()
    assert f"{count.lower()} pre-registered studies" in (REPO / "docs" / "index.md").read_text()


def test_the_quick_preset_counts_its_trainings_as_at_most():
    """guide.md gave the quick preset's "26 trainings + the baseline" as a fixed number, while a gene proposed
    twice is trained once (the committed quick run trained 25); both pages say "up to" the GA's count."""
    from evo_attention.train.presets import PRESETS

    q = PRESETS["quick"]
    most = q["population_size"] + (q["n_generations"] - 1) * (q["population_size"] - q["elite_size"])
    for page in (REPO / "README.md", REPO / "docs" / "guide.md"):
        text = " ".join(page.read_text().split())
        assert f"up to {most}" in text and f"{most} trainings +" not in text, page


def test_the_docs_build_as_a_site_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "programs" / "index.html").is_file()
    # headings get GitHub's anchors, so one link to a section works on GitHub and on the site
    assert 'id="evo-attention-export---format-hf"' in (tmp_path / "site" / "export" / "index.html").read_text()


def test_version_starts_without_importing_torch():
    """`evo-attention --version` answers before any command module or torch loads (start-up measured
    at 0.1-0.3 s against about 5 s when every command was imported first)."""
    code = ("import sys; from evo_attention.cli import main; assert main(['--version']) == 0; "
            "import evo_attention; print('torch' in sys.modules, evo_attention.__version__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    printed, imported = done.stdout.splitlines()
    assert printed.startswith("evo-attention ") and imported.startswith("False")


def test_status_and_report_start_without_importing_torch(tmp_path):
    """`status` and `report` read a store and draw figures: neither imports torch (1.5 s of start-up
    on a 2-core CPU, where status takes about 0.3 s without it)."""
    from evo_attention.cli import main

    run = tmp_path / "run"
    assert main(["search", "--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "3",
                 "--quiet", "--population", "2", "--generations", "1", "--elite", "1", "--no-check",
                 "--out", str(run)]) == 0
    for command in ("status", "report"):
        code = (f"import sys; from evo_attention.cli import main; assert main([{command!r}, {str(run)!r}]) == 0; "
                "print('torch' in sys.modules)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.splitlines()[-1] == "False", command
