"""A fair comparison of named attention variants at one fixed model size.

Every configuration trains the same model (same size, data, steps, batch, learning rate and seeds)
and differs only in its attention gene, so the differences in validation loss are the
mechanisms' own. ``NAMED_CONFIGS`` is the one table of the named variants; ranks are fractions
of ``d_model`` so that a variant means the same thing at every size:

    from evo_attention.compare import resolve_configs, run_compare
    entries = resolve_configs("baseline,rope_only,dot|sparsemax|none|fixed", d_model=128)
    payload = run_compare(config, entries, seeds=2, out_dir="runs/compare")

``run_compare`` trains through an executor (``executors.make_executor``; parallel executors work
too), records failures (oom, diverged, error) as rows with their status and goes on, and writes
``compare_results.json``, ``compare.md`` and ``compare.png`` into ``out_dir``.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .config import Config
from .errors import UserError
from .genes import VANILLA_KEY, AttentionGene
from .jsonio import write_json
from .report.summary import finite_or_none as _finite

RESULTS_FILE = "compare_results.json"
TABLE_FILE = "compare.md"
FIGURE_FILE = "compare.png"

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
RESULT_KEYS = ("name", "gene", "seed", "status", "error", "val_loss", "val_perplexity", "accuracy", "train_loss",
               "params", "flops_per_step", "time_s", "tokens_per_s", "peak_memory_mb", "eval_tokens", "steps",
               "trained_steps", "device")


@dataclass(frozen=True)
class NamedConfig:
    """A named attention variant: the vanilla components plus the three axes.

    ``rank_divisor`` d gives qkv_rank = d_model // d (0: full projections).
    """

    name: str
    position: str
    rank_divisor: int
    attn_bias: str
    description: str

    def rank(self, d_model: int) -> int:
        return 0 if not self.rank_divisor else max(1, d_model // self.rank_divisor)

    def gene(self, d_model: int) -> AttentionGene:
        return AttentionGene.parse(VANILLA_KEY).replace(position=self.position, qkv_rank=self.rank(d_model),
                                                        attn_bias=self.attn_bias)


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
CONFIGS_BY_NAME = {c.name: c for c in NAMED_CONFIGS}
EVOLVED_NAME = "evolved"


# -- choosing the configurations ---------------------------------------------------------------
def resolve_configs(spec: str | Sequence[str] | None, d_model: int) -> list[tuple[str, AttentionGene]]:
    """``[(name, gene)]`` for a comma-separated (or listed) mix of names and gene strings.

    ``None`` or ``"all"`` is the 13 named configurations. A gene string (it contains ``|``) is
    named by its key. Repeats are dropped; an unknown name is a UserError listing the valid ones.
    """
    if spec is None:
        items = ["all"]
    elif isinstance(spec, str):
        items = [s.strip() for s in spec.split(",")]
    else:
        items = [str(s).strip() for s in spec]
    items = [s for s in items if s]
    if not items:
        raise UserError("--configs is empty: give names such as baseline,rope_only or gene strings")
    entries: dict[str, AttentionGene] = {}
    for item in items:
        if item == "all":
            for named in NAMED_CONFIGS:
                entries.setdefault(named.name, named.gene(d_model))
        elif "|" in item:
            gene = AttentionGene.parse(item)
            entries.setdefault(gene.key, gene)
        elif item in CONFIGS_BY_NAME:
            entries.setdefault(item, CONFIGS_BY_NAME[item].gene(d_model))
        else:
            raise UserError(f"unknown configuration {item!r}: valid names are all, {', '.join(CONFIGS_BY_NAME)} "
                            "(or a gene string like 'dot|softmax|none|fixed|pos=rope')")
    return list(entries.items())


def evolved_entry(run_dir: str | Path) -> tuple[str, AttentionGene]:
    """``("evolved", best gene)`` of the finished search in ``run_dir``."""
    from .report import load_run

    best = load_run(run_dir).best_gene
    if best is None:
        raise UserError(f"the run in {run_dir} has no successful evaluation yet: no evolved gene to compare")
    return EVOLVED_NAME, AttentionGene.parse(best)


def list_table(d_model: int) -> str:
    """The named configurations as a text table (what ``--list`` prints)."""
    rows = [("name", "position", "qkv_rank", "attn_bias", f"gene at d_model {d_model}", "what")]
    for c in NAMED_CONFIGS:
        rank = f"d/{c.rank_divisor} = {c.rank(d_model)}" if c.rank_divisor else "0 (full)"
        rows.append((c.name, c.position, rank, c.attn_bias, c.gene(d_model).key, c.description))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def settings_for(preset_name: str | None, explicit: dict) -> dict:
    """Compare's settings: Config defaults < DEFAULT_SIZE < compare preset < ``explicit``.

    ``explicit`` holds what a general preset, a config file and the flags name (cli.explicit_settings).
    """
    settings = dict(DEFAULT_SIZE)
    if preset_name in COMPARE_PRESETS:
        settings.update(COMPARE_PRESETS[preset_name])
    settings.update(explicit)
    return settings


# -- running -------------------------------------------------------------------------------------
def run_compare(config: Config, entries: Sequence[tuple[str, AttentionGene]], *, seeds: int = 1,
                out_dir: str | Path | None = "runs/compare", data=None, executor="local",
                quiet: bool = False) -> dict:
    """Train every ``(name, gene)`` of ``entries`` with ``seeds`` seeds (config.seed + i) and
    summarise; writes the outputs into ``out_dir`` (unless None). Returns the JSON payload.

    ``executor``: a name for ``executors.make_executor`` or an Executor (left open).
    """
    from .executors import EvalTask, Executor, make_executor

    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise UserError(f"--seeds must be a positive integer, got {seeds!r}")
    if not entries:
        raise UserError("nothing to compare: give at least one configuration")
    if data is None:
        from .data import data_from_config

        data = data_from_config(config)
    tasks = [EvalTask(gene=gene.key, seed=config.seed + i, steps=config.train_steps, eval_split="valid",
                      role="compare", label=name) for name, gene in entries for i in range(seeds)]
    own = not isinstance(executor, Executor)
    runner = make_executor(executor) if own else executor
    view = _Progress(len(tasks), quiet)
    done: dict[tuple[str, int], dict] = {}
    start = time.perf_counter()
    try:
        with ExitStack() as stack:
            if own:
                stack.enter_context(runner)
            stack.callback(view.close)
            for task, record in runner.run(tasks, config, data, on_start=view.start, on_step=view.step):
                done[(task.label, task.seed)] = _result(task.label, record)
                _release_memory(record)
                view.finished(done[(task.label, task.seed)], len(done))
    except KeyboardInterrupt:
        if done and out_dir is not None:  # keep what finished; the rest is marked interrupted
            write_outputs(out_dir, _payload(config, data, runner, seeds, entries, tasks, done,
                                            time.perf_counter() - start, interrupted=True))
        raise
    payload = _payload(config, data, runner, seeds, entries, tasks, done, time.perf_counter() - start)
    if out_dir is not None:
        write_outputs(out_dir, payload)
    return payload


def _payload(config, data, runner, seeds, entries, tasks, done: dict, elapsed: float,
             interrupted: bool = False) -> dict:
    results = [done.get((t.label, t.seed)) or _not_run(t, interrupted) for t in tasks]
    aggregates = aggregate(results, entries)
    summary = summarize(aggregates, elapsed)
    if interrupted:
        summary["interrupted"] = True
    return {"settings": _settings(config, data, runner, seeds, entries), "results": results,
            "aggregates": aggregates, "summary": summary}


def _result(name: str, record: dict) -> dict:
    return {"name": name, **{k: record.get(k) for k in RESULT_KEYS if k != "name"}}


def _not_run(task, interrupted: bool) -> dict:
    out = {k: None for k in RESULT_KEYS}
    out.update(name=task.label, gene=task.gene, seed=task.seed, steps=task.steps,
               status="interrupted" if interrupted else "error",
               error="interrupted before it finished" if interrupted else "the executor returned no result")
    return out


def _release_memory(record: dict) -> None:
    """Free GPU memory the finished training left behind before the next one starts."""
    import torch

    if torch.cuda.is_available() and str(record.get("device") or "").startswith("cuda"):
        gc.collect()  # drop cyclic garbage holding tensors, then give cached blocks back
        torch.cuda.empty_cache()


def _settings(config: Config, data, runner, seeds: int, entries) -> dict:
    from .training import resolve_device

    describe = getattr(runner, "describe", None)
    return {
        "d_model": config.d_model, "n_layers": config.n_layers, "n_heads": config.n_heads, "d_ff": config.ffn_dim,
        "max_seq_len": config.max_seq_len, "vocab_size": data.vocab_size, "data": data.name,
        "steps": config.train_steps, "batch_size": config.batch_size, "learning_rate": config.learning_rate,
        "lr_schedule": config.lr_schedule, "eval_steps": config.eval_steps, "seed": config.seed, "seeds": seeds,
        "seed_list": [config.seed + i for i in range(seeds)], "device": str(resolve_device(config.device)),
        "executor": describe() if callable(describe) else getattr(runner, "name", str(runner)),
        "configs": [{"name": n, "gene": g.key} for n, g in entries],
        "config": config.to_dict(),
        "data_description": data.describe() if hasattr(data, "describe") else None,
    }


# -- statistics -----------------------------------------------------------------------------------
def mean_sd(values: Iterable) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None when undefined) of the finite values."""
    vals = [v for v in (_finite(x) for x in values) if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def aggregate(results: Sequence[dict], entries: Sequence[tuple[str, AttentionGene]]) -> list[dict]:
    """Per configuration, over its seeds: mean and sd of loss, perplexity (exp of the mean loss),
    accuracy, time and memory. ``status`` is ok (every seed ok), partial, or the first failure's."""
    out = []
    for name, gene in entries:
        runs = [r for r in results if r["name"] == name]
        ok = [r for r in runs if r["status"] == "ok" and _finite(r["val_loss"]) is not None]
        loss, loss_sd = mean_sd(r["val_loss"] for r in ok)
        acc, acc_sd = mean_sd(r["accuracy"] for r in ok)
        failed = [r for r in runs if r not in ok]
        status = "ok" if not failed else ("partial" if ok else failed[0]["status"])
        out.append({
            "name": name, "gene": gene.key, "status": status, "n_seeds": len(runs), "n_ok": len(ok),
            "val_loss": loss, "val_loss_sd": loss_sd,
            "val_perplexity": math.exp(loss) if loss is not None and loss < 700 else None,
            "accuracy": acc, "accuracy_sd": acc_sd,
            "params": next((r["params"] for r in runs if r["params"] is not None), None),
            "time_s": mean_sd(r["time_s"] for r in runs)[0],
            "peak_memory_mb": mean_sd(r["peak_memory_mb"] for r in runs)[0],
            "errors": sorted({r["error"] for r in failed if r.get("error")}),
        })
    return out


def summarize(aggregates: Sequence[dict], total_time_s: float | None = None) -> dict:
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
        "n_configs": len(aggregates),
        "n_ok": len(ranked),
        "val_loss_mean": loss_mean,
        "val_loss_sd": loss_sd,
        "per_config": {a["name"]: {"mean": a["val_loss"], "sd": a["val_loss_sd"], "n": a["n_ok"]} for a in aggregates},
        "ranking": ranking,
        "best": ranking[0]["name"] if ranking else None,
        "failed": [{"name": a["name"], "status": a["status"], "errors": a["errors"]}
                   for a in aggregates if a["val_loss"] is None],
        "total_time_s": total_time_s,
    }


