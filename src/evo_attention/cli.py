"""The ``evo-attention`` command.

Each subcommand parses flags into a Config (defaults < --preset < --config FILE < flags) and calls
the library; bad input ends with one line ``evo-attention: error: ...`` and exit status 2, never
a traceback.
"""

from __future__ import annotations

import argparse
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


def add_executor_flags(p: argparse.ArgumentParser, title: str = "execution") -> None:
    """Where the trainings run: the same flags for search, validate, ablate and compare."""
    x = p.add_argument_group(title)
    x.add_argument("--workers", type=int, metavar="N",
                   help="train N models at once in worker processes on this machine (one GPU each, round-robin; "
                        "on a CPU the cores are split between them)")
    x.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local (this machine; the default) or ray (a local Ray instance or a cluster)")
    x.add_argument("--ray-address", metavar="ADDR", help="address of a running Ray cluster, e.g. 10.0.0.1:6379 or auto")
    x.add_argument("--gpus-per-trial", type=float, metavar="G", help="GPUs each training reserves with --executor ray")
    x.add_argument("--cpus-per-trial", type=float, metavar="C",
                   help="CPUs each training reserves with --executor ray (default 1); threads per worker with --workers")


def executor_from_args(args):
    """The executor that the flags of ``add_executor_flags`` name."""
    from .executors import make_executor

    return make_executor(args.executor, workers=args.workers, address=args.ray_address,
                         cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial)


def explicit_settings(args, extra: dict | None = None) -> dict:
    """The settings a command line names: its preset, its --config file and its flags."""
    from .presets import merged_settings

    flags = {}
    for flag, name in CONFIG_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            flags[name] = None if (name == "vocab_size" and value == 0) else value
    flags.update(extra or {})
    return merged_settings(getattr(args, "preset", None), getattr(args, "config", None), flags)


def checked(config):
    """Fail fast on settings that would otherwise surface only after the data is loaded."""
    from .training import resolve_device

    resolve_device(config.device)
    config.space()
    return config


def config_from_args(args, extra: dict | None = None):
    from .config import Config

    return checked(Config.from_dict(explicit_settings(args, extra), source="the command line"))


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
# search, status, report
# ---------------------------------------------------------------------------------------------

# settings that may differ when a run is resumed (where it runs, where its data lies); the data
# itself is checked by fingerprint. The executor flags (--workers, --executor, ...) are not part of
# the config at all: a run may be resumed with any executor.
RESUMABLE_CHANGES = ("device", "data_dir")
# search flag -> Config field, for the multi-fidelity settings (they change results: stored)
FIDELITY_FLAGS = {"fidelity": "fidelity", "hurdle": "hurdle", "halving_eta": "halving_eta",
                  "halving_rungs": "halving_rungs", "halving_audit": "halving_audit"}


def search_config(args):
    """The config of a new run, or the stored config of a resumed one (checked against the flags)."""
    from .config import Config
    from .store import RunStore

    extra = {}
    if args.no_baseline:
        extra["baseline"] = False
    extra.update({name: getattr(args, flag) for flag, name in FIDELITY_FLAGS.items()
                  if getattr(args, flag, None) is not None})
    options = {name: value for name, value in (("dedupe", args.dedupe or None), ("seed_vanilla", args.seed_vanilla or None),
                                               ("mutation_schedule", args.mutation_schedule)) if value is not None}
    settings = explicit_settings(args, extra)
    if options:
        settings["strategy_options"] = {**settings.get("strategy_options", {}), **options}
    if not args.resume:
        return checked(Config.from_dict(settings, source="the command line"))
    with RunStore.open(args.out, readonly=True) as store:
        stored = store.config()
    for name, value in settings.items():
        if name not in RESUMABLE_CHANGES and stored.get(name) != value:
            raise UserError(f"{_flag_name(name)} {value!r} contradicts the run in {args.out} (it has {stored.get(name)!r}): "
                            "drop the setting to resume, or start a new run with --overwrite")
    merged = {**stored, **{k: settings[k] for k in RESUMABLE_CHANGES if k in settings}}
    return checked(Config.from_dict(merged, source=f"the run in {args.out}"))


def _flag_name(field: str) -> str:
    flags = {v: k for k, v in {**CONFIG_FLAGS, **FIDELITY_FLAGS}.items()}
    return "--" + flags[field].replace("_", "-") if field in flags else field


def _install_sigterm_handler():
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. called from a library)
        pass


def _executor_text(executor) -> str:
    details = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in executor.describe().items()
                        if k != "name" and v is not None)
    return f"{executor.name} ({details})" if details else executor.name


