"""A fair comparison of named attention variants at one fixed model size.

Every configuration trains the same model (size, data, steps, batch, learning rate and seeds) and
differs only in its attention gene, so the differences in validation loss are the mechanisms' own.
``NAMED_CONFIGS`` is the one table of the named variants; ranks are fractions of ``d_model`` so that a
variant means the same thing at every size:

    from evo_attention.studies.compare import resolve_configs, run_compare
    entries = resolve_configs("baseline,rope_only,dot|sparsemax|none|fixed", d_model=128)
    result = run_compare(config, entries, seeds=2, out_dir="runs/compare")

``run_compare`` trains every configuration with the seeds ``seed + 1 ... seed + N`` through the runner,
an executor and a run store (role ``compare``: a search run's, or its own in ``out_dir``), so a stored
training never runs again. A failure (oom, diverged, error) is a row with its status; the
``CompareResult`` is written as ``compare_results.json``, ``compare.md`` and ``compare.png``.

With a learning-rate grid (``lr_grid``) every configuration, the baseline included, trains at its own
best rate of the grid (``studies.lr_grid``); the result then carries the ``grid`` block
(``compare_lr_grid.png``). With ``match_params`` the vanilla baseline is also trained at each
configuration's parameter count (a row ``baseline (FFN W)`` per width), and each paired verdict is
against the matched baseline (``versus`` names it). With a suite (``suite``, or the config's) every
configuration and the baseline train on every point of the suite instead (``studies.suite``): the
result is a ``SuiteResult``, written as ``compare_suite.{json,md,png}``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from evo_attention.data import data_from_config
from evo_attention.genes import VANILLA_KEY, AttentionGene, is_gene_text, split_genes
from evo_attention.report import load_run
from evo_attention.report.attachments import COMPARE_FIGURE, COMPARE_RESULTS, COMPARE_TABLE
from evo_attention.search.store import RunStore
from evo_attention.studies import lr_grid as grids
from evo_attention.studies.common import (DEFAULT_TUNING_SEEDS, StudyResult, StudySetup, study_resources,
                                          tuning_seeds, validation_seeds, write_files)
from evo_attention.train.config import Config, parse_lr_grid
from evo_attention.train.environment import resolve_device
from evo_attention.train.presets import overlay
from evo_attention.train.record import EvaluationRecord, usable_metric
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir
from evo_attention.util.jsonio import to_jsonable
from evo_attention.util import stats
from evo_attention.util.stats import describe


# The study's model: 512 dims, 8 layers of 8 heads, 2048-wide FFN (below any --preset/--config/flag).
DEFAULT_SIZE = {"d_model": 512, "n_layers": 8, "n_heads": 8, "d_ff": 2048}
# Compare-specific presets (the general ones, quick and seed, work as well).
COMPARE_PRESETS = {
    "small": {  # a CPU-sized comparison: minutes per configuration on 2 cores
        "d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512, "max_seq_len": 64,
        "batch_size": 16, "eval_batch_size": 64, "eval_steps": 8, "train_steps": 100,
        "learning_rate": 1e-3, "lr_schedule": "cosine", "warmup_steps": 10, "log_every": 10,
    },
}
RESULT_KEYS = ("name", "gene", "seed", "status", "error", "val_loss", "val_perplexity", "accuracy", "bits_per_byte",
               "train_loss", "params", "flops_per_step", "time_s", "tokens_per_s", "peak_memory_mb", "eval_tokens",
               "eval_complete", "steps", "trained_steps", "device")


@dataclass(frozen=True)
class NamedConfig:
    """A named attention variant: the vanilla components plus the axes, as fractions of the size.

    ``rank_divisor`` d gives qkv_rank = d_model // d (0: full projections); ``window_divisor`` w a
    window of max_seq_len // w keys (0: full attention); ``kv_groups`` g gives n_heads // g key/value
    heads (0: one per head; g = n_heads: multi-query).
    """

    name: str
    position: str
    rank_divisor: int
    attn_bias: str
    description: str
    window_divisor: int = 0
    kv_groups: int | str = 0  # a divisor of the heads, or "all" for a single key/value head
    normalization: str = "softmax"

    def rank(self, d_model: int) -> int:
        return 0 if not self.rank_divisor else max(1, d_model // self.rank_divisor)

    def window(self, max_seq_len: int) -> int:
        return 0 if not self.window_divisor else max(1, max_seq_len // self.window_divisor)

    def kv_heads(self, n_heads: int) -> int:
        if self.kv_groups == "all":
            return 1
        return 0 if not self.kv_groups else max(1, n_heads // self.kv_groups)

    def gene(self, d_model: int, n_heads: int = 4, max_seq_len: int = 128,
             attention_dropout: float | None = None) -> AttentionGene:
        """The configuration's gene at this size; ``attention_dropout`` (not None) replaces the vanilla one."""
        gene = AttentionGene.parse(VANILLA_KEY).replace(position=self.position, qkv_rank=self.rank(d_model),
                                                        attn_bias=self.attn_bias, window=self.window(max_seq_len),
                                                        kv_heads=self.kv_heads(n_heads),
                                                        normalization=self.normalization)
        return gene if attention_dropout is None else gene.replace(attention_dropout=float(attention_dropout))


