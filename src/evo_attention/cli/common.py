"""What every subcommand shares: the training and executor flags, turning flags into a Config
(defaults < --preset < --config FILE < flags), and speaking of settings by their flags."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import signal
import warnings
from contextlib import suppress
from pathlib import Path

from evo_attention.util.errors import UserError
from evo_attention.util.files import register_output_kind
from evo_attention.util.format import number as fmt_number
from evo_attention.util.plugins import load_plugins, with_given_plugins
from evo_attention.util.progress import log

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

def _count_or_word(what: str, word: str):
    """A parser of a positive whole number, or of 'full', 'all' or 'none' as 0 (which stands for None)."""
    def parse(text: str) -> int:
        if text.lower() in ("full", "none", "all"):
            return 0
        try:
            count = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not an integer (or '{word}')") from None
        if count < 1:  # 0 would silently stand for the word
            raise argparse.ArgumentTypeError(f"{what} {text!r} must be a positive integer (or '{word}')")
        return count
    return parse


def _name_list(text: str) -> list:
    return [part.strip() for part in text.split(",")]


# how each kind of Config value (``nn.spec.setting(parse=...)``) is read from the command line;
# ``vocab`` and ``count_or_all`` read a word such as 'full' or 'all' as 0, which stands for None
PARSERS = {"int": int, "float": float, "str": str, "list": _name_list, "vocab": _count_or_word("vocab size", "full"),
           "count_or_all": _count_or_word("eval steps", "all")}
# the help sections of the training flags: the Config groups each shows, in this order
SECTIONS = (("data and model", ("task", "model")), ("training", ("train", "trial", "execution")),
            ("search", ("search",)))


def _flag_fields(groups) -> list:
    from evo_attention.train.config import Config

    return [f for group in groups for f in dataclasses.fields(Config) if f.metadata.get("group") == group and f.metadata.get("flag")]


def _config_flags(groups) -> dict:
    """flag (as an argparse dest) -> Config field, for the Config fields of ``groups`` the command line sets."""
    return {f.metadata["flag"].replace("-", "_"): f.name for f in _flag_fields(groups)}


# flag -> Config field, generated from the Config's declarations on first use (reading them imports
# the training layer, which commands such as status never need)
@functools.cache
def config_flags() -> dict:
    """The flags every training command shares."""
    return _config_flags([group for _, groups in SECTIONS for group in groups])


@functools.cache
def fidelity_flags() -> dict:
    """The search's multi-fidelity flags (they change results: stored)."""
    return _config_flags(["fidelity"])


@functools.cache
def _zero_is_none() -> tuple:
    """The fields whose flag value 0 stands for None ("full" vocabulary, "all" evaluation batches)."""
    return tuple(f.name for _, groups in SECTIONS for f in _flag_fields(groups)
                 if f.metadata["parse"] in ("vocab", "count_or_all"))


def add_training_flags(p: argparse.ArgumentParser, *, search: bool = False) -> None:
    """The Config flags, generated from the Config's field declarations, in their help sections."""
    from evo_attention.train.presets import PRESETS
    from evo_attention.train.schedules import alternatives

    for title, groups in SECTIONS:
        if groups == ("search",) and not search:
            continue
        g = p.add_argument_group(title)
        if title == "data and model":
            g.add_argument("--preset", help=f"named starting point: {alternatives(PRESETS)} (what each sets: "
                                            "evo_attention/train/presets.py)")
            g.add_argument("--config", metavar="FILE", help="YAML file of Config settings (flags override it)")
            g.add_argument("--plugin", action="append", metavar="MODULE",
                           help="import this module or .py file first, in every worker too: its registered "
                                "components, strategies and datasets join the search (repeatable)")
        _add_config_flags(g, groups)


def add_fidelity_flags(p: argparse.ArgumentParser) -> None:
    """The search's multi-fidelity flags, generated from the Config's declarations."""
    _add_config_flags(p.add_argument_group("multi-fidelity (part of the run: changes its results)"), ["fidelity"])


def _add_config_flags(group, groups) -> None:
    for f in _flag_fields(groups):
        meta = {k: v() if callable(v) and k in ("help", "choices") else v for k, v in f.metadata.items()}
        options = {"type": PARSERS[meta["parse"]], "help": meta["help"]}
        if meta["choices"]:
            options["choices"] = list(meta["choices"])
        if meta["metavar"] or meta["parse"] == "list":
            options["metavar"] = meta["metavar"] or "LIST"
        group.add_argument("--" + meta["flag"], dest=meta["flag"].replace("-", "_"), **options)


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


