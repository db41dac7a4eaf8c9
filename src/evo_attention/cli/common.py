"""What every subcommand shares: the training and executor flags, turning flags into a Config
(defaults < --preset < --config FILE < flags), and speaking of settings by their flags."""

from __future__ import annotations

import argparse

from evo_attention.util.format import number as fmt_number
from evo_attention.util.plugins import load_plugins

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# search flag -> Config field, for the multi-fidelity settings (they change results: stored)
FIDELITY_FLAGS = {"fidelity": "fidelity", "hurdle": "hurdle", "halving_eta": "halving_eta",
                  "halving_rungs": "halving_rungs", "halving_audit": "halving_audit"}
# flag -> Config field, for the flags shared by the training commands
CONFIG_FLAGS = {
    "data": "data", "data_dir": "data_dir", "tokenizer": "tokenizer", "text_field": "text_field",
    "vocab_size": "vocab_size", "seq_len": "max_seq_len",
    "d_model": "d_model", "layers": "n_layers", "heads": "n_heads", "ffn": "d_ff", "block": "block",
    "batch_size": "batch_size",
    "eval_batch_size": "eval_batch_size", "steps": "train_steps", "lr": "learning_rate", "seed": "seed",
    "device": "device", "precision": "precision", "compile": "compile", "eval_steps": "eval_steps", "eval_stride": "eval_stride",
    "lr_schedule": "lr_schedule", "dropout": "dropout", "favor_features": "favor_features",
    "population": "population_size", "generations": "n_generations", "elite": "elite_size",
    "mutation_rate": "mutation_rate", "crossover_rate": "crossover_rate", "strategy": "strategy",
    "genome": "genome", "objectives": "objectives",
}


def _vocab_size(text: str):
    if text.lower() in ("full", "none", "all"):
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"vocab size {text!r} is not an integer (or 'full')") from None
    return value


def _eval_steps(text: str):
    if text.lower() in ("all", "none", "full"):
        return 0
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"eval steps {text!r} is not an integer (or 'all')") from None


# flags whose value 0 stands for None ("full" vocabulary, "all" evaluation batches)
_ZERO_IS_NONE = ("vocab_size", "eval_steps")


def _name_list(text: str) -> list:
    return [part.strip() for part in text.split(",")]


