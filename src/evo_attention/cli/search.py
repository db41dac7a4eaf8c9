"""``evo-attention search``: run (or resume) a search into a run directory, then write its report."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from evo_attention.cli.common import (EXIT_INTERRUPTED, SETTING_ORIGINS, add_executor_flags, add_fidelity_flags,
                                      add_training_flags, checked, executor_from_args, explicit_settings,
                                      fidelity_flags, flag_of, given, install_sigterm_handler, note, number, suite_text,
                                      user_message, with_given_plugins)
from evo_attention.search.lock import LOCK_NAME, check_free
from evo_attention.util.errors import UserError
from evo_attention.util.format import direction, signed_change


# settings that may differ when a run is resumed (where it runs, where its data lies, how its trials
# are grouped into batches); the data itself is checked by fingerprint. The executor flags
# (--workers, --executor, ...) are not part of the config at all: a run may be resumed with any executor.
RESUMABLE_CHANGES = ("device", "data_dir", "batch_models")


def search_config(args):
    """The config of a new run, or the stored config of a resumed one (checked against the flags)."""
    from evo_attention.search.store import RunStore
    from evo_attention.studies.evolution import CHECK_META
    from evo_attention.train.config import CAP_FIELDS, Config, cap_value, parse_lr_grid

    extra = {"baseline": False} if args.no_baseline else {}
    extra.update({name: getattr(args, flag) for flag, name in fidelity_flags().items()
                  if getattr(args, flag, None) is not None})
    options = {name: value for name, value in (("dedupe", args.dedupe or None), ("seed_vanilla", args.seed_vanilla or None),
                                               ("mutation_schedule", args.mutation_schedule)) if value is not None}
    settings = explicit_settings(args, extra)
    if options:
        settings["strategy_options"] = {**settings.get("strategy_options", {}), **options}
    if not args.resume:
        config = checked(Config.from_dict(settings, source="the command line"))
        from evo_attention.search import STRATEGIES

        strategy = STRATEGIES.get(config.strategy)  # an unknown one is named when the search starts
        unread = [name for name in ("mutation_rate", "crossover_rate", "elite_size") if given(flag_of(name))
                  and strategy is not None and name not in strategy.CONFIG_FIELDS]  # what it reads of the config
        for name in unread:  # an elite is noted, not refused: registered plans give the climb one
            readers = ", ".join(n for n, cls in STRATEGIES.items() if name in cls.CONFIG_FIELDS)
            said = f"{flag_of(name)} is read only by the strategies {readers}; --strategy {config.strategy} does not " \
                   "use it"
            if name != "elite_size":
                raise UserError(f"{said}: drop it")
            note(f"{said}: ignored")
        return config
    with RunStore.open(args.out, readonly=True) as store:
        stored = store.check_kind("search").config()
        if args.no_check and store.get_meta(CHECK_META):  # a started run keeps its check (Evolution refuses too)
            raise UserError(f"--no-check contradicts the run in {args.out} (it was started with a fresh-seed check): "
                            "drop it to resume, or start a new run with --overwrite")
    from evo_attention.data import unused_settings

    for name in unused_settings(str(stored.get("data"))):  # kept by versions that ignored them: never applied
        stored.pop(name, None)
    defaults = Config().to_dict()  # a run stored before a field existed ran with its default
    for name, value in settings.items():
        if name in CAP_FIELDS:  # a cap as the config keeps it: "50000" is 50000, "1.2X" is "1.2x"
            value = cap_value(value, name)
        elif name == "rate_grid" and value is not None:  # "1e-3,3e-3" is [0.001, 0.003]
            value = list(parse_lr_grid(value, name))
        had = stored.get(name, defaults.get(name))
        if name == "plugins" and len(standing_in := with_given_plugins(had or [], value)) == len(had or []):
            had = value = stored[name] = standing_in  # each --plugin file stands in for the run's of its file name
        if name not in RESUMABLE_CHANGES and had != value:
            has = ("it was started without it" if had in (None, {}, []) else
                   f"it has {_typed(name, had) if name in ('baseline', 'strategy_options') else _shown(had)}")
            raise UserError(f"{_typed(name, value)} contradicts the run in {args.out} ({has}): drop the setting to "
                            "resume, or start a new run with --overwrite")
    merged = {**stored, **{k: settings[k] for k in RESUMABLE_CHANGES if k in settings}}
    return checked(Config.from_dict(merged, source=f"the run in {args.out}"))


def _typed(name: str, value) -> str:
    """A setting in the words the user typed it: its flag(s) and value, or its config-file key."""
    if name == "baseline":
        return "--no-baseline" if value is False else "the baseline"
    if name == "strategy_options" and isinstance(value, dict):  # --dedupe, --seed-vanilla, --mutation-schedule
        flags = [flag_of(k) for k in value]
        if value and all(flags):
            return " ".join(f if v is True else f"{f} {v}" for f, v in zip(flags, value.values()))
    flag = flag_of(name)
    if flag and name not in SETTING_ORIGINS:
        return f"{flag} {_shown(value)}"
    where = f" ({SETTING_ORIGINS[name]})" if name in SETTING_ORIGINS else ""
    return f"{name}: {_shown(value)}{where}"


def _shown(value) -> str:
    """A setting as its flag takes it: a list of names comma-separated (``--objectives``)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    return repr(value)


