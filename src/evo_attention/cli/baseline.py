"""``evo-attention baseline`` (also ``train``): train and evaluate one gene, by default the vanilla
transformer, and write ``result.json`` (and the model with ``--save-model``).

With ``--lr-grid`` the gene is first trained at every rate of the grid on the tuning seeds
``seed + 1001 ...`` (validation split, kept in a run store in ``--out``, so a repeat trains
nothing), its rate chosen by the mean validation loss (``studies.lr_grid``); then it is trained
with ``seed`` at that rate and measured on ``--eval-split``. ``result.json`` gains the ``grid``
block and ``lr_grid.png`` draws its curve."""

from __future__ import annotations

from evo_attention.cli.common import (BASELINE, add_executor_flags, add_training_flags, config_from_args,
                                      executor_from_args, note, number, out_arg)
from evo_attention.cli.validate import add_grid_flags
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir
from evo_attention.util.format import utc_now
from evo_attention.util.jsonio import write_json
from evo_attention.util.progress import log, training_bar


def cmd_baseline(args) -> int:
    from evo_attention.data import data_from_config
    from evo_attention.genes import AttentionGene
    from evo_attention.train.saving import save_model
    from evo_attention.train.spec import Trial
    from evo_attention.train.trainer import run_training

    config = config_from_args(args)
    gene = AttentionGene.parse(args.gene) if args.gene is not None else AttentionGene.vanilla()
    if args.lr_grid:
        from evo_attention.studies.common import tuning_seeds

        tuning_seeds(config.seed, args.tuning_seeds, verdict_seeds=[config.seed])  # before anything is written
    out = out_arg(args, kind=BASELINE, study="baseline")  # made once every flag and the data are checked
    data = data_from_config(config)
    if args.matched_to:  # the width validate --match-params gives the model matched to that gene
        from evo_attention.nn.matching import matched_baseline

        if getattr(args, "ffn", None) is not None:
            raise UserError("--matched-to sets the feed-forward width: drop --ffn")
        spec = config.model.with_data(data.vocab_size, data.seq_len)
        width = matched_baseline(spec, AttentionGene.parse(args.matched_to), reference=gene)["ffn_dim"]
        config = config.replace(d_ff=width)
        log(f"feed-forward width {width}: {gene}'s parameters match {args.matched_to}'s", args.quiet)
    _replace_earlier(out, gene, config, data, args)
    grid = None
    if args.lr_grid:
        grid = tune_rate(args, config, data, gene, out)
        config = config.replace(learning_rate=grid["genes"][gene.key]["selected"])
    output_dir(out)  # an unwritable place fails before the training, not after it
    log(f"training {gene} on {data.name} for {config.train_steps} steps (seed {config.seed}"
        + (f", lr {config.learning_rate:g}, the best of the grid)" if grid else ")"), args.quiet)
    with training_bar(str(gene), config.train_steps, enabled=not args.quiet) as bar:
        result = run_training(Trial.from_config(gene, config, eval_split=args.eval_split, data=data), data, progress=bar)
    record, trainer = result.record, result.trainer
    write_json(out / "result.json", {**record.to_dict(), "created_at": utc_now(),  # a study dates its results by it
                                     "config": config.to_dict(),
                                     "data_description": data.describe(), **({"grid": grid} if grid else {})})
    if data.vocab is not None:
        (out / "vocab.json").write_text(data.vocab.to_json())
    if args.save_model and trainer is not None and record["status"] == "ok":
        kept = {k: record[k] for k in ("val_perplexity", "val_loss", "accuracy", "eval_split", "steps", "seed")}
        save_model(trainer.model, out / "model", vocab=data.vocab, tokenizer=getattr(data, "tokenizer", None),
                   settings=trainer.settings, extra={"result": kept})
    split = args.eval_split
    if record["status"] != "ok":
        log(f"{gene}: {record['status']} ({record.get('error') or 'non-finite loss'}); record in {out / 'result.json'}")
        return 1
    bpb = "" if record.bits_per_byte is None else (
        f"{number(record.bits_per_byte, 4)} bits per byte ({record.eval_bytes:,} bytes), ")
    log(f"{gene}: {split} {bpb}perplexity {number(record['val_perplexity'], 2)}, loss {number(record['val_loss'], 4)}, "
        f"accuracy {number(record['accuracy'], 4)} over {record['eval_tokens']:,} tokens; train loss "
        f"{number(record['train_loss'], 4)}; {record['params']:,} parameters; {record['time_s']:.1f}s "
        f"({number(record['tokens_per_s'], 0)} tokens/s)")
    log(f"wrote {out / 'result.json'}" + (f" and {out / 'model'}" if args.save_model else ""))
    return 0


