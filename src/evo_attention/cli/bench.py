"""``evo-attention bench``: time the real training step and estimate what a search costs here."""

from __future__ import annotations

import re
import sys

from evo_attention.cli.common import add_training_flags, config_from_args, given, note, out_arg
from evo_attention.util.errors import UserError

DEFAULT_TOKENS_PER_STEP = 4096


def cmd_bench(args) -> int:
    from evo_attention.data import data_from_config
    from evo_attention.genes import AttentionGene
    from evo_attention.search.driver import planned_evaluations
    from evo_attention.train.bench import bench_gene
    from evo_attention.util.format import human_seconds
    from evo_attention.util.jsonio import dumps

    _check_bench_flags(args)
    requested_steps = args.steps  # --steps: how many steps to time; --budget: steps per evaluation
    args.steps = args.budget
    try:
        config = config_from_args(args)
    except UserError as exc:  # here the training budget is --budget (--steps counts the timed steps)
        if "train_steps" not in exc.settings:
            raise
        raise UserError(re.sub(r"(?<![\w-])train_steps(?![\w-])", "--budget", str(exc)),
                        setting=tuple(s for s in exc.settings if s != "train_steps")) from None
    gene = AttentionGene.parse(args.gene) if args.gene is not None else AttentionGene.vanilla()
    if args.reprobe:  # after every input is checked, before anything reads a kept answer
        from evo_attention.train.probe_cache import forget_probes

        removed = forget_probes()
        print(f"forgot {len(removed)} kept probe answer{'s' if len(removed) != 1 else ''}: measuring again",
              file=sys.stderr)
    if args.seq_lens is not None:
        return _long_context(args, config, steps=requested_steps or 5)
    data = data_from_config(config)
    if args.profile:
        from evo_attention.train.bench import profile_step

        print(profile_step(gene, config, data, warmup=args.warmup))
        return 0
    result = bench_gene(gene, config, data, steps=requested_steps or 20, warmup=args.warmup, models=args.models)
    result["planned_evaluations"] = planned_evaluations(config)
    result["est_search_s"] = result["est_evaluation_s"] * result["planned_evaluations"]
    if args.json:
        print(dumps(result))
        return 0
    flops = result["flops_per_step"]
    models = f"{result['models']} models in one batched trainer, " if result["models"] > 1 else ""
    print(f"{gene} ({result['block']} block) on {result['device']} ({result['precision']}, "
          f"{result['threads']} threads), {models}"
          f"batch {result['batch_size']} x {result['seq_len']} tokens, {result['params']:,} parameters")
    print(f"  {result['ms_per_step']:.1f} ms/step, {result['tokens_per_s']:,.0f} tokens/s, "
          f"{flops / 1e9:.1f} GFLOP/step, {result['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s achieved")
    limit = f"  this machine's matmul limit at {result['precision']}: {result['peak_flops_per_s'] / 1e9:.0f} GFLOP/s "
    print(limit + (f"(2048^3 product), so the step runs at {100 * result['mfu']:.0f}% of it (mfu {result['mfu']:.2f})"
                   if result["mfu"] is not None else "(2048^3 product), below what the step achieved even when "
                   "measured again: the machine is too busy to measure it (mfu not reported)"))
    if result.get("decode_tokens_per_s"):
        print(f"  generation (batch 1, key/value cache, greedy): {result['decode_tokens_per_s']:,.0f} tokens/s")
    share = f", its share of a batch of {result['models']}" if result["models"] > 1 else ""
    print(f"  one evaluation ({result['train_steps']} steps + eval{share}): "
          f"~{human_seconds(result['est_evaluation_s'])}; {result['trainings_per_hour']:,.0f} trainings/hour; "
          f"a search of {result['planned_evaluations']} evaluations: ~{human_seconds(result['est_search_s'])}")
    print(f"  --batch-models auto would train {result['auto_models']} model{'s' if result['auto_models'] != 1 else ''} "
          f"per batch at this shape here ({result['auto_models_reason']})")
    return 0


LONG_CONTEXT_FLAGS = (("genes", "--genes"), ("tokens_per_step", "--tokens-per-step"), ("out", "--out"))


def _check_bench_flags(args) -> None:
    """Refuse counts that make no sense and long-context flags without long-context mode, before any work."""
    for flag in ("--init-from", "--max-params"):
        if given(flag):
            note(f"{flag} is a search setting that bench does not use (it times one training of --gene): ignored")
    for value, flag, minimum in ((args.budget, "--budget", 1), (args.steps, "--steps", 1), (args.warmup, "--warmup", 0),
                                 (args.tokens_per_step, "--tokens-per-step", 1), (args.models, "--models", 1)):
        if value is not None and value < minimum:
            what = "a positive integer" if minimum else "a non-negative integer"
            raise UserError(f"{flag} must be {what}, got {value}")
    if args.models != 1 and (args.seq_lens is not None or args.profile):
        raise UserError(f"--models times the training step of K batched models: drop "
                        f"{'--seq-lens' if args.seq_lens is not None else '--profile'} or --models")
    if args.seq_lens is not None and args.gene is not None:
        raise UserError("--gene times one gene; long-context mode (--seq-lens) times the families of --genes: give "
                        "the gene as --genes NAME=GENE, or drop --seq-lens")
    if args.seq_lens is None:
        named = [flag for name, flag in LONG_CONTEXT_FLAGS if getattr(args, name) is not None]
        if named:
            raise UserError(f"{named[0]} applies to long-context mode only: add --seq-lens T,T,... or drop {named[0]}")