def executor_from_args(args, config):
    """The executor that the flags of ``add_executor_flags`` name, running trials as ``config``'s
    execution settings say (``batch_models``)."""
    from evo_attention.search.executors import executor_for

    return executor_for(config, args.executor, workers=args.workers, address=args.ray_address,
                        cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial)


def explicit_settings(args, extra: dict | None = None) -> dict:
    """The settings a command line names: its preset, its --config file and its flags."""
    from evo_attention.train.environment import resolve_device
    from evo_attention.train.presets import example_counts_note, merged_settings, own_vocabulary

    preset, config_file, quiet, resume = (getattr(args, name, None) for name in ("preset", "config", "quiet", "resume"))
    flags = {name: None if (name in _zero_is_none() and value == 0) else value
             for flag, name in config_flags().items() if (value := getattr(args, flag, None)) is not None}
    flags.update(extra or {})
    settings = merged_settings(preset, config_file, flags)
    # the GPU default stream, but where a resumed run keeps the stream its trials were keyed with
    if str(settings.get("device") or "").startswith("cuda") and "dropout_stream" not in settings and not resume:
        resolve_device(settings["device"])  # a device this machine lacks is refused before the note on it
        settings["dropout_stream"] = "counter"  # the GPU-fast default: masks drawn on the device (docs/scaling.md)
        log("--device cuda: dropout masks are drawn on the device (--dropout-stream counter, the GPU default); "
            "give --dropout-stream cpu for the CPU's masks", quiet)
    if note := example_counts_note(preset, settings):
        log(note, quiet)
    _note_origins(preset, config_file, flags)
    if getattr(args, "plugin", None):
        settings["plugins"] = list(dict.fromkeys(list(settings.get("plugins") or []) + args.plugin))
    load_plugins(settings.get("plugins") or ())  # their names must be known before the settings are checked
    # a resume trains the vocabulary its run stored: the flags are only checked against it
    return settings if resume else own_vocabulary(settings)


# where each setting of the command being run came from, when not from one of its flags ("config file
# PATH", "preset NAME"): ``user_message`` then names the key and its file rather than a flag not given
SETTING_ORIGINS: dict[str, str] = {}
# what an interrupted command says it kept (a study's store, set by ``out_arg``); cleared per command
KEPT_ON_INTERRUPT: list[str] = []
# the flags the command line typed (``given``), and the notes said (``note``: each once); set per command
GIVEN_FLAGS: set[str] = set()
NOTED: set[str] = set()


def _note_origins(preset_name, config_file, flags) -> None:
    from evo_attention.train.presets import preset, read_config_file

    SETTING_ORIGINS.clear()
    if preset_name:
        SETTING_ORIGINS.update(dict.fromkeys(preset(preset_name), f"preset {preset_name}"))
    if config_file:
        SETTING_ORIGINS.update(dict.fromkeys(read_config_file(config_file), f"config file {config_file}"))
    for name in flags:
        SETTING_ORIGINS.pop(name, None)


def given(flag: str) -> bool:
    """Whether the command line typed ``flag`` (``--flag VALUE`` or ``--flag=VALUE``)."""
    return flag in GIVEN_FLAGS


def note(message: str) -> None:
    """One warning line (``evo-attention: warning: ...``), said once per command: a setting the
    command does not use, a result to read with care."""
    if message not in NOTED:
        NOTED.add(message)
        warnings.warn(message, UserWarning, stacklevel=2)


def note_unused_flags(args) -> None:
    """Notes for flags typed where the command does not use them (its exit code is unchanged); a
    refusal for one that contradicts another."""
    objectives = getattr(args, "objectives", None)
    objectives = ",".join(objectives) if isinstance(objectives, (list, tuple)) else str(objectives or "")
    if getattr(args, "suite", None) and given("--objectives") and objectives.strip() != "suite_accuracy":
        raise UserError(f"--objectives {objectives} does not apply with --suite: a suite run ranks genes by their "
                        "suite accuracy; leave --objectives out")
    grid = getattr(args, "lr_grid", None)
    if given("--tuning-seeds") and not grid:
        note("--tuning-seeds is used only with --lr-grid (the rates are tuned on those seeds): ignored")
    for flag in ("--executor", "--workers", "--ray-address", "--gpus-per-trial", "--cpus-per-trial"):
        if given(flag) and not grid and getattr(args, "command", None) in ("baseline", "train"):
            note(f"{flag} is used only with --lr-grid (it runs the grid's trainings): ignored")
    if given("--lr") and grid:
        note("--lr is not used with --lr-grid (each gene trains at its own best rate of the grid): ignored")
    for flag in ("--mde", "--max-seeds"):
        if given(flag) and hasattr(args, "seeds") and args.seeds != "auto":
            note(f"{flag} is used only with --seeds auto (it shapes the seed plan): ignored")
    if given("--seed") and getattr(args, "seed_block", None) is not None:
        note("--seed is not used with --seed-block (every seed comes from the block): ignored")
    note_unused_keys(args)


