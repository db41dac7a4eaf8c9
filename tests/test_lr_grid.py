"""Each gene at its own best learning rate: the grid, the selection on the tuning seeds, the verdict
on fresh seeds, the family of the baseline at its rate, the outputs, and a resumed grid."""

import json
import math

import pytest

from evo_attention import AttentionGene, Config
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.report.studies.validation import validation_markdown
from evo_attention.search.executors import Executor, LocalExecutor
from evo_attention.studies import lr_grid
from evo_attention.studies.ablation import ablate, write_ablation
from evo_attention.studies.common import StudySetup, study_store, tuning_seeds
from evo_attention.studies.compare import resolve_configs, run_compare
from evo_attention.studies.transfer import transfer_genes, write_transfer
from evo_attention.studies.validate import validate_genes, write_validation
from evo_attention.train.config import parse_lr_grid
from evo_attention.train.record import EvaluationRecord
from evo_attention.util.errors import UserError

PNG = b"\x89PNG\r\n\x1a\n"
VANILLA = AttentionGene.vanilla().key
SPARSE = "dot|sparsemax|none|fixed|bias|0.10"
GATE = "dot|softmax|output_gate|fixed|bias|0.10"
OTHER = "cosine|softmax|none|fixed|bias|0.10"
GRID = "5e-4,1e-3,2e-3,4e-3"
RATES = (5e-4, 1e-3, 2e-3, 4e-3)
TUNING = [1008, 1009]  # seed 7 + 1001, + 1002
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, seed=7)

# Where each gene's known curve has its minimum: inside the grid for the baseline and SPARSE, above
# it for GATE (its best rate of the grid is the largest: an edge winner); OTHER is never tuned here.
OPTIMUM = {VANILLA: 1e-3, SPARSE: 2e-3, GATE: 1e-2, OTHER: 1e-3}


def known_value(gene: str, rate: float, seed: int, split: str) -> float:
    """A perplexity with a known best rate per gene: a parabola in log2(rate), a little noise of
    the gene and seed (never the same for two genes: the paired differences have a spread), and
    the test split 5% above the validation split."""
    bowl = 10.0 * (1.0 + 0.1 * math.log2(rate / OPTIMUM[gene]) ** 2)
    noise = 1.0 + 0.002 * ((seed * (3 + sorted(OPTIMUM).index(gene))) % 5)
    return bowl * noise * (1.05 if split == "test" else 1.0)


class KnownExecutor(Executor):
    """Returns the records of ``known_value`` without training, and remembers every trial it was
    given as (gene, seed, rate, split); ``stop_after`` raises KeyboardInterrupt after that many."""

    name = "known"

    def __init__(self, stop_after: int | None = None):
        self.seen = []
        self.stop_after = stop_after

    def run(self, tasks, *, on_start=None, on_step=None):
        for task in tasks:
            if self.stop_after is not None and len(self.seen) >= self.stop_after:
                raise KeyboardInterrupt
            trial = task.trial
            rate = trial.train.learning_rate
            self.seen.append((task.gene, task.seed, rate, trial.eval_split))
            value = known_value(task.gene, rate, task.seed, trial.eval_split)
            yield task, EvaluationRecord(
                gene=task.gene, seed=task.seed, steps=task.steps, data_fingerprint=trial.task.fingerprint,
                context=trial.context, status="ok", val_loss=math.log(value), val_perplexity=value, accuracy=0.5,
                eval_split=trial.eval_split, params=100, time_s=0.01)


class CountingExecutor(LocalExecutor):
    def __init__(self):
        self.trained = []

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.gene, task.seed, task.trial.train.learning_rate))
            yield task, record


@pytest.fixture(scope="module")
def tiny():
    config = Config(**TINY)
    return config, data_from_config(config)


def _tuning(seen):
    return {(g, s, r) for g, s, r, split in seen if s in TUNING}


def _verdict(seen):
    return {(g, s, r, split) for g, s, r, split in seen if s not in TUNING}


