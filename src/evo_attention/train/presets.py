"""Named starting points for a run, and how a final Config is assembled.

Precedence: built-in defaults < preset < YAML config file < command-line flags.

- ``seed``: the original EvoAttention experiment (the Config defaults: WikiText-2, a GA of 12 x 10).
- ``quick``: the embedded associative-recall task, a 64-dim model, a GA of 8 x 4: minutes on a laptop CPU.
- ``shakespeare-char``: a text corpus (give ``data_dir``) at the character level; bits per character.
- ``fitness-lm``: the language fitness for searches (give ``data_dir``): Shakespeare bytes; its fitness
  check (docs/tasks.md) says how reliably one training sees the output gate.
"""

from __future__ import annotations

import dataclasses
from contextlib import suppress
from pathlib import Path
from typing import Any, Mapping

from evo_attention.train.config import Config, warmup_twice
from evo_attention.util.errors import UserError
from evo_attention.util.plugins import in_folder
from evo_attention.util.yamlio import DuplicateKey, unique_key_loader

# the small model and search of the quick presets (each spliced in where its settings stand)
_SMALL_MODEL = {"d_model": 64, "n_heads": 4, "n_layers": 2, "dropout": 0.0}
_SMALL_SEARCH = {"population_size": 8, "n_generations": 4, "elite_size": 2}
PRESETS: dict[str, dict[str, Any]] = {
    "seed": {},
    "quick": {
        "data": "recall",
        "vocab_size": 32,
        "max_seq_len": 32,
        "recall": {"num_pairs": 4, "train_examples": 20000, "eval_examples": 500},
        **_SMALL_MODEL,
        "batch_size": 32,
        "eval_batch_size": 250,
        "eval_steps": None,
        "learning_rate": 2e-3,
        "train_steps": 400,
        **_SMALL_SEARCH,
    },
    "shakespeare-char": {  # give --data-dir ../shared/data/shakespeare (or any text corpus)
        "data": "text",
        "tokenizer": "char",
        "max_seq_len": 128,
        **_SMALL_MODEL,
        "batch_size": 32,
        "eval_batch_size": 128,
        "eval_steps": None,
        "learning_rate": 2e-3,
        "lr_schedule": "cosine",
        "warmup_steps": 50,
        "train_steps": 600,
        **_SMALL_SEARCH,
    },
    "fitness-lm": {  # give --data-dir ../shared/data/shakespeare; measured by fitness-check (docs/tasks.md)
        "data": "text",
        "tokenizer": "byte",
        "vocab_size": None,
        "max_seq_len": 64,
        **_SMALL_MODEL,
        "short_conv": 3,
        "batch_size": 16,
        "eval_batch_size": 64,
        "eval_steps": None,
        "learning_rate": 4e-3,  # the vanilla gene's best of 2e-3..1.6e-2 (the committed fitness check)
        "lr_schedule": "wsd",
        "warmup": 0.05,
        "lr_decay_fraction": 0.2,
        "train_steps": 828,
        **_SMALL_SEARCH,
    },
}


