"""``evo-attention attention-maps``: draw and measure a trained model's attention weights.

    evo-attention attention-maps --model runs/best/model --text "the cat sat on the mat"
    evo-attention attention-maps --gene "dot|sparsemax|none|fixed" --preset quick --steps 200
    evo-attention attention-maps --from-run runs/quick          # the run's best gene -> runs/quick/maps
"""

from __future__ import annotations

from pathlib import Path

from evo_attention.cli.common import (GIVEN_FLAGS, add_training_flags, checked, explicit_settings, given,
                                      load_with_plugins, note, out_arg, over_run, run_suite)
from evo_attention.cli.validate import note_unfinished
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir
from evo_attention.util.progress import log, training_bar


def _input(args, tokenizer, data, max_len: int) -> tuple[list[int], str]:
    """(ids, where they come from): --text read by the model's tokenizer, else a validation example
    of ``data``; checked before any model trains."""
    from evo_attention.studies.maps import encode_text, validation_sample

    if args.text is not None:
        for flag in ("--sample", "--length"):
            if given(flag):
                note(f"{flag} picks the validation example drawn without --text: ignored")
        return encode_text(args.text, tokenizer, max_len), "--text"
    if args.length > min(data.seq_len, max_len):
        note(f"--length {args.length} is beyond the example's {min(data.seq_len, max_len)} tokens: all of them are "
             "drawn")
    ids = validation_sample(data, min(args.length, data.seq_len, max_len), args.sample)
    return ids, f"validation example {args.sample}, first {len(ids)} tokens"


def _trained_model(args):
    """(model, tokenizer, ids, text source, source) for --gene / --from-run: the run's kept model of the
    same training when it has one, else trained here on the fly, after the input is checked."""
    from evo_attention.train.config import Config
    from evo_attention.data import data_from_config
    from evo_attention.genes import AttentionGene
    from evo_attention.report import load_run
    from evo_attention.train.spec import Trial
    from evo_attention.search.models import kept_model_of
    from evo_attention.search.store import RunStore
    from evo_attention.train.saving import load_model
    from evo_attention.train.trainer import run_training

    settings, origin = explicit_settings(args), "the command line"
    if args.from_run:
        with RunStore.open(args.from_run, readonly=True) as run:
            stored = run.config()
        suite, points = run_suite(args.from_run)
        if suite is not None:  # maps are drawn on one task: a point's data, named
            if "data" not in settings:
                raise UserError(f"the run in {args.from_run} is a suite run (suite {suite}): attention maps are drawn "
                                f"on one task; give --data, e.g. one of its points: {', '.join(points)}")
            stored = {k: v for k, v in stored.items() if k not in ("suite", "objectives", "recall")}  # the suite's own
        settings, origin = over_run(stored, settings), f"the run in {args.from_run} with the flags"
    config = checked(Config.from_dict(settings, source=origin))
    if args.gene is not None:
        gene = AttentionGene.parse(args.gene)
    else:  # the run's best (cmd_maps refuses a command without --gene or --from-run)
        best = load_run(args.from_run).best_gene
        if best is None:
            raise UserError(f"the run in {args.from_run} has no finished search evaluation: give --gene")
        gene = AttentionGene.parse(best)
        note_unfinished(args.from_run, "attention-maps")
    data = data_from_config(config)
    tokenizer = data.tokenizer or data.vocab
    ids, text_source = _input(args, tokenizer, data, config.model.with_data(data.vocab_size, data.seq_len).max_seq_len)
    trial = Trial.from_config(gene, config, data=data)
    kept = kept_model_of(args.from_run, trial.key()) if args.from_run else None
    if kept is not None:  # the very training the run kept (search --keep-models): drawn without retraining
        measured = {k: kept.get(k) for k in ("gene", "steps", "seed", "val_perplexity", "accuracy")}
        source = {"model": kept["dir"], **measured, "data": data.name, "run": args.from_run}
        log(f"drawing the model the run kept for {gene} ({kept['dir']}): no retraining", args.quiet)
        return load_model(kept["dir"]).eval(), tokenizer, ids, text_source, source
    log(f"training {gene} on {data.name} for {config.train_steps} steps (seed {config.seed}) to draw its maps",
        args.quiet)
    with training_bar(str(gene), config.train_steps, enabled=not args.quiet) as bar:
        result = run_training(trial, data, progress=bar)
    record, trainer = result.record, result.trainer
    if record["status"] != "ok" or trainer is None:
        raise UserError(f"training {gene.key} ended with status {record['status']} "
                        f"({record.get('error') or 'non-finite loss'}): try fewer --steps or a lower --lr")
    source = {"gene": gene.key, "steps": config.train_steps, "seed": config.seed, "data": data.name,
              "val_perplexity": record.get("val_perplexity"), "accuracy": record.get("accuracy"),
              "run": args.from_run}
    return trainer.model.eval(), tokenizer, ids, text_source, source


