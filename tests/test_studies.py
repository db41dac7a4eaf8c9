"""The base of the seed-based studies: one setup resolved once, one training path, typed results."""

import json
from pathlib import Path

import pytest

from evo_attention import AttentionGene, Config
from evo_attention.data import data_from_config
from evo_attention.search.executors import LocalExecutor
from evo_attention.studies.ablation import AblationResult, ablate, write_ablation
from evo_attention.studies.common import StudySetup, run_seeds, study_store
from evo_attention.studies.transfer import TransferResult, transfer_genes, write_transfer
from evo_attention.studies.validate import ValidationResult, validate_genes, write_validation
from evo_attention.train.spec import Trial
from evo_attention.util.errors import UserError

VANILLA = AttentionGene.vanilla().key
SPARSE = "dot|sparsemax|none|fixed|bias|0.10"
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, seed=7)


class CountingExecutor(LocalExecutor):
    def __init__(self):
        self.trained = []

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.gene, task.seed, task.steps))
            yield task, record


@pytest.fixture(scope="module")
def tiny():
    config = Config(**TINY)
    return config, data_from_config(config)


# -- the setup ------------------------------------------------------------------------------------
def test_the_setup_resolves_seeds_steps_and_provenance_once(tiny):
    config, data = tiny
    setup = StudySetup.resolve(config, data, role="validate", n_seeds=3, search_seed=7, source_run=Path("runs/x"))
    assert setup.seeds == (8, 9, 10) and setup.steps == 6 and setup.role == "validate"
    assert (setup.metric, setup.metric_label, setup.lower_is_better) == ("val_perplexity", "perplexity", True)
    assert StudySetup.resolve(config, data, role="validate", n_seeds=2, steps=3).steps == 3
    accuracy = StudySetup.resolve(config, data, role="validate", n_seeds=2, metric="accuracy", eval_split="test")
    assert (accuracy.metric_label, accuracy.lower_is_better, accuracy.eval_split) == ("accuracy", False, "test")

    block = setup.provenance()
    assert block["seeds"] == [8, 9, 10] and block["steps"] == 6 and block["search_seed"] == 7
    assert block["source_run"] == "runs/x" and block["confidence"] == 0.95 and block["eval_split"] == "valid"
    assert (block["metric"], block["metric_label"], block["lower_is_better"]) == ("val_perplexity", "perplexity", True)
    assert block["config"] == config.to_dict() and block["data"] == data.describe()
    assert {"numpy", "scipy", "matplotlib"} <= set(block["versions"]) and block["created_at"]
    assert setup.provenance(steps=[6, 12])["steps"] == [6, 12]

    # one task per distinct gene and seed, each the trial of that pair with the setup's steps and split
    tasks = setup.tasks([SPARSE, VANILLA, SPARSE])
    assert [(t.gene, t.seed) for t in tasks] == [(g, s) for g in (SPARSE, VANILLA) for s in (8, 9, 10)]
    assert all(t.role == "validate" and t.label == f"seed {t.seed}" for t in tasks)
    assert tasks[0].trial == Trial.from_config(SPARSE, config, seed=8, steps=6, data=data)
    assert setup.tasks([SPARSE], labels={SPARSE: "sparse"})[0].label == "sparse, seed 8"

    # a rung of a ladder: another config, its own steps, the same seeds and metric
    rung = setup.at(config.replace(d_model=32, n_heads=1, train_steps=9))
    assert (rung.steps, rung.seeds, rung.metric, rung.role) == (9, setup.seeds, setup.metric, "validate")
    assert rung.tasks([SPARSE])[0].trial.model.d_model == 32


@pytest.mark.parametrize("changes, setting, words", [
    ({"n_seeds": 1}, "n_seeds", "at least 2 seeds"),
    ({"n_seeds": 2, "search_seed": 8}, "seed", "include 8"),
    ({"n_seeds": 0, "min_seeds": 1, "seeds_setting": "seeds"}, "seeds", "seeds 0 is too few"),
])
def test_the_setup_refuses_bad_seeds_naming_the_setting(tiny, changes, setting, words):
    config, data = tiny
    with pytest.raises(UserError, match=words) as err:
        StudySetup.resolve(config, data, role="validate", **changes)
    assert err.value.setting == setting


def test_the_setup_allows_one_seed_where_asked(tiny):
    config, data = tiny
    assert StudySetup.resolve(config, data, role="compare", n_seeds=1, min_seeds=1).seeds == (8,)


