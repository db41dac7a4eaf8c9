"""evo-attention compare: the named table, choosing configurations, running, statistics, outputs."""

import json
import math
import statistics

import pytest

from evo_attention import AttentionGene, Config, components
from evo_attention.cli import main
from evo_attention.report.attachments import COMPARE_RESULTS as RESULTS_FILE
from evo_attention.studies.compare import (NAMED_CONFIGS, aggregate, list_table, resolve_configs, run_compare,
                                          rank_configs)
from evo_attention.search.executors import Executor, LocalExecutor
from evo_attention.search.store import RunStore
from evo_attention.train.record import EvaluationRecord

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAMES = ["baseline", "lora_small", "lora_medium", "lora_large", "lora_xl", "rope_only", "rope_small", "rope_large",
         "bias_only", "enhanced_small", "enhanced_medium", "enhanced_large", "enhanced_xl"]
TINY = {"data": "recall", "vocab_size": 16, "max_seq_len": 16,
        "recall": {"num_pairs": 2, "train_examples": 64, "eval_examples": 16},
        "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0, "batch_size": 4,
        "eval_batch_size": 16, "eval_steps": None, "train_steps": 2, "log_every": 1}
TINY_FLAGS = ["--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4",
              "--eval-batch-size", "16"]


@pytest.fixture
def tiny_yaml(tmp_path):
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in TINY.items()}))
    return path


@pytest.fixture
def boom():
    """A normalization that always raises: its trainings must become failed rows."""

    @components.register_normalization("boom")
    def boom_norm(scores, mask):
        raise RuntimeError("boom went the normalization")

    yield "dot|boom|none|fixed"
    components.unregister("normalization", "boom")


# -- the table -----------------------------------------------------------------------------------
def test_the_thirteen_named_configurations():
    assert [c.name for c in NAMED_CONFIGS] == NAMES
    genes = dict(resolve_configs(None, d_model=512))
    assert list(genes) == NAMES
    assert genes["baseline"] == AttentionGene.vanilla()
    assert [genes[f"lora_{s}"].qkv_rank for s in ("small", "medium", "large", "xl")] == [32, 64, 128, 256]
    assert [genes[f"enhanced_{s}"].qkv_rank for s in ("small", "medium", "large", "xl")] == [32, 64, 128, 256]
    assert {genes[f"enhanced_{s}"].position for s in ("small", "medium", "large", "xl")} == {"rope"}
    assert genes["rope_only"].position == "rope" and genes["rope_only"].qkv_rank == 0
    assert genes["rope_small"].position == "rope:linear:2" and genes["rope_large"].position == "rope:ntk:4"
    assert genes["bias_only"].attn_bias == "rel" and genes["bias_only"].position == "learned"
    # only the axes differ from the vanilla transformer
    for gene in genes.values():
        assert set(gene.differences(AttentionGene.vanilla())) <= {"position", "qkv_rank", "attn_bias"}
    assert dict(resolve_configs("lora_small", d_model=16))["lora_small"].qkv_rank == 1  # never rank 0


def test_resolve_names_and_gene_strings():
    entries = resolve_configs("baseline, dot|sparsemax|none|fixed|pos=alibi ,baseline,rope_only", d_model=64)
    assert [name for name, _ in entries] == ["baseline", "dot|sparsemax|none|fixed|bias|0.10|pos=alibi", "rope_only"]
    assert entries[1][1].position == "alibi"
    assert [n for n, _ in resolve_configs("all", 64)] == NAMES
    baseline_gene = dict(resolve_configs("baseline", 64))["baseline"].key  # never a gene compared with itself
    assert [n for n, _ in resolve_configs(f"baseline,{baseline_gene},rope_only", 64)] == ["baseline", "rope_only"]


@pytest.mark.parametrize("spec, bad", [("baseline,lora_tiny", "lora_tiny"), (" , ", "empty"),
                                       ("dot|softmax|nope|fixed", "nope")])