# The one table of named configurations (docs/compare.md shows the same).
NAMED_CONFIGS = (
    NamedConfig("baseline", "learned", 0, "none", "the vanilla transformer: full Q/K/V, learned absolute positions"),
    NamedConfig("lora_small", "learned", 16, "none", "low-rank Q/K/V, rank d/16"),
    NamedConfig("lora_medium", "learned", 8, "none", "low-rank Q/K/V, rank d/8"),
    NamedConfig("lora_large", "learned", 4, "none", "low-rank Q/K/V, rank d/4"),
    NamedConfig("lora_xl", "learned", 2, "none", "low-rank Q/K/V, rank d/2"),
    NamedConfig("rope_only", "rope", 0, "none", "rotary positions instead of the learned table"),
    NamedConfig("rope_small", "rope:linear:2", 0, "none", "rotary, linear position interpolation x2"),
    NamedConfig("rope_large", "rope:ntk:4", 0, "none", "rotary, NTK-aware base scaling x4"),
    NamedConfig("bias_only", "learned", 0, "rel", "learned positions + learned relative bias per head"),
    NamedConfig("enhanced_small", "rope", 16, "rel", "rotary + relative bias + low-rank Q/K/V, rank d/16"),
    NamedConfig("enhanced_medium", "rope", 8, "rel", "rotary + relative bias + low-rank Q/K/V, rank d/8"),
    NamedConfig("enhanced_large", "rope", 4, "rel", "rotary + relative bias + low-rank Q/K/V, rank d/4"),
    NamedConfig("enhanced_xl", "rope", 2, "rel", "rotary + relative bias + low-rank Q/K/V, rank d/2"),
)
# The efficient families, by name beside the 13 (not in "all", which is the study's comparison).
FAMILY_CONFIGS = (
    NamedConfig("sliding_window", "learned", 0, "none", "each query sees its last max_seq_len/4 keys", window_divisor=4),
    NamedConfig("gqa", "learned", 0, "none", "grouped-query attention: n_heads/2 key/value heads", kv_groups=2),
    NamedConfig("mqa", "learned", 0, "none", "multi-query attention: one key/value head", kv_groups="all"),
    NamedConfig("linear", "learned", 0, "none", "causal linear attention, phi = elu + 1: O(T) time",
                normalization="linear"),
    NamedConfig("performer", "learned", 0, "none", "FAVOR+ random features, an approximation of softmax: O(T) "
                "time (favor_features per head)", normalization="favor"),
)
CONFIGS_BY_NAME = {c.name: c for c in NAMED_CONFIGS + FAMILY_CONFIGS}
EVOLVED_NAME = "evolved"


# -- choosing the configurations ---------------------------------------------------------------
def named_dropout(config: Config) -> float | None:
    """The attention dropout of the named configurations under ``config``: none (0) on a generated
    task, where the baseline has none either (``Config.resolved_baseline``); None (their own, 0.10) elsewhere."""
    return config.resolved_baseline().attention_dropout if config.generated_task else None


