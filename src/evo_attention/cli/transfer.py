"""``evo-attention transfer``: retrain genes and the baseline at a ladder of model sizes.

    evo-attention transfer --from-run runs/quick --top 2 --sizes 64x2,128x4 --steps 400 --seeds 3
    evo-attention transfer --genes "dot|sparsemax|none|fixed" --preset quick --sizes 128x2,256x4 \\
        --tokens-per-param 20 --block llama

The reference is the search size (the run's d_model x layers, or the configured one with
--genes); every other size is compared with it. The seeds are ``seed + 1 ... seed + N`` as for
``validate``, never the search seed. Every flag that sets the model or the training applies at
every size, except the size itself (--sizes), the heads (d_model / 32 unless --heads) and the
steps (--steps or --tokens-per-param). With --lr-grid the grid is tuned at every size: each gene
and the baseline are compared at their own best rate at that size.
"""

from __future__ import annotations


def cmd_transfer(args) -> int:
    from evo_attention.cli.common import executor_from_args
    from evo_attention.cli.validate import analysis_setup, grid_text, log_grid, log_outputs, run_genes, study_setup
    from evo_attention.report import load_run
    from evo_attention.studies.transfer import plan, run_transfer, write_transfer
    from evo_attention.util.progress import log

    summary = load_run(args.from_run) if args.from_run else None
    genes = run_genes(args, summary, args.top, verb="transfer")
    budget = dict(sizes=args.sizes, steps=args.size_steps, tokens_per_param=args.tokens_per_param, heads=args.heads)
    # every bad size, budget or head count is refused before any file is written or data loaded
    config, data, store, out, search_seed = analysis_setup(args, "runs/transfer",
                                                           check=lambda c: plan(c, genes, **budget))
    rungs = plan(config, genes, **budget)
    log(f"carrying {len(genes)} gene(s) and the baseline across {len(rungs)} sizes "
        f"({', '.join(r.label for r in rungs)}; reference {rungs[0].label}) on {data.name} in the {config.block} "
        f"block: {args.seeds} seeds each ({config.seed + 1}..{config.seed + args.seeds}){grid_text(args, config)}",
        args.quiet)
    try:
        with executor_from_args(args, config) as executor:
            setup = study_setup(args, "transfer", config, data, store, executor, search_seed)
            result = run_transfer(setup, genes, **budget)
    finally:
        if store is not None:
            store.close()
    paths = write_transfer(result, out)
    log(result.headline.replace("**", ""))
    for gene, verdict in result.verdicts.items():
        log(f"  {gene} at {result.largest}: {verdict}")
    log_grid(result)
    log_outputs(paths, args.from_run)
    return 0


def register(subparsers) -> None:
    from evo_attention.cli.validate import add_analysis_flags
    from evo_attention.studies.transfer import DEFAULT_SIZES, DEFAULT_TRANSFER_SEEDS, HEAD_DIM

    # "resolve": this command's --steps (a list) and --seeds (another default) replace the shared ones
    p = subparsers.add_parser("transfer", conflict_handler="resolve",
                              help="retrain genes and the baseline at larger model sizes: does the advantage hold, "
                                   "shrink, vanish or reverse with scale?")
    p.add_argument("--genes", help="comma-separated gene keys, e.g. 'dot|sparsemax|output_gate|learned'")
    p.add_argument("--top", type=int, default=3, help="with --from-run and no --genes: the best K genes (default 3)")
    add_analysis_flags(p, "runs/transfer")
    s = p.add_argument_group("sizes and budgets")
    s.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"the ladder, D_MODELxLAYERS comma-separated (default {DEFAULT_SIZES}); the search size is "
                        f"added first when missing. Heads: d_model/{HEAD_DIM} (the search's own at the search size) "
                        "unless --heads")
    s.add_argument("--steps", dest="size_steps", metavar="N[,N...]",
                   help="training steps: one number for every size, or one per size of --sizes (an added search "
                        "size keeps the search's steps); default the configured steps")
    s.add_argument("--tokens-per-param", type=float, metavar="R",
                   help="instead of --steps: train R tokens per parameter of the baseline at each size")
    s.add_argument("--seeds", type=int, default=DEFAULT_TRANSFER_SEEDS,
                   help=f"trainings per gene and size, with seeds seed+1 .. seed+N (default {DEFAULT_TRANSFER_SEEDS}; "
                        "never the search seed)")
    p.set_defaults(func=cmd_transfer)