# search settings that commands without the search's flags read all the same (setting -> commands): the gene
# their verdicts are against (curve: the attention dropout of its named genes); a suite, which ablate and transfer
# refuse
READ_BY = {"baseline_gene": ("validate", "ablate", "transfer", "compare", "curve", "fitness"),
           "suite": ("ablate", "transfer")}


def note_unused_keys(args) -> None:
    """A note per key of the --config file that the command does not use: a search setting (groups search and
    fidelity) where it takes no search flags, but one it has a flag of its own for (--suite, --baseline-gene) or
    reads all the same (``READ_BY``). A file that cannot be read is said where the command reads it."""
    from evo_attention.train.config import Config
    from evo_attention.train.presets import read_config_file

    path, command = getattr(args, "config", None), getattr(args, "command", None)
    if not path or hasattr(args, "population"):  # a search (or bench's estimate of one) reads every setting
        return
    try:
        keys = read_config_file(path)
    except UserError:
        return
    fields = {f.name: f.metadata for f in dataclasses.fields(Config)}
    for key in keys:
        meta = fields.get(key, {})
        own_flag = (meta.get("flag") or "").replace("-", "_")  # the command's flag of this setting, if it has one
        if meta.get("group") in ("search", "fidelity") and not hasattr(args, own_flag) \
                and command not in READ_BY.get(key, ()):
            note(f"{key} (config file {path}) is a search setting that {command} does not use: ignored")


def check_schedule_and_suite(config) -> None:
    """Refuse what contradicts the chosen schedule or suite; note what it does not use."""
    from evo_attention.train.config import unused_warmup
    from evo_attention.train.schedules import SCHEDULES, alternatives, takes_warmup, uses_decay

    schedule = config.lr_schedule
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    # named by a flag or a config file (a preset's or a stored run's warm-up under another schedule is kept: its key)
    for name in ("warmup_steps", "warmup"):
        named = given(flag_of(name)) or (SETTING_ORIGINS.get(name, "").startswith("config file")
                                         and getattr(config, name) != defaults[name])
        if named and not takes_warmup(schedule):
            raise UserError(unused_warmup(name, schedule), setting=(name, "lr_schedule"))
    if given("--decay-fraction") and not uses_decay(schedule):
        note(f"--decay-fraction is not used by --lr-schedule {schedule} (only a schedule with a decay phase reads "
             f"it: {alternatives(filter(uses_decay, SCHEDULES))}): ignored")
    if config.suite is not None:
        origin = SETTING_ORIGINS.get("data", "")
        if origin.startswith("config file"):
            raise UserError(f"data and suite both name the data ({origin}): a suite trains on its points' data; "
                            "give one of them")


def checked(config):
    """Fail fast on settings that would otherwise surface only after the data is loaded."""
    from evo_attention.data import parse_tokenizer, takes_options
    from evo_attention.train.environment import resolve_device

    check_schedule_and_suite(config)
    # a corpus's other tokenizers make their own vocabulary: a word vocabulary size (a flag or a config
    # file's, not a preset's or a stored run's) would be ignored
    named = given("--vocab-size") or SETTING_ORIGINS.get("vocab_size", "").startswith("config file")
    if named and config.vocab_size is not None and config.suite is None and not takes_options(config.data) \
            and parse_tokenizer(config.tokenizer)[0] != "word":
        raise UserError(f"vocab_size {config.vocab_size} is the size of a word vocabulary; tokenizer "
                        f"{config.tokenizer} makes its own: drop vocab_size (or give full)",
                        setting=("vocab_size", "tokenizer"))
    device = resolve_device(config.device)
    check_model_memory(config, device)
    load_plugins(config.plugins)  # a stored run's plugins (a resume) before its search space is read
    config.space()
    return config