def resolve_configs(spec: str | Sequence[str] | None, d_model: int, n_heads: int = 4,
                    max_seq_len: int = 128, attention_dropout: float | None = None) -> list[tuple[str, AttentionGene]]:
    """``[(name, gene)]`` for a comma-separated (or listed) mix of names and gene strings: ``None`` or
    ``"all"`` is the 13 named configurations; a gene string (it contains ``|``) is named by its key.
    Repeats are dropped, and a gene string whose gene is already listed; an unknown name is a UserError
    listing the valid ones. ``attention_dropout`` (not None) replaces the named configurations' own
    (``named_dropout``); gene strings stay as written."""
    items = ["all"] if spec is None else split_genes(spec) if isinstance(spec, str) else [str(s).strip() for s in spec]
    items = [s for s in items if s]
    if not items:
        raise UserError("configs is empty: give names such as baseline,rope_only or gene strings", setting="configs")
    entries: dict[str, AttentionGene] = {}
    for item in items:
        if is_gene_text(item):
            gene = AttentionGene.parse(item)
            if all(g.key != gene.key for g in entries.values()):  # never a gene compared with itself
                entries[gene.key] = gene
        elif item == "all" or item in CONFIGS_BY_NAME:
            for named in NAMED_CONFIGS if item == "all" else [CONFIGS_BY_NAME[item]]:
                entries.setdefault(named.name, named.gene(d_model, n_heads, max_seq_len, attention_dropout))
        else:
            raise UserError(f"unknown configuration {item!r}: valid names are all, {', '.join(CONFIGS_BY_NAME)} "
                            "(or a gene string like 'dot|softmax|none|fixed|pos=rope')")
    return list(entries.items())


def evolved_entry(run_dir: str | Path) -> tuple[str, AttentionGene]:
    """``("evolved", best gene)`` of the finished search in ``run_dir``."""
    best = load_run(run_dir).best_gene
    if best is None:
        raise UserError(f"the run in {run_dir} has no successful evaluation yet: no evolved gene to compare")
    return EVOLVED_NAME, AttentionGene.parse(best)


def list_table(d_model: int, n_heads: int = 4, max_seq_len: int = 128) -> str:
    """The named configurations as a text table (what ``--list`` prints): the 13 of the study
    ("all"), then the efficient families."""
    rows = [("name", "position", "qkv_rank", "attn_bias", f"gene at d_model {d_model}, {n_heads} heads, "
             f"{max_seq_len} tokens", "what")]
    for c in NAMED_CONFIGS + FAMILY_CONFIGS:
        rank = f"d/{c.rank_divisor} = {c.rank(d_model)}" if c.rank_divisor else "0 (full)"
        rows.append((c.name, c.position, rank, c.attn_bias, c.gene(d_model, n_heads, max_seq_len).key, c.description))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def settings_for(preset_name: str | None, explicit: dict) -> dict:
    """Compare's settings: Config defaults < DEFAULT_SIZE < compare preset < ``explicit`` (what a general
    preset, a config file and the flags name: cli.explicit_settings)."""
    settings = {**DEFAULT_SIZE, **COMPARE_PRESETS.get(preset_name, {})}
    if "d_model" in explicit and "d_ff" not in explicit:
        settings["d_ff"] = None  # 4 x the given width, not the study's 2048
    return overlay(settings, explicit)


# -- running -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class CompareResult(StudyResult):
    """A comparison, as ``compare_results.json`` holds it: the ``settings``, one row per
    configuration and seed (``results``, the keys of ``RESULT_KEYS``), the per-configuration
    ``aggregates`` and the ranking ``summary``; with a learning-rate grid also the ``grid``
    block (each configuration's curve and selected rate)."""

    settings: dict
    results: list[dict]
    aggregates: list[dict]
    summary: dict
    grid: dict | None = None

    kind: ClassVar[str] = "compare"

    def to_dict(self) -> dict:
        return to_jsonable({"settings": self.settings, "results": self.results, "aggregates": self.aggregates,
                            "summary": self.summary, **({} if self.grid is None else {"grid": self.grid})})