# -- the grid and its seeds -----------------------------------------------------------------------
def test_a_grid_is_sorted_distinct_positive_rates_and_its_seeds_a_block_of_their_own(tiny):
    assert parse_lr_grid("4e-3, 5e-4,1e-3,1e-3") == (5e-4, 1e-3, 4e-3)
    assert parse_lr_grid([2e-3, 1e-3]) == (1e-3, 2e-3)
    for bad, words in (("1e-3", "at least 2"), ("1e-3,1e-3", "at least 2"), ("1e-3,-1", "not a learning rate"),
                       ("1e-3,abc", "not a learning rate"), ("1e-3,nan", "not a learning rate")):
        with pytest.raises(UserError, match=words) as err:
            parse_lr_grid(bad)
        assert err.value.setting == "lr_grid"
    assert tuning_seeds(7, 3) == [1008, 1009, 1010]
    with pytest.raises(UserError, match="share seed 1008"):
        tuning_seeds(7, 2, verdict_seeds=range(8, 1010))
    with pytest.raises(UserError, match="positive number of tuning seeds"):
        tuning_seeds(7, 0)

    config, data = tiny
    setup = StudySetup.resolve(config, data, role="validate", n_seeds=3, lr_grid=GRID)
    assert setup.lr_grid == RATES and setup.tuning_seeds == (1008, 1009) and setup.seeds == (8, 9, 10)
    assert not set(setup.tuning_seeds) & set(setup.seeds)
    assert setup.at_rate(2e-3).tasks([SPARSE])[0].trial.train.learning_rate == 2e-3
    assert setup.at_rate(2e-3).steps == setup.steps  # a point of the grid keeps the study's steps
    # without a grid nothing changes: no rates, no tuning seeds
    plain = StudySetup.resolve(config, data, role="validate", n_seeds=3)
    assert plain.lr_grid == () and plain.tuning_seeds == ()
    # seeds planned from a pilot may reach far: the tuning block must stay clear of all of them
    with pytest.raises(UserError, match="share seed"):
        StudySetup.resolve(config, data, role="validate", n_seeds="auto", mde=0.01, max_seeds=2000, lr_grid=GRID)


def test_the_selection_skips_rates_with_failed_seeds_and_breaks_ties_to_the_smaller_rate():
    curve = [{"lr": 1e-3, "mean": 5.0, "n_failed": 0}, {"lr": 2e-3, "mean": 4.0, "n_failed": 1},
             {"lr": 4e-3, "mean": 5.0, "n_failed": 0}]
    assert lr_grid.select(curve) == 1e-3  # 2e-3 lost a seed; 1e-3 and 4e-3 tie
    assert lr_grid.select(curve, lower_is_better=False) == 1e-3
    assert lr_grid.select([{"lr": 1e-3, "mean": None, "n_failed": 2}, {"lr": 2e-3, "mean": 9.0, "n_failed": 1}]) == 2e-3