def _executor_text(executor) -> str:
    details = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in executor.describe().items()
                        if k != "name" and v is not None)
    return f"{executor.name} ({details})" if details else executor.name


KEEPS_WINNER = ("quick", "shakespeare-char")  # presets whose first run keeps its best model for export


def check_search_out(out) -> None:
    """The output rule (``util.files.check_output``) for a search's directory: a run store (of any
    kind: the store decides) or a stopped run's lock is its own; a saved model or an export is never
    written into."""
    import evo_attention.interop.export  # noqa: F401 - the export formats register their output kinds
    import evo_attention.interop.hf  # noqa: F401
    import evo_attention.interop.hf_attention  # noqa: F401
    from evo_attention.search.store import RunStore
    from evo_attention.util.files import check_output

    check_output(out, "out", kind="a search run", own=lambda p: RunStore.exists(p) or (Path(p) / LOCK_NAME).exists())


def cmd_search(args) -> int:
    from evo_attention.report.status import executor_flags
    from evo_attention.search.store import StoreDamaged, StoreLost
    from evo_attention.studies.evolution import Evolution, end_of_run_lines
    from evo_attention.util.progress import log

    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite contradict each other: choose one")
    check_search_out(args.out)
    check_free(args.out)  # a run another process writes is refused before its settings are compared
    config = search_config(args)
    on_suite = suite_text(args, config)  # --data beside --suite is refused before anything is written
    out = Path(args.out)
    executor = executor_from_args(args, config)
    from evo_attention.search.trackers import make_tracker

    trackers = [make_tracker(spec, out) for spec in args.track or []]  # a missing package fails before training
    if args.keep_models is None and not args.resume and not on_suite and getattr(args, "preset", None) in KEEPS_WINNER:
        args.keep_models = 1  # a first run keeps its winner, so `export --from-run` works on it
    evolution = Evolution(config, out_dir=out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet,
                          executor=executor, trackers=trackers, keep_models=args.keep_models, announce=False,
                          check=0 if args.no_check else None)
    resume_cmd = f"evo-attention search --resume --out {shlex.quote(str(out))}{executor_flags(executor.describe())}"
    install_sigterm_handler(survive_hangup=True)  # a closed terminal never stops a search
    what = (f"{config.train_steps} steps per model, data {evolution.data.name}; {evolution.planned} evaluations "
            "planned" if not on_suite else f"{on_suite}; {evolution.planned} trainings planned")
    log(f"{'resuming' if args.resume else 'starting'} a {config.strategy} search in {out}: "
        f"{config.population_size} x {config.n_generations} generations, {what}; executor {_executor_text(executor)}"
        + (f"; fidelity {evolution.schedule.to_dict()['mode']}, rungs {'/'.join(map(str, evolution.schedule.rungs))} "
           "steps" if evolution.schedule else ""), args.quiet)
    if evolution.init_from:
        from evo_attention.report.summary import init_from_text

        log(f"warm start from {init_from_text(evolution.init_from)}", args.quiet)
    from evo_attention.studies.fitness import check_lines

    for line, warning in check_lines(config, None if on_suite else evolution.data):
        note(line) if warning else log(line, args.quiet)
    from evo_attention.train.config import CAP_FIELDS

    caps = {name: getattr(config, name) for name in CAP_FIELDS if getattr(config, name) is not None}
    if caps:
        log("constraints: " + ", ".join(f"{flag_of(name)} {value}" for name, value in caps.items())
            + " (parameters and FLOPs checked before training: a gene over them is never trained)", args.quiet)
    try:
        with evolution:
            evolution.run()
    except StoreLost:  # its own line says where the run is, if anywhere: not this --out
        raise
    except StoreDamaged as exc:  # resuming the store as it is fails again: restore it first
        raise UserError(f"{user_message(exc)}, then resume with: {resume_cmd}") from None
    except UserError as exc:  # a fault during the run (a full disk, say): what finished is in the store
        raise UserError(f"{user_message(exc)}; resume with: {resume_cmd}") from None
    except KeyboardInterrupt:
        print(f"evo-attention: interrupted; every finished evaluation is saved in {out / 'run.db'}.\n"
              f"resume with: {resume_cmd}", file=sys.stderr)
        return EXIT_INTERRUPTED
    from evo_attention.report import load_run

    summary = load_run(out)
    log(summary.statement)
    if best_line(summary):
        log(best_line(summary))
    if evolution.schedule is not None:
        from evo_attention.search.fidelity import fidelity_lines
        from evo_attention.search.store import RunStore

        with RunStore.open(out, readonly=True) as store:
            for line in fidelity_lines(store.get_meta("fidelity") or {}):
                log(line.strip())
    if evolution.checked is not None:
        log(f"fresh-seed check: {evolution.checked['line']} ({out / 'fresh_check.md'})")
    if n := summary.counts.get("equivalent"):
        log(f"functional-equivalence cache: {n} evaluation{'s' if n != 1 else ''} answered by the training of a "
            "program that computes the same function (no training)")
    if evolution.keep_models:
        from evo_attention.search.models import kept_models

        kept, racing = kept_models(out), summary.racing or {}
        raced = {str(r["gene"]): r["told"] for r in racing.get("genes") or []}  # what a raced gene ranks by
        over = f", mean + standard error over {len(racing.get('seeds') or [])} seeds"
        log(f"kept {len(kept)} trained model{'s' if len(kept) != 1 else ''} in {out / 'models'}: "
            + "; ".join(f"{m['rank']}. {m['gene']} (perplexity {number(raced.get(m['gene'], m.get('val_perplexity')))}"
                        f"{over if m['gene'] in raced else ''}, {m['dir']})" for m in kept))
    for line in end_of_run_lines(out, kept=evolution.keep_models, suite=summary.suite is not None):
        log(line)
    return 0 if summary.best_gene is not None else 1