def run_compare(config: Config, entries: Sequence[tuple[str, AttentionGene]], *, seeds: int = 1,
                out_dir: str | Path | None = "runs/compare", data=None, executor="local",
                store: RunStore | None = None, quiet: bool = False, lr_grid=None,
                n_tuning_seeds: int = DEFAULT_TUNING_SEEDS, suite=None, match_params: bool = False):
    """Train every ``(name, gene)`` of ``entries`` and summarise into ``out_dir`` (unless None): see the
    module docstring. ``executor`` and ``store``: as ``common.study_resources`` takes them. ``suite`` (a
    suite's name, YAML path or ``Suite``) returns a ``studies.suite.SuiteResult``."""
    if not entries:
        raise UserError("nothing to compare: give at least one configuration", setting="configs")
    if config.baseline_gene is not None:  # the configuration named baseline is the one the setting names
        base = config.resolved_baseline()
        entries = [("baseline", base)] + [(n, g) for n, g in entries if n != "baseline" and g.key != base.key]
    suite = config.suite if suite is None else suite
    if suite is not None and match_params:
        raise UserError("match_params cannot be combined with a suite yet: drop one of them",
                        setting=("match_params", "suite"))
    validation_seeds(config.seed, seeds, minimum=1, setting="seeds")  # fail before anything is written or loaded
    if suite is not None:
        return _compare_on_suite(config, entries, suite, seeds=seeds, out_dir=out_dir, executor=executor, store=store,
                                 quiet=quiet, lr_grid=lr_grid)
    if lr_grid is not None:  # the grid's checks, before anything is written or loaded
        parse_lr_grid(lr_grid)
        tuning_seeds(config.seed, n_tuning_seeds, verdict_seeds=range(config.seed + 1, config.seed + seeds + 1))
    if out_dir is not None:
        output_dir(out_dir)  # before any training: an unwritable place fails now, not after the work
    if data is None:
        data = data_from_config(config)
    done: dict[tuple[str, int], EvaluationRecord] = {}
    start = time.perf_counter()

    def finished(task, record, cached):
        done[(task.gene, task.seed)] = record

    with study_resources(config, executor, store, out_dir, "compare") as (pool, store):
        setup = StudySetup.resolve(config, data, role="compare", n_seeds=seeds, min_seeds=1, metric="val_loss",
                                   store=store, executor=pool, quiet=quiet, seeds_setting="seeds", lr_grid=lr_grid,
                                   n_tuning_seeds=n_tuning_seeds, match_params=match_params)
        genes, labels = [gene for _, gene in entries], {gene.key: name for name, gene in reversed(entries)}
        grid = grids.tune(setup, genes, labels=labels) if setup.lr_grid else None  # an interruption: kept in the store
        matched = None
        try:
            if grid is None:
                setup.train(genes, labels=labels, on_finished=finished)
            else:
                grids.train_at_rates(setup, genes, grids.selected_rates(grid), labels=labels, on_finished=finished)
            if setup.match_params:
                matched = train_matched(setup, entries)
        except KeyboardInterrupt:
            if done and out_dir is not None:  # keep what finished; the rest is marked interrupted
                write_outputs(out_dir, _result_of(setup, pool, entries, done, time.perf_counter() - start,
                                                  interrupted=True, grid=grid))
            raise
        result = _result_of(setup, pool, entries, done, time.perf_counter() - start, grid=grid,
                            matched=matched)  # the store still open
    if out_dir is not None:
        write_outputs(out_dir, result)
    return result


def _compare_on_suite(config: Config, entries, suite, *, seeds: int, out_dir, executor, store, quiet: bool, lr_grid):
    """``run_compare`` on a suite (``studies.suite``), kept in the same stores."""
    from evo_attention.data.suites import Suite, load_suite
    from evo_attention.studies.suite import run_suite, write_suite

    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    if lr_grid is not None:
        raise UserError(f"lr_grid cannot be combined with suite {suite.name}: a rate per configuration and point is "
                        "not defined yet; drop one of them", setting=("lr_grid", "suite"))
    if out_dir is not None:
        output_dir(out_dir)
    with study_resources(config, executor, store, out_dir, "compare") as (pool, store):
        setup = StudySetup.resolve(config, None, role="compare", n_seeds=seeds, min_seeds=1, metric="suite_accuracy",
                                   store=store, executor=pool, quiet=quiet, seeds_setting="seeds")
        result = run_suite(setup, suite, entries, study="compare")
    if out_dir is not None:
        write_suite(result, out_dir)
    return result


