"""``evo-attention validate``: re-train genes and the baseline with fresh seeds and compare them.

    evo-attention validate --from-run runs/quick --top 3 --seeds 5
    evo-attention validate --genes "dot|sparsemax|output_gate|learned" --preset quick --seeds 5
    evo-attention validate --genes "dot|softmax|none|fixed|pos=rope" --suite mad-cpu --preset quick --seeds 3

The seeds are ``seed + 1 ... seed + N`` (``--seed`` defaults to the run's search seed), never the
search seed itself. ``--lr-grid 5e-4,1e-3,2e-3`` trains each gene and the baseline at their own best
rate of the grid, chosen on the tuning seeds ``seed + 1001 ...`` (``studies.lr_grid``).
With ``--suite NAME|FILE`` (or a ``--from-run`` run made on a suite) every gene and the baseline
train on every point of the suite and are compared by suite accuracy (``studies.suite``):
validation_suite.json, .md and the heat map .png; the trainings are kept in the run's store, else
in a store in the output directory, so a repeat trains nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Mapping

from evo_attention.cli.common import (add_executor_flags, add_training_flags, checked, executor_from_args,
                                      explicit_settings, given, note, out_arg, over_run, suite_text)
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir
from evo_attention.util.progress import log


def _seeds(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds {text!r} is not a whole number or 'auto'") from None


def _fraction(text: str) -> float:
    """'1%' -> 0.01; '0.01' -> 0.01."""
    raw = text.strip()
    try:
        return float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction such as 0.01 or 1%") from None


def lr_grid_flag(text: str) -> tuple[float, ...]:
    """'5e-4,1e-3,2e-3' -> (0.0005, 0.001, 0.002): the rates of --lr-grid."""
    from evo_attention.train.config import parse_lr_grid

    try:
        return parse_lr_grid(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("lr_grid ", "", 1).replace("learning_rate", "--lr")) from None


def tuning_seeds_flag(text: str) -> int:
    """--tuning-seeds: a whole number >= 1, refused here, so also where --lr-grid is absent and it goes unread."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of tuning seeds per rate")
    return value


def add_grid_flags(p: argparse.ArgumentParser, what: str = "gene") -> None:
    """--lr-grid and --tuning-seeds (validate, ablate, transfer, compare, baseline)."""
    from evo_attention.studies.common import DEFAULT_TUNING_SEEDS, TUNING_OFFSET

    p.add_argument("--lr-grid", type=lr_grid_flag, metavar="LR,LR,...",
                   help=f"train each {what} (the baseline included) at every rate of this grid, e.g. "
                        "5e-4,1e-3,2e-3,4e-3, on the tuning seeds, pick its best rate on the validation split, and "
                        "measure it at that rate on the usual (fresh) seeds; --lr is then not used")
    p.add_argument("--tuning-seeds", type=tuning_seeds_flag, default=DEFAULT_TUNING_SEEDS, metavar="T",
                   help=f"with --lr-grid: seeds per rate, seed+{TUNING_OFFSET + 1} .. seed+{TUNING_OFFSET}+T "
                        f"(default {DEFAULT_TUNING_SEEDS}; never a seed the result is measured on)")


def grid_text(args, base: int) -> str:
    """What a command's log line says about its grid ('' without one); ``base``: the seed its seeds count
    from (``seed_base``: --seed, or the --seed-block's base)."""
    from evo_attention.studies.common import TUNING_OFFSET

    if not getattr(args, "lr_grid", None):
        return ""
    first, last = base + TUNING_OFFSET + 1, base + TUNING_OFFSET + args.tuning_seeds
    seeds = f"seed {first}" if first == last else f"seeds {first}..{last}"
    return (f"; each at its best of the learning rates {', '.join(f'{r:g}' for r in args.lr_grid)}, tuned on {seeds} "
            "(validation split)")