def add_training_flags(p: argparse.ArgumentParser, *, search: bool = False) -> None:
    g = p.add_argument_group("data and model")
    g.add_argument("--preset", help="named starting point: quick (recall task, minutes on a CPU), shakespeare-char "
                                    "(character level, with --data-dir) or seed (the original)")
    g.add_argument("--config", metavar="FILE", help="YAML file of Config settings (flags override it)")
    g.add_argument("--plugin", action="append", metavar="MODULE",
                   help="import this module or .py file first, in every worker too: its registered components, "
                        "strategies and datasets join the search (repeatable)")
    g.add_argument("--data", help="dataset: wikitext2, text, recall, hf:NAME[:CONFIG] or hf:/path/to/saved")
    g.add_argument("--tokenizer", help="word (default), char, byte or bpe:N (BPE trained on the train split)")
    g.add_argument("--text-field", help="the text column of an hf: dataset (default text)")
    g.add_argument("--data-dir", help="directory of train.txt/valid.txt/test.txt (else $EVO_ATTENTION_DATA_DIR)")
    g.add_argument("--vocab-size", type=_vocab_size, help="vocabulary size, or 'full' for every training word")
    g.add_argument("--seq-len", type=int, help="tokens per window (max_seq_len)")
    g.add_argument("--d-model", type=int)
    g.add_argument("--layers", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--ffn", type=int, help="feed-forward width (default 4 x d_model; about 8/3 x d_model with "
                                           "--block llama)")
    g.add_argument("--block", choices=["gpt2", "llama"],
                   help="the block around the attention: gpt2 (LayerNorm + GELU, the default) or llama "
                        "(RMSNorm + SwiGLU, no feed-forward biases)")
    g.add_argument("--dropout", type=float)
    g.add_argument("--favor-features", type=int, help="random features per head of normalization favor (default 64)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, help="training steps per model")
    t.add_argument("--batch-size", type=int)
    t.add_argument("--eval-batch-size", type=int)
    t.add_argument("--eval-steps", type=_eval_steps,
                   help="cap on evaluation batches, or 'all' for the whole split (the default of the presets)")
    t.add_argument("--eval-stride", type=int, help="strided evaluation: score the last S tokens of each window")
    t.add_argument("--lr", type=float, help="learning rate")
    t.add_argument("--lr-schedule", choices=["constant", "cosine"])
    t.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"])
    t.add_argument("--compile", choices=["auto", "on", "off"],
                   help="torch.compile the model (auto: only where measured to pay, e.g. additive on CPU)")
    t.add_argument("--seed", type=int)
    t.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps")
    if search:
        s = p.add_argument_group("search")
        s.add_argument("--strategy", help="search strategy: ga, random, nsga2 or tpe (tpe needs the [tpe] extra: "
                                          "Optuna), or one a plugin registers")
        s.add_argument("--objectives", type=_name_list, metavar="LIST",
                       help="what the search minimises, comma-separated: perplexity first, then any of params, "
                            "flops, train_ms_per_step, latency_ms, peak_memory_mb (default perplexity)")
        s.add_argument("--genome", help="shared (one gene for every layer, default) or per_layer (a gene per layer)")
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
    from evo_attention.search.executors import make_executor

    return make_executor(args.executor, workers=args.workers, address=args.ray_address,
                         cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial)


def explicit_settings(args, extra: dict | None = None) -> dict:
    """The settings a command line names: its preset, its --config file and its flags."""
    from evo_attention.train.presets import merged_settings

    flags = {}
    for flag, name in CONFIG_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            flags[name] = None if (name in _ZERO_IS_NONE and value == 0) else value
    flags.update(extra or {})
    settings = merged_settings(getattr(args, "preset", None), getattr(args, "config", None), flags)
    if getattr(args, "plugin", None):
        settings["plugins"] = list(dict.fromkeys(list(settings.get("plugins") or []) + args.plugin))
    load_plugins(settings.get("plugins") or ())  # their names must be known before the settings are checked
    return settings


def checked(config):
    """Fail fast on settings that would otherwise surface only after the data is loaded."""
    from evo_attention.train.environment import resolve_device

    resolve_device(config.device)
    load_plugins(config.plugins)  # a stored run's plugins (a resume) before its search space is read
    config.space()
    return config


def config_from_args(args, extra: dict | None = None):
    from evo_attention.train.config import Config

    return checked(Config.from_dict(explicit_settings(args, extra), source="the command line"))


def number(value, digits=3) -> str:
    """``value`` with ``digits`` decimals, ``-`` when it is missing or not finite."""
    return fmt_number(value, f".{digits}f")


# Settings that are not Config fields but arguments of library calls, named by their flags.
ARGUMENT_FLAGS = {"workers": "--workers", "address": "--ray-address", "cpus_per_trial": "--cpus-per-trial",
                  "gpus_per_trial": "--gpus-per-trial", "n_seeds": "--seeds", "seeds": "--seeds",
                  "genes": "--genes", "configs": "--configs", "out": "--out", "data_dir": "--data-dir",
                  "overwrite": "--overwrite", "executor": "--executor", "resume": "--resume",
                  "text": "--text", "length": "--length", "sample": "--sample", "save_model": "--save-model",
                  "config_file": "--config", "dedupe": "--dedupe", "seed_vanilla": "--seed-vanilla",
                  "mutation_schedule": "--mutation-schedule", "plugins": "--plugin", "track": "--track",
                  "prompt": "--prompt", "temperature": "--temperature", "top_k": "--top-k",
                  "max_new_tokens": "--max-new-tokens", "keep_models": "--keep-models", "rank": "--rank",
                  "model": "--model", "sizes": "--sizes", "steps": "--steps", "tokens_per_param": "--tokens-per-param"}


def flag_of(setting: str) -> str | None:
    """The command-line flag of a Config field or library argument, if it has one."""
    fields = {name: "--" + flag.replace("_", "-") for flag, name in {**CONFIG_FLAGS, **FIDELITY_FLAGS}.items()}
    return fields.get(setting) or ARGUMENT_FLAGS.get(setting)


def user_message(exc) -> str:
    """A library error in the words of the command line: the setting it names becomes its flag."""
    import re

    message = str(exc)
    for setting in getattr(exc, "settings", ()):
        flag = flag_of(setting)
        if flag:
            message = re.sub(rf"(?<![\w-]){re.escape(setting)}(?![\w-])", flag, message)
    return message


def install_sigterm_handler() -> None:
    """Turn SIGTERM into KeyboardInterrupt, so a terminated command stops cleanly."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. called from a library)
        pass