def _saved_model(args):
    """(model, tokenizer, ids, text source, source) for --model: the tokenizer is the one saved with it;
    without --text the example comes from the data of the Config it was trained with."""
    from evo_attention.data import data_from_config
    from evo_attention.train.saving import load_config, load_model, load_tokenizer, saved_plugins

    load_with_plugins(saved_plugins(args.model), args.plugin)  # its genes may use their ops and components
    model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    data = None if args.text is not None else data_from_config(load_config(args.model))
    ids, text_source = _input(args, tokenizer, data, model.spec.max_seq_len)
    return model, tokenizer, ids, text_source, {"model": str(args.model)}


def cmd_maps(args) -> int:
    from evo_attention.studies.maps import attention_maps

    if args.model and (args.gene is not None or args.from_run):
        raise UserError("give either --model DIR (a saved model) or --gene/--from-run (train one), not both")
    if args.model is None and args.gene is None and not args.from_run:
        raise UserError("no model: give --model DIR (saved with --save-model), --gene KEY or --from-run DIR")
    out = output_dir(out_arg(args, Path(args.from_run) / "maps" if args.from_run else "runs/maps",
                             kind="attention maps"))
    if args.model:
        for flag in sorted(GIVEN_FLAGS - OWN_FLAGS):
            note(f"{flag} is not used with --model (a saved model is drawn as it was trained, on its own data): "
                 "ignored")
    model, tokenizer, ids, text_source, source = _saved_model(args) if args.model else _trained_model(args)
    result = attention_maps(model, ids, out, tokenizer=tokenizer, source=source, text_source=text_source)
    for layer in result["layers"]:
        if not layer["heads"]:
            log(f"layer {layer['layer']} {layer['str']}: no attention weights (its program mixes along time without "
                "forming any)")
            continue
        heads = ", ".join(f"h{m['head']} {100 * m['sparsity']:.0f}% zeros / H {m['entropy']:.2f} / "
                          f"d {m['mean_distance']:.1f}" for m in layer["heads"])
        log(f"layer {layer['layer']} {layer['str']}: {heads}")
    log(f"wrote {out / 'attention_maps.json'} and {sum(bool(layer['figure']) for layer in result['layers'])} "
        f"figure(s) in {out}")
    return 0


# the flags that apply to a saved model (--model); the training and data flags apply to --gene/--from-run
OWN_FLAGS = {"--model", "--text", "--sample", "--length", "--out", "--quiet", "--plugin"}


def register(subparsers) -> None:
    p = subparsers.add_parser("attention-maps", help="draw a model's attention weights per layer and head, and "
                              "measure their sparsity, entropy and distance")
    p.add_argument("--model", metavar="DIR", help="a saved model (baseline --save-model writes DIR/model)")
    p.add_argument("--gene", help="train this gene on the fly (with --steps and the data flags) and draw it")
    p.add_argument("--from-run", metavar="DIR", help="the run's best gene (or --gene) with the run's settings: its "
                   "kept model (search --keep-models) when the run has it, else trained here; outputs go to DIR/maps")
    p.add_argument("--text", help="the text to attend over, read by the model's own tokenizer (words, characters, "
                   "bytes or BPE tokens; unknown words or characters become <unk>)")
    p.add_argument("--sample", type=int, default=0, help="without --text: which validation example (default 0)")
    p.add_argument("--length", type=int, default=32, help="without --text: tokens of the example to show (default 32)")
    p.add_argument("--out", help="output directory (default runs/maps, or DIR/maps with --from-run)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_training_flags(p)
    p.set_defaults(func=cmd_maps)