def add_analysis_flags(p: argparse.ArgumentParser, default_out: str) -> None:
    from evo_attention.report.studies.common import METRICS
    from evo_attention.studies.common import DEFAULT_MARGIN, DEFAULT_MAX_SEEDS, DEFAULT_POWER, DEFAULT_SEEDS

    p.add_argument("--from-run", metavar="DIR", help="a search run: its config is the default (flags override it), "
                   "its store caches and keeps the trainings, and the outputs go into it")
    p.add_argument("--seeds", type=_seeds, default=DEFAULT_SEEDS,
                   help=f"trainings per gene, with seeds seed+1 .. seed+N (default {DEFAULT_SEEDS}; validate: the "
                        "fewest at which the exact test can decide after Holm over its family, the compared genes "
                        "and the store's earlier comparisons on those seeds: 6 for one, 7 for three; never the "
                        "search seed); validate takes 'auto': plan them from a pilot for --mde")
    p.add_argument("--margin", type=_fraction, default=DEFAULT_MARGIN, metavar="M",
                   help="equivalence margin, e.g. 1%% (the default): a gene within it of the baseline, by the "
                        "equivalence test, is 'equivalent within ±M' (relative for perplexity and bits, in units "
                        "for loss and accuracy)")
    p.add_argument("--power", type=_fraction, default=DEFAULT_POWER,
                   help="power of the seed plan and of the minimal detectable effect (default 0.8)")
    p.set_defaults(mde=None, max_seeds=DEFAULT_MAX_SEEDS)  # the flags of validate's --seeds auto (its register)
    p.add_argument("--eval-split", choices=["valid", "test"], default="valid",
                   help="measure on the validation split (default) or the test split (outputs get a _test suffix)")
    p.add_argument("--metric", choices=[m for m in METRICS if m != "suite_accuracy"],
                   help="what to compare (default val_perplexity; with --suite: suite accuracy, always)")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="confidence level of intervals and verdicts (default 0.95)")
    p.add_argument("--out", help=f"output directory (default: the run directory with --from-run, else {default_out})")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_grid_flags(p)
    add_training_flags(p)
    add_executor_flags(p, "execution (as for search)")


def analysis_setup(args, default_out: str, check=None, suite: bool = False, *, write: bool = True):
    """(config, data, store or None, out dir, search seed or None) of an analysis command;
    ``check(config)`` (optional) runs before anything is written or loaded, the study's flags
    (``study_setup``) before anything is written. The store is the ``--from-run`` run's; with
    ``--lr-grid`` or a suite and no run, one in the output directory (``run.db``). ``suite``: the
    command takes a suite (its config's ``suite``; data is then None, the points name theirs); a
    command that does not refuses a config with one. ``write=False`` (a dry run): no output
    directory and no store (both None), the data loaded."""
    from evo_attention.data import data_from_config
    from evo_attention.search.store import RunStore
    from evo_attention.studies.common import PILOT_SEEDS, study_store, tuning_seeds, validation_seeds
    from evo_attention.train.config import Config

    settings, study = explicit_settings(args), Path(default_out).name
    if given("--lr") and getattr(args, "lr_grid", None):  # noted as ignored: it must change nothing, not even a key
        settings.pop("learning_rate", None)
    stored, stored_data, source = {}, {}, "the command line"
    if args.from_run:
        with RunStore.open(args.from_run, readonly=True) as run:
            stored, stored_data = run.config(), run.get_meta("data") or {}
        settings, source = over_run(stored, settings), f"the run in {args.from_run} with the flags"
    config = checked(Config.from_dict(settings, source=source))
    search_seed = stored.get("seed")
    # fail before loading any data (seeds auto: the pilot's seeds come first)
    base = seed_base(args, config, search_seed)
    seeds = validation_seeds(base, PILOT_SEEDS if args.seeds == "auto" else args.seeds, search_seed)
    if getattr(args, "lr_grid", None):
        reach = seeds + (list(range(seeds[-1] + 1, seeds[-1] + args.max_seeds + 1)) if args.seeds == "auto" else [])
        tuning_seeds(base, args.tuning_seeds, verdict_seeds=reach, search_seed=search_seed)
    if check is not None:
        check(config)
    if config.suite is not None:
        if not suite:
            raise UserError(f"{study} does not take a suite yet (the run's config names suite {config.suite}): "
                            "use validate or compare --suite")
        if args.seeds == "auto":
            raise UserError("--seeds auto cannot be combined with --suite: give a number of seeds")
        if args.metric not in (None, "suite_accuracy"):
            raise UserError(f"--metric {args.metric} does not apply with --suite: a suite compares suite accuracy")
        suite_text(args, config)  # --data beside --suite, and the suite itself, checked before anything is written
    data = data_from_config(config) if config.suite is None else None
    # every flag of the study is checked before anything is written (run_study makes the setup again, with the store)
    study_setup(args, study, config, data, None, None, search_seed)
    if not write:
        return config, data, None, None, search_seed
    # the output place exists (or the command fails) before any training
    out = output_dir(out_arg(args, args.from_run or default_out, kind=f"the results of {study}", study=study,
                             also=[args.from_run]))
    if args.from_run:
        if data is not None and stored_data.get("fingerprint") not in (None, data.fingerprint):
            log(f"note: the data differs from the data of the run in {args.from_run} (fingerprint "
                f"{data.fingerprint[:12]} vs {str(stored_data['fingerprint'])[:12]}); results are not comparable to "
                "the search", args.quiet)
        store = RunStore.open(args.from_run, by_study=True)
    else:  # kept in a store of the study's own in --out, so that a repeat or an interrupted study trains nothing
        store = study_store(out, config, study)  # again (one writer: its lock)
    return config, data, store, out, search_seed