GRID_FIGURE = "lr_grid.png"


def _replace_earlier(out, gene, config, data, args) -> None:
    """Refuse to replace the result of another training in ``out`` (another trial: gene, seed, steps,
    data or a setting that shapes it; the rate aside where a grid chooses it) unless --overwrite,
    which also removes its model and grid figure: a result.json and a model/ of two trainings never
    stand side by side."""
    import json
    import shutil

    from evo_attention.train.config import Config
    from evo_attention.train.spec import Trial

    try:
        earlier = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return
    rate = config.learning_rate if args.lr_grid or earlier.get("grid") else None

    def identity(genome, cfg, split):
        key = Trial.from_config(genome, cfg if rate is None else cfg.replace(learning_rate=rate), eval_split=split,
                                data=data).key()
        return key[:3] + key[4:]  # the data's fingerprint is compared on its own

    try:
        same = (earlier.get("data_fingerprint") == data.fingerprint and identity(gene, config, args.eval_split)
                == identity(earlier["gene"], Config.from_dict(earlier["config"]), earlier["eval_split"]))
    except (KeyError, TypeError, ValueError, UserError):  # a result this version cannot read: another training
        same = False
    if same:
        return  # the same training again
    if not args.overwrite:
        raise UserError(f"{out} holds the result of another training (of {earlier.get('gene')}, seed "
                        f"{earlier.get('seed')}, {earlier.get('steps')} steps, or other data or settings): choose "
                        "another --out, or add --overwrite to replace it (and its saved model)")
    shutil.rmtree(out / "model", ignore_errors=True)
    (out / GRID_FIGURE).unlink(missing_ok=True)


def tune_rate(args, config, data, gene, out) -> dict:
    """The grid block of ``gene`` (``studies.lr_grid.tune``): every rate on the tuning seeds, by
    validation loss, kept in the run store in ``out``; draws ``lr_grid.png`` and logs the choice."""
    from evo_attention.report.figures import plot_lr_grid
    from evo_attention.report.studies.lr_grid import edge_warnings
    from evo_attention.studies.common import StudySetup, study_store, tuning_seeds
    from evo_attention.studies.lr_grid import panel, tune

    seeds = tuning_seeds(config.seed, args.tuning_seeds, verdict_seeds=[config.seed])
    log(f"tuning the learning rate of {gene} over {', '.join(f'{r:g}' for r in args.lr_grid)} with seeds "
        f"{seeds[0]}..{seeds[-1]} (validation loss)", args.quiet)
    with executor_from_args(args, config) as executor, study_store(out, config, "baseline") as store:
        setup = StudySetup(config=config, data=data, seeds=(config.seed,), steps=config.train_steps, role="baseline",
                           metric="val_loss", store=store, executor=executor, quiet=args.quiet,
                           lr_grid=tuple(args.lr_grid), tuning_seeds=tuple(seeds))
        grid = tune(setup, [gene])
    plot_lr_grid([panel(grid["genes"])], out / GRID_FIGURE, ylabel=f"validation loss, mean over {len(seeds)} "
                 f"tuning seed{'s' if len(seeds) != 1 else ''}", title=f"Learning-rate grid of {gene}; ringed: selected")
    for line in edge_warnings(grid["genes"], grid["rates"]):
        note(line.replace('`', ''))  # evo-attention: warning: ...
    return grid


def register(sub) -> None:
    for name, text in (("baseline", "train and evaluate one gene (default: the vanilla transformer)"),
                       ("train", "the same as baseline: train and evaluate one gene")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--gene", help="gene, e.g. 'dot|sparsemax|output_gate|learned' (default: dot|softmax|none|fixed)")
        p.add_argument("--out", default="runs/baseline", help="directory for result.json (default runs/baseline)")
        p.add_argument("--eval-split", choices=["valid", "test"], default="valid")
        p.add_argument("--save-model", action="store_true", help="also save the trained weights (safetensors)")
        p.add_argument("--overwrite", action="store_true",
                       help="replace the result (and saved model) of another training in --out")
        p.add_argument("--matched-to", metavar="GENE",
                       help="widen the feed-forward to the width that matches GENE's parameter count (the model "
                            "validate --match-params trains), e.g. to tune the matched model on --lr-grid")
        p.add_argument("--quiet", action="store_true", help="no progress output")
        add_grid_flags(p)
        add_executor_flags(p, "execution of the grid's trainings")
        add_training_flags(p)
        p.set_defaults(func=cmd_baseline)
