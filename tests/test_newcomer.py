"""A newcomer's first hour, as the README writes it (tiny sizes): the quick search, its report,
validate at its default seeds, both Hugging Face exports from the quick run, and generation with
default settings. Every command is the README's, with flags that only shrink it."""

import json
from pathlib import Path

from evo_attention.cli import main
from evo_attention.util import stats

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "10", "--population", "3", "--generations", "1", "--d-model", "32", "--batch-size", "8", "--quiet"]


def test_the_readme_commands_run_in_order(tmp_path, monkeypatch, capsys):
    readme = (REPO / "README.md").read_text()
    for command in ("evo-attention search --preset quick --out runs/quick", "evo-attention report runs/quick",
                    "evo-attention validate --from-run runs/quick",
                    "evo-attention export --from-run runs/quick --rank 1 --format hf"):
        assert command in readme, command
    monkeypatch.chdir(tmp_path)
    assert main(["search", "--preset", "quick", "--out", "runs/quick", *SMALL]) == 0
    assert main(["report", "runs/quick"]) == 0 and Path("runs/quick/report.html").is_file()
    # validate at its defaults: the seeds are the fewest at which the exact test can decide
    assert main(["validate", "--from-run", "runs/quick", "--top", "1", "--steps", "10", "--quiet"]) == 0
    result = json.loads(Path("runs/quick/validation.json").read_text())
    assert len(result["seeds"]) == stats.decisive_seeds(1) == 6
    assert all(not g.get("cannot_decide") for g in result["genes"])
    # the quick preset kept its winner: both exports work from the run, and the model generates
    assert main(["export", "--from-run", "runs/quick", "--rank", "1", "--format", "hf", "--out", "exported"]) == 0
    assert main(["export", "--from-run", "runs/quick", "--rank", "1", "--format", "hf-attention",
                 "--out", "exported-attention"]) == 0
    model = next(Path("runs/quick/models").iterdir())
    capsys.readouterr()
    assert main(["generate", "--model", str(model), "--prompt", "k0 v1 k1"]) == 0
    assert capsys.readouterr().out.startswith("k0 v1 k1")
