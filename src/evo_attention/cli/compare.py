"""``evo-attention compare``: train named attention variants at one fixed size and rank them.

    evo-attention compare --preset small --data wikitext2 --data-dir ../shared/data/wikitext-2
    evo-attention compare --configs baseline,rope_only,"dot|sparsemax|none|fixed" --seeds 3
    evo-attention compare --list
    evo-attention compare --preset small --configs baseline,rope_only --seeds 3 --lr-grid 5e-4,1e-3,2e-3,4e-3
    evo-attention compare --suite mad-cpu --preset small --configs baseline,rope_only,linear --seeds 3

The model size defaults to the study's 512d / 8 layers / 8 heads / 2048 FFN; ``--preset small``
is a CPU-sized comparison (see ``evo_attention.compare``). The seeds are ``seed + 1 ... seed +
N``. The trainings are kept in a run store: the ``--from-run`` run's, else one in ``--out``, so a
repeat with the same settings trains nothing. Writes compare_results.json, compare.md and
compare.png into ``--out``. With ``--lr-grid`` every configuration (the baseline included) is
trained at its own best rate of the grid, chosen by validation loss on the tuning seeds
(``compare_lr_grid.png``). With ``--suite NAME|FILE`` every configuration and the baseline train on
every point of the suite (each for the suite's steps), scored by accuracy: compare_suite.json,
compare_suite.md and the heat map compare_suite.png (``studies.suite``).
"""

from __future__ import annotations

import argparse

from evo_attention.cli.common import (add_executor_flags, add_training_flags, checked, executor_from_args,
                                      explicit_settings, load_run_plugins, note, out_arg, suite_text,
                                      with_run_suite)
from evo_attention.cli.validate import (add_grid_flags, add_match_flag, add_suite_flag, grid_text, log_grid,
                                        log_suite_result, note_unfinished)
from evo_attention.util.errors import UserError
from evo_attention.util.format import direction, signed_change
from evo_attention.util.progress import log


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="train named attention variants at one fixed model size and rank them",
                              description="Train a list of named attention configurations (or gene strings) at one "
                                          "model size, for the same steps, batch and seeds, and rank them by "
                                          "validation loss.")
    p.add_argument("--configs", metavar="LIST",
                   help="comma-separated names (see --list) and/or gene strings; default: all 13 named configurations")
    p.add_argument("--seeds", type=int, default=1, metavar="N", help="train each configuration with N seeds "
                   "(seed+1 .. seed+N) and report mean ± sd (default 1)")
    p.add_argument("--from-run", metavar="DIR", help="also compare the best gene of the search run in DIR (as "
                   "'evolved'); the trainings are kept in its store")
    p.add_argument("--list", action="store_true", help="print the named configurations and exit")
    p.add_argument("--out", default="runs/compare", help="output directory (default runs/compare); without "
                   "--from-run it keeps the trainings in a store of its own (run.db), so a repeat trains nothing")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_suite_flag(p, "configuration")
    add_match_flag(p)
    add_grid_flags(p, "configuration")
    add_training_flags(p)
    add_executor_flags(p)
    p.set_defaults(func=cmd_compare)


def compare_config(args):
    """Config: defaults < the study's size < --preset (small, quick or seed) < --config < flags."""
    from evo_attention.studies.compare import COMPARE_PRESETS, settings_for
    from evo_attention.train.config import Config
    from evo_attention.train.presets import PRESETS

    preset = args.preset
    if preset is not None and preset not in COMPARE_PRESETS and preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}: valid presets for compare are "
                        f"{', '.join(list(COMPARE_PRESETS) + list(PRESETS))}")
    general = argparse.Namespace(**{**vars(args), "preset": None if preset in COMPARE_PRESETS else preset})
    settings = settings_for(preset, explicit_settings(general))
    return checked(Config.from_dict(settings, source="the command line"))


def cmd_compare(args) -> int:
    from contextlib import ExitStack

    from evo_attention.search.store import RunStore
    from evo_attention.genes import split_genes
    from evo_attention.studies.compare import evolved_entry, list_table, named_dropout, resolve_configs, run_compare

    config = compare_config(args)
    if args.list:
        print(list_table(config.d_model, config.n_heads, config.max_seq_len))
        return 0
    if args.seeds < 1:
        raise UserError(f"--seeds must be a positive integer, got {args.seeds}")
    if args.from_run:
        config = with_run_suite(config, args, args.from_run)
        # its best gene may use their ops: imported here and in every worker (the config's plugins)
        config = config.replace(plugins=load_run_plugins(args.from_run, config.plugins))
    on_suite = suite_text(args, config)
    entries = resolve_configs(args.configs, config.d_model, config.n_heads, config.max_seq_len,
                              attention_dropout=named_dropout(config))
    named = [c for c in dict.fromkeys(split_genes(args.configs or "")) if c != "all"]
    if len(named) > len(entries):
        note(f"--configs names {len(named)} configurations of {len(entries)} distinct gene(s): each gene is "
             "compared once")
    if args.from_run:
        entries.append(evolved_entry(args.from_run))
        note_unfinished(args.from_run, "compare")
    executor = executor_from_args(args, config)
    out = out_arg(args, kind="a comparison", study="compare", also=[args.from_run])
    budget = on_suite or f"{config.train_steps} steps, data {config.data}"
    log(f"comparing {len(entries)} configuration(s) x {args.seeds} seed(s) "
        f"({config.seed + 1}..{config.seed + args.seeds}) at {config.d_model}d x {config.n_layers} layers x "
        f"{config.n_heads} heads (FFN {config.ffn_dim}), batch {config.batch_size}, {budget}"
        f"{grid_text(args, config.seed)}", args.quiet)
    # with --from-run the trainings are kept in (and served from) that run's store, else in --out's own
    with ExitStack() as stack:
        stack.enter_context(executor)
        store = stack.enter_context(RunStore.open(args.from_run, by_study=True)) if args.from_run else None
        result = run_compare(config, entries, seeds=args.seeds, out_dir=out, executor=executor, store=store,
                             quiet=args.quiet, lr_grid=args.lr_grid, n_tuning_seeds=args.tuning_seeds,
                             match_params=args.match_params)
    if config.suite is not None:
        return log_suite_result(result, out, args.quiet)
    summary = result.summary
    if summary["ranking"]:
        log(f"best (change of perplexity vs baseline; {direction(True)}):", args.quiet)
    for row in summary["ranking"][:3]:
        change = "" if row["perplexity_change_pct"] is None else f" (change {signed_change(row['perplexity_change_pct'])})"
        log(f"#{row['rank']} {row['name']}: loss {row['val_loss']:.4f}{change}", args.quiet)
    for failed in summary["failed"]:
        log(f"{failed['name']}: {failed['status']}", args.quiet)
    if not args.quiet:
        log_grid(result)
    log(f"results in {out}: compare_results.json, compare.md, compare.png", args.quiet)
    return 0 if summary["n_ok"] else 1