def test_bad_configuration_names_are_one_line_errors(spec, bad):
    with pytest.raises(ValueError) as err:
        resolve_configs(spec, 64)
    assert bad in str(err.value) and "\n" not in str(err.value)


def test_list_prints_the_table(capsys):
    assert main(["compare", "--list", "--d-model", "256"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert name in out
    assert "d/16 = 16" in out and "pos=rope|rank=128|abias=rel" in out
    assert list_table(512).count("\n") == len(NAMES) + 5  # the 13, then sliding_window, gqa, mqa, linear, performer
    assert "win=32" in out and "kvh=4" in out and "kvh=1" in out  # 8 heads, 128 tokens: window 32, 4 K/V heads
    assert "dot|linear|none|fixed" in out and "dot|favor|none|fixed" in out


def test_cli_rejects_bad_input_in_one_line(capsys):
    assert main(["compare", "--configs", "baseline,nonesuch", "--data", "recall"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evo-attention: error: unknown configuration 'nonesuch'") and "\n" not in err
    assert main(["compare", "--preset", "huge", "--list"]) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err
    assert main(["compare", "--seeds", "0", "--data", "recall"] + TINY_FLAGS) == 2
    assert "--seeds" in capsys.readouterr().err
    # the executor flags are search's: checked the same way
    assert main(["compare", "--configs", "baseline", "--data", "recall", "--gpus-per-trial", "1"] + TINY_FLAGS) == 2
    assert "--gpus-per-trial applies to --executor ray" in capsys.readouterr().err
    assert main(["compare", "--configs", "baseline", "--data", "recall", "--ray-address", "auto"] + TINY_FLAGS) == 2
    assert "--ray-address needs --executor ray" in capsys.readouterr().err


def test_size_precedence():
    from evo_attention.cli.compare import compare_config

    def config(argv):
        from evo_attention.cli import build_parser

        return compare_config(build_parser().parse_args(["compare"] + argv))

    c = config([])
    assert (c.d_model, c.n_layers, c.n_heads, c.ffn_dim) == (512, 8, 8, 2048)
    c = config(["--preset", "small"])
    assert (c.d_model, c.n_layers, c.n_heads, c.ffn_dim) == (128, 2, 4, 512) and c.train_steps < 1000
    c = config(["--preset", "small", "--d-model", "64", "--steps", "17"])
    assert (c.d_model, c.n_layers, c.train_steps) == (64, 2, 17)
    c = config(["--preset", "small", "--warmup-fraction", "0.1"])  # a warm-up in either form replaces the preset's
    assert c.warmup == 0.1
    c = config(["--preset", "quick"])  # a general preset's size wins over the study's default
    assert (c.d_model, c.n_layers, c.data) == (64, 2, "recall")


# -- running -------------------------------------------------------------------------------------
def test_all_thirteen_at_a_tiny_size_through_the_cli(tmp_path, tiny_yaml):
    out = tmp_path / "cmp"
    assert main(["compare", "--config", str(tiny_yaml), "--out", str(out), "--quiet"]) == 0
    payload = json.loads((out / RESULTS_FILE).read_text())
    assert set(payload) >= {"settings", "results", "aggregates", "summary"}
    assert [r["name"] for r in payload["results"]] == NAMES
    for r in payload["results"]:
        assert {"name", "gene", "val_loss", "val_perplexity", "accuracy", "time_s", "peak_memory_mb", "params",
                "status", "error"} <= set(r)
        assert r["status"] == "ok" and math.isfinite(r["val_loss"]) and r["steps"] == 2
    s = payload["settings"]
    assert (s["d_model"], s["n_layers"], s["n_heads"], s["d_ff"], s["steps"], s["seeds"]) == (16, 1, 2, 32, 2, 1)
    params = {r["name"]: r["params"] for r in payload["results"]}
    assert params["lora_small"] < params["lora_medium"] < params["lora_large"] < params["baseline"]
    assert params["rope_only"] == params["baseline"] - 16 * 16  # no position table
    ranking = payload["summary"]["ranking"]
    assert sorted(r["name"] for r in ranking) == sorted(NAMES)
    assert [r["val_loss"] for r in ranking] == sorted(r["val_loss"] for r in ranking)
    assert payload["summary"]["best"] == ranking[0]["name"]
    assert (out / "compare.png").read_bytes().startswith(PNG_SIGNATURE)
    table = (out / "compare.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == 13 and rows[0].startswith(f"| 1 | {ranking[0]['name']} |")


def test_seeds_give_mean_and_sd_and_failures_become_rows(tmp_path, boom):
    config = Config(**TINY)
    entries = resolve_configs(f"baseline,rope_only,{boom}", config.d_model)
    payload = run_compare(config, entries, seeds=2, out_dir=tmp_path, quiet=True)
    results = payload["results"]
    # the seeds are the run seed's next ones (config.seed 42), as for validate: never the seed itself
    assert [(r["name"], r["seed"]) for r in results] == [
        (n, s) for n in ("baseline", "rope_only", "dot|boom|none|fixed|bias|0.10") for s in (43, 44)]
    assert payload["settings"]["seed_list"] == [43, 44] and payload["settings"]["seeds"] == 2
    failed = [r for r in results if r["name"].startswith("dot|boom")]
    assert all(r["status"] == "error" and "boom went" in r["error"] for r in failed)
    by_name = {a["name"]: a for a in payload["aggregates"]}
    base = [r["val_loss"] for r in results if r["name"] == "baseline"]
    assert base[0] != base[1]  # the seeds differ
    assert by_name["baseline"]["val_loss"] == pytest.approx(statistics.fmean(base))
    assert by_name["baseline"]["val_loss_sd"] == pytest.approx(statistics.stdev(base))
    assert by_name["baseline"]["n_ok"] == 2 and by_name["baseline"]["status"] == "ok"
    boom_agg = by_name["dot|boom|none|fixed|bias|0.10"]
    assert boom_agg["status"] == "error" and boom_agg["val_loss"] is None and boom_agg["n_ok"] == 0
    summary = payload["summary"]
    assert summary["per_config"]["baseline"] == {"mean": by_name["baseline"]["val_loss"],
                                                 "sd": by_name["baseline"]["val_loss_sd"], "n": 2}
    assert [r["name"] for r in summary["ranking"]] == sorted(["baseline", "rope_only"],
                                                             key=lambda n: by_name[n]["val_loss"])
    assert summary["val_loss_mean"] == pytest.approx((by_name["baseline"]["val_loss"] + by_name["rope_only"]["val_loss"]) / 2)
    assert summary["failed"][0]["status"] == "error"
    table = (tmp_path / "compare.md").read_text()
    assert "±" in table and "| - | dot\\|boom\\|none\\|fixed\\|bias\\|0.10 | `dot\\|boom" in table  # '|' escaped
    assert "error: RuntimeError: boom went the normalization" in table
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG_SIGNATURE)
    json.loads((tmp_path / RESULTS_FILE).read_text())  # strict JSON: NaN/inf were written as null


def test_the_paired_verdict_keeps_what_cannot_be_decided_and_the_seeds_to_decide(tmp_path):
    """compare's paired rows carry the verdict's every key (stats.VERDICT_KEYS), as validate's do: it
    dropped cannot_decide and seeds_to_decide, and its table gave the seeds for equivalence instead."""
    from evo_attention.util import stats

    payload = run_compare(Config(**TINY), resolve_configs("baseline,rope_only", 16), seeds=2, out_dir=tmp_path,
                          quiet=True)
    row = payload["summary"]["paired"]["rope_only"]
    assert set(stats.VERDICT_KEYS) <= set(row) and row["seeds_to_decide_range"] is not None
    assert row["cannot_decide"] == "2 seeds cannot decide: the smallest possible p is 0.5"
    assert row["cannot_decide"] in (tmp_path / "compare.md").read_text()


class ReversedExecutor(Executor):
    """Finishes the tasks in reverse order (like a parallel executor might)."""

    name = "reversed"

    def __init__(self):
        self.calls = 0

    def run(self, tasks, *, on_start=None, on_step=None):
        self.calls += 1
        for task, record in reversed(list(LocalExecutor().run(tasks, on_start=on_start,
                                                              on_step=on_step))):
            yield task, record


def test_any_executor_and_any_completion_order(tmp_path):
    config = Config(**TINY)
    executor = ReversedExecutor()
    payload = run_compare(config, resolve_configs("baseline,lora_small,rope_only", 16), out_dir=None,
                          executor=executor, quiet=True)
    assert executor.calls == 1
    assert [r["name"] for r in payload["results"]] == ["baseline", "lora_small", "rope_only"]
    assert payload["settings"]["executor"]["name"] == "reversed"


class ScriptedExecutor(Executor):
    """Returns made-up records without training: ok, oom, diverged, then an interruption."""

    name = "scripted"

    def run(self, tasks, *, on_start=None, on_step=None):
        outcomes = [("ok", 2.0), ("oom", None), ("diverged", None)]
        for task, (status, loss) in zip(tasks, outcomes):
            trial = task.trial
            yield task, EvaluationRecord(
                gene=task.gene, seed=task.seed, steps=task.steps, data_fingerprint=trial.task.fingerprint,
                context=trial.context, status=status, val_loss=loss if loss else math.nan,
                val_perplexity=math.exp(loss) if loss else math.inf, accuracy=0.5 if loss else math.nan,
                params=100, time_s=1.0, peak_memory_mb=10.0, error=None if loss else f"{status} at step 3")
        raise KeyboardInterrupt


def test_failures_and_an_interruption_are_written(tmp_path):
    entries = resolve_configs("baseline,lora_small,rope_only,bias_only", 16)
    with pytest.raises(KeyboardInterrupt):
        run_compare(Config(**TINY), entries, out_dir=tmp_path, executor=ScriptedExecutor(), quiet=True)
    payload = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert [r["status"] for r in payload["results"]] == ["ok", "oom", "diverged", "interrupted"]
    assert payload["summary"]["interrupted"] is True and payload["summary"]["best"] == "baseline"
    assert [f["status"] for f in payload["summary"]["failed"]] == ["oom", "diverged", "interrupted"]
    table = (tmp_path / "compare.md").read_text()
    assert "oom: oom at step 3" in table and "interrupted" in table


def test_from_run_adds_the_evolved_gene(tmp_path, tiny_yaml):
    run_dir = tmp_path / "run"
    best = "dot|sparsemax|none|fixed|bias|0.10"
    with RunStore.create(run_dir, config=Config(**TINY).to_dict(), meta={"done": True}) as store:
        store.record({"gene": best, "seed": 0, "steps": 2, "data_fingerprint": "x", "context": "c", "status": "ok",
                      "val_perplexity": 3.0, "val_loss": math.log(3.0)}, role="search", generation=0)
    out = tmp_path / "cmp"
    assert main(["compare", "--config", str(tiny_yaml), "--configs", "baseline", "--from-run", str(run_dir),
                 "--out", str(out), "--quiet"]) == 0
    payload = json.loads((out / RESULTS_FILE).read_text())
    assert [(r["name"], r["gene"]) for r in payload["results"]] == [
        ("baseline", AttentionGene.vanilla().key), ("evolved", best)]
    # the trainings are kept in the run's store (beside its search), not in a store of the output's own
    with RunStore.open(run_dir, readonly=True) as store:
        assert sorted((r["gene"], r["seed"]) for r in store.evaluations(role="compare")) == [
            (AttentionGene.vanilla().key, 43), (best, 43)]  # the default seed 42, plus one
        assert len(store.evaluations(role="search")) == 1
    assert not RunStore.exists(out)


class CountingExecutor(LocalExecutor):
    def __init__(self):
        self.trained = []

    def run(self, tasks, **kw):
        for task, record in super().run(tasks, **kw):
            self.trained.append((task.gene, task.seed))
            yield task, record


def test_a_repeated_compare_is_served_from_its_store(tmp_path):
    config = Config(**{**TINY, "seed": 5})
    entries = resolve_configs("baseline,rope_only", config.d_model)
    executor = CountingExecutor()
    first = run_compare(config, entries, seeds=2, out_dir=tmp_path, executor=executor, quiet=True)
    genes = [gene.key for _, gene in entries]
    assert sorted(executor.trained) == sorted((g, s) for g in genes for s in (6, 7))  # seeds seed+1, seed+2
    assert first.settings["seed_list"] == [6, 7] and [r["seed"] for r in first.results] == [6, 7, 6, 7]
    with RunStore.open(tmp_path, readonly=True) as store:  # --out holds the comparison's own store
        assert {r["role"] for r in store.evaluations()} == {"compare"} and len(store.evaluations()) == 4

    executor.trained.clear()
    again = run_compare(config, entries, seeds=2, out_dir=tmp_path, executor=executor, quiet=True)
    assert executor.trained == []  # nothing trained again
    assert [r["val_loss"] for r in again.results] == [r["val_loss"] for r in first.results]
    assert again.aggregates == first.aggregates
    # a third seed trains only the new pairs
    third = run_compare(config, entries, seeds=3, out_dir=tmp_path, executor=executor, quiet=True)
    assert sorted(executor.trained) == sorted((g, 8) for g in genes)
    # the typed result is what compare_results.json holds
    written = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert third.to_dict() == written and list(written) == ["settings", "results", "aggregates", "summary"]
    assert third.summary == written["summary"] and written["settings"]["seed_list"] == [6, 7, 8]


def test_summary_statistics():
    entries = [(n, AttentionGene.vanilla()) for n in ("baseline", "a", "b")]
    results = [{"name": n, "seed": s, "status": "ok", "val_loss": v, "accuracy": 0.5, "params": 10, "time_s": 1.0,
                "peak_memory_mb": 5.0, "error": None}
               for n, s, v in [("baseline", 0, 2.0), ("baseline", 1, 2.2), ("a", 0, 1.9), ("a", 1, 1.9),
                               ("b", 0, 2.5), ("b", 1, float("nan"))]]
    aggregates = aggregate(results, entries)
    by = {a["name"]: a for a in aggregates}
    assert by["baseline"]["val_loss"] == pytest.approx(2.1) and by["baseline"]["val_loss_sd"] == pytest.approx(0.1414, abs=1e-4)
    assert by["a"]["val_loss_sd"] == 0.0
    assert by["b"]["status"] == "partial" and by["b"]["n_ok"] == 1 and by["b"]["val_loss_sd"] is None  # nan dropped
    summary = rank_configs(aggregates)
    assert [r["name"] for r in summary["ranking"]] == ["a", "baseline", "b"]
    assert summary["val_loss_mean"] == pytest.approx((1.9 + 2.1 + 2.5) / 3)
    assert summary["val_loss_sd"] == pytest.approx(statistics.stdev([1.9, 2.1, 2.5]))
    a = summary["ranking"][0]
    assert a["loss_vs_baseline"] == pytest.approx(-0.2)
    assert a["perplexity_change_pct"] == pytest.approx(100 * (math.exp(-0.2) - 1))


def test_efficient_families_run_by_name(tmp_path):
    """linear, performer, sliding_window, gqa and mqa train beside the baseline on one code path."""
    names = ["baseline", "linear", "performer", "sliding_window", "gqa", "mqa"]
    config = Config(**{**TINY, "n_heads": 2, "favor_features": 8})
    entries = resolve_configs(",".join(names), config.d_model, config.n_heads, config.max_seq_len)
    assert [name for name, _ in entries] == names
    payload = run_compare(config, entries, out_dir=tmp_path / "cmp", quiet=True)
    rows = {r["name"]: r for r in payload["results"]}
    assert set(rows) == set(names)
    assert all(r["status"] == "ok" and math.isfinite(r["val_loss"]) for r in rows.values())
