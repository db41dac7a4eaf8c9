"""Transfer across scale: does a gene's advantage at the search size survive in larger models?

``transfer_genes`` retrains the chosen genes and the baseline (``Config.resolved_baseline``) at a
ladder of sizes (``d_model x n_layers``) with fresh seeds (never the search seed), through the runner
and the run store like ``validate``, and reports per size:

- each gene's and the baseline's mean and t interval, and each gene's difference to the baseline
  (``validate.comparison_result``, the one home of those numbers);
- each gene's *relative change*, the gene minus the baseline as a fraction of the baseline (the
  paired relative change on a ratio metric's log scale, else ``Δ / baseline mean``) with its
  interval, signed like every change: relative, because the metric itself moves with size;
- Kendall's tau between the rankings of the genes and the baseline by their means at the reference
  size and at this size;
- a verdict against the reference size (``util.stats.transfer_verdict``: holds, shrinks, vanishes
  or reverses).

The reference is the search size, the configured ``d_model x n_layers`` (a run's own with
``--from-run``), added as the first rung when the sizes lack it, and retrained exactly as configured;
every other size gets ``d_model / 32`` heads (``heads`` overrides this at every size) and the block's
default feed-forward width. The budget per rung: ``steps`` (one for every rung, or one per given size;
an added search size keeps ``train_steps``), or ``tokens_per_param`` R: ``round(R * P / (batch_size *
seq_len))`` steps, P the baseline's parameters at that size; else ``train_steps`` everywhere.

With a learning-rate grid the grid is tuned at every size and each gene and the baseline are compared
at their own best rate there (``studies.lr_grid``; the ``grid`` block has an entry per size). With
``StudySetup.match_params`` each gene at every size is judged against the vanilla baseline widened to
its parameter count there (``validate.matched_statistics``; ``versus`` names it, ``versus_plain``
keeps the plain comparison), Holm's family that of the matched comparisons over the whole ladder.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

import torch

from evo_attention.genes import AttentionGene, layers_of, size_problem
from evo_attention.nn.model import TinyTransformer
from evo_attention.report.studies.transfer import transfer_headline, transfer_markdown
from evo_attention.search.executors import Executor
from evo_attention.studies import lr_grid as grids
from evo_attention.studies.common import (DEFAULT_TUNING_SEEDS, SeedStudyResult, StudySetup, gene_keys, samples,
                                          write_json_and_markdown, written)
from evo_attention.studies.validate import comparison_result, matched_baseline_rows, matched_statistics
from evo_attention.util import stats
from evo_attention.util.errors import UserError
from evo_attention.util.jsonio import to_jsonable

DEFAULT_SIZES = "128x2,256x4,384x6"
DEFAULT_TRANSFER_SEEDS = 3
HEAD_DIM = 32  # dims per head at the sizes of the ladder other than the search size
MIN_RANKED = 4  # Kendall's tau is computed from this many ranked genes (the baseline included) on


@dataclass(frozen=True)
class Rung:
    """One size of the ladder: the config it trains with (its size, heads and ``train_steps``)."""

    config: object  # train.Config
    search_size: bool

    @property
    def label(self) -> str:
        return f"{self.config.d_model}x{self.config.n_layers}"


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"128x2,256x4"`` -> ``[(128, 2), (256, 4)]`` (d_model x layers); a malformed entry, a zero
    or a repeated size is a UserError."""
    sizes = []
    for item in (t.strip() for t in str(text).split(",")):
        match = re.fullmatch(r"(\d+)\s*[xX]\s*(\d+)", item)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise UserError(f"sizes {text!r}: {item!r} is not a size: write D_MODELxLAYERS with positive integers, "
                            "e.g. 128x2,256x4,384x6", setting="sizes")
        size = (int(match[1]), int(match[2]))
        if size in sizes:
            raise UserError(f"sizes {text!r} names {item} twice: give each size once", setting="sizes")
        sizes.append(size)
    return sizes