def preset(name: str) -> dict:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}: valid presets are {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def read_config_file(path: str | Path) -> dict:
    """Read a YAML (or JSON) config file into a dict; every key must be a Config field."""
    import yaml

    path = Path(path)
    if path.is_dir():
        raise UserError(f"config file {path} is a directory: give the path of a YAML file", setting="config_file")
    if not path.is_file():
        raise UserError(f"config file {path} does not exist: check the path given to config_file",
                        setting="config_file")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=unique_key_loader())
    except DuplicateKey as exc:
        raise UserError(f"config file {path} sets {exc.key} twice (lines {exc.first} and {exc.second}): keep one "
                        "of them (YAML would silently take the last)", setting="config_file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read config file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"config file {path} is not valid YAML{where}: fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of settings, not {type(data).__name__}")
    Config.check_keys(data, source=str(path))
    space = data.get("search_space")
    program = space.get("program") if isinstance(space, dict) else None
    if isinstance(program, dict) and program.get("ops") == []:  # stored configs write [] for every op
        raise UserError(f"config file {path} lists no program ops (ops: []): name the ops the programs may use, "
                        "or leave ops out for every op", setting="search_space")
    if isinstance(data.get("plugins"), list):
        data["plugins"] = [in_folder(name, path.resolve().parent) for name in data["plugins"]]
    # a fraction beside the default steps is one warm-up, as Config takes it (and as Config.to_dict writes it)
    if data.get("warmup") is not None and data.get("warmup_steps") == Config().warmup_steps:
        data = {k: v for k, v in data.items() if k != "warmup_steps"}
    return _yaml_numbers(data)


def _yaml_numbers(data: dict) -> dict:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string: make such values of float settings numbers."""
    float_fields = {f.name for f in dataclasses.fields(Config) if "float" in str(f.type)}
    out = dict(data)
    for name in float_fields & set(out):
        if isinstance(out[name], str):
            with suppress(ValueError):  # else left as it is: Config names the field and the bad value
                out[name] = float(out[name])
    return out


def merged_settings(preset_name: str | None = None, config_file: str | Path | None = None,
                    overrides: Mapping[str, Any] | None = None) -> dict:
    """The settings named explicitly: preset < file < overrides (defaults not included). The
    warm-up is one setting in two forms (``warmup_steps`` or the fraction ``warmup``): a layer that
    gives it replaces an earlier layer's in either form (``overlay``)."""
    settings: dict[str, Any] = {}
    if preset_name:
        settings = overlay(settings, preset(preset_name), f"preset {preset_name}")
    if config_file:
        layer = read_config_file(config_file)
        settings = overlay(settings, layer, str(config_file))
        data = (overrides or {}).get("data")
        if layer.get("recall") and data is not None and not _same_task(data, settings.get("data")):
            raise UserError(f"{config_file} gives task options (recall) for data {settings['data']}, not for data "
                            f"{data}: remove them from the file, or name data {data} there with its own options",
                            setting=("recall", "data"))
    return overlay(settings, overrides or {})


WARMUP_FORMS = ("warmup_steps", "warmup")  # one setting, the warm-up, in two forms: steps or a fraction


def overlay(settings: Mapping[str, Any], layer: Mapping[str, Any], source: str | None = None) -> dict:
    """``settings`` updated with ``layer``, whose warm-up (``warmup_steps`` or a ``warmup`` fraction)
    replaces the one in ``settings`` in either form (UserError if ``layer``, ``source``, gives both).
    Task options (``recall``) belong to their task: a layer naming another task and no options drops
    them; one naming the same task keeps them, its inline knobs replacing theirs."""
    given = [name for name in WARMUP_FORMS if layer.get(name) is not None]
    if len(given) > 1:
        where = f"{source}: " if source else ""
        raise UserError(where + warmup_twice(layer["warmup"], layer["warmup_steps"]),
                        setting=("warmup", "warmup_steps"))
    out = {k: v for k, v in settings.items() if not (given and k in WARMUP_FORMS)}
    if "data" in layer and "recall" not in layer and isinstance(out.get("recall"), dict):
        inline = _task(layer["data"])[1]
        if _same_task(layer["data"], settings.get("data")):
            out["recall"] = {k: v for k, v in out["recall"].items() if k not in inline}
        else:
            out.pop("recall")
    out.update(layer)
    return out


def _task(name) -> tuple[str, dict]:
    """``(task, inline knobs)`` of a data name; a name no task is registered under yet (a plugin's,
    loaded later) gives its head and no knobs."""
    from evo_attention.data.synthetic import is_synthetic, parse_data_name  # imports torch: only for options

    return parse_data_name(name) if is_synthetic(name) else (str(name).split(":")[0], {})


def _same_task(data, other) -> bool:
    """Whether data names ``data`` and ``other`` name one task (``mqar`` and ``mqar:seq_len=32`` do);
    True where ``other`` is None (no data named yet)."""
    return other is None or _task(data)[0] == _task(other)[0]


EXAMPLE_COUNTS = ("train_examples", "eval_examples")


def example_counts_note(preset_name: str | None, settings: Mapping[str, Any]) -> str | None:
    """One line saying what a generated task uses where the preset's options gave example counts for
    its own data and the run names other data without them (they do not carry over); else None."""
    from evo_attention.data.synthetic import COMMON_DEFAULTS, is_synthetic, parse_data_name

    layer = PRESETS.get(preset_name or "", {})
    counts = {k: v for k, v in (layer.get("recall") or {}).items() if k in EXAMPLE_COUNTS}
    data = settings.get("data")
    if not counts or data == layer.get("data") or not is_synthetic(data):
        return None
    try:
        task, inline = parse_data_name(data)
    except UserError:
        return None  # the Config names the bad data name
    given = {**inline, **(settings.get("recall") or {})}
    if all(k in given for k in counts):
        return None
    used = {k: given.get(k, COMMON_DEFAULTS[k]) for k in EXAMPLE_COUNTS}
    preset_counts = ", ".join(f"{k} {v}" for k, v in counts.items())
    trains = ("fresh examples every step" if str(used["train_examples"]) == "0"
              else f"{used['train_examples']} examples")
    return (f"note: {data} trains on {trains} and evaluates {used['eval_examples']} per split "
            f"(the task's train_examples and eval_examples), not the preset {preset_name}'s {preset_counts} (for its "
            f"data {layer.get('data')!r}); set them inline to choose, e.g. {task}:train_examples=20000")


def build_config(preset_name: str | None = None, config_file: str | Path | None = None,
                 overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults < preset < file < overrides."""
    return Config.from_dict(own_vocabulary(merged_settings(preset_name, config_file, overrides)), source="settings")


def own_vocabulary(settings: dict) -> dict:
    """``settings`` where a generated task takes its own vocabulary unless a layer sets ``vocab_size``
    (the default 10000 is a word corpus's). Registered tasks must be known (plugins loaded) first."""
    from evo_attention.data import is_synthetic

    data = settings.get("data")
    if "vocab_size" not in settings and (data == "recall" or is_synthetic(data)):
        settings["vocab_size"] = None
    return settings