def best_line(summary) -> str | None:
    """The search's best gene against the baseline: its change (best - baseline) with the metric's
    direction, the one sign convention of every output (``util.format``)."""
    from evo_attention.genes import gene_label

    if summary.suite is not None and summary.best is not None:
        line = f"best: {gene_label(summary.best_gene)}  suite accuracy {number(summary.best['suite_accuracy'], 4)}"
        if summary.suite.get("vs_baseline") is not None:
            line += (f"  vs baseline {number(summary.baseline['suite_accuracy'], 4)}: change "
                     f"{100 * summary.suite['vs_baseline']:+.1f} accuracy points ({direction(False)})")
        return line
    if summary.best_gene is None:
        return None
    line = f"best: {gene_label(summary.best_gene)}  perplexity {number(summary.best_perplexity)}"
    accuracy = {r.get("role"): r.get("accuracy") for r in summary.evaluations + summary.search_evaluations
                if r.get("id") == summary.best.get("id") or (r.get("role") == "baseline" and r.get("status") == "ok")}
    if accuracy.get("search") is not None:  # a task scored at its answers (recall): the accuracy beside it
        line += f", accuracy {number(accuracy['search'], 3)}"
    if summary.change:  # a raced run's values (best and baseline) are each over the racing seeds
        n = summary.best.get("seeds", 1)
        seeds = "one seed" if n == 1 else f"mean + standard error over {n} seeds each"
        line += (f"  vs baseline {number(summary.baseline['perplexity'])}"
                 + (f", accuracy {number(accuracy['baseline'], 3)}" if accuracy.get("baseline") is not None else "")
                 + f": change {signed_change(summary.change['percent'])} ({direction(True)}; {seeds}: "
                 "validate to test it)")
    return line


def register(sub) -> None:
    p = sub.add_parser("search", help="run (or resume) an evolutionary search over attention mechanisms")
    p.add_argument("--out", default="runs/search", help="run directory (default runs/search)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--no-baseline", action="store_true", help="do not train the vanilla transformer for comparison")
    p.add_argument("--no-check", action="store_true", help="skip the fresh-seed check at the end (the top 3 genes and "
                   "the vanilla gene trained on 2 fresh seeds: does the winner hold?)")
    p.add_argument("--dedupe", action="store_true", help="re-draw offspring that repeat an evaluated gene")
    p.add_argument("--seed-vanilla", action="store_true", help="put the vanilla transformer into generation 0")
    p.add_argument("--mutation-schedule", choices=["constant", "adaptive"],
                   help="adaptive: mutation rate decays from 0.6 to --mutation-rate over the generations")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--keep-models", type=int, metavar="K",
                   help="keep the K best trained models in OUT/models (weights, config, vocabulary) for export, "
                        "generate and attention-maps; saved where they train, no retraining (default 1 for the "
                        f"{' and '.join(KEEPS_WINNER)} presets, else 0; part of the run: --resume keeps the run's K)")
    p.add_argument("--track", action="append", metavar="TRACKER",
                   help="also log the search to tensorboard[:DIR], mlflow[:URI] or wandb (offline); repeatable")
    add_training_flags(p, search=True)
    add_executor_flags(p, "execution (not part of the run: a run may be resumed with another executor)")
    add_fidelity_flags(p)
    p.set_defaults(func=cmd_search)
