"""One sign convention in every output that shows a change from the baseline: the gene's value
minus the baseline's (so a lower perplexity shows as a negative change), with the metric's
direction ("lower is better") said with it, and no "improvement" of the opposite sign beside it."""

import json
import math
import re

from evo_attention import Config
from evo_attention.cli.search import best_line
from evo_attention.report import load_run, write_report
from evo_attention.report.runs import write_comparison
from evo_attention.report.studies.compare import compare_markdown
from evo_attention.report.studies.validation import validation_markdown
from evo_attention.search.store import RunStore
from evo_attention.studies import validate as val
from evo_attention.studies.common import StudySetup

BASE = "dot|softmax|none|fixed|bias|0.10"
BEST = "dot|sparsemax|none|fixed|bias|0.10"  # better than the baseline: every change shown is negative


def _run(tmp_path, name="run"):
    run_dir = tmp_path / name
    config = Config(population_size=2, elite_size=1, n_generations=1, train_steps=10).to_dict()
    meta = {"strategy": {"name": "ga", "options": {}}, "data": {"name": "wikitext2", "fingerprint": "fp"}, "done": True}

    def rec(gene, ppl, seed=42):
        return {"gene": gene, "seed": seed, "steps": 10, "data_fingerprint": "fp", "context": "ctx", "status": "ok",
                "val_perplexity": ppl, "val_loss": math.log(ppl), "params": 1000, "eval_tokens": 64}

    with RunStore.create(run_dir, config=config, meta=meta) as store:
        store.record(rec(BASE, 160.0), role="baseline")
        store.record(rec(BEST, 120.0), role="search", generation=0)
        store.record(rec("cosine|softmax|none|fixed|bias|0.10", 210.0), role="search", generation=0)
    return run_dir


def _validation(out_dir):
    seeds = [43, 44, 45, 46, 47]
    noise = [0.0, 0.2, -0.2, 0.1, -0.1]
    records = {(g, s): {"status": "ok", "val_perplexity": m + n}
               for g, m in ((BASE, 10.0), (BEST, 8.0)) for s, n in zip(seeds, noise)}
    setup = StudySetup(config=Config(), data=None, seeds=tuple(seeds), steps=10, role="validate")
    result = val.validation_statistics(setup, records, [BEST])
    val.write_validation({**result, "steps": 10}, out_dir)
    return result


def _compare_payload():
    agg = {"gene": BASE, "val_loss": 5.0, "val_loss_sd": None, "val_perplexity": 148.4, "accuracy": 0.2,
           "params": 1000, "time_s": 1.0, "peak_memory_mb": 10.0, "status": "ok"}
    settings = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 64, "data": "recall", "vocab_size": 16,
                "max_seq_len": 16, "steps": 10, "batch_size": 8, "seeds": 1, "seed_list": [1], "learning_rate": 1e-3}
    return {"settings": settings,
            "aggregates": [{**agg, "name": "vanilla"}, {**agg, "name": "sparse", "gene": BEST, "val_loss": 4.9}],
            "summary": {"ranking": [{"rank": 1, "name": "sparse", "perplexity_change_pct": -9.5},
                                    {"rank": 2, "name": "vanilla", "perplexity_change_pct": 0.0}],
                        "failed": [], "n_ok": 2, "val_loss_mean": 4.95, "val_loss_sd": 0.07}}


CHANGE = re.compile(r"([+-]\d+(?:\.\d+)?)%")


def _check(text, where):
    assert "improvement" not in text.lower(), where
    assert "lower is better" in text, where
    assert "higher is better" not in text, where  # perplexity only: one direction said


def test_every_output_with_a_change_uses_one_sign(tmp_path):
    run_dir = _run(tmp_path)
    _validation(run_dir)
    write_report(run_dir)
    summary = load_run(run_dir)
    outputs = {
        "search summary (CLI)": best_line(summary),
        "report.md": (run_dir / "report.md").read_text(),
        "report.html": (run_dir / "report.html").read_text(),
        "validation.md": validation_markdown(json.loads((run_dir / "validation.json").read_text())),
        "compare.md": compare_markdown(_compare_payload()),
    }
    paths = write_comparison([run_dir, _run(tmp_path, "other")], tmp_path / "cmp")
    outputs["runs.md"] = (tmp_path / "cmp" / "runs.md").read_text()
    for where, text in outputs.items():
        _check(text, where)
    # the best gene's perplexity is 25% below the baseline's: -25.0%, never +25.0%
    for where in ("search summary (CLI)", "report.md", "report.html", "runs.md"):
        assert "-25.0%" in outputs[where] and "+25.0%" not in outputs[where], where
    # the validated gene is better: its paired change is negative wherever shown
    for where in ("validation.md", "report.md"):
        paired = outputs[where].split("paired change", 1)[1]
        assert CHANGE.search(paired).group(1).startswith("-"), where
    assert "-9.5%" in outputs["compare.md"]
    # JSON: the field names say a change, and its sign is the metric's
    results = json.loads((run_dir / "final_results.json").read_text())
    assert "improvement" not in results and results["change"]["percent"] == -25.0
    runs = json.loads(paths["json"].read_text())
    assert all("improvement_percent" not in r and r["change_percent"] == -25.0 for r in runs["runs"])
