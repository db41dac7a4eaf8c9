"""Validation, ablation and attention maps: enumeration, metrics, and the commands end to end."""

import json
import math

import pytest
import torch

from evo_attention import AttentionGene, Config, TinyTransformer
from evo_attention.studies import ablation, maps
from evo_attention.studies import validate as val  # the module
from evo_attention.report.studies.ablation import ablation_markdown
from evo_attention.report.studies.validation import validation_markdown
from evo_attention.cli import main
from evo_attention.util.errors import UserError
from evo_attention import Evolution
from evo_attention.search.executors import LocalExecutor
from evo_attention.search.store import RunStore

PNG = b"\x89PNG\r\n\x1a\n"
VANILLA = AttentionGene.vanilla()
SPARSE = "dot|sparsemax|none|fixed|bias|0.10"  # differs from vanilla in the normalization only
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, population_size=2, n_generations=1, elite_size=1,
            seed=7)


class CountingExecutor(LocalExecutor):
    def __init__(self):
        self.trained = []

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.gene, task.seed))
            yield task, record


# -- ablation enumeration -------------------------------------------------------------------------
def test_ablation_enumerates_exactly_the_differing_fields():
    gene = AttentionGene.parse("cosine|sparsemax|output_gate|fixed|nobias|0.10")
    variants = ablation.ablation_variants(gene)
    fields = gene.differences(VANILLA)
    assert fields == ["similarity", "normalization", "gating", "use_bias"]
    assert [v.kind for v in variants[:2]] == ["full", "baseline"]
    assert variants[0].gene == gene and variants[1].gene == VANILLA
    removed = [v for v in variants if v.kind == "remove"]
    added = [v for v in variants if v.kind == "add"]
    assert [v.field for v in removed] == fields and [v.field for v in added] == fields
    assert len(variants) == 2 + 2 * len(fields)
    for v in removed:  # the gene with exactly that field set back to the vanilla value
        assert v.gene.differences(gene) == [v.field] and getattr(v.gene, v.field) == getattr(VANILLA, v.field)
    for v in added:  # vanilla with exactly that field taken from the gene
        assert v.gene.differences(VANILLA) == [v.field] and getattr(v.gene, v.field) == getattr(gene, v.field)
    assert next(v for v in removed if v.field == "use_bias").change == "bias: nobias -> bias"


def test_ablation_of_a_single_field_gene_and_of_vanilla():
    variants = ablation.ablation_variants(SPARSE)
    assert [v.gene.key for v in variants] == [SPARSE, VANILLA.key, VANILLA.key, SPARSE]
    with pytest.raises(UserError, match="nothing to ablate"):
        ablation.ablation_variants(VANILLA)


def _fake_records(values_by_gene, seeds):
    return {(g, s): {"status": "ok", "val_perplexity": v} for g, vals in values_by_gene.items()
            for s, v in zip(seeds, vals)}


def _setup(seeds, **changes):
    """A study setup without data or store: the statistics of known values."""
    from evo_attention.studies.common import StudySetup

    return StudySetup(config=Config(), data=None, seeds=tuple(seeds), steps=10, role="validate", **changes)


def records_of_loss(records):
    return {k: {"status": r["status"], "val_loss": r["val_perplexity"]} for k, r in records.items()}