# -- progress -----------------------------------------------------------------------------------------
class _Progress:
    """A live bar for the training in progress (terminals) and one line per finished training."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet = total, quiet
        self.start_time = time.monotonic()
        self._stack = ExitStack()
        self._bar = None
        self._task = None

    def start(self, task) -> None:
        from .progress import training_bar

        self._stack.close()
        self._stack = ExitStack()
        self._task = task
        label = task.label if task.label == task.gene else f"{task.label} ({task.gene})"
        self._bar = self._stack.enter_context(training_bar(f"{label} seed {task.seed}", task.steps,
                                                           enabled=not self.quiet))

    def step(self, task, step: int, total: int, loss: float) -> None:
        if self._bar is not None and task == self._task:
            self._bar(step, total, loss)

    def finished(self, result: dict, done: int) -> None:
        from .progress import log

        if self._task is not None and (self._task.label, self._task.seed) == (result["name"], result["seed"]):
            self.close()
        elapsed = time.monotonic() - self.start_time
        if result["status"] == "ok":
            outcome = (f"loss {result['val_loss']:.4f}  ppl {result['val_perplexity']:.2f}  "
                       f"{result['params']:,} params  {result['time_s']:.0f}s")
        else:
            outcome = f"{result['status']}: {result.get('error') or 'non-finite loss'}"
        log(f"[{done}/{self.total} {elapsed:.0f}s] {result['name']} seed {result['seed']}: {outcome}", self.quiet)

    def close(self) -> None:
        self._stack.close()
        self._bar = self._task = None


# -- outputs ----------------------------------------------------------------------------------------
def write_outputs(out_dir: str | Path, payload: dict) -> dict[str, Path]:
    """Write the JSON, the markdown table and the figure; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / RESULTS_FILE, "table": out / TABLE_FILE, "figure": out / FIGURE_FILE}
    write_json(paths["results"], payload)
    paths["table"].write_text(markdown_table(payload), encoding="utf-8")
    plot_compare(payload, paths["figure"])
    return paths