def matched_name(width: int) -> str:
    """The name of the baseline matched at feed-forward width ``width``."""
    return f"baseline (FFN {width})"


def train_matched(setup: StudySetup, entries) -> dict:
    """The parameter-matched baselines of ``entries`` but the baseline gene: ``{"matches": name -> match,
    "records": width -> (baseline key, seed) -> record, "setups": width -> setup}``; each width trained
    once (the plain width's are the baseline's own trainings)."""
    base = setup.baseline
    names = {name: gene.key for name, gene in entries if gene.key != base}
    by_key = setup.matched_baselines(dict.fromkeys(names.values()))
    matches = {name: by_key[key] for name, key in names.items()}
    records, setups = {}, {}
    for match in matches.values():
        width = match["ffn_dim"]
        if width not in setups:
            setups[width] = setup.with_ffn(match["d_ff"])  # the plain width: read from the store when trained
            records[width] = setups[width].train([base], labels={base: matched_name(width)})
    return {"matches": matches, "records": records, "setups": setups}


def _result_of(setup: StudySetup, pool, entries, done: dict, elapsed: float,
               interrupted: bool = False, grid: dict | None = None, matched: dict | None = None) -> CompareResult:
    """One row per configuration and seed (``entries``' order, then seeds; a pair without a record did
    not run); with a ``grid`` every row and aggregate says its rate; with ``matched`` (``train_matched``)
    a row per matched baseline and seed follows, named ``baseline (FFN W)``."""
    results = [_result(name, done[gene.key, seed]) if (gene.key, seed) in done
               else _not_run(name, gene.key, seed, setup.steps, interrupted)
               for name, gene in entries for seed in setup.seeds]
    extra = []
    for width, records in (matched or {}).get("records", {}).items():
        if width == setup.config.ffn_dim:
            continue  # the plain baseline: its rows are those of "baseline" (or of no row, without one)
        extra.append((matched_name(width), AttentionGene.parse(setup.baseline)))
        results += [_result(matched_name(width), records[setup.baseline, seed]) for seed in setup.seeds]
    aggregates = aggregate(results, list(entries) + extra)
    rates = None
    if grid is not None:
        rates = grids.selected_rates(grid)
        for row in results + aggregates:
            row["learning_rate"] = rates[row["gene"]]
    summary = rank_configs(aggregates, elapsed)
    summary["paired"] = paired_with_baseline(setup, results, entries, rates=rates, matched=matched)
    if interrupted:
        summary["interrupted"] = True
    settings = _settings(setup, pool, entries)
    if matched is not None:
        settings["match_params"] = {name: {k: m[k] for k in ("ffn_dim", "params", "candidate_params", "off")}
                                    for name, m in matched["matches"].items()}
    if grid is not None:
        settings["lr_grid"] = list(setup.lr_grid)
        grid = grids.with_verdict_seeds(grid, setup.seeds)
    return CompareResult(settings, results, aggregates, summary, grid)


def _result(name: str, record) -> dict:
    return {"name": name, **{k: record.get(k) for k in RESULT_KEYS if k != "name"}}


def _not_run(name: str, gene: str, seed: int, steps: int, interrupted: bool) -> dict:
    return {**dict.fromkeys(RESULT_KEYS), "name": name, "gene": gene, "seed": seed, "steps": steps,
            "status": "interrupted" if interrupted else "error",
            "error": "interrupted before it finished" if interrupted else "the executor returned no result"}