def test_ablation_contributions_from_known_values():
    gene = AttentionGene.parse("dot|sparsemax|output_gate|fixed|bias|0.10")
    variants = ablation.ablation_variants(gene)
    seeds = [1, 2, 3, 4]
    noise = [0.0, 0.1, -0.1, 0.05]
    means = {gene.key: 5.0, VANILLA.key: 8.0,
             "dot|softmax|output_gate|fixed|bias|0.10": 7.5,  # without sparsemax: sparsemax carries 2.5
             "dot|sparsemax|none|fixed|bias|0.10": 5.2}  # without the gate: it carries 0.2 only
    records = _fake_records({k: [m + n for n in noise] for k, m in means.items()}, seeds)
    result = ablation.ablation_statistics(_setup(seeds, metric="val_loss"), variants, records_of_loss(records))
    contrib = {(c["kind"], c["field"]): c for c in result["contributions"]}
    # each the change of the loss the field causes, with it minus without it: negative = it helps
    assert contrib["remove", "normalization"]["metric_change"] == pytest.approx(-2.5)
    assert contrib["remove", "gating"]["metric_change"] == pytest.approx(-0.2)
    assert contrib["add", "normalization"]["metric_change"] == pytest.approx(5.2 - 8.0)
    assert contrib["add", "gating"]["metric_change"] == pytest.approx(-0.5)
    assert result["total"]["metric_change"] == pytest.approx(-3.0)
    # on perplexity the contributions are paired relative changes: full / (without F) - 1, per seed
    relative = ablation.ablation_statistics(_setup(seeds), variants, records)
    by = {(c["kind"], c["field"]): c for c in relative["contributions"]}
    expected = math.exp(sum(math.log((5.0 + n) / (7.5 + n)) for n in noise) / len(noise)) - 1
    assert by["remove", "normalization"]["metric_change"] == pytest.approx(expected)
    assert by["remove", "normalization"]["relative"] is True
    c = contrib["remove", "normalization"]
    assert c["metric_change_low"] == pytest.approx(c["metric_change"]) == c["metric_change_high"]  # shared noise cancels
    text = ablation_markdown(result)
    assert "without normalization" in text and "softmax -> sparsemax" in text and "| Variant |" in text


# -- attention-map metrics ------------------------------------------------------------------------
def test_head_metrics_of_known_patterns():
    t = 6
    causal = torch.ones(t, t).tril()
    uniform = causal / causal.sum(-1, keepdim=True)
    diagonal = torch.eye(t)
    m_uniform, m_diag = maps.head_metrics(torch.stack([uniform, diagonal]))
    assert m_uniform["sparsity"] == 0.0 and m_uniform["entropy"] == pytest.approx(m_uniform["uniform_entropy"])
    assert m_uniform["mean_distance"] == pytest.approx(sum(i / 2 for i in range(t)) / t)
    assert m_diag["sparsity"] == pytest.approx(1 - t / (t * (t + 1) / 2))
    assert m_diag["entropy"] == 0.0 and m_diag["mean_distance"] == 0.0
    assert m_uniform["row_sum_max_error"] < 1e-6


def test_sparsemax_maps_have_exact_zeros_and_rows_summing_to_one(tmp_path):
    torch.manual_seed(0)
    config = Config(vocab_size=16, d_model=16, n_heads=2, n_layers=2, max_seq_len=12, dropout=0.0)
    model = TinyTransformer(config, SPARSE)
    for block in model.blocks:  # peaked scores, as after training
        torch.nn.init.normal_(block.attn.qkv.weight, std=0.5)
    ids = list(range(1, 13))
    weights = maps.compute_maps(model, ids)
    assert len(weights) == 2 and weights[0].shape == (2, 12, 12)
    for w in weights:
        assert (w == 0).any(), "sparsemax must put exact zeros on some allowed keys"
        assert torch.allclose(w.sum(-1), torch.ones(2, 12), atol=1e-5)
        assert (w.triu(1) == 0).all()  # causal
    result = maps.attention_maps(model, ids, tmp_path, source={"gene": SPARSE})
    saved = json.loads((tmp_path / "attention_maps.json").read_text())
    assert saved == result and len(saved["layers"]) == 2
    for layer in saved["layers"]:
        assert (tmp_path / layer["figure"]).read_bytes()[:8] == PNG
        for head in layer["heads"]:
            assert 0.0 < head["sparsity"] <= 1.0 and head["future_weight"] == 0.0
            assert 0.0 <= head["entropy"] <= head["uniform_entropy"] + 1e-9
            assert 0.0 <= head["mean_distance"] <= 11 and head["row_sum_max_error"] < 1e-5
    softmax = TinyTransformer(config, VANILLA)
    assert all(h["sparsity"] == 0.0 for h in maps.head_metrics(maps.compute_maps(softmax, ids)[0]))