def test_training_goes_through_the_store_and_a_repeat_trains_nothing(tiny, tmp_path):
    config, data = tiny
    executor = CountingExecutor()
    with study_store(tmp_path / "store", config, "test") as store:
        setup = StudySetup.resolve(config, data, role="ablation", n_seeds=2, steps=3, store=store, executor=executor)
        first = setup.train([VANILLA, SPARSE])
        assert sorted(executor.trained) == sorted((g, s, 3) for g in (VANILLA, SPARSE) for s in (8, 9))
        assert set(first) == {(g, s) for g in (VANILLA, SPARSE) for s in (8, 9)}
        assert {r["role"] for r in store.evaluations()} == {"ablation"}
        executor.trained.clear()
        again = setup.train([SPARSE, VANILLA])
        assert executor.trained == [] and {k: r["val_loss"] for k, r in again.items()} == {
            k: r["val_loss"] for k, r in first.items()}
        # run_seeds (explicit seeds) is the same path: served from the store too
        assert run_seeds([SPARSE], config, data, [8], steps=3, store=store, executor=executor)[SPARSE, 8] == \
            again[SPARSE, 8]
        assert executor.trained == []
    # the store stays in its directory: opened again, never created twice
    with study_store(tmp_path / "store", config, "test") as again:
        assert len(again.evaluations()) == 4 and again.get_meta("study") == "test"


# -- typed results --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny):
    with study_store(tmp_path_factory.mktemp("studies"), tiny[0], "test") as store:
        yield store


def _written(path: Path) -> dict:
    return json.loads(path.read_text())


def test_validate_returns_a_typed_result_that_is_what_it_writes(tiny, store, tmp_path):
    config, data = tiny
    result = validate_genes([SPARSE], config, data, n_seeds=2, store=store, search_values={SPARSE: 3.0})
    assert isinstance(result, ValidationResult) and result.kind == "validation"
    assert result.seeds == [8, 9] and result.metric == "val_perplexity" and result.confidence == 0.95
    assert result.baseline["gene"] == VANILLA and [g["gene"] for g in result.genes] == [SPARSE]
    assert result.genes[0]["search_value"] == 3.0 and result.best["gene"] == SPARSE
    assert result.headline == result["headline"] and result["steps"] == 6 and result.get("nonesuch") is None
    paths = write_validation(result, tmp_path)
    written = _written(paths["json"])
    assert result.to_dict() == written and result == written and list(result) == list(written)


def test_ablate_returns_a_typed_result_that_is_what_it_writes(tiny, store, tmp_path):
    config, data = tiny
    result = ablate(SPARSE, config, data, n_seeds=2, store=store)
    assert isinstance(result, AblationResult) and result.kind == "ablation" and result.gene == SPARSE
    assert [v["name"] for v in result.variants] == ["full gene", "baseline", "without normalization",
                                                    "baseline + normalization"]
    assert [c["field"] for c in result.contributions] == ["normalization", "normalization"]
    assert result.total["kind"] == "total" and result.seeds == [8, 9]
    whole = data.scored_tokens("valid")  # each variant's values scored the whole split
    assert all(v["eval_tokens"] == whole and v["eval_complete"] is True for v in result.variants)
    written = _written(write_ablation(result, tmp_path)["json"])
    assert result.to_dict() == written and list(result) == list(written)


def test_transfer_returns_a_typed_result_that_is_what_it_writes(tiny, store, tmp_path):
    config, data = tiny
    result = transfer_genes([SPARSE], config, data, sizes="32x1", n_seeds=2, store=store)
    assert isinstance(result, TransferResult) and result.kind == "transfer"
    assert result.reference == "16x1" and result.largest == "32x1" and [s["size"] for s in result.sizes] == [
        "16x1", "32x1"]
    assert set(result.verdicts) == {SPARSE} and result["steps"] == [6, 6] and result.seeds == [8, 9]
    rows = [r for s in result.sizes for r in [s["baseline"], *s["genes"]]]
    assert all(r["eval_tokens"] == data.scored_tokens("valid") and r["eval_complete"] is True for r in rows)
    written = _written(write_transfer(result, tmp_path)["json"])
    assert result.to_dict() == written and list(result) == list(written)
    assert list(written)[-1] == "headline" and written["headline"] == result.headline


def test_the_failed_trainings_are_listed_one_each_with_gene_and_seed():
    from evo_attention.report.studies.validation import validation_markdown
    from evo_attention.studies.common import samples

    records = {("g", 1): {"status": "diverged", "error": "non-finite loss"},
               ("g", 2): {"status": "ok", "val_perplexity": 9.0},
               ("g", 3): {"status": "diverged", "error": "non-finite loss"}, ("g", 4): {"status": "failed"}}
    row = {"gene": "g", **samples(records, "g", [1, 2, 3, 4], "val_perplexity")}
    assert row["errors"] == ["seed 1: non-finite loss", "seed 3: non-finite loss", "seed 4: failed"]
    text = validation_markdown({"seeds": [1, 2, 3, 4], "genes": [row], "baseline": {"gene": "b", "values": [1.0] * 4}})
    assert [line for line in text.splitlines() if line.startswith("- `g`")] == [
        "- `g`: seed 1: non-finite loss", "- `g`: seed 3: non-finite loss", "- `g`: seed 4: failed"]