def check_model_memory(config, device) -> None:
    """A generated task's vocabulary is known from its knobs: a model whose weights could not fit is
    refused before the task is generated (a large vocabulary takes minutes to build)."""
    if config.suite is not None or not config.generated_task:
        return
    from evo_attention.data.synthetic import TASKS, check_task_memory, given_knobs, resolve_knobs
    from evo_attention.train.trainer import check_training_memory

    options = {k: v for k, v in (config.recall or {}).items() if k != "seed"}
    try:
        task, knobs = given_knobs(config.data, seq_len=config.max_seq_len, vocab_size=config.vocab_size,
                                  options=options)
        resolved = resolve_knobs(task, knobs)
    except UserError:  # knobs a command varies (curve) may complete them: the data's own checks say the rest
        return
    check_task_memory(config.data, TASKS[task], resolved)  # data that cannot fit is said first, in its words
    vocab = resolved["vocab"]
    spec = dataclasses.replace(config.model, vocab_size=vocab)
    check_training_memory(spec, config.resolved_baseline().key, 1, device, vocab_from=config.data)


def load_with_plugins(stored, given) -> list[str]:
    """Import ``with_given_plugins(stored, given)``; the list imported."""
    plugins = with_given_plugins(stored, given)
    load_plugins(plugins)
    return plugins


def load_run_plugins(run_dir, given) -> list[str]:
    """Import the plugins the run in ``run_dir`` stored, before any of its genes is read (they may use their
    ops and components), a --plugin file in ``given`` standing in for one of its name; the list imported."""
    from evo_attention.search.store import RunStore

    with RunStore.open(run_dir, readonly=True) as run:
        return load_with_plugins(run.config().get("plugins") or [], given)


def over_run(stored: dict, settings: dict) -> dict:
    """A run's ``stored`` settings with a command's ``settings`` over them (``overlay``), the run's plugins kept
    beside the command's (its genes may use their ops and components), a --plugin file standing in for one."""
    from evo_attention.train.presets import overlay

    plugins = with_given_plugins(stored.get("plugins") or [], settings.get("plugins"))
    return overlay(stored, {**settings, "plugins": plugins})


def config_from_args(args, extra: dict | None = None):
    from evo_attention.train.config import Config

    return checked(Config.from_dict(explicit_settings(args, extra), source="the command line"))


def run_suite(run_dir) -> tuple[str | None, list[str]]:
    """(the suite, its points' data names) of the suite run in ``run_dir``; (None, []) for any other run."""
    from evo_attention.search.store import RunStore

    with RunStore.open(run_dir, readonly=True) as store:
        meta = store.get_meta("suite")
        stored = (store.config() or {}).get("suite")
    if not meta or not stored:
        return None, []
    return stored, [str(p.get("data")) for p in meta.get("points") or []]


def with_run_suite(config, args, run_dir):
    """``config`` on the suite of ``run_dir`` when that is a suite run and the command names neither
    --data nor --suite: its genes were ranked on the suite's points, never on the default data."""
    suite, _ = run_suite(run_dir)
    if suite is None or config.suite is not None or getattr(args, "data", None):
        return config
    return config.replace(suite=suite)


def suite_text(args, config) -> str:
    """A command's log words for its suite ('' without one): the suite, its points and their steps;
    UserError for --data beside --suite (the points name the data)."""
    if config.suite is None:
        return ""
    from evo_attention.data.suites import load_suite

    if getattr(args, "data", None):
        raise UserError(f"--data {args.data} and --suite {config.suite} both name the data: a suite trains on its "
                        "points' data; give one of them")
    suite = load_suite(config.suite)
    steps = sorted({config.train_steps if p.steps is None else p.steps for p in suite.points})
    text = (f"suite {suite.name} ({len(suite.points)} points: {', '.join(suite.labels)}; "
            f"{'/'.join(map(str, steps))} steps per point)")
    if getattr(args, "steps", None) is not None and all(p.steps is not None for p in suite.points):
        text += f"; --steps {args.steps} does not apply: every point trains for the suite's steps (docs/tasks.md)"
    model = suite.points[0].model
    if model:
        text += "; the suite's model: " + ", ".join(f"{k} {v}" for k, v in model.items())
        for key, value in model.items():
            if (given_value := getattr(args, key, None)) not in (None, value):
                text += f" (--{key.replace('_', '-')} {given_value} does not apply: the suite fixes it)"
    return text


def number(value, digits=3) -> str:
    """``value`` with ``digits`` decimals, ``-`` when it is missing or not finite."""
    return fmt_number(value, f".{digits}f")