def test_text_encoding():
    from evo_attention.data import Vocab

    vocab = Vocab(["<unk>", "<eos>", "the", "cat"])
    assert maps.encode_text("the dog cat", vocab, 8) == [2, 0, 3]
    with pytest.raises(UserError, match="more than the model's context"):
        maps.encode_text("the cat the cat", vocab, 3)
    with pytest.raises(UserError, match="not in the model's vocabulary"):
        maps.encode_text("k1 zebra", Vocab(["<fill>", "k1"]), 8)


# -- the commands end to end ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("validate") / "run"
    with Evolution(Config(**TINY), out_dir=run_dir) as evolution:
        evolution.run()
    return run_dir


def test_validate_from_run_end_to_end(tiny_run, capsys):
    with RunStore.open(tiny_run, readonly=True) as store:
        before = len(store.evaluations())
    code = main(["validate", "--from-run", str(tiny_run), "--genes", SPARSE, "--seeds", "2", "--quiet"])
    assert code == 0
    result = json.loads((tiny_run / "validation.json").read_text())
    assert result["seeds"] == [8, 9] and result["search_seed"] == 7 and result["steps"] == 6
    assert result["baseline"]["search_value"] is not None  # the run's baseline measured the same thing
    assert result["baseline"]["gene"] == VANILLA.key and [g["gene"] for g in result["genes"]] == [SPARSE]
    row = result["genes"][0]
    assert len(row["values"]) == 2 and row["verdict"] in ("better", "worse", "equivalent", "undetermined")
    for sample in (result["baseline"], row):  # where and in which precision each seed trained
        assert sample["devices"] == ["cpu", "cpu"] and sample["precisions"][0] in ("fp32", "bf16")
    for key in ("mean", "sd", "ci_low", "ci_high", "difference", "diff_ci_low", "diff_ci_high", "p_value", "p_holm",
                "cohens_d"):
        assert key in row
    assert "Multi-seed validation" in (tiny_run / "validation.md").read_text()
    assert (tiny_run / "validation.png").read_bytes()[:8] == PNG
    with RunStore.open(tiny_run, readonly=True) as store:
        rows = store.evaluations(role="validate")
        assert len(store.evaluations()) == before + 4
    assert sorted((r["gene"], r["seed"]) for r in rows) == sorted(
        (g, s) for g in (VANILLA.key, SPARSE) for s in (8, 9))
    assert row["verdict"] in capsys.readouterr().err  # the verdict is logged

    # a second validation with the same settings trains nothing: every record comes from the store
    config = Config(**TINY)
    from evo_attention.data import data_from_config

    executor = CountingExecutor()
    with RunStore.open(tiny_run) as store:
        again = val.validate_genes([SPARSE], config, data_from_config(config), n_seeds=2, store=store,
                                   executor=executor)
    assert executor.trained == [] and again["genes"][0]["values"] == row["values"]

    # the ablation of a one-field gene reuses the same trainings: nothing is trained again
    assert main(["ablate", "--from-run", str(tiny_run), "--gene", SPARSE, "--seeds", "2", "--quiet"]) == 0
    abl = json.loads((tiny_run / "ablation.json").read_text())
    assert [v["name"] for v in abl["variants"]] == ["full gene", "baseline", "without normalization",
                                                    "baseline + normalization"]
    assert abl["fields"] == ["normalization"] and (tiny_run / "ablation.png").read_bytes()[:8] == PNG
    assert "## Contributions" in (tiny_run / "ablation.md").read_text()
    with RunStore.open(tiny_run, readonly=True) as store:
        assert len(store.evaluations()) == before + 4

    # attention maps of the gene, trained on the fly with the run's settings, on a given text
    assert main(["attention-maps", "--from-run", str(tiny_run), "--gene", SPARSE, "--text", "k1 v3 k0 v5 k1",
                 "--quiet"]) == 0
    saved = json.loads((tiny_run / "maps" / "attention_maps.json").read_text())
    assert saved["tokens"] == ["k1", "v3", "k0", "v5", "k1"] and saved["genes"] == [SPARSE]
    assert (tiny_run / "maps" / "attention_layer0.png").read_bytes()[:8] == PNG

    # the report gathers all of it
    assert main(["report", str(tiny_run)]) == 0
    text = (tiny_run / "report.md").read_text()
    for expected in ("Validated: ", "## Multi-seed validation (validation split)", "## Ablation of",
                     "## Attention maps", "](maps/attention_layer0.png)", "](validation.png)"):
        assert expected in text, expected
    page = (tiny_run / "report.html").read_text()
    assert "Multi-seed validation" in page and "data:image/png;base64," in page


