"""Several runs compared side by side (report.runs), from synthetic run stores (no training)."""

import json

import pytest

from evo_attention import Config
from evo_attention.cli import main
from evo_attention.report.runs import OUTPUTS, compare_runs, write_comparison
from evo_attention.search import pareto
from evo_attention.search.store import RunStore
from evo_attention.util.errors import UserError

BASE = "dot|softmax|none|fixed|bias|0.10"
# strategy -> search evaluations in store order: (gene, perplexity or None for a failure, params)
RUNS = {
    "ga": [("cosine|softmax|none|fixed|bias|0.10", 150.0, 900), ("dot|sigmoid|none|fixed|bias|0.10", 140.0, 1200),
           ("dot|softmax|output_gate|fixed|bias|0.10", None, 1000), ("dot|softmax|input_gate|fixed|bias|0.10", 130.0, 1500)],
    "random": [("additive|softmax|none|fixed|bias|0.10", 145.0, 800), ("dot|relu_norm|none|fixed|bias|0.10", 160.0, 700),
               ("cosine|sigmoid|none|fixed|bias|0.10", 135.0, 1100)],
}


def _record(gene, ppl, params, seed=42):
    ok = ppl is not None
    return {"gene": gene, "seed": seed, "steps": 100, "data_fingerprint": "fp", "context": "ctx",
            "status": "ok" if ok else "diverged", "error": None if ok else "diverged: nan",
            "val_perplexity": ppl, "val_loss": 5.0 if ok else float("inf"), "params": params, "eval_tokens": 4096}


def _run(tmp_path, strategy, steps=100, validation=None):
    run_dir = tmp_path / f"search-{strategy}"
    config = Config(strategy=strategy, objectives=["perplexity", "params"], train_steps=steps).to_dict()
    meta = {"strategy": {"name": strategy, "options": {}}, "data": {"name": "wikitext2", "fingerprint": "fp"},
            "done": True}
    with RunStore.create(run_dir, config=config, meta=meta) as store:
        store.record(_record(BASE, 155.0, 1000), role="baseline")
        for gene, ppl, params in RUNS[strategy]:
            store.record(_record(gene, ppl, params), role="search", generation=0)
    if validation:
        (run_dir / "validation.json").write_text(json.dumps(validation))
    return run_dir


def _validation(gene):
    return {"kind": "validation", "metric": "val_perplexity", "eval_split": "valid",
            "baseline": {"gene": BASE, "mean": 150.0},
            "genes": [{"gene": "dot|sigmoid|none|fixed|bias|0.10", "mean": 149.0},
                      {"gene": gene, "n": 5, "mean": 148.0, "ci_low": 145.0, "ci_high": 151.0, "difference": -2.0,
                       "diff_ci_low": -5.0, "diff_ci_high": 1.0, "p_holm": 0.4, "verdict": "not distinguishable",
                       "seeds": [43, 44, 45, 46, 47]}]}


def test_runs_side_by_side_with_anytime_curves_and_one_common_box(tmp_path):
    ga = _run(tmp_path, "ga", validation=_validation("dot|softmax|input_gate|fixed|bias|0.10"))
    rnd = _run(tmp_path, "random")
    result = compare_runs([ga, rnd])
    by = {run["strategy"]: run for run in result["runs"]}
    assert [run["name"] for run in result["runs"]] == ["search-ga", "search-random"]
    assert by["ga"]["anytime"] == [150.0, 140.0, 140.0, 130.0]  # a failure leaves the best where it was
    assert by["random"]["anytime"] == [145.0, 145.0, 135.0]
    assert (by["ga"]["search_trainings"], by["ga"]["failed"]) == (4, 1)
    assert by["ga"]["best_gene"] == "dot|softmax|input_gate|fixed|bias|0.10"
    assert by["ga"]["change_percent"] == pytest.approx(-100 * 25 / 155)
    # the hypervolumes share one box: the bounds of both runs' finished evaluations together
    points = {s: [(p, float(n)) for _, p, n in RUNS[s] if p is not None] for s in RUNS}
    ideal, reference = pareto.bounds(points["ga"] + points["random"])
    assert result["box"]["ideal_point"] == {"perplexity": 130.0, "params": 700.0}
    for s in RUNS:
        assert by[s]["hypervolume"] == pytest.approx(pareto.hypervolume_share(points[s], ideal, reference))
    assert by["random"]["front"] == [{"perplexity": 135.0, "params": 1100.0},
                                     {"perplexity": 145.0, "params": 800.0}, {"perplexity": 160.0, "params": 700.0}]
    # the validation of the run's best gene, not of the first gene validated
    assert by["ga"]["validated"]["mean"] == 148.0 and by["ga"]["validated"]["verdict"] == "not distinguishable"
    assert by["random"]["validated"] is None
    assert result["differences"] == {}