def seed_block_flag(text: str):
    """--seed-block: a whole number >= 0, or 'run' (the --from-run run's search seed)."""
    if text.strip().lower() == "run":
        return "run"
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a block number (a whole number >= 0) or 'run'")
    return value


def seed_block(args, search_seed):
    """The seed block an analysis command's flags name (None: the seeds count from --seed)."""
    block = getattr(args, "seed_block", None)
    if block == "run":
        if search_seed is None:
            raise UserError("--seed-block run takes the block of the --from-run run's search seed: give --from-run, "
                            "or a block number")
        if search_seed < 0:
            raise UserError(f"--seed-block run: the run's search seed {search_seed} is negative; give a block number")
        return int(search_seed)
    return block


def seed_base(args, config, search_seed) -> int:
    """The seed an analysis command's seeds count from (its block's base, else --seed)."""
    from evo_attention.studies.common import seed_block_base

    block = seed_block(args, search_seed)
    return config.seed if block is None else seed_block_base(block)


def study_setup(args, role: str, config, data, store, executor, search_seed):
    """The ``StudySetup`` of an analysis command: its flags (seeds, split, metric, confidence,
    --from-run, --quiet) with the config, data, store and executor ``analysis_setup`` gave."""
    from evo_attention.studies.common import StudySetup

    if args.seeds == "auto" and role != "validate":
        raise UserError(f"--seeds auto plans the seeds of a validation; give {role} a number of seeds")
    return StudySetup.resolve(config, data, role=role, n_seeds=args.seeds, eval_split=args.eval_split,
                              metric="suite_accuracy" if config.suite is not None else args.metric or "val_perplexity",
                              confidence=args.confidence, store=store, executor=executor,
                              search_seed=search_seed, source_run=args.from_run, quiet=args.quiet,
                              margin=args.margin, power=args.power, mde=args.mde, max_seeds=args.max_seeds,
                              lr_grid=args.lr_grid, n_tuning_seeds=args.tuning_seeds,
                              match_params=getattr(args, "match_params", False),
                              seed_block=seed_block(args, search_seed))


def add_match_flag(p: argparse.ArgumentParser, where: str = "", model: str = "the vanilla model") -> None:
    """--match-params (validate, compare, transfer, curve)."""
    p.add_argument("--match-params", action="store_true",
                   help=f"also train a parameter-matched baseline per gene{where}: {model} with its feed-forward "
                        "width set so that its parameters are within 0.5%% of the gene's; each verdict is then "
                        "against it (the table shows both baselines)")


