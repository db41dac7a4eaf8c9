"""One sign convention in every output that shows a change from the baseline: the gene's value
minus the baseline's (so a lower perplexity shows as a negative change), with the metric's
direction ("lower is better") said with it, and no "improvement" of the opposite sign beside it."""

import json
import math
import re

import pytest

from evo_attention import Config
from evo_attention.cli.search import best_line
from evo_attention.report import load_run, write_report
from evo_attention.report.runs import write_comparison
from evo_attention.report.studies import read_studies
from evo_attention.report.studies.ablation import OLDER_SIGN, ablation_markdown, contribution_lines
from evo_attention.report.studies.compare import compare_markdown
from evo_attention.report.studies.transfer import OLDER_ADVANTAGE, transfer_headline, transfer_markdown
from evo_attention.report.studies.validation import validation_markdown
from evo_attention.search.store import RunStore
from evo_attention.studies import ablation as abl
from evo_attention.studies import transfer as tr
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


SEEDS = (43, 44, 45, 46, 47)
SCALE = (1.0, 1.02, 0.98, 1.01, 0.99)  # each seed's shared factor: the paired ratios are exact


def _records(means):
    return {(g, s): {"status": "ok", "val_perplexity": m * f, "params": 1000}
            for g, m in means.items() for s, f in zip(SEEDS, SCALE)}


def _ablation(out_dir):
    """BEST differs from BASE in its normalization only, which lowers the perplexity from 10 to 8."""
    setup = StudySetup(config=Config(), data=None, seeds=SEEDS, steps=10, role="ablation")
    variants = abl.ablation_variants(BEST)
    result = abl.ablation_statistics(setup, variants, _records({BASE: 10.0, BEST: 8.0}))
    abl.write_ablation({**result, "steps": 10}, out_dir)
    return {**result, "steps": 10}


def _transfer(out_dir):
    """BEST at two sizes, 20% below the baseline at the reference and 10% below it at the larger one."""
    rows = []
    for (d_model, search), (base, gene) in (((16, True), (10.0, 8.0)), ((32, False), (10.0, 9.0))):
        setup = StudySetup(config=Config(d_model=d_model, n_layers=1), data=None, seeds=SEEDS, steps=10,
                           role="transfer")
        rung = tr.Rung(setup.config, search)
        rows.append(tr.size_statistics(setup, rung, _records({BASE: base, BEST: gene}), [BEST], tokens_per_step=64,
                                       vocab_size=16))
    rows = tr.transfer_statistics(rows, 0.95, True, True)
    result = {"kind": "transfer", "metric": "val_perplexity", "metric_label": "perplexity", "lower_is_better": True,
              "reference": rows[0]["size"], "largest": rows[1]["size"], "sizes": rows, "seeds": list(SEEDS),
              "confidence": 0.95, "eval_split": "valid", "genes": [{"gene": BEST, "str": BEST}]}
    result["headline"] = transfer_headline(result)
    tr.write_transfer(result, out_dir)
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


def test_ablation_and_transfer_outputs_use_one_sign(tmp_path):
    run_dir = _run(tmp_path)
    ablation, transfer = _ablation(run_dir), _transfer(run_dir)
    write_report(run_dir)
    outputs = {"ablation (CLI)": "\n".join(contribution_lines(ablation)), "ablation.md": ablation_markdown(ablation),
               "transfer (CLI headline)": transfer["headline"], "transfer.md": transfer_markdown(transfer),
               "report.md": (run_dir / "report.md").read_text(), "report.html": (run_dir / "report.html").read_text()}
    for where, text in outputs.items():
        _check(text, where)
        assert "positive = better" not in text.lower() and "positive contributions" not in text.lower(), where
    # the field (sparsemax) lowers the perplexity by 20%: a negative contribution, wherever shown
    for where in ("ablation (CLI)", "ablation.md", "report.md", "report.html"):
        assert "-20.00%" in outputs[where] and "+20.00%" not in outputs[where], where
    # (the variants table shows "without sparsemax" minus the full gene, +25%: the variant minus its reference)
    assert "+25.00%" not in outputs["ablation (CLI)"]
    # the gene is 20% and 10% below the baseline at the two sizes: negative relative changes
    for where in ("transfer (CLI headline)", "transfer.md", "report.md", "report.html"):
        assert "-20.0%" in outputs[where] and "-10.0%" in outputs[where] and "+20.0%" not in outputs[where], where
    assert "Advantage" not in outputs["transfer.md"]
    # JSON: the field names say a change, and its sign is the metric's
    written = json.loads((run_dir / "ablation.json").read_text())
    for c in written["contributions"] + [written["total"]]:
        assert "value" not in c and c["metric_change"] == pytest.approx(-0.2, abs=1e-9), c
    written = json.loads((run_dir / "transfer.json").read_text())
    genes = [g for size in written["sizes"] for g in size["genes"]]
    assert all(not any(k.startswith("advantage") for k in g) for g in genes)
    assert [round(g["relative_change"], 6) for g in genes] == [-0.2, -0.1]
    assert genes[1]["transfer"] == "shrinks"


def test_older_ablation_and_transfer_files_read_in_the_current_sign(tmp_path):
    """Files written with the older sign (contributions and advantage positive = better) are read
    in the current one and marked with ``recomputed_from``."""
    run_dir = _run(tmp_path)
    ablation, transfer = _ablation(run_dir), _transfer(run_dir)
    for c in ablation["contributions"] + [ablation["total"]]:  # as an earlier version wrote them
        value = -c.pop("metric_change")
        low, high = c.pop("metric_change_low"), c.pop("metric_change_high")
        c.update(value=value, low=-high, high=-low)
        del c["relative"]
    (run_dir / "ablation.json").write_text(json.dumps(ablation))
    for size in transfer["sizes"]:
        for g in size["genes"]:
            g["advantage"], low, high = -g.pop("relative_change"), g.pop("relative_change_low"), \
                g.pop("relative_change_high")
            g["advantage_low"], g["advantage_high"] = -high, -low
    transfer["headline"] = "an older headline: advantage +20.0%"
    (run_dir / "transfer.json").write_text(json.dumps(transfer))
    found = read_studies(run_dir)
    old_ablation, old_transfer = found.ablations[0], found.transfers[0]
    assert old_ablation["recomputed_from"] == OLDER_SIGN and old_transfer["recomputed_from"] == OLDER_ADVANTAGE
    assert old_ablation["total"]["metric_change"] == pytest.approx(-0.2, abs=1e-9)
    assert [round(g["relative_change"], 6) for s in old_transfer["sizes"] for g in s["genes"]] == [-0.2, -0.1]
    assert "-20.0%" in old_transfer["headline"] and "+20.0%" not in old_transfer["headline"]
    write_report(run_dir)
    for text in ((run_dir / "report.md").read_text(), (run_dir / "report.html").read_text()):
        _check(text, "report")
        assert "-20.00%" in text and "older sign" in text and "+20.0%" not in text
