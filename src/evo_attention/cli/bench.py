"""``evo-attention bench``: time the real training step and estimate what a search costs here."""

from __future__ import annotations


def cmd_bench(args) -> int:
    from evo_attention.cli.common import config_from_args
    from evo_attention.data import data_from_config
    from evo_attention.genes import AttentionGene
    from evo_attention.search.driver import planned_evaluations
    from evo_attention.train.bench import bench_gene
    from evo_attention.util.format import human_seconds
    from evo_attention.util.jsonio import dumps

    timed_steps = args.steps or 20  # --steps: how many steps to time; --budget: steps per evaluation
    args.steps = args.budget
    config = config_from_args(args)
    gene = AttentionGene.parse(args.gene) if args.gene is not None else AttentionGene.vanilla()
    data = data_from_config(config)
    if args.profile:
        from evo_attention.train.bench import profile_step

        print(profile_step(gene, config, data, warmup=args.warmup))
        return 0
    result = bench_gene(gene, config, data, steps=timed_steps, warmup=args.warmup)
    result["planned_evaluations"] = planned_evaluations(config)
    result["est_search_s"] = result["est_evaluation_s"] * result["planned_evaluations"]
    if args.json:
        print(dumps(result))
        return 0
    flops = result["flops_per_step"]
    print(f"{gene} ({result['block']} block) on {result['device']} ({result['precision']}, "
          f"{result['threads']} threads), "
          f"batch {result['batch_size']} x {result['seq_len']} tokens, {result['params']:,} parameters")
    print(f"  {result['ms_per_step']:.1f} ms/step, {result['tokens_per_s']:,.0f} tokens/s, "
          f"{flops / 1e9:.1f} GFLOP/step, {result['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s achieved")
    print(f"  this machine's matmul limit at {result['precision']}: {result['peak_flops_per_s'] / 1e9:.0f} GFLOP/s "
          f"(2048^3 product), so the step runs at {100 * result['mfu']:.0f}% of it (mfu {result['mfu']:.2f})")
    print(f"  one evaluation ({result['train_steps']} steps + eval): ~{human_seconds(result['est_evaluation_s'])}; "
          f"a search of {result['planned_evaluations']} evaluations: ~{human_seconds(result['est_search_s'])}")
    return 0


def register(sub) -> None:
    from evo_attention.cli.common import add_training_flags

    p = sub.add_parser("bench", help="time the training step and estimate the cost of a search on this machine")
    p.add_argument("--gene", help="gene to time (default: the vanilla transformer)")
    p.add_argument("--budget", type=int, help="training steps per evaluation for the estimates (default: the config's)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--profile", action="store_true", help="print the top operators of one training step "
                   "(torch.profiler) instead of timing")
    add_training_flags(p, search=True)
    for action in p._actions:  # here --steps counts the timed steps, not the training budget
        if action.dest == "steps":
            action.help = "steps to time (default 20)"
    p.set_defaults(func=cmd_bench)