def test_attention_maps_from_a_run_draw_its_kept_model_of_the_same_training(tmp_path, monkeypatch):
    """attention-maps --from-run retrained the best gene although the run kept that very model; it now
    draws the kept one, and trains only a training the run did not keep (here: other steps)."""
    import evo_attention.train.trainer as trainer
    from evo_attention.search.models import kept_models

    run_dir = tmp_path / "run"
    with Evolution(Config(**TINY), out_dir=run_dir, keep_models=1) as evolution:
        evolution.run()
    (kept,) = kept_models(run_dir)
    trained = []
    real = trainer.run_training
    monkeypatch.setattr(trainer, "run_training", lambda trial, *a, **k: trained.append(trial) or real(trial, *a, **k))
    assert main(["attention-maps", "--from-run", str(run_dir), "--quiet"]) == 0
    drawn = json.loads((run_dir / "maps" / "attention_maps.json").read_text())
    assert trained == [] and drawn["source"]["model"] == kept["dir"] and drawn["genes"] == [kept["gene"]]
    assert main(["attention-maps", "--from-run", str(run_dir), "--steps", "3", "--quiet", "--out",
                 str(tmp_path / "other")]) == 0
    assert [t.steps for t in trained] == [3]


def test_the_best_of_an_unfinished_search_is_taken_with_a_note(tiny_run, tmp_path):
    """validate, transfer (run_genes), export, ablate, compare and attention-maps may take a stopped search's best
    genes, but say that the search is not finished, in status's words; and --top beyond the ranked genes says how
    many there are."""
    import argparse
    import shutil
    import warnings

    from evo_attention.cli.validate import run_genes
    from evo_attention.report import load_run

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a finished search with enough genes: nothing to say
        assert len(run_genes(argparse.Namespace(genes=None), load_run(tiny_run), 1)) == 1
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    with RunStore.open(run) as store:
        store.set_meta("done", False)  # as if it had been stopped
    with pytest.warns(UserWarning) as told:
        genes = run_genes(argparse.Namespace(genes=None), load_run(run), 9, verb="transfer")
    assert [str(w.message) for w in told] == [
        f"the search in {run} is not finished (interrupted: 1 of 1 generations done, 3 trainings recorded of 3 "
        "planned): transfer takes its best genes so far",
        f"--top 9 asks for more genes than the run in {run} has ranked (the vanilla gene and its baseline aside): "
        f"transfer takes the {len(genes)} it has"]
    with pytest.warns(UserWarning, match="is not finished .*: export takes its best genes so far"):
        assert main(["export", "--from-run", str(run), "--format", "hf-attention", "--out", str(tmp_path / "hf")]) == 0