# -- the verdict at the selected rates ------------------------------------------------------------
def test_each_gene_is_measured_at_its_best_rate_on_fresh_seeds(tiny, tmp_path):
    config, data = tiny
    executor = KnownExecutor()
    result = validate_genes([SPARSE, GATE], config, data, n_seeds=3, executor=executor, lr_grid=GRID)
    grid = result["grid"]
    assert grid["rates"] == list(RATES) and grid["tuning_seeds"] == TUNING and grid["verdict_seeds"] == [8, 9, 10]
    # every gene, the baseline included, was tuned on the same grid and tuning seeds, on the validation split
    assert _tuning(executor.seen) == {(g, s, r) for g in (VANILLA, SPARSE, GATE) for s in TUNING for r in RATES}
    assert {split for g, s, r, split in executor.seen if s in TUNING} == {"valid"}
    # the selected rate is the argmin of the mean validation value over the tuning seeds
    expected = {VANILLA: 1e-3, SPARSE: 2e-3, GATE: 4e-3}
    for gene, row in grid["genes"].items():
        means = [sum(known_value(gene, r, s, "valid") for s in TUNING) / 2 for r in RATES]
        assert [p["mean"] for p in row["curve"]] == pytest.approx(means)
        assert row["selected"] == RATES[means.index(min(means))] == expected[gene]
    assert lr_grid.selected_rates(grid) == expected
    # the verdict: each gene only at its selected rate, on the study's seeds, never a tuning seed
    assert _verdict(executor.seen) == {(g, s, expected[g], "valid") for g in expected for s in (8, 9, 10)}
    rows = {r["gene"]: r for r in [result["baseline"]] + result["genes"]}
    for gene, row in rows.items():
        assert row["values"] == pytest.approx([known_value(gene, expected[gene], s, "valid") for s in (8, 9, 10)])
    assert abs(rows[SPARSE]["relative"]) < 0.01  # at their own best rates the two curves' minima meet
    # an edge winner is flagged, and the outputs say the grid should be widened
    assert [g["at_edge"] for g in grid["genes"].values()] == [False, False, True] and grid["at_edge"] == [GATE]
    paths = write_validation(result, tmp_path)
    md = paths["md"].read_text()
    assert "## Each gene at its own best learning rate" in md and "| lr 0.0005 | lr 0.001 |" in md
    assert f"the best rate of `{GATE}` is the grid's largest, 0.004: the grid should be widened" in md
    assert md.count("the grid should be widened") == 1 and "![Learning-rate grid](validation_lr_grid.png)" in md
    assert "| 3/3 | 0.002 |" in md  # the rate each gene was measured at
    assert paths["grid"].name == "validation_lr_grid.png" and paths["grid"].read_bytes()[:8] == PNG
    written = json.loads(paths["json"].read_text())
    assert written == result.to_dict() and written["grid"]["genes"][GATE]["at_edge"] is True


def test_the_test_split_measures_the_verdict_and_never_tunes(tiny):
    config, data = tiny
    executor = KnownExecutor()
    result = validate_genes([SPARSE], config, data, n_seeds=2, executor=executor, lr_grid=GRID, eval_split="test")
    assert {split for g, s, r, split in executor.seen if s in TUNING} == {"valid"}
    assert {split for g, s, r, split in executor.seen if s not in TUNING} == {"test"}
    assert result["grid"]["tuning_split"] == "valid" and result["eval_split"] == "test"
    assert result["genes"][0]["values"] == pytest.approx([known_value(SPARSE, 2e-3, s, "test") for s in (8, 9)])
    assert "on the test split" in validation_markdown({**result.to_dict(), "steps": 6})


def test_the_family_is_that_of_the_baseline_at_its_selected_rate(tiny, tmp_path):
    config, data = tiny
    executor = KnownExecutor()
    with study_store(tmp_path / "store", config, "test") as store:
        # earlier plain validations: at 1e-3 (the baseline's best rate) and at 4e-3
        validate_genes([OTHER, SPARSE], config.replace(learning_rate=1e-3), data, n_seeds=2, store=store,
                       executor=executor)
        validate_genes([GATE], config.replace(learning_rate=4e-3), data, n_seeds=2, store=store, executor=executor)
        executor.seen.clear()
        result = validate_genes([SPARSE], config, data, n_seeds=2, store=store, executor=executor, lr_grid=GRID)
    # the baseline at its rate 1e-3 on seeds 8, 9 came from the store: those are the trainings compared with
    assert not [x for x in executor.seen if x[0] == VANILLA and x[1] in (8, 9)]
    # its family: SPARSE at 2e-3 (this study), OTHER at 1e-3 and SPARSE at 1e-3 (the earlier comparisons with
    # these baseline trainings); GATE was compared with other baseline trainings (4e-3) and is not in it
    assert result["family_size"] == 3 and result["genes"][0]["family_size"] == 3


