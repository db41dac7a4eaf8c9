"""The ``evo-attention`` command.

Each subcommand parses flags into a Config (defaults < --preset < --config FILE < flags) and calls
the library; bad input ends with one line ``evo-attention: error: ...`` and exit status 2, never
a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .errors import UserError
from .jsonio import write_json

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# flag -> Config field, for the flags shared by the training commands
CONFIG_FLAGS = {
    "data": "data", "data_dir": "data_dir", "vocab_size": "vocab_size", "seq_len": "max_seq_len",
    "d_model": "d_model", "layers": "n_layers", "heads": "n_heads", "ffn": "d_ff", "batch_size": "batch_size",
    "eval_batch_size": "eval_batch_size", "steps": "train_steps", "lr": "learning_rate", "seed": "seed",
    "device": "device", "precision": "precision", "eval_steps": "eval_steps", "eval_stride": "eval_stride",
    "lr_schedule": "lr_schedule", "dropout": "dropout",
    "population": "population_size", "generations": "n_generations", "elite": "elite_size",
    "mutation_rate": "mutation_rate", "crossover_rate": "crossover_rate", "strategy": "strategy",
}


def _vocab_size(text: str):
    if text.lower() in ("full", "none", "all"):
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"vocab size {text!r} is not an integer (or 'full')") from None
    return value


def add_training_flags(p: argparse.ArgumentParser, *, search: bool = False) -> None:
    g = p.add_argument_group("data and model")
    g.add_argument("--preset", help="named starting point: quick (recall task, minutes on a CPU) or seed (the original)")
    g.add_argument("--config", metavar="FILE", help="YAML file of Config settings (flags override it)")
    g.add_argument("--data", help="dataset: wikitext2, text or recall")
    g.add_argument("--data-dir", help="directory of train.txt/valid.txt/test.txt (else $EVO_ATTENTION_DATA_DIR)")
    g.add_argument("--vocab-size", type=_vocab_size, help="vocabulary size, or 'full' for every training word")
    g.add_argument("--seq-len", type=int, help="tokens per window (max_seq_len)")
    g.add_argument("--d-model", type=int)
    g.add_argument("--layers", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--ffn", type=int, help="feed-forward width (default 4 x d_model)")
    g.add_argument("--dropout", type=float)
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, help="training steps per model")
    t.add_argument("--batch-size", type=int)
    t.add_argument("--eval-batch-size", type=int)
    t.add_argument("--eval-steps", type=int, help="cap on evaluation batches (default: the whole split)")
    t.add_argument("--eval-stride", type=int, help="strided evaluation: score the last S tokens of each window")
    t.add_argument("--lr", type=float, help="learning rate")
    t.add_argument("--lr-schedule", choices=["constant", "cosine"])
    t.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"])
    t.add_argument("--seed", type=int)
    t.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps")
    if search:
        s = p.add_argument_group("search")
        s.add_argument("--strategy", help="search strategy: ga or random")
        s.add_argument("--population", type=int)
        s.add_argument("--generations", type=int)
        s.add_argument("--elite", type=int)
        s.add_argument("--mutation-rate", type=float)
        s.add_argument("--crossover-rate", type=float)


def config_from_args(args, *, default_preset: str | None = None, extra: dict | None = None):
    from .presets import build_config

    overrides = {field: getattr(args, flag, None) for flag, field in CONFIG_FLAGS.items()}
    if overrides.get("vocab_size") == 0:
        overrides["vocab_size"] = None
        full_vocab = True
    else:
        full_vocab = False
    overrides.update(extra or {})
    config = build_config(getattr(args, "preset", None), getattr(args, "config", None), overrides,
                          default_preset=default_preset)
    if full_vocab:
        config = config.replace(vocab_size=None)
    # fail fast on settings that would otherwise surface only after the data is loaded
    from .training import resolve_device

    resolve_device(config.device)
    config.space()
    return config


def _fmt(value, digits=3):
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}f}"


# ---------------------------------------------------------------------------------------------
# baseline
# ---------------------------------------------------------------------------------------------

def cmd_baseline(args) -> int:
    from .data import data_from_config
    from .genes import AttentionGene
    from .progress import log, training_bar
    from .saving import save_model
    from .training import train_and_evaluate

    config = config_from_args(args)
    gene = AttentionGene.parse(args.gene) if args.gene else AttentionGene.vanilla()
    out = Path(args.out)
    data = data_from_config(config)
    log(f"training {gene} on {data.name} for {config.train_steps} steps (seed {config.seed})", args.quiet)
    with training_bar(str(gene), config.train_steps, enabled=not args.quiet) as bar:
        record = train_and_evaluate(gene, config, data, eval_split=args.eval_split, progress=bar,
                                    keep_trainer=bool(args.save_model))
    trainer = record.pop("_trainer", None)
    out.mkdir(parents=True, exist_ok=True)
    record["config"] = config.to_dict()
    record["data_description"] = data.describe()
    write_json(out / "result.json", record)
    if data.vocab is not None:
        (out / "vocab.json").write_text(data.vocab.to_json())
    if args.save_model and trainer is not None and record["status"] == "ok":
        save_model(trainer.model, out / "model", vocab=data.vocab, extra={"result": {
            k: record[k] for k in ("val_perplexity", "val_loss", "accuracy", "eval_split", "steps", "seed")}})
    split = args.eval_split
    if record["status"] != "ok":
        log(f"{gene}: {record['status']} ({record.get('error') or 'non-finite loss'}); record in {out / 'result.json'}")
        return 1
    log(f"{gene}: {split} perplexity {_fmt(record['val_perplexity'], 2)}, loss {_fmt(record['val_loss'], 4)}, "
        f"accuracy {_fmt(record['accuracy'], 4)} over {record['eval_tokens']:,} tokens; train loss "
        f"{_fmt(record['train_loss'], 4)}; {record['params']:,} parameters; {record['time_s']:.1f}s "
        f"({_fmt(record['tokens_per_s'], 0)} tokens/s)")
    log(f"wrote {out / 'result.json'}" + (f" and {out / 'model'}" if args.save_model else ""))
    return 0


# ---------------------------------------------------------------------------------------------
# the parser
# ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="evo-attention",
                                     description="Evolve attention mechanisms for small transformer language models.")
    parser.add_argument("--version", action="version", version=f"evo-attention {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("baseline", help="train and evaluate one gene (default: the vanilla transformer)")
    p.add_argument("--gene", help="gene, e.g. 'dot|sparsemax|output_gate|learned' (default: dot|softmax|none|fixed)")
    p.add_argument("--out", default="runs/baseline", help="directory for result.json (default runs/baseline)")
    p.add_argument("--eval-split", choices=["valid", "test"], default="valid")
    p.add_argument("--save-model", action="store_true", help="also save the trained weights (safetensors)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_training_flags(p)
    p.set_defaults(func=cmd_baseline)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


_EXTRA_COMMANDS: list = []  # functions (subparsers) -> None, added by later command modules


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"evo-attention: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("evo-attention: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