def _settings(setup: StudySetup, pool, entries) -> dict:
    config, data = setup.config, setup.data
    return {
        "d_model": config.d_model, "n_layers": config.n_layers, "n_heads": config.n_heads, "d_ff": config.ffn_dim,
        "block": config.block, "max_seq_len": config.max_seq_len, "vocab_size": data.vocab_size, "data": data.name,
        "steps": config.train_steps, "batch_size": config.batch_size, "learning_rate": config.learning_rate,
        "lr_schedule": config.lr_schedule, "eval_steps": config.eval_steps, "seed": config.seed,
        "seeds": len(setup.seeds), "seed_list": list(setup.seeds), "margin": setup.margin,
        "device": str(resolve_device(config.device)),
        "executor": pool.describe(),
        "configs": [{"name": n, "gene": g.key} for n, g in entries],
        "config": config.to_dict(),
        "data_description": data.describe() if hasattr(data, "describe") else None,
    }


# -- statistics -----------------------------------------------------------------------------------
def mean_sd(values) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None when undefined) of the finite values."""
    d = describe(values)
    return d["mean"], d["sd"]


def aggregate(results: Sequence[dict], entries: Sequence[tuple[str, AttentionGene]]) -> list[dict]:
    """Per configuration, over its seeds: mean and sd of loss, perplexity (exp of the mean loss),
    accuracy, time and memory. ``status`` is ok (every seed ok), partial, or the first failure's."""
    out = []
    for name, gene in entries:
        runs = [r for r in results if r["name"] == name]
        ok = [r for r in runs if usable_metric(r, "val_loss") is not None]
        loss, loss_sd = mean_sd(r["val_loss"] for r in ok)
        acc, acc_sd = mean_sd(r["accuracy"] for r in ok)
        failed = [r for r in runs if r not in ok]
        status = "ok" if not failed else ("partial" if ok else failed[0]["status"])
        out.append({
            "name": name, "gene": gene.key, "status": status, "n_seeds": len(runs), "n_ok": len(ok),
            "val_loss": loss, "val_loss_sd": loss_sd,
            "val_perplexity": math.exp(loss) if loss is not None and loss < 700 else None,
            "accuracy": acc, "accuracy_sd": acc_sd,
            "bits_per_byte": mean_sd(r.get("bits_per_byte") for r in ok)[0],
            "params": next((r["params"] for r in runs if r["params"] is not None), None),
            "time_s": mean_sd(r["time_s"] for r in runs)[0],
            "peak_memory_mb": mean_sd(r["peak_memory_mb"] for r in runs)[0],
            "errors": sorted({r["error"] for r in failed if r.get("error")}),
        })
    return out


def rank_configs(aggregates: Sequence[dict], total_time_s: float | None = None) -> dict:
    """Loss mean and sd across configurations, the per-config statistics and the ranking."""
    ranked = sorted((a for a in aggregates if a["val_loss"] is not None), key=lambda a: (a["val_loss"], a["name"]))
    base = next((a for a in aggregates if a["name"] == "baseline" and a["val_loss"] is not None), None)
    loss_mean, loss_sd = mean_sd(a["val_loss"] for a in ranked)
    ranking = []
    for i, a in enumerate(ranked):
        row = {"rank": i + 1, "name": a["name"], "gene": a["gene"], "val_loss": a["val_loss"],
               "val_loss_sd": a["val_loss_sd"], "val_perplexity": a["val_perplexity"],
               "loss_vs_baseline": None, "perplexity_change_pct": None}
        if base is not None:
            row["loss_vs_baseline"] = a["val_loss"] - base["val_loss"]
            row["perplexity_change_pct"] = 100.0 * math.expm1(a["val_loss"] - base["val_loss"])
        if loss_sd:
            row["z"] = (a["val_loss"] - loss_mean) / loss_sd  # distance from the mean in sds across configs
        ranking.append(row)
    return {
        "n_configs": len(aggregates), "n_ok": len(ranked), "val_loss_mean": loss_mean, "val_loss_sd": loss_sd,
        "per_config": {a["name"]: {"mean": a["val_loss"], "sd": a["val_loss_sd"], "n": a["n_ok"]} for a in aggregates},
        "ranking": ranking, "best": ranking[0]["name"] if ranking else None,
        "failed": [{"name": a["name"], "status": a["status"], "errors": a["errors"]}
                   for a in aggregates if a["val_loss"] is None],
        "total_time_s": total_time_s,
    }