# -- every study, the same grid for every gene ----------------------------------------------------
def test_compare_gives_every_configuration_the_baseline_included_the_same_grid(tiny, tmp_path):
    config, _ = tiny
    executor = KnownExecutor()
    entries = resolve_configs(f"baseline,{SPARSE}", config.d_model)
    result = run_compare(config, entries, seeds=2, out_dir=tmp_path, executor=executor, quiet=True, lr_grid=GRID)
    assert _tuning(executor.seen) == {(g, s, r) for g in (VANILLA, SPARSE) for s in TUNING for r in RATES}
    assert result["grid"]["metric"] == "val_loss" and lr_grid.selected_rates(result["grid"]) == {
        VANILLA: 1e-3, SPARSE: 2e-3}
    assert {(r["name"], r["learning_rate"]) for r in result["results"]} == {("baseline", 1e-3), (SPARSE, 2e-3)}
    assert result["settings"]["lr_grid"] == list(RATES) and set(result["summary"]["paired"]) == {SPARSE}
    md = (tmp_path / "compare.md").read_text()
    assert "lr: each configuration at its own best of 0.0005, 0.001, 0.002, 0.004" in md
    assert "baseline: `dot\\|softmax" in md and (tmp_path / "compare_lr_grid.png").read_bytes()[:8] == PNG


def test_ablation_and_transfer_tune_every_gene(tiny, tmp_path):
    config, data = tiny
    executor = KnownExecutor()
    result = ablate(SPARSE, config, data, n_seeds=2, executor=executor, lr_grid=GRID)
    assert set(result["grid"]["genes"]) == {SPARSE, VANILLA}
    assert {v["gene"]: v["values"][0] for v in result["variants"]} == pytest.approx(
        {SPARSE: known_value(SPARSE, 2e-3, 8, "valid"), VANILLA: known_value(VANILLA, 1e-3, 8, "valid")})
    paths = write_ablation(result, tmp_path)
    assert "| lr |" in paths["md"].read_text() and paths["grid"].read_bytes()[:8] == PNG

    executor = KnownExecutor()
    result = transfer_genes([GATE], config, data, sizes="32x1", n_seeds=2, executor=executor, lr_grid=GRID)
    sizes = result["grid"]["sizes"]
    assert [s["size"] for s in sizes] == ["16x1", "32x1"]
    assert all(s["genes"][GATE]["selected"] == 4e-3 and s["genes"][VANILLA]["selected"] == 1e-3 for s in sizes)
    assert result["grid"]["at_edge"] == [f"{GATE} @ 16x1", f"{GATE} @ 32x1"]
    assert len([x for x in executor.seen if x[1] in TUNING]) == 2 * 2 * 4 * 2  # sizes x genes x rates x seeds
    paths = write_transfer(result, tmp_path)
    md = paths["md"].read_text()
    assert "### 32x1" in md and md.count("the grid should be widened") == 2
    assert paths["grid"].name == "transfer_lr_grid.png"


# -- the store: every point cached ----------------------------------------------------------------
def test_an_interrupted_grid_resumes_where_it_stopped(tiny, tmp_path):
    config, data = tiny
    with study_store(tmp_path / "store", config, "test") as store:
        with pytest.raises(KeyboardInterrupt):
            validate_genes([SPARSE], config, data, n_seeds=2, store=store, executor=KnownExecutor(stop_after=5),
                           lr_grid=GRID)
        assert len(store.evaluations(role="lr-grid")) == 5  # each point stored the moment it finished
        executor = KnownExecutor()
        first = validate_genes([SPARSE], config, data, n_seeds=2, store=store, executor=executor, lr_grid=GRID)
        assert len(_tuning(executor.seen)) == 2 * 4 * 2 - 5  # only what was missing
        executor = KnownExecutor()
        again = validate_genes([SPARSE], config, data, n_seeds=2, store=store, executor=executor, lr_grid=GRID)
    assert executor.seen == [] and again["grid"] == first["grid"] and again["genes"][0]["values"] == first["genes"][0][
        "values"]