def _num(value, fmt: str) -> str:
    value = _finite(value)
    return "-" if value is None else format(value, fmt)


def _cell(text) -> str:
    """A markdown table cell: '|' (in gene keys) escaped, which GFM requires even in code spans."""
    return str(text).replace("|", "\\|")


def markdown_table(payload: dict) -> str:
    """``compare.md``: the settings, then every configuration ranked by validation loss."""
    s, summary = payload["settings"], payload["summary"]
    aggregates = {a["name"]: a for a in payload["aggregates"]}
    seeds = s["seeds"]
    lines = [
        "# Attention variants at one model size",
        "",
        f"{s['d_model']} dims, {s['n_layers']} layers x {s['n_heads']} heads, FFN {s['d_ff']}; data {s['data']} "
        f"(vocab {s['vocab_size']}, {s['max_seq_len']} tokens); {s['steps']} steps of batch {s['batch_size']}, "
        f"lr {s['learning_rate']:g} ({s['lr_schedule']}); seed{'s' if seeds > 1 else ''} "
        f"{', '.join(map(str, s['seed_list']))}."
        + (f" Loss is the mean ± sd over {seeds} seeds." if seeds > 1 else ""),
        "",
        "| rank | name | gene | val loss | perplexity | vs baseline | accuracy | params | time (s) | peak MB | status |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in summary["ranking"]:
        a = aggregates[row["name"]]
        loss = _num(a["val_loss"], ".4f") + (f" ± {_num(a['val_loss_sd'], '.4f')}" if seeds > 1 else "")
        change = "-" if row["perplexity_change_pct"] is None else f"{row['perplexity_change_pct']:+.1f}%"
        lines.append(f"| {row['rank']} | {_cell(a['name'])} | `{_cell(a['gene'])}` | {loss} | {_num(a['val_perplexity'], '.2f')} | "
                     f"{change} | {_num(a['accuracy'], '.4f')} | {_num(a['params'], ',.0f')} | "
                     f"{_num(a['time_s'], '.1f')} | {_num(a['peak_memory_mb'], '.0f')} | {a['status']} |")
    for failed in summary["failed"]:
        a = aggregates[failed["name"]]
        why = "; ".join(failed["errors"]) or failed["status"]
        lines.append(f"| - | {_cell(a['name'])} | `{_cell(a['gene'])}` | - | - | - | - | {_num(a['params'], ',.0f')} | "
                     f"{_num(a['time_s'], '.1f')} | {_num(a['peak_memory_mb'], '.0f')} | "
                     f"{a['status']}: {_cell(why)} |")
    lines += ["", f"Validation loss across the {summary['n_ok']} configurations that trained: "
              f"{_num(summary['val_loss_mean'], '.4f')} ± {_num(summary['val_loss_sd'], '.4f')} (mean ± sd)."
              + ("" if summary.get("total_time_s") is None else f" Total time {summary['total_time_s']:.0f} s."),
              "", f"![comparison]({FIGURE_FILE})", ""]
    return "\n".join(lines)


# -- the figure ------------------------------------------------------------------------------------
FAMILY_COLORS = {"baseline": "#222222", "lora": "#1f77b4", "rope": "#ff7f0e", "bias": "#2ca02c",
                 "enhanced": "#9467bd", EVOLVED_NAME: "#d62728"}
OTHER_COLOR = "#7f7f7f"


def _color(name: str) -> str:
    return FAMILY_COLORS.get(name.split("_")[0], OTHER_COLOR)


def _short(name: str, limit: int = 28) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def plot_compare(payload: dict, path: str | Path) -> Path:
    """``compare.png``: (a) the loss ranking with error bars (sd over seeds), (b) loss vs
    parameters, (c) loss vs training time, (d) peak memory; failed configurations are marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    aggregates = payload["aggregates"]
    ranked = [a for a in sorted(aggregates, key=lambda a: (a["val_loss"] is None, a["val_loss"] or 0.0, a["name"]))]
    ok = [a for a in ranked if a["val_loss"] is not None]
    s = payload["settings"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9), dpi=110)
    try:
        ax = axes[0, 0]
        ys = list(range(len(ranked)))[::-1]  # best on top
        if ok:
            lows = [a["val_loss"] - (a["val_loss_sd"] or 0.0) for a in ok]
            highs = [a["val_loss"] + (a["val_loss_sd"] or 0.0) for a in ok]
            span = max(highs) - min(lows) or abs(max(highs)) * 0.05 or 1.0
            left = min(lows) - 0.25 * span
            ax.barh(ys[: len(ok)], [a["val_loss"] - left for a in ok], left=left, color=[_color(a["name"]) for a in ok],
                    xerr=[a["val_loss_sd"] or 0.0 for a in ok] if s["seeds"] > 1 else None, capsize=3, alpha=0.85)
            ax.set_xlim(left, max(highs) + 0.4 * span)
            base = next((a for a in ok if a["name"] == "baseline"), None)
            if base is not None:
                ax.axvline(base["val_loss"], color="#222222", linestyle="--", linewidth=1, label="baseline")
                ax.legend(loc="lower right", fontsize=8)
            for y, a, high in zip(ys, ok, highs):
                ax.text(high, y, f"  {a['val_loss']:.3f}", va="center", fontsize=7)
        for y, a in zip(ys[len(ok):], ranked[len(ok):]):
            ax.text(0.02, y, f"{a['status']}", transform=ax.get_yaxis_transform(), va="center", color="#d62728",
                    fontsize=8)
        ax.set_yticks(ys)
        ax.set_yticklabels([_short(a["name"]) for a in ranked], fontsize=8)
        ax.set_xlabel("validation loss" + (f" (mean ± sd, {s['seeds']} seeds)" if s["seeds"] > 1 else ""))
        ax.set_title("Ranking (lower is better)")

        for ax, key, label, title in ((axes[0, 1], "params", "parameters", "Loss vs parameters"),
                                      (axes[1, 0], "time_s", "time per training (s)", "Loss vs time")):
            points = [a for a in ok if _finite(a[key]) is not None]
            for a in points:
                ax.errorbar(a[key], a["val_loss"], yerr=a["val_loss_sd"] if s["seeds"] > 1 else None, fmt="o",
                            color=_color(a["name"]), capsize=3)
                ax.annotate(_short(a["name"], 18), (a[key], a["val_loss"]), fontsize=7, xytext=(4, 3),
                            textcoords="offset points")
            ax.set_xlabel(label)
            ax.set_ylabel("validation loss")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            if not points:
                ax.text(0.5, 0.5, "no finished configuration", ha="center", transform=ax.transAxes)

        ax = axes[1, 1]
        mem = [a for a in ranked if _finite(a["peak_memory_mb"]) is not None]
        ax.barh(list(range(len(mem)))[::-1], [a["peak_memory_mb"] for a in mem], color=[_color(a["name"]) for a in mem],
                alpha=0.85)
        ax.set_yticks(list(range(len(mem)))[::-1])
        ax.set_yticklabels([_short(a["name"]) for a in mem], fontsize=8)
        ax.set_xlabel("peak memory (MB" + (", GPU allocated)" if str(s.get("device", "")).startswith("cuda")
                                           else ", process)"))
        ax.set_title("Peak memory")

        fig.suptitle(f"{s['data']}: {s['d_model']}d x {s['n_layers']} layers x {s['n_heads']} heads, "
                     f"{s['steps']} steps, batch {s['batch_size']}, {s['seeds']} seed{'s' if s['seeds'] > 1 else ''}")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return Path(path)