def run_study(args, role: str, config, data, store, search_seed, run):
    """``run(setup)`` on the ``study_setup`` of an analysis command, inside its executor; the store
    ``analysis_setup`` opened is closed afterwards, whatever happens."""
    try:
        with executor_from_args(args, config) as executor:
            return run(study_setup(args, role, config, data, store, executor, search_seed))
    finally:
        if store is not None:
            store.close()


def run_genes(args, summary, top: int, verb: str = "validate") -> list[str]:
    """The genes to study: --genes, else the best ``top`` of the run (the vanilla gene and the run's
    baseline excluded)."""
    from evo_attention.genes import AttentionGene, split_genes

    if args.genes:
        genes = split_genes(args.genes)
        if not genes:
            raise UserError(f"--genes {args.genes!r} names no gene: give keys like 'dot|sparsemax|output_gate|learned'")
        if given("--top"):
            note("--top is used only without --genes (the best of the --from-run run): ignored")
        keys = [AttentionGene.parse(g).key for g in genes]
        twice = next((k for k in keys if keys.count(k) > 1), None)
        if twice is not None:
            note(f"--genes names {twice} more than once (spelt alike or not): it is studied once")
        return list(dict.fromkeys(keys))
    if summary is None:
        raise UserError(f"nothing to {verb}: give --genes KEY[,KEY...] or --from-run DIR")
    if top < 1:
        raise UserError(f"--top {top} must be at least 1")
    # the vanilla gene and the run's own baseline (on generated tasks without attention dropout)
    left_out = {AttentionGene.vanilla().key, (summary.baseline or {}).get("gene")}
    ranked = [r["gene"] for r in summary.ranking if r["gene"] not in left_out]
    if not ranked:
        raise UserError(f"the run in {summary.run_dir} has no finished search evaluation to {verb}: let it run, "
                        "or give --genes")
    note_unfinished(summary.run_dir, verb)
    if len(ranked) < top:
        note(f"--top {top} asks for more genes than the run in {summary.run_dir} has ranked (the vanilla gene and "
             f"its baseline aside): {verb} takes the {len(ranked)} it has")
    return ranked[:top]


def note_unfinished(run_dir, verb: str) -> None:
    """A note, in ``status``'s words, when the search in ``run_dir`` has not finished (interrupted, or
    running): what ``verb`` takes from it is its best so far. Every command that takes a run's best says it."""
    from evo_attention.report.status import run_status

    s = run_status(run_dir)
    if not s.get("study") and not s["done"]:
        planned = f" of {s['planned']} planned" if s["planned"] else ""
        note(f"the search in {run_dir} is not finished ({s['state']}: {s['generations_done']} of {s['generations']} "
             f"generations done, {s['trained']} trainings recorded{planned}): {verb} takes its best genes so far")