def test_the_default_seeds_can_decide_over_the_family_the_validation_tests(tiny_run, tmp_path):
    """One gene validated after two on the same seeds: the earlier comparison there joins Holm's family
    (docs/validation.md, Holm across the run), so the default is the 7 seeds that can decide over 2, not the 6
    of one gene, whose smallest p (0.031) is 0.0625 after Holm over 2."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    gate = "dot|softmax|output_gate|fixed|bias|0.10"
    assert main(["validate", "--from-run", str(run), "--genes", f"{SPARSE},{gate}", "--quiet"]) == 0
    first = json.loads((run / "validation.json").read_text())
    assert first["family_size"] == 2 and first["seeds"] == list(range(8, 15))
    assert main(["validate", "--from-run", str(run), "--genes", SPARSE, "--quiet"]) == 0
    again = json.loads((run / "validation.json").read_text())
    assert again["family_size"] == 2 and again["seeds"] == first["seeds"]


def test_a_result_of_other_genes_or_seeds_is_replaced_with_a_note(tiny_run, tmp_path):
    """validation.json (ablation.json) of another command in the same run is replaced with one note before anything
    trains: what it held, and that its trainings stay in run.db; the same command again (a rebuild) says nothing."""
    import shutil
    import warnings

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("validation*", "ablation*"))

    def replaced(*argv, seeds="2"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main([*argv, "--from-run", str(run), "--seeds", seeds, "--quiet"]) == 0
        return [str(w.message) for w in caught if "this replaces" in str(w.message)]

    gate = "dot|softmax|output_gate|fixed|bias|0.10"
    assert replaced("validate", "--genes", SPARSE) == []
    assert replaced("validate", "--genes", f"{SPARSE},{gate}") == [
        f"this replaces {run / 'validation.json'} and its .md and .png ({SPARSE} at 2 seeds); its trainings stay in "
        f"{run / 'run.db'}, so the command that wrote it rebuilds it"]
    assert replaced("validate", "--genes", f"{SPARSE},{gate}") == []
    assert replaced("ablate", "--gene", SPARSE) == []
    assert replaced("ablate", "--gene", SPARSE, seeds="3") == [
        f"this replaces {run / 'ablation.json'} and its .md and .png ({SPARSE} at 2 seeds); its trainings stay in "
        f"{run / 'run.db'}, so the command that wrote it rebuilds it"]


def test_validate_rejects_bad_input(tiny_run, capsys):
    assert main(["validate", "--quiet"]) == 2
    assert "give --genes" in capsys.readouterr().err
    assert main(["validate", "--from-run", str(tiny_run), "--seeds", "1", "--quiet"]) == 2
    assert "at least 2 seeds" in capsys.readouterr().err
    assert main(["validate", "--from-run", str(tiny_run), "--seed", "5", "--quiet"]) == 2
    assert "include 7, on which the search picked its winners: use --seed 7" in capsys.readouterr().err
    assert main(["validate", "--genes", "dot|bogus|none|fixed", "--quiet"]) == 2
    assert "unknown normalization" in capsys.readouterr().err
    assert main(["ablate", "--gene", VANILLA.key, "--quiet"]) == 2
    assert "nothing to ablate" in capsys.readouterr().err
    assert main(["attention-maps", "--quiet"]) == 2
    assert "no model" in capsys.readouterr().err


def test_validation_summary_from_known_values(tmp_path):
    seeds = list(range(43, 52))  # 8 pairs after the failure: the exact test can pass Holm over 2
    noise = [0.0, 0.2, -0.2, 0.1, -0.1, 0.3, -0.3, 0.15, -0.15]
    genes = {VANILLA.key: 10.0, SPARSE: 8.0, "dot|softmax|output_gate|fixed|bias|0.10": 10.0}
    records = _fake_records({k: [m + n for n in noise] for k, m in genes.items()}, seeds)
    records[SPARSE, 51] = {"status": "diverged", "val_perplexity": math.inf, "error": None}
    result = val.validation_statistics(_setup(seeds), records, [SPARSE, "dot|softmax|output_gate|fixed|bias|0.10"],
                                       search_values={SPARSE: 7.5})
    sparse, gate = result["genes"]
    assert sparse["n_failed"] == 1 and sparse["values"][-1] is None and sparse["n"] == 8
    assert sparse["verdict"] == "better" and sparse["search_value"] == 7.5 and sparse["n_pairs"] == 8
    assert sparse["test"] == "sign-flip" and sparse["p_value"] == pytest.approx(2 / 256)
    assert gate["verdict"] == "equivalent" and gate["difference"] == pytest.approx(0.0)
    assert gate["verdict_label"] == "equivalent within ±1%" and result["family_size"] == 2
    assert "**better**" in result["headline"]
    paths = val.write_validation({**result, "steps": 10}, tmp_path)
    md = paths["md"].read_text()
    assert "| Search | Paired change [95% CI] (lower is better) | Unpaired (Welch) |" in md and "| 7.500 |" in md and "diverged" in md
    assert paths["png"].read_bytes()[:8] == PNG
    test_paths = val.write_validation({**result, "eval_split": "test"}, tmp_path)
    assert test_paths["json"].name == "validation_test.json"


def test_attention_maps_of_a_saved_model(tmp_path):
    from evo_attention.data import data_from_config
    from evo_attention.train.saving import save_model

    config = Config(**TINY)
    data = data_from_config(config)
    torch.manual_seed(0)
    model = TinyTransformer(config.replace(vocab_size=data.vocab_size), SPARSE)
    save_model(model, tmp_path / "model", vocab=data.vocab)
    out = tmp_path / "maps"
    assert main(["attention-maps", "--model", str(tmp_path / "model"), "--length", "10", "--out", str(out),
                 "--quiet"]) == 0  # a validation example, tokenized by the saved vocabulary
    saved = json.loads((out / "attention_maps.json").read_text())
    assert saved["source"] == {"model": str(tmp_path / "model")} and len(saved["tokens"]) == 10
    assert saved["token_ids"] == data.eval_items("valid", torch.tensor([0]))[0][0, :10].tolist()
    assert saved["tokens"][0].startswith("k")  # recall examples start with a key
    assert main(["attention-maps", "--model", str(tmp_path / "model"), "--text", "k0 zebra", "--out", str(out),
                 "--quiet"]) == 2


def test_attention_maps_of_a_layer_that_forms_no_weights(tmp_path, capsys):
    from evo_attention.data import data_from_config
    from evo_attention.report.studies.maps import maps_table
    from evo_attention.train.saving import save_model

    config = Config(**TINY)
    data = data_from_config(config)
    torch.manual_seed(0)
    genes = [SPARSE, "prog=o(shift(v))"]  # the second layer mixes along time without weights
    model = TinyTransformer(config.replace(vocab_size=data.vocab_size, n_layers=2), genes)
    assert model.attention_maps(torch.tensor([[1, 2, 3]]))[1] is None
    save_model(model, tmp_path / "model", vocab=data.vocab)
    out = tmp_path / "maps"
    assert main(["attention-maps", "--model", str(tmp_path / "model"), "--length", "6", "--out", str(out)]) == 0
    assert "layer 1 " in capsys.readouterr().err  # its line says it has no weights
    saved = json.loads((out / "attention_maps.json").read_text())
    assert [layer["figure"] for layer in saved["layers"]] == ["attention_layer0.png", None]
    assert saved["layers"][1]["heads"] == [] and "no weights" in maps_table(saved)


def test_validation_carries_each_genes_cost_as_the_median_over_its_seeds(tmp_path):
    seeds = [43, 44, 45]
    records = _fake_records({VANILLA.key: [10.0, 10.2, 9.8], SPARSE: [9.0, 9.1, 8.9]}, seeds)
    for (gene, seed), r in records.items():
        slow = 2.0 if gene == SPARSE else 1.0
        r.update(params=1000, flops_per_step=4e6, train_time_s=slow * (10 + seed - 43), trained_steps=100,
                 latency_ms=slow * 5.0)
    records[SPARSE, 45]["train_time_s"] = 900.0  # one slow neighbour: the median ignores it
    result = val.validation_statistics(_setup(seeds), records, [SPARSE])
    assert result["baseline"]["cost"] == {"params": 1000, "flops": 4e6, "train_ms_per_step": 110.0, "latency_ms": 5.0}
    assert result["genes"][0]["cost"]["train_ms_per_step"] == 220.0
    md = val.write_validation({**result, "steps": 100}, tmp_path)["md"].read_text()
    assert "| Gene | Params | FLOPs / train step | Train ms / step | Latency ms |" in md
    assert "| 220.0 (2.00x) | 10.0 (2.00x) |" in md


def test_search_values_are_shown_only_where_the_search_measured_the_same_thing(tiny_run):
    """Another evaluation (fewer batches scored) or another corpus makes the search's number a
    different measurement: the validation then shows none."""
    out = tiny_run / "other"
    assert main(["validate", "--from-run", str(tiny_run), "--genes", SPARSE, "--seeds", "2", "--eval-steps", "1",
                 "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "validation.json").read_text())
    assert result["baseline"]["search_value"] is None and "| Search" not in (out / "validation.md").read_text()


@pytest.mark.parametrize("seeds, says", [(3, "3 seeds cannot decide"), (5, "5 seeds cannot show a difference")])
def test_too_few_seeds_are_told_in_cannot_decides_words(seeds, says):
    """At 3-4 seeds equivalence cannot be shown either: the warning said 'undetermined or equivalent at best'."""
    import argparse

    from evo_attention.cli.validate import _decisive_seeds

    with pytest.warns(UserWarning) as told:
        _decisive_seeds(argparse.Namespace(confidence=0.95, seeds=seeds), lambda n: 1, planned=True)
    text = str(told[0].message)
    assert text.startswith(says) and "6 seeds are the fewest" in text and "equivalent at best" not in text


def test_a_confidence_without_an_alpha_is_named_as_the_flag():
    import argparse

    from evo_attention.cli.validate import _decisive_seeds

    with pytest.raises(UserError, match="^confidence 1.0 is outside") as raised:
        _decisive_seeds(argparse.Namespace(confidence=1.0, seeds=3), lambda n: 1, planned=True)
    assert raised.value.setting == "confidence"


def test_a_partial_evaluation_is_recorded_per_gene_and_said_in_the_markdown_and_the_summary(tmp_path, capsys):
    """eval_steps scores part of the split: each row keeps the tokens its values were scored on and that they
    were not the whole split; validation.md and the printed summary say so."""
    import yaml

    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    assert main(["validate", "--config", str(tmp_path / "tiny.yaml"), "--genes", SPARSE, "--seeds", "2",
                 "--eval-steps", "1", "--eval-batch-size", "16", "--quiet", "--out", str(out)]) == 0
    result = json.loads((out / "validation.json").read_text())
    for row in (result["baseline"], result["genes"][0]):  # 16 examples of 2 queries each, of the split's 64
        assert row["eval_tokens"] == 32 and row["eval_complete"] is False
    assert result["data"]["scored_tokens"]["valid"] == 128
    said = "each value is measured on 32 of the 128 scored tokens of the valid split"
    assert said in (out / "validation.md").read_text() and said in capsys.readouterr().err


def test_the_scored_tokens_are_one_count_where_the_seeds_agree_and_old_results_say_nothing():
    seeds = [43, 44]
    records = _fake_records({VANILLA.key: [10.0, 10.2], SPARSE: [9.0, 9.1]}, seeds)
    for (gene, seed), r in records.items():
        r.update(eval_tokens=128, eval_complete=True)
    records[SPARSE, 44].update(eval_tokens=96)
    result = val.validation_statistics(_setup(seeds), records, [SPARSE])
    assert result["baseline"]["eval_tokens"] == 128 and result["genes"][0]["eval_tokens"] == [128, 96]
    assert result["genes"][0]["eval_complete"] is True and "Partial" not in validation_markdown(result)
    old = _fake_records({VANILLA.key: [10.0, 10.2], SPARSE: [9.0, 9.1]}, seeds)  # records without the fields
    result = val.validation_statistics(_setup(seeds), old, [SPARSE])
    assert result["genes"][0]["eval_complete"] is None and "Partial" not in validation_markdown(result)
    for row in (result["baseline"], *result["genes"]):
        del row["eval_tokens"], row["eval_complete"]  # a file written before the rows kept them
    assert "Partial" not in validation_markdown(result)


def test_validate_genes_names_its_settings_and_keeps_two_seeds_at_least():
    """validate_genes lists its settings (help() shows them) and passes on none that lowers the two
    seeds a spread needs (``min_seeds``) or changes its role."""
    import inspect
    named = set(inspect.signature(val.validate_genes).parameters)
    assert {"n_seeds", "lr_grid", "n_tuning_seeds", "match_params"} <= named
    for extra in ({"min_seeds": 1}, {"seeds_setting": "x"}, {"role": "x"}):
        with pytest.raises(TypeError, match="validate_genes"):
            val.validate_genes(["vanilla"], None, None, n_seeds=1, **extra)