def paired_with_baseline(setup: StudySetup, results: Sequence[dict], entries,
                         rates: Mapping[str, float] | None = None, matched: dict | None = None) -> dict:
    """Every configuration against the one named ``baseline`` (if any), paired by seed on the
    perplexity's log scale (``StudySetup.versus_baseline`` when it is the study's baseline gene, so its
    family spans the store; else over this comparison): by name, the paired change, p-values and verdict.
    Empty with one seed or without a baseline. ``rates`` (gene key -> rate): each at its own rate of a
    grid; ``matched`` (``train_matched``): each against the baseline of its parameter count."""
    if len(setup.seeds) < 2 or ("baseline" not in dict(entries) and matched is None):
        return {}
    per_seed = {(r["name"], r["seed"]): usable_metric(r, "val_perplexity") for r in results}
    values = {name: [per_seed.get((name, s)) for s in setup.seeds] for name, _ in entries}
    reference = values.pop("baseline", None)
    perplexity = dataclasses.replace(setup, metric="val_perplexity")
    if matched is not None:
        refs, setups = {}, {}
        for name, match in matched["matches"].items():
            width = match["ffn_dim"]
            refs[name] = [usable_metric(matched["records"][width][setup.baseline, s], "val_perplexity")
                          for s in setup.seeds]
            setups[name] = dataclasses.replace(matched["setups"][width], metric="val_perplexity")
        values = {name: v for name, v in values.items() if name in refs}
        compared = perplexity.versus_baselines(values, refs, setups, genes=[gene.key for _, gene in entries])
        for name, match in matched["matches"].items():
            compared[name]["versus"] = {"baseline": "matched", "d_ff": match["ffn_dim"], "params": match["params"],
                                        "candidate_params": match["candidate_params"], "off": match["off"]}
    elif dict(entries)["baseline"].key == setup.baseline:
        genes = {name: gene.key for name, gene in entries if name != "baseline"}
        by_key = {genes[n]: v for n, v in values.items()}
        by_gene = (perplexity.versus_baseline(by_key, reference) if rates is None
                   else grids.versus_baseline(perplexity, by_key, reference, rates))
        compared = {name: by_gene[genes[name]] for name in values}
    else:
        compared = stats.versus_reference(values, reference, confidence=setup.confidence, log=True,
                                          margin=setup.margin, power=setup.power)
    keys = ("n_pairs", "relative", "relative_ci_low", "relative_ci_high", "scale", "difference", "diff_ci_low",
            "diff_ci_high", "p_value", "p_holm", "family_size", "verdict", "verdict_label", *stats.VERDICT_KEYS,
            "versus")
    return {name: {k: row.get(k) for k in keys} for name, row in compared.items()}


# -- outputs ----------------------------------------------------------------------------------------
def write_outputs(out_dir: str | Path, payload: Mapping) -> dict[str, Path]:
    """Write the JSON, the markdown table and the figure of a result (a ``CompareResult`` or its
    dict); returns name -> path."""
    from evo_attention.report.figures import plot_compare
    from evo_attention.report.studies.compare import compare_markdown

    payload = dict(payload)  # the report's renderers read plain dicts
    paths = write_files(out_dir, {"results": COMPARE_RESULTS, "table": COMPARE_TABLE, "figure": COMPARE_FIGURE},
                        payload, compare_markdown(payload))
    plot_compare(payload, paths["figure"])
    grids.add_grid_figure(paths, payload, "compare", paths["figure"].parent, lambda _: [grids.panel(_named(payload))])
    return paths


def _named(payload: Mapping) -> dict:
    """The grid's genes of a comparison, each labelled with its configuration's name."""
    names = {c["gene"]: c["name"] for c in reversed(payload["settings"].get("configs") or [])}
    return {key: {**row, "str": names.get(key, row.get("str"))}
            for key, row in payload["grid"]["genes"].items()}