def test_the_commands_take_a_grid_and_a_repeat_trains_nothing(tiny, tmp_path, capsys):
    import yaml

    config, data = tiny
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "validate"
    flags = ["--config", str(path), "--lr-grid", "1e-3,1e-2", "--tuning-seeds", "1", "--quiet"]
    assert main(["validate", "--genes", SPARSE, "--seeds", "2", "--out", str(out)] + flags) == 0
    result = json.loads((out / "validation.json").read_text())
    assert result["grid"]["tuning_seeds"] == [1008] and result["seeds"] == [8, 9]
    assert set(result["grid"]["genes"]) == {VANILLA, SPARSE} and (out / "validation_lr_grid.png").exists()
    assert "selected learning rates" in capsys.readouterr().err
    # a repeat (the store in --out) trains nothing: every point of the grid and every verdict training
    executor = CountingExecutor()
    with study_store(out, config, "validate") as store:
        again = validate_genes([SPARSE], config, data, n_seeds=2, store=store, executor=executor, lr_grid="1e-3,1e-2",
                               n_tuning_seeds=1)
    assert executor.trained == [] and again["grid"] == result["grid"]

    # baseline: the grid on the tuning seeds, then the gene at its selected rate with the seed itself
    base = tmp_path / "baseline"
    assert main(["baseline", "--out", str(base)] + flags) == 0
    written = json.loads((base / "result.json").read_text())
    selected = written["grid"]["genes"][VANILLA]["selected"]
    assert written["seed"] == 7 and written["config"]["learning_rate"] == selected and written["grid"]["tuning_seeds"] == [
        1008]
    assert (base / "lr_grid.png").read_bytes()[:8] == PNG

    with pytest.raises(SystemExit):  # argparse refuses it, naming the flag
        main(["validate", "--genes", SPARSE, "--config", str(path), "--lr-grid", "1e-3", "--quiet"])
    assert "argument --lr-grid: '1e-3' holds 1 distinct rate: a grid needs at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["validate", "--genes", SPARSE, "--config", str(path), "--lr-grid", "1e-3,2e-3", "--tuning-seeds", "0",
              "--out", str(tmp_path / "x"), "--quiet"])
    assert "tuning seeds" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("command", ["baseline", "validate", "ablate", "transfer", "compare", "curve", "fitness-check"])
def test_a_non_positive_tuning_seeds_is_refused_without_a_grid_too(command, capsys):
    for value in ("-3", "0", "two"):
        with pytest.raises(SystemExit):  # argparse refuses it, naming the flag, before any other check
            main([command, "--tuning-seeds", value, "--quiet"])
        assert f"argument --tuning-seeds: '{value}' is not a positive number" in capsys.readouterr().err


def test_an_lr_beside_a_grid_changes_nothing(tmp_path, recwarn):
    run = tmp_path / "run"
    tiny = ["--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "3", "--quiet"]
    assert main(["search", *tiny, "--population", "2", "--generations", "1", "--elite", "1", "--keep-models", "0",
                 "--out", str(run)]) == 0
    rate = json.loads((run / "final_results.json").read_text())["config"]["learning_rate"]
    flags = ["validate", "--from-run", str(run), "--top", "1", "--seeds", "2", "--lr-grid", f"1e-9,{rate}",
             "--tuning-seeds", "1", "--quiet"]
    results = []
    for extra, out in (([], "a"), (["--lr", "0.5"], "b")):
        assert main([*flags, *extra, "--out", str(tmp_path / out)]) == 0
        results.append(json.loads((tmp_path / out / "validation.json").read_text()))
    assert "--lr is not used with --lr-grid (each gene trains at its own best rate of the grid): ignored" in \
        [str(w.message) for w in recwarn]
    assert results[0]["genes"][0]["search_value"] is not None  # the run's rate wins: the search measured the same
    assert [g.get("search_value") for g in results[0]["genes"]] == [g.get("search_value") for g in results[1]["genes"]]
    assert [g["values"] for g in results[0]["genes"]] == [g["values"] for g in results[1]["genes"]]