# Settings that are not Config fields but arguments of library calls, named by their flags: each name's own
# flag (``cpus_per_trial``: ``--cpus-per-trial``), but for the few whose flag has another name.
ARGUMENT_FLAGS = {**{name: "--" + name.replace("_", "-") for name in (
    "workers", "cpus_per_trial", "gpus_per_trial", "seeds", "genes", "configs", "out", "data_dir", "overwrite",
    "executor", "resume", "text", "length", "sample", "save_model", "dedupe", "seed_vanilla", "mutation_schedule",
    "track", "prompt", "temperature", "top_k", "max_new_tokens", "keep_models", "rank", "model", "sizes", "steps",
    "tokens_per_param", "models", "margin", "mde", "power", "max_seeds", "metric", "eval_split", "confidence", "knob",
    "break_at", "lr_grid", "tuning_seeds", "optuna_journal", "match_params", "plan", "solve_threshold", "seed_block",
    "solve_test")},
    "address": "--ray-address", "n_seeds": "--seeds", "out_dir": "--out", "config_file": "--config",
    "plugins": "--plugin", "values": "--knob"}


def flag_of(setting: str) -> str | None:
    """The command-line flag of a Config field or library argument, if it has one."""
    fields = {name: "--" + flag.replace("_", "-") for flag, name in {**config_flags(), **fidelity_flags()}.items()}
    return fields.get(setting) or ARGUMENT_FLAGS.get(setting)


def user_message(exc) -> str:
    """A library error in the words of the command line: the setting it names becomes its flag."""
    message = str(exc)
    notes = []
    for setting in getattr(exc, "settings", ()):
        if setting in SETTING_ORIGINS:  # not from a flag: the key, and where it is set
            notes.append(f"{setting} is set in {SETTING_ORIGINS[setting]}")
            continue
        flag = flag_of(setting)
        if flag:
            # a word of its own, never part of a path (``runs/out``) or a name (``plan.yaml``; a full stop ends it)
            message = re.sub(rf"(?<![\w\-/.]){re.escape(setting)}(?![\w\-/]|\.\w)", flag, message)
    return message + (f" ({'; '.join(notes)})" if notes else "")


# a baseline's directory (its result.json; with --save-model its model/): no other command's output joins it
BASELINE = "a baseline"
register_output_kind(BASELINE, lambda path: (path / "result.json").is_file())


def out_arg(args, default=None, *, kind: str, study: str | None = None, also=(), sources: dict | None = None):
    """The one rule for a command's ``--out``: given (even ``""``), it is what is used, and it is
    checked by ``util.files.check_output`` (never empty, never under a file, never a run store, a
    locked or a model directory, never one of ``sources``, what the command reads); only an absent
    ``--out`` takes the command's ``default`` (None: no output). ``study``: a directory holding that
    study's own store is of the command's kind; ``also``: other paths that are (the run a validation
    adds to). Returns a Path, or None."""
    from evo_attention.search.lock import LOCK_NAME, check_free
    from evo_attention.search.store import RunStore
    from evo_attention.util.files import check_output

    value = args.out if args.out is not None else default
    if value is None:
        return None
    mine = {Path(p).resolve() for p in also if p is not None}
    if study is not None:
        KEPT_ON_INTERRUPT[:] = [f"every finished training is kept in {Path(value) / 'run.db'}; run the same "
                                "command again to go on (it trains only what is missing)"]

    def own(path) -> bool:
        if path.resolve() in mine:
            return True
        if study is None:
            return False
        check_free(path)  # a live writer is named as such
        if not RunStore.exists(path):  # a lock without a store: a study stopped before it made one
            return (path / LOCK_NAME).exists()
        with RunStore.open(path, readonly=True) as store:
            return store.kind() == study

    return check_output(value, "out", kind=kind, own=own, sources=sources)


# the signals a command handles; ``cli.main`` puts them back as they were when it ends
HANDLED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def install_sigterm_handler(*, survive_hangup: bool = False) -> None:
    """Turn SIGTERM and Ctrl-C (SIGINT) into one KeyboardInterrupt, so a terminated command stops cleanly:
    after the first, both are ignored, so a second Ctrl-C cuts neither the cleanup (workers or Ray
    stopping, the store closing, a study's files written) nor the interrupted line. With
    ``survive_hangup`` a closed terminal (SIGHUP) does not stop the command either: its progress
    output is best-effort (``util.progress``), the work goes on, as under ``nohup``."""
    def handler(signum, frame):
        for stop in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop, signal.SIG_IGN)
        raise KeyboardInterrupt

    with suppress(ValueError):  # not the main thread (e.g. called from a library)
        for stop in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop, handler)
        if survive_hangup and hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, signal.SIG_IGN)