def parse_steps(text: str | int | None) -> list[int] | None:
    """``"400"`` or ``"200,400,800"`` -> a list of positive step counts (None stays None)."""
    if text is None:
        return None
    items = [t.strip() for t in str(text).split(",")]
    if not all(t.isdigit() and int(t) > 0 for t in items):
        raise UserError(f"steps {text!r} must be a positive number of training steps, or one per size separated "
                        "by commas (e.g. 400 or 200,400,800)", setting="steps")
    return [int(t) for t in items]


def ladder(config, sizes: Sequence[tuple[int, int]], genes: Sequence[str], *, steps: Sequence[int] | None = None,
           tokens_per_param: float | None = None, heads: int | None = None) -> list[Rung]:
    """The rungs to train, the search size first (added when ``sizes`` lacks it); checks that every
    size takes its heads and every gene (UserError naming the setting otherwise)."""
    if steps is not None and tokens_per_param is not None:
        raise UserError("give steps or tokens_per_param, not both: one budget rule per study",
                        setting=("steps", "tokens_per_param"))
    bad_ratio = isinstance(tokens_per_param, bool) or not isinstance(tokens_per_param, (int, float)) \
        or not math.isfinite(tokens_per_param) or tokens_per_param <= 0
    if tokens_per_param is not None and bad_ratio:
        raise UserError(f"tokens_per_param {tokens_per_param!r} must be a positive number, e.g. 20",
                        setting="tokens_per_param")
    search = (config.d_model, config.n_layers)
    if steps is not None and len(steps) not in (1, len(sizes)):
        raise UserError(f"steps gives {len(steps)} values for {len(sizes)} sizes: give one number for every size, or "
                        f"one per size in the order of sizes", setting="steps")
    one_budget = steps is not None and len(steps) == 1
    budgets = dict.fromkeys([search, *sizes], steps[0]) if one_budget else dict(zip(sizes, steps or []))
    # the reference first; the others in the given order
    order = [search] + [size for size in sizes if size != search]
    if len(order) < 2:
        raise UserError(f"sizes names only the search size {search[0]}x{search[1]}: add at least one other size, "
                        "e.g. 128x2,256x4", setting="sizes")
    rungs = []
    for d, n in order:
        at_search = (d, n) == search
        h = heads if heads is not None else (config.n_heads if at_search else d // HEAD_DIM)
        if h < 1 or d % h or (heads is None and not at_search and d % HEAD_DIM):
            why = (f"{d} is not divisible by the {h} heads given" if heads is not None else
                   f"{d} is not a multiple of {HEAD_DIM} (one head per {HEAD_DIM} dims)")
            raise UserError(f"size {d}x{n} does not divide into heads: d_model {why}: choose sizes whose d_model "
                            f"divides into heads, or give n_heads", setting=("sizes", "n_heads"))
        changes = {"d_model": d, "n_layers": n, "n_heads": h, "train_steps": budgets.get((d, n), config.train_steps)}
        if not at_search:
            changes["d_ff"] = None  # the block's default width at this size
        rung = Rung(config.replace(**changes), at_search)
        _check_genes_fit(genes, rung.config)
        rungs.append(rung)
    return rungs


def _check_genes_fit(genes: Sequence[str], config) -> None:
    size = f"{config.d_model}x{config.n_layers}"
    for key in genes:
        genome = AttentionGene.parse(key)
        layers = layers_of(genome)
        if len(layers) > 1 and len(layers) != config.n_layers:
            raise UserError(f"genome {genome.key} has a gene for each of {len(layers)} layers and size {size} has "
                            f"{config.n_layers}: transfer a per-layer genome only to sizes with {len(layers)} layers",
                            setting="sizes")
        problem = size_problem(genome, d_model=config.d_model, n_heads=config.n_heads, size=size)
        if problem:
            fix, setting = _SIZE_FIXES[problem.field]
            raise UserError(f"{problem.problem}: {fix}", setting=setting)


# A gene that does not fit a rung (genes.size_problem): the fix in a ladder's terms, and the settings named.
_SIZE_FIXES = {"kv_heads": ("choose sizes or n_heads that it divides", ("sizes", "n_heads")),
               "qkv_rank": ("choose larger sizes", "sizes")}


def baseline_parameters(config, vocab_size: int) -> int:
    """The baseline model's parameters at ``config``'s size (built on the meta device: no memory)."""
    with torch.device("meta"):
        return TinyTransformer(config.replace(vocab_size=vocab_size), config.resolved_baseline()).num_parameters()


def with_budgets(rungs: Sequence[Rung], data, tokens_per_param: float | None) -> list[Rung]:
    """The rungs with their steps set from ``tokens_per_param`` (unchanged without it)."""
    if tokens_per_param is None:
        return list(rungs)
    out = []
    for rung in rungs:
        tokens_per_step = rung.config.batch_size * data.seq_len
        steps = max(1, round(tokens_per_param * baseline_parameters(rung.config, data.vocab_size) / tokens_per_step))
        out.append(Rung(rung.config.replace(train_steps=steps), rung.search_size))
    return out


# -- the statistics -------------------------------------------------------------------------------
def relative_change(row: Mapping, baseline_mean: float | None) -> dict:
    """``relative_change`` with its ``_low`` and ``_high``: the gene minus the baseline as a fraction of
    the baseline: the paired relative change on a ratio metric's log scale, else the difference over the
    baseline's mean (None where a number is missing)."""
    log = row.get("scale") == "log"
    names = (("relative", "relative_ci_low", "relative_ci_high") if log
             else ("difference", "diff_ci_low", "diff_ci_high"))
    value, low, high = (row.get(n) for n in names)
    if value is None or (not log and (baseline_mean is None or baseline_mean <= 0)):
        return {"relative_change": None, "relative_change_low": None, "relative_change_high": None}
    scale = 1.0 if log else 1.0 / baseline_mean
    both = low is not None and high is not None
    return {"relative_change": value * scale, "relative_change_low": low * scale if both else None,
            "relative_change_high": high * scale if both else None}


def kendall(reference_means: Mapping[str, float | None], means: Mapping[str, float | None]) -> dict:
    """Kendall's tau (tau-b) between two rankings of the same genes by their means (genes without
    a mean at either size left out): ``{"kendall_tau", "kendall_p", "kendall_n"}``."""
    from scipy.stats import kendalltau

    keys = [k for k in reference_means if reference_means[k] is not None and means.get(k) is not None]
    out = {"kendall_tau": None, "kendall_p": None, "kendall_n": len(keys)}
    if len(keys) < MIN_RANKED:  # fewer rankings are always near +-1 with p near 1: nothing to read
        return out
    result = kendalltau([reference_means[k] for k in keys], [means[k] for k in keys])
    if math.isfinite(result.statistic):
        out["kendall_tau"] = float(result.statistic)
        out["kendall_p"] = float(result.pvalue) if math.isfinite(result.pvalue) else None
    return out


def _params(records: Mapping[tuple[str, int], Mapping], key: str, seeds: Sequence[int]) -> int | None:
    return next((int(records[key, s]["params"]) for s in seeds if records[key, s].get("params") is not None), None)


def size_statistics(setup: StudySetup, rung: Rung, records: Mapping[tuple[str, int], Mapping], keys: Sequence[str],
                    *, tokens_per_step: int, vocab_size: int, others: Mapping[str, dict] | None = None,
                    rates: Mapping[str, float] | None = None, matched: Mapping | None = None,
                    matched_others: Mapping[str, dict] | None = None) -> dict:
    """One size's row: its shape and budget, the baseline's and every gene's statistics (paired with
    the baseline, Holm over ``others`` too: the comparisons at the other sizes) and relative change.
    ``rates`` (gene key -> rate): each trained at its own rate of a grid. ``matched``
    (``validate.matched_baseline_rows`` at this size): each gene against its matched baseline, Holm
    over ``matched_others``."""
    seeds = list(setup.seeds)
    base_key = setup.baseline
    base = samples(records, base_key, seeds, setup.metric)
    per_gene = {k: samples(records, k, seeds, setup.metric) for k in keys}
    stored = setup.others(keys) if rates is None else grids.store_family(setup, keys, rates)
    family = {**stored, **(others or {})}
    compared = setup.versus({k: s["values"] for k, s in per_gene.items()}, base["values"], family)
    numbers = comparison_result("transfer-size", setup, base, per_gene, compared)
    if matched is not None:
        numbers = matched_statistics(setup, numbers, records, keys, trained=matched, others=matched_others)
    c = rung.config
    return {
        "size": rung.label, "d_model": c.d_model, "n_layers": c.n_layers, "n_heads": c.n_heads, "d_ff": c.ffn_dim,
        "search_size": rung.search_size, "steps": c.train_steps, "tokens": c.train_steps * tokens_per_step,
        "params": _params(records, base_key, seeds) or baseline_parameters(c, vocab_size),
        "baseline": {**numbers["baseline"], "params": _params(records, base_key, seeds)},
        "genes": [{**row, "params": _params(records, row["gene"], seeds),
                   **relative_change(row, reference_of(numbers, row).get("mean"))} for row in numbers["genes"]],
        **({"matched_baselines": numbers["matched_baselines"]} if matched is not None else {}),
    }


def reference_of(size_row: Mapping, gene_row: Mapping) -> Mapping:
    """The baseline row a gene's verdict at one size used: its matched baseline (``versus``), else
    the plain one."""
    versus = gene_row.get("versus") or {}
    if versus.get("baseline") == "matched":
        return next(b for b in size_row.get("matched_baselines") or [] if b.get("d_ff") == versus.get("d_ff"))
    return size_row["baseline"]


def transfer_statistics(size_rows: Sequence[dict], confidence: float = 0.95, log: bool = True,
                        lower_is_better: bool = True) -> list[dict]:
    """The size rows (the reference first) with Kendall's tau (from 4 ranked genes on), every gene's
    verdict, and the interaction test: does the gene's paired advantage change from the reference
    size to this one (``stats.paired_interaction`` on the per-seed differences, Holm over every
    gene and size)?"""
    reference = size_rows[0]
    ref_means = {r["gene"]: r.get("mean") for r in [reference["baseline"]] + reference["genes"]}
    ref_rows = {r["gene"]: r for r in reference["genes"]}
    interactions = {}
    for i, row in enumerate(size_rows[1:], 1):
        for g in row["genes"]:
            ref = ref_rows[g["gene"]]
            interactions[i, g["gene"]] = stats.paired_interaction(
                _differences(ref, reference_of(reference, ref), log),
                _differences(g, reference_of(row, g), log), confidence)
    p_holm = stats.holm_family({k: v.get("p_value") for k, v in interactions.items()})
    out = []
    for i, row in enumerate(size_rows):
        means = {r["gene"]: r.get("mean") for r in [row["baseline"]] + row["genes"]}
        genes = []
        for g in row["genes"]:
            ref = ref_rows[g["gene"]]
            extra = {"transfer": stats.REFERENCE if i == 0 else stats.transfer_verdict(ref, g, lower_is_better)}
            if i:
                inter = interactions[i, g["gene"]]
                extra["interaction"] = {**{k: inter.get(k) for k in ("change", "ci_low", "ci_high", "p_value", "test",
                                                                     "n_a", "n_b")},
                                        "p_holm": p_holm[i, g["gene"]]}
            genes.append({**g, **extra})
        out.append({**row, "reference": i == 0, "genes": genes, **kendall(ref_means, means)})
    return out


def _differences(row: Mapping, baseline: Mapping, log: bool) -> dict:
    """seed -> the gene's per-seed difference from the baseline (log values on a ratio metric)."""
    return {seed: math.log(value) - math.log(base) if log else value - base
            for seed, value, base in zip(row.get("seeds") or [], row.get("values") or [], baseline.get("values") or [])
            if not (value is None or base is None or (log and (value <= 0 or base <= 0)))}


def largest(size_rows: Sequence[Mapping]) -> Mapping:
    """The size with the most baseline parameters (the last given on a tie)."""
    return max(reversed(size_rows), key=lambda r: r.get("params") or 0)


# -- the study ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TransferResult(SeedStudyResult):
    """A transfer study: the size rows (the reference first), each gene's verdict at the largest
    size, the headline, and the provenance (its ``steps``: one per size). Written as the
    statistics, the provenance, then the headline (which reads both)."""

    headline: str = ""

    kind: ClassVar[str] = "transfer"

    def to_dict(self) -> dict:
        return to_jsonable({**self.statistics, **self.provenance, "headline": self.headline})

    sizes = written("sizes")
    reference = written("reference")
    largest = written("largest")
    verdicts = written("verdicts")


def transfer_genes(genes: Sequence[AttentionGene | str], config, data, *, sizes: str | Sequence[tuple[int, int]] =
                   DEFAULT_SIZES, steps: str | Sequence[int] | int | None = None, tokens_per_param: float | None = None,
                   heads: int | None = None, n_seeds: int = DEFAULT_TRANSFER_SEEDS, eval_split: str = "valid",
                   metric: str = "val_perplexity", confidence: float = 0.95, store=None,
                   executor: Executor | None = None, search_seed: int | None = None,
                   source_run: str | os.PathLike | None = None, quiet: bool = True, lr_grid=None,
                   n_tuning_seeds: int = DEFAULT_TUNING_SEEDS, match_params: bool = False) -> TransferResult:
    """Retrain ``genes`` and the baseline at every size of the ladder (``sizes``, ``steps``,
    ``tokens_per_param`` and ``heads``: see ``plan``) and compare each size with the search size; the
    other keyword arguments are those of ``StudySetup.resolve``."""
    setup = StudySetup.resolve(config, data, role="transfer", n_seeds=n_seeds, eval_split=eval_split, metric=metric,
                               confidence=confidence, store=store, executor=executor, search_seed=search_seed,
                               source_run=source_run, quiet=quiet, lr_grid=lr_grid, n_tuning_seeds=n_tuning_seeds,
                               match_params=match_params)
    return run_transfer(setup, genes, sizes=sizes, steps=steps, tokens_per_param=tokens_per_param, heads=heads)


def run_transfer(setup: StudySetup, genes: Sequence[AttentionGene | str], *,
                 sizes: str | Sequence[tuple[int, int]] = DEFAULT_SIZES, steps: str | Sequence[int] | int | None = None,
                 tokens_per_param: float | None = None, heads: int | None = None) -> TransferResult:
    """The transfer study of ``genes`` with a resolved ``setup``, at each rung's config (``StudySetup.at``)."""
    config, data = setup.config, setup.data
    keys = transfer_keys(config, genes)
    rungs = plan(config, keys, sizes=sizes, steps=steps, tokens_per_param=tokens_per_param, heads=heads)
    rungs = with_budgets(rungs, data, tokens_per_param)
    base_key = setup.baseline
    trained, tuned = [], {}  # tuned: size -> the grid block at that size (with a learning-rate grid)
    # one family over the whole ladder: every size's comparisons join Holm's correction at every size
    # (with matched baselines: the matched comparisons form it, the plain ones one of their own)
    pairs, matched_pairs = {}, {}
    for rung in rungs:
        at = setup.at(rung.config)
        if setup.lr_grid:
            tuned[rung.label] = grids.tune(at, [base_key] + keys)
            records = grids.train_at_rates(at, [base_key] + keys, grids.selected_rates(tuned[rung.label]))
        else:
            records = at.train([base_key] + keys)
        matched = matched_baseline_rows(at, records, keys) if setup.match_params else None
        trained.append((rung, at, records, matched))
        base = samples(records, base_key, list(at.seeds), at.metric)["values"]
        for k in keys:
            values = samples(records, k, list(at.seeds), at.metric)["values"]
            pairs[f"{k} @ {rung.label}"] = {"values": values, "reference": base}
            if matched is not None:
                matched_pairs[f"{k} @ {rung.label}"] = {"values": values, "reference": matched["references"][k]}
    size_rows = []
    for rung, at, records, matched in trained:
        def elsewhere(family: Mapping[str, dict]) -> dict:
            return {name: pair for name, pair in family.items() if not name.endswith(f" @ {rung.label}")}

        rates = grids.selected_rates(tuned[rung.label]) if tuned else None
        size_rows.append(size_statistics(at, rung, records, keys, tokens_per_step=rung.config.batch_size * data.seq_len,
                                         vocab_size=data.vocab_size, others=elsewhere(pairs), rates=rates,
                                         matched=matched, matched_others=elsewhere(matched_pairs) if matched else None))
    rows = transfer_statistics(size_rows, setup.confidence, setup.log_scale, setup.lower_is_better)
    top = largest(rows[1:])
    numbers = {
        "kind": "transfer", "analysis": stats.ANALYSIS, "metric": setup.metric, "metric_label": setup.metric_label,
        "lower_is_better": setup.lower_is_better, "reference": rows[0]["size"], "block": config.block,
        "tokens_per_param": tokens_per_param, "heads": heads,
        "genes": [{"gene": k, "str": str(AttentionGene.parse(k))} for k in keys],
        **({"match_params": True} if setup.match_params else {}),
        "sizes": rows, "verdicts": {g["gene"]: g["transfer"] for g in top["genes"]}, "largest": top["size"],
    }
    if tuned:
        numbers["grid"] = grid_by_size(tuned, setup.seeds)
    provenance = setup.provenance(steps=[r["steps"] for r in rows])
    return TransferResult(numbers, provenance, headline=transfer_headline({**numbers, **provenance}))


def grid_by_size(tuned: Mapping[str, dict], seeds: Sequence[int]) -> dict:
    """The ``grid`` block of a ladder: the rates and seeds once, then per size (in the ladder's
    order) each gene's curve, selected rate and ``at_edge``; ``at_edge`` lists ``gene @ size``."""
    first = next(iter(tuned.values()))
    common = {k: first[k] for k in ("rates", "tuning_seeds", "tuning_split", "metric", "metric_label",
                                    "lower_is_better", "rule")}
    sizes = [{"size": size, "genes": block["genes"], "at_edge": block["at_edge"]} for size, block in tuned.items()]
    return {**common, "verdict_seeds": list(seeds), "sizes": sizes,
            "at_edge": [f"{k} @ {s['size']}" for s in sizes for k in s["at_edge"]]}


def transfer_keys(config, genes: Sequence[AttentionGene | str]) -> list[str]:
    """The distinct gene keys to carry over, the baseline left out (it always comes along)."""
    baseline = config.resolved_baseline().key
    keys = [k for k in gene_keys(genes) if k != baseline]
    if not keys:
        raise UserError("no gene to transfer other than the baseline: give at least one gene other than the baseline",
                        setting="genes")
    return keys


def plan(config, genes: Sequence[AttentionGene | str], *, sizes: str | Sequence[tuple[int, int]] = DEFAULT_SIZES,
         steps: str | Sequence[int] | int | None = None, tokens_per_param: float | None = None,
         heads: int | None = None) -> list[Rung]:
    """The ladder of a study, checked (every UserError of bad sizes, steps or heads comes from here,
    before any data is loaded or file written)."""
    parsed_sizes = parse_sizes(sizes) if isinstance(sizes, str) else [tuple(s) for s in sizes]
    parsed_steps = parse_steps(",".join(map(str, steps)) if isinstance(steps, (list, tuple)) else steps)
    return ladder(config, parsed_sizes, transfer_keys(config, genes), steps=parsed_steps,
                  tokens_per_param=tokens_per_param, heads=heads)


# -- the plan without training (transfer --dry-run) -----------------------------------------------
DRY_RUN_WARMUP, DRY_RUN_STEPS = 2, 3  # untimed and timed training steps per gene and size
TIMING = (f"measured on this machine: the median of {DRY_RUN_STEPS} training steps timed one by one after "
          f"{DRY_RUN_WARMUP} untimed ones, of each gene and the baseline at each size (train.bench.step_time), times "
          "the steps of every training")


def dry_run(config, data, genes: Sequence[AttentionGene | str], *, sizes: str | Sequence[tuple[int, int]] = DEFAULT_SIZES,
            steps: str | Sequence[int] | int | None = None, tokens_per_param: float | None = None,
            heads: int | None = None, n_seeds: int = DEFAULT_TRANSFER_SEEDS, lr_grid: Sequence[float] = (),
            n_tuning_seeds: int = DEFAULT_TUNING_SEEDS, device: str | None = None, measure: bool = True) -> dict:
    """The ladder a transfer study would train, without training it: per size its shape, the
    baseline's parameters, the steps (``steps`` or ``tokens_per_param``), the tokens of one
    training, the trainings (every gene and the baseline on ``n_seeds`` seeds, plus a grid's points
    on ``n_tuning_seeds``), each genome's measured seconds per step (``TIMING``; ``measure=False``:
    none) and the estimated wall time of the size's trainings, one at a time. Evaluation, data
    loading and model building are not counted, nor trainings a store holds already."""
    from evo_attention.train.bench import step_time

    keys = transfer_keys(config, genes)
    if lr_grid:
        grids.check_rates_free(keys)
    rungs = with_budgets(plan(config, keys, sizes=sizes, steps=steps, tokens_per_param=tokens_per_param, heads=heads),
                         data, tokens_per_param)
    genomes = [config.resolved_baseline().key] + keys
    per_gene = n_seeds + len(lr_grid) * n_tuning_seeds  # trainings of one genome at one size
    rows, environment = [], {}
    for rung in rungs:
        c = rung.config
        timings = {key: step_time(key, c, data, steps=DRY_RUN_STEPS, warmup=DRY_RUN_WARMUP, device=device)
                   for key in genomes} if measure else {}
        if timings:
            environment = {k: v for k, v in next(iter(timings.values())).items() if k in ("device", "precision",
                                                                                           "threads")}
        seconds = {key: t["seconds_per_step"] for key, t in timings.items()}
        rows.append({
            "size": rung.label, "reference": rung.search_size, "d_model": c.d_model, "n_layers": c.n_layers,
            "n_heads": c.n_heads, "d_ff": c.ffn_dim, "params": baseline_parameters(c, data.vocab_size),
            "steps": c.train_steps, "tokens": c.train_steps * c.batch_size * data.seq_len,
            "trainings": len(genomes) * per_gene, "seconds_per_step": seconds,
            "flops_per_step": {key: t["flops_per_step"] for key, t in timings.items()},
            "estimated_s": sum(s * c.train_steps * per_gene for s in seconds.values()) if seconds else None,
        })
    estimates = [r["estimated_s"] for r in rows]
    return {"genes": keys, "seeds": n_seeds, "lr_grid": list(lr_grid), "tuning_seeds": n_tuning_seeds if lr_grid else 0,
            "tokens_per_param": tokens_per_param, "block": config.block, "sizes": rows,
            "trainings": sum(r["trainings"] for r in rows),
            "estimated_s": sum(estimates) if all(e is not None for e in estimates) else None,
            "timing": TIMING if measure else None, **environment}


# -- output ---------------------------------------------------------------------------------------
def write_transfer(result: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``transfer.{json,md,png}`` (``transfer_test.*`` for the test split) into ``out_dir``;
    with a learning-rate grid also ``transfer_lr_grid.png`` (``grid`` in the paths)."""
    from evo_attention.report.figures import plot_transfer

    paths = write_json_and_markdown("transfer", result, out_dir, transfer_markdown(result))
    plot_transfer(result, paths["png"])
    grids.add_grid_figure(paths, result, "transfer", out_dir,
                          lambda grid: [grids.panel(s["genes"], title=str(s["size"])) for s in grid["sizes"]])
    return paths