def note_replaced(out, kind: str, setup, genes, **also) -> None:
    """One note before anything trains when this study's result replaces one in ``out`` (``kind``: validation,
    ablation, transfer, validation_suite) made for other genes, seeds, steps or metric (``also``: a transfer's
    sizes): the file a researcher cites goes, while its trainings stay in the store (a rebuild says nothing)."""
    import json

    from evo_attention.studies.plan import validation_file

    path = validation_file(out, setup.eval_split, kind)
    if not path.is_file():
        return
    now = {"genes": list(genes), "seeds": None if setup.planned else list(setup.seeds), "steps": setup.steps,
           "metric": setup.metric, **also}
    try:
        held = json.loads(path.read_text())
        was = {**held, "genes": [str(r["gene"]) for r in held.get("genes") or [held]],
               "sizes": [s["size"] for s in held.get("sizes") or []]}
        what = f"{', '.join(was['genes'])} at {len(was['seeds'])} seeds" + (
            f", sizes {', '.join(was['sizes'])}" if was["sizes"] else "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        was, what = {}, "not readable"
    if not all(value in (None, was.get(key)) for key, value in now.items()):
        note(f"this replaces {path} and its .md and .png ({what}); its trainings stay in {setup.store.path}, so the "
             "command that wrote it rebuilds it")


def search_values(summary, keys, metric: str, config, data, eval_split: str) -> dict:
    """Each gene's value in the search (its search-seed training; the baseline's too), where it
    measured the same thing: the same data, steps and settings (a search on another corpus, or one
    that scored fewer evaluation batches, shows no value here)."""
    from evo_attention.genes import AttentionGene
    from evo_attention.train.record import usable_metric
    from evo_attention.train.spec import Trial

    if summary is None or eval_split != "valid" or config.train_steps != summary.config.get("train_steps"):
        return {}
    seed, context = summary.config.get("seed"), Trial.from_config(AttentionGene.vanilla(), config).context
    out = {}
    for record in summary.evaluations:
        same = (record.get("seed") == seed and record.get("data_fingerprint") == data.fingerprint
                and record.get("context") == context)
        if same and record.get("role") in ("search", "baseline") and record.get("gene") in keys:
            value = usable_metric(record, metric)
            if value is not None:
                out.setdefault(record["gene"], value)
    return out


def log_grid(result) -> None:
    """What a study's verdict lines leave out: that eval_steps cut its evaluations short (``partial_note``);
    with a learning-rate grid, each gene's selected rate, and a warning per edge winner."""
    from evo_attention.report.studies.common import partial_note

    if partial := partial_note(result):
        log(partial)
    grid = result.get("grid")
    if not grid:
        return
    for where, genes in ([(f" at {s['size']}", s["genes"]) for s in grid["sizes"]] if "sizes" in grid
                         else [("", grid["genes"])]):
        log_selected_rates(genes, grid["rates"], where)


def log_selected_rates(genes: Mapping, rates, where: str = "", quiet: bool = False) -> None:
    """One line of each gene's selected rate (a ``grid`` block's ``genes``), and a warning per edge winner."""
    from evo_attention.report.studies.lr_grid import edge_warnings

    log(f"selected learning rates{where}: " + ", ".join(f"{g['str']} {g['selected']:g}" for g in genes.values()),
        quiet)
    for line in edge_warnings(genes, rates, where=where):
        note(line.replace('`', ''))  # evo-attention: warning: ...


def log_outputs(result, paths: dict, from_run: str | None) -> None:
    """What the verdict lines of an analysis leave out (``log_grid``), which files it wrote and, for a run's
    analysis, how to fold them into its report."""
    log_grid(result)
    log(f"wrote {', '.join(str(p) for p in paths.values())}")
    if from_run:
        log(f"fold it into the run's report with: evo-attention report {from_run}")


def apply_plan(args):
    """With --plan FILE: the plan (``studies.plan``), its family set into the flags it fixes
    (the genes, seeds, margin, confidence and seed block); None without one."""
    if not getattr(args, "plan", None):
        return None
    from evo_attention.studies.plan import load_plan

    if args.genes:
        raise UserError("--plan names the genes it compares: drop --genes")
    fixed = [flag for flag in ("--seeds", "--margin", "--confidence", "--seed-block") if given(flag)]
    if fixed:
        raise UserError(f"--plan fixes {fixed[0]} (its seeds, margin, alpha and seed block): drop {fixed[0]}, or "
                        "amend the plan", setting="plan")
    plan = load_plan(args.plan)
    family = plan.family()
    args.genes = ",".join(family["comparisons"])
    args.seeds, args.margin, args.confidence = family["seeds"], family["margin"], 1.0 - family["alpha"]
    if family.get("seed_block") is not None:
        args.seed_block = family["seed_block"]
    return plan


def _decisive_seeds(args, family, planned: bool) -> None:
    """Without --seeds: the fewest seeds (at least the default) at which the verdict rule can decide after
    Holm over the family the validation will test on them (``family(n)``: its size on n seeds, the store's
    earlier comparisons on them included); a requested count that cannot decide is said before training."""
    import itertools

    from evo_attention.studies.common import DEFAULT_SEEDS
    from evo_attention.util import stats

    stats.check_confidence(args.confidence)  # before alpha = 1 - confidence is checked, so the flag is named
    alpha = 1.0 - args.confidence
    if not planned and not given("--seeds"):  # ends by EXACT_BELOW seeds, where no family stops a decision
        args.seeds = next(n for n in itertools.count(DEFAULT_SEEDS) if stats.decisive_seeds(family(n), alpha) <= n)
    elif isinstance(args.seeds, int) and args.seeds >= 2:  # fewer is refused by the study itself
        size = family(args.seeds)
        needed = stats.decisive_seeds(size, alpha)
        why = stats.cannot_decide(args.seeds, alpha, size)
        if why and args.seeds < needed:
            note(f"{why}: with {size} comparison{'s' if size != 1 else ''} in Holm's family, {needed} seeds are the "
                 "fewest that can show a difference")


def cmd_validate(args) -> int:
    from evo_attention.report import load_run
    from evo_attention.studies.validate import run_validation, write_validation

    summary = load_run(args.from_run) if args.from_run else None
    plan = apply_plan(args)
    genes = run_genes(args, summary, args.top)
    config, data, store, out, search_seed = analysis_setup(args, "runs/validate", suite=True)
    from evo_attention.studies.plan import check_registration, check_unplanned, validation_file

    try:  # before anything trains: a plan's result is replaced only by its plan, as it allows
        if plan is not None:
            if config.suite is not None:
                raise UserError("--plan runs a validation without a suite: drop --suite")
            check_registration(plan, out, args.eval_split)
        elif config.suite is None:
            check_unplanned(validation_file(out, args.eval_split))
        setup = study_setup(args, "validate", config, data, store, None, search_seed)
        keys = [g for g in genes if g != setup.baseline]
        if not keys:  # before a family of none is sized
            raise UserError(f"no gene to validate other than the baseline: give at least one gene other than "
                            f"{setup.baseline}", setting="genes")
        _decisive_seeds(args, lambda n: setup.family_size(keys, n), plan is not None)
        note_replaced(out, "validation_suite" if config.suite else "validation",
                      study_setup(args, "validate", config, data, store, None, search_seed), keys)
    except BaseException:
        if store is not None:
            store.close()
        raise
    if config.suite is not None:
        return _validate_on_suite(args, keys, config, store, out, search_seed)
    base_key = config.resolved_baseline().key
    base = seed_base(args, config, search_seed)
    seeds = (f"seeds planned from a pilot ({base + 1}..{base + 3})" if args.seeds == "auto"
             else f"{args.seeds} seeds each ({base + 1}..{base + args.seeds})")
    log(f"validating {len(keys)} gene(s) and the baseline on {data.name}: {seeds}, {config.train_steps} steps, "
        f"{args.eval_split} split{grid_text(args, base)}"
        f"{'; each against a parameter-matched baseline' if args.match_params else ''}", args.quiet)
    known = search_values(summary, genes + [base_key], args.metric or "val_perplexity", config, data, args.eval_split)
    result = run_study(args, "validate", config, data, store, search_seed,
                       lambda setup: run_validation(setup, genes, search_values=known))
    if plan is not None:
        from evo_attention.studies.validate import ValidationResult

        result = ValidationResult({**result.statistics, "plan": plan.record()}, result.provenance)
    paths = write_validation(result, out)
    log(result.headline.replace("**", ""))
    for row in result.genes:
        log(f"  {row['str']}: {row['verdict']}")
    log_outputs(result, paths, args.from_run)
    return 0


def add_suite_flag(p: argparse.ArgumentParser, what: str) -> None:
    """--suite and --baseline-gene of compare and validate (Config settings that only search's flags carry)."""
    from evo_attention.train.config import shipped_suites

    p.add_argument("--suite", metavar="NAME|FILE",
                   help=f"train each {what} and the baseline on every point of this suite of tasks "
                        f"({shipped_suites()} or a suite YAML file), each point for the suite's steps, and compare "
                        "their accuracy per point and their suite accuracy (the mean over the points); see "
                        "docs/tasks.md")
    add_baseline_flag(p)


def add_baseline_flag(p: argparse.ArgumentParser) -> None:
    """--baseline-gene (Config ``baseline_gene``, a setting that only search's flags carry)."""
    p.add_argument("--baseline-gene", metavar="GENE",
                   help="the gene every verdict compares against (default: the vanilla transformer; on a generated "
                        "task or suite without attention dropout, dot|softmax|none|fixed|bias|0.00)")


def log_suite_result(result, out: Path, quiet: bool) -> int:
    """What compare and validate say of a suite result (with ``partial_note``); 1 when no gene has a suite
    accuracy."""
    log(result.headline.replace("**", ""), quiet)
    for row in [result.baseline] + list(result.genes):
        verdict = f": {row['verdict_label']}" if row.get("verdict_label") else ""
        failed = f", {row['n_failed']} failed trainings" if row["n_failed"] else ""
        log(f"  {row['name']}: suite accuracy {row['mean']:.4f}{failed}{verdict}" if row.get("mean") is not None
            else f"  {row['name']}: no result", quiet)
    from evo_attention.report.attachments import output_stem
    from evo_attention.report.studies.common import partial_note

    if partial := partial_note(result):
        log(partial, quiet)

    stem = output_stem(f"{result['study']}_suite", result["eval_split"])
    log(f"results in {out}: {stem}.json, {stem}.md, {stem}.png", quiet)
    return 0 if any(r.get("mean") is not None for r in [result.baseline] + list(result.genes)) else 1


def _validate_on_suite(args, genes, config, store, out, search_seed) -> int:
    """``validate`` on the config's suite (``studies.suite``): every gene and the baseline on every point."""
    from evo_attention.data.suites import load_suite
    from evo_attention.genes import AttentionGene
    from evo_attention.studies.suite import run_suite, write_suite

    entries = [(str(AttentionGene.parse(g)), g) for g in genes]  # the baseline's left out by cmd_validate
    base = seed_base(args, config, search_seed)
    log(f"validating {len(entries)} gene(s) and the baseline on {suite_text(args, config)}: {args.seeds} seeds each "
        f"({base + 1}..{base + args.seeds}), {args.eval_split} split", args.quiet)
    result = run_study(args, "validate", config, None, store, search_seed,
                       lambda setup: run_suite(setup, load_suite(config.suite), entries, study="validation"))
    write_suite(result, out)
    code = log_suite_result(result, out, args.quiet)
    if args.from_run:
        log(f"fold it into the run's report with: evo-attention report {args.from_run}")
    return code


def register(subparsers) -> None:
    from evo_attention.studies.common import DEFAULT_MAX_SEEDS, SEED_BLOCK_BASE, SEED_BLOCK_SIZE

    p = subparsers.add_parser("validate", help="re-train genes and the baseline with several fresh seeds: means, "
                              "confidence intervals, paired tests by seed with Holm correction, verdicts")
    p.add_argument("--genes", help="comma-separated gene keys, e.g. 'dot|sparsemax|output_gate|learned'")
    p.add_argument("--top", type=int, default=3, help="with --from-run and no --genes: the best K genes (default 3)")
    add_analysis_flags(p, "runs/validate")
    p.add_argument("--mde", type=_fraction, metavar="E",
                   help="with --seeds auto: the smallest change the planned seeds should detect, e.g. 1%%")
    p.add_argument("--max-seeds", type=int, default=DEFAULT_MAX_SEEDS, metavar="N",
                   help=f"with --seeds auto: plan at most N seeds (default {DEFAULT_MAX_SEEDS})")
    add_match_flag(p)
    p.add_argument("--seed-block", type=seed_block_flag, metavar="K|run",
                   help=f"draw the seeds from block K ({SEED_BLOCK_BASE}+K*{SEED_BLOCK_SIZE}+1 ..) instead of "
                        "seed+1 ..: validations of several searches with different blocks never share a seed; 'run': "
                        "the block of the --from-run run's search seed (recorded in the result)")
    p.add_argument("--plan", metavar="FILE",
                   help="run a registered study plan (YAML: comparisons, margin, alpha, test, seeds; see "
                        "docs/validation.md); its values replace --genes, --seeds, --margin and --confidence, and a "
                        "family change after results exist in --out is refused unless the plan records it as an "
                        "amendment with its time")
    add_suite_flag(p, "gene")
    p.set_defaults(func=cmd_validate)