def test_the_comparison_says_where_runs_differ_beyond_the_strategy(tmp_path):
    result = compare_runs([_run(tmp_path, "ga"), _run(tmp_path, "random", steps=200)])
    assert result["differences"] == {"train_steps": [100, 200]}


def test_written_outputs_and_the_command(tmp_path, capsys):
    ga, rnd = _run(tmp_path, "ga"), _run(tmp_path, "random")
    paths = write_comparison([ga, rnd], tmp_path / "cmp")
    assert {p.name for p in paths.values()} == set(OUTPUTS.values())
    text = (tmp_path / "cmp" / "runs.md").read_text()
    assert "| search-random | random | 3 |" in text and "not validated" in text
    assert "share every setting but the strategy" in text
    assert (tmp_path / "cmp" / "runs.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["report", str(ga), str(rnd), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "runs.json").is_file() and (ga / "report.md").is_file()


@pytest.mark.parametrize("args,message", [
    (["{ga}", "{rnd}"], "name it with --out DIR"),
    (["{ga}", "--out", "{tmp}/x"], "give two or more run directories"),
    (["{ga}", "{tmp}/nothing", "--out", "{tmp}/x"], "nothing"),
])
def test_bad_comparisons_get_one_line(tmp_path, capsys, args, message):
    ga, rnd = _run(tmp_path, "ga"), _run(tmp_path, "random")
    argv = ["report"] + [a.format(ga=ga, rnd=rnd, tmp=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("out, message", [
    ("{tmp}/notes.txt", "is not a directory: give the path of a directory as --out"),
    ("{ga}", "--out {ga} is the input run 1 of 2 this command reads"),
    ("{rnd}", "--out {rnd} is the input run 2 of 2 this command reads"),
    ("{other}", "--out {other} holds a run store ({other}/run.db), not a comparison of runs"),
    ("{tmp}/notes.txt/cmp", "is a file, not a directory"),
    ("", "--out is empty"),
])
def test_the_comparison_follows_the_one_output_rule_before_anything_is_written(tmp_path, capsys, out, message):
    ga, rnd, other = _run(tmp_path, "ga"), _run(tmp_path, "random"), _run(tmp_path / "other", "ga")
    (tmp_path / "notes.txt").write_text("mine\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    names = dict(ga=ga, rnd=rnd, other=other, tmp=tmp_path)
    assert main(["report", str(ga), str(rnd), "--out", out.format(**names)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.format(**names) in err and "Traceback" not in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # not even a run's report
    with pytest.raises(UserError, match="is the input run 1 of 2"):  # the library follows the same rule
        write_comparison([ga, rnd], ga)


def test_one_run_is_not_a_comparison(tmp_path):
    with pytest.raises(UserError, match="at least two"):
        compare_runs([_run(tmp_path, "ga")])


def test_a_comparison_with_a_store_that_is_no_search_writes_nothing(tmp_path, capsys):
    ga = _run(tmp_path, "ga")
    RunStore.create(tmp_path / "v", config=Config().to_dict(), meta={"study": "validate"}).close()
    def written():  # the stores' SQLite side files aside
        return {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith("run.db")}

    before = written()
    assert main(["report", str(ga), str(tmp_path / "v"), "--out", str(tmp_path / "cmp")]) == 2
    assert "holds the store of a validate, not of a search" in capsys.readouterr().err
    assert written() == before  # not even ga's report