def _long_context(args, config, steps: int) -> int:
    """The long-context mode: every gene at every length of --seq-lens, ``steps`` timed steps each."""
    from pathlib import Path

    from evo_attention.data import data_from_config
    from evo_attention.genes import AttentionGene, split_genes
    from evo_attention.report.figures import plot_long_context
    from evo_attention.train.bench import LONG_CONTEXT_GENES, bench_lengths
    from evo_attention.util.files import output_dir, write_text
    from evo_attention.util.format import markdown_table
    from evo_attention.util.jsonio import dumps, write_json

    lengths = _positive_list(args.seq_lens, "--seq-lens")
    if args.tokens_per_step is None:
        args.tokens_per_step = DEFAULT_TOKENS_PER_STEP
    genes = dict(LONG_CONTEXT_GENES)
    if args.genes:
        genes = {}
        for item in split_genes(args.genes):
            name, equals, key = (part.strip() for part in item.partition("="))
            if not equals:
                if name not in LONG_CONTEXT_GENES:
                    raise UserError(f"--genes item {item!r} is neither a family ({', '.join(LONG_CONTEXT_GENES)}) nor "
                                    "name=gene")
                key = LONG_CONTEXT_GENES[name]
            if not name or not key:
                raise UserError(f"--genes item {item!r} needs a name and a gene: write name=gene, e.g. "
                                "mine=dot|softmax|none|fixed")
            try:
                key = AttentionGene.parse(key).key
            except UserError as exc:
                raise UserError(f"--genes item {item!r}: {exc}") from None
            genes[name] = key
    if args.tokens_per_step < max(lengths):
        raise UserError(f"--tokens-per-step {args.tokens_per_step} is below the longest length {max(lengths)}: each "
                        "step needs at least one sequence")
    out = output_dir(out_arg(args, kind="a long-context benchmark")) if args.out is not None else None

    def progress(name, t):
        if not args.json:
            print(f"  T={t}: {name}", flush=True)

    rows = bench_lengths(genes, config, lambda t: data_from_config(config.replace(max_seq_len=t)), lengths,
                         tokens_per_step=args.tokens_per_step, steps=steps, warmup=args.warmup, progress=progress)
    memory = "step_memory_mb" if rows[0]["device"].startswith("cpu") else "peak_memory_mb"
    header = ["T", "batch"] + [f"{n} ms/step" for n in genes] + [f"{n} MB" for n in genes]
    table = []
    for t in lengths:
        at = {r["name"]: r for r in rows if r["seq_len"] == t}
        first = next(iter(at.values()))
        table.append([str(t), str(first["batch_size"])] + [f"{at[n]['ms_per_step']:.0f}" for n in genes]
                     + [f"{at[n][memory]:.0f}" if at[n][memory] is not None else "-" for n in genes])
    text = markdown_table(header, table)
    print(dumps(rows) if args.json else text)
    if out is not None:
        write_json(out / "long_context.json", {"rows": rows, "genes": genes, "tokens_per_step": args.tokens_per_step})
        write_text(out / "long_context.md", text + "\n")
        plot_long_context(rows, out / "long_context.png")
        if not args.json:
            print(f"wrote {Path(out) / 'long_context.md'}, long_context.json and long_context.png")
    return 0


def _positive_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a comma-separated list of integers, e.g. 128,256,512") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} {text!r} needs positive lengths, e.g. 128,256,512")
    return values


def register(sub) -> None:
    p = sub.add_parser("bench", help="time the training step and estimate the cost of a search on this machine")
    p.add_argument("--gene", help="gene to time (default: the vanilla transformer)")
    p.add_argument("--budget", type=int, help="training steps per evaluation for the estimates (default: the config's)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    p.add_argument("--models", type=int, default=1, metavar="K",
                   help="time one trainer of K same-gene models trained as one batch (what --batch-models K runs; "
                        "default 1: one model)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--reprobe", action="store_true", help="forget this cache directory's kept probe answers "
                   "(precision, models per batch, matmul limit) and measure them again")
    p.add_argument("--profile", action="store_true", help="print the top operators of one training step "
                   "(torch.profiler) instead of timing")
    p.add_argument("--seq-lens", metavar="T,T,...", help="long-context mode: time every family of --genes at these "
                   "sequence lengths (e.g. 128,256,512,1024,2048) with a fixed token count per step")
    p.add_argument("--genes", metavar="NAME[=GENE],...", help="long-context mode: families to time (default softmax, "
                   "linear, favor, window; or name=gene pairs)")
    p.add_argument("--tokens-per-step", type=int, help="long-context mode: tokens per training step "
                   f"(batch = this // T; default {DEFAULT_TOKENS_PER_STEP})")
    p.add_argument("--out", help="long-context mode: write long_context.{json,md,png} into this directory")
    add_training_flags(p, search=True)
    for action in p._actions:  # here --steps counts the timed steps, not the training budget
        if action.dest == "steps":
            action.help = "steps to time (default 20; 5 per gene and length with --seq-lens)"
    p.set_defaults(func=cmd_bench)