def cmd_search(args) -> int:
    from .evolution import Evolution
    from .progress import log

    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite contradict each other: choose one")
    config = search_config(args)
    out = Path(args.out)
    executor = executor_from_args(args)
    evolution = Evolution(config, out_dir=out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet,
                          executor=executor)
    resume_cmd = f"evo-attention search --resume --out {out}"
    _install_sigterm_handler()
    log(f"{'resuming' if args.resume else 'starting'} a {config.strategy} search in {out}: "
        f"{config.population_size} x {config.n_generations} generations, {config.train_steps} steps per model, "
        f"data {evolution.data.name}; {evolution.planned} evaluations planned; executor {_executor_text(executor)}"
        + (f"; fidelity {evolution.schedule.to_dict()['mode']}, rungs {'/'.join(map(str, evolution.schedule.rungs))} "
           "steps" if evolution.schedule else ""), args.quiet)
    try:
        with evolution:
            evolution.run()
    except KeyboardInterrupt:
        print(f"evo-attention: interrupted; every finished evaluation is saved in {out / 'run.db'}.\n"
              f"resume with: {resume_cmd}", file=sys.stderr)
        return EXIT_INTERRUPTED
    from .report import load_run

    summary = load_run(out)
    log(summary.statement)
    if summary.best_gene is not None:
        line = f"best: {summary.best_gene}  perplexity {_fmt(summary.best_perplexity)}"
        if summary.improvement:
            line += (f"  vs baseline {_fmt(summary.baseline['perplexity'])} "
                     f"({summary.improvement['percent']:+.1f}%)")
        log(line)
    if evolution.schedule is not None:
        from .fidelity import format_summary
        from .store import RunStore

        with RunStore.open(out, readonly=True) as store:
            for line in format_summary(store.get_meta("fidelity") or {}):
                log(line.strip())
    log(f"results in {out}: final_results.json, evaluations.csv, evolution_progress.png, report.md")
    return 0 if summary.best_gene is not None else 1


def cmd_status(args) -> int:
    from .status import format_status, run_status

    status = run_status(args.run_dir)
    if args.json:
        from .jsonio import dumps

        print(dumps(status))
    else:
        print(format_status(status))
    return 0


def cmd_report(args) -> int:
    from .report import write_report

    paths = write_report(args.run_dir)
    for path in paths.values():
        print(path)
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

    p = sub.add_parser("search", help="run (or resume) an evolutionary search over attention mechanisms")
    p.add_argument("--out", default="runs/search", help="run directory (default runs/search)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--no-baseline", action="store_true", help="do not train the vanilla transformer for comparison")
    p.add_argument("--dedupe", action="store_true", help="re-draw offspring that repeat an evaluated gene")
    p.add_argument("--seed-vanilla", action="store_true", help="put the vanilla transformer into generation 0")
    p.add_argument("--mutation-schedule", choices=["constant", "adaptive"],
                   help="adaptive: mutation rate decays from 0.6 to --mutation-rate over the generations")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_training_flags(p, search=True)
    add_executor_flags(p, "execution (not part of the run: a run may be resumed with another executor)")
    f = p.add_argument_group("multi-fidelity (part of the run: changes its results)")
    f.add_argument("--fidelity", choices=["full", "halving"],
                   help="halving: successive halving inside each generation; only the best 1/eta of the new "
                        "individuals at each rung train on (default full)")
    f.add_argument("--hurdle", type=float, metavar="Q",
                   help="stop individuals whose loss at the first rung is worse than the generation's Q-quantile")
    f.add_argument("--halving-eta", type=int, metavar="ETA", help="keep the best 1/ETA at each rung (default 3)")
    f.add_argument("--halving-rungs", type=int, metavar="R",
                   help="rungs at budget/ETA^k steps, k = R-1 ... 0, the full budget included (default 3)")
    f.add_argument("--halving-audit", type=int, metavar="N",
                   help="per generation, train N randomly chosen new individuals to the full budget whatever "
                        "their early loss, to measure on them how well early losses predict final ones (default 0)")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("status", help="where a run stands (read from its store, also while it runs)")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="(re)write a run's results and report from its store")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)

    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"evo_attention.commands.{name}").register(sub)
    return parser


# Further subcommands live in evo_attention/commands/<name>.py, each with register(subparsers);
# the helpers above (add_training_flags, config_from_args, ...) are theirs to use.
COMMAND_MODULES: tuple = ("validate", "ablate", "maps", "bench", "compare")


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
