"""Plugins: modules that extend the search space (components, strategies, datasets) by registering
into the package's registries when imported.

A plugin is named as a module (``my_lab.attention``) or a file (``plugins/squared.py``), in the
config's ``plugins`` list or with ``--plugin``; installed packages can also declare one in the
entry-point group ``evo_attention.plugins`` (loaded everywhere automatically). ``load_plugins`` is
called in the search driver and in every worker process (local, spawned, Ray) before any gene is
parsed, so a plugin's names work everywhere; importing a module twice is harmless (Python caches
it), and the entry points are read once a process (reading them opens every installed distribution).
A plugin that cannot be imported is a one-line error naming it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
from importlib import metadata
from pathlib import Path

from evo_attention.util.errors import UserError

ENTRY_POINT_GROUP = "evo_attention.plugins"


def _is_file(name: str) -> bool:
    # a file, not a module (an existing file without the .py suffix too: it is refused as such)
    return name.endswith(".py") or "/" in name or "\\" in name or Path(name).expanduser().is_file()


def _import(name: str):
    if _is_file(name):
        path = Path(name).expanduser().resolve()
        spec = importlib.util.spec_from_file_location(f"evo_attention_plugin_{path.stem}", path)
        if not path.is_file() or spec is None:  # no spec: a suffix Python does not import
            why = "is a directory" if path.is_dir() else "is not a .py file" if path.is_file() else "does not exist"
            if why == "does not exist" and not Path(name).expanduser().is_absolute():
                raise UserError(f"plugin file {name} does not exist in {Path.cwd()}: a relative path is read from the "
                                "current directory, one a run or saved model stored from the directory it started in; "
                                "give the file's place with plugins PATH (a file of the same name stands in for the "
                                "stored one)", setting="plugins")
            raise UserError(f"plugin file {name} {why}: give the path of a .py file or a module name",
                            setting="plugins")
        module_name = spec.name
        if module_name in sys.modules:
            return sys.modules[module_name]
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0] or str(Path.cwd()) in sys.path:
            raise
        sys.path.append(str(Path.cwd()))  # a console script does not look in the working directory
        return importlib.import_module(name)


def in_folder(name, folder: Path):
    """A plugin listed in a config file: a relative file path is read from the file's ``folder`` (the
    run stores the path so made, which names the file from anywhere); a module name stays."""
    return str(folder / Path(name.strip()).expanduser()) if isinstance(name, str) and _is_file(name.strip()) else name


def plugin_identity(name: str) -> str:
    """What a plugin is matched by between commands and folders: a .py file by its file name (a
    relative path stored by a run or model names the file only where it started), a module by its name."""
    return Path(name).name if name.endswith(".py") else name


def stands_in(given: str, stored: str) -> bool:
    """Whether a command's plugin ``given`` stands in for a run's or model's ``stored`` one: the same
    ``plugin_identity``, or a .py file for a module whose last component is the file's stem
    (``plugins/attn.py`` for ``my_lab.attn``: a module imported from where the run started)."""
    return plugin_identity(given) == plugin_identity(stored) or (
        given.endswith(".py") and not stored.endswith(".py") and Path(given).stem == stored.rsplit(".", 1)[-1])


def with_given_plugins(stored, given) -> list[str]:
    """The plugins a model or run was trained with (``stored``) and a command's --plugin (``given``):
    a given plugin that ``stands_in`` for a stored one replaces it in its place."""
    given = list(given or ())
    return list(dict.fromkeys([next((g for g in given if stands_in(g, p)), p) for p in stored] + given))


def load_plugins(names=()) -> list[dict]:
    """Import the plugins ``names`` and every entry-point plugin; ``[{"module", "version"}]``."""
    if not isinstance(names, (list, tuple)):  # a config file's `plugins: mymod` would be read letter by letter
        raise UserError(f"plugins must be a list of module names or .py files, got {names!r}", setting="plugins")
    loaded = list(_entry_point_plugins())
    files = {}  # a file's module is named by its stem: two files of one name would be one module
    for name in names or ():
        if not isinstance(name, str) or not name.strip():
            raise UserError(f"plugin {name!r} is not a module name or a .py file", setting="plugins")
        if _is_file(name.strip()):
            path = Path(name.strip()).expanduser().resolve()
            if files.setdefault(path.stem, path) != path:
                raise UserError(f"plugin files {files[path.stem]} and {path} have the same name: rename one",
                                setting="plugins")
        loaded.append(_load(name.strip(), lambda n=name.strip(): _import(n), None))
    return loaded


@functools.cache
def _entry_point_plugins() -> tuple[dict, ...]:
    return tuple(_load(entry.value, lambda e=entry: e.load(), entry.dist.version if entry.dist else None)
                 for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name))


def _load(name: str, load, version: str | None) -> dict:
    try:
        module = load()
    except UserError as exc:
        raise UserError(f"plugin {name}: {exc}", setting="plugins") from None
    except SystemExit as exc:  # a plugin must not end the program that imports it
        raise UserError(f"plugin {name} called sys.exit({exc.code!r}) while it was imported: a plugin must register "
                        "its components and return, never exit", setting="plugins") from None
    except Exception as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise UserError(f"plugin {name} could not be imported ({type(exc).__name__}: {reason}): check that it is "
                        "installed or that the path is right, in every worker too", setting="plugins") from None
    if version is None:
        version = getattr(module, "__version__", None)
    if version is None:  # the version of the distribution the module's top-level package comes from
        with contextlib.suppress(metadata.PackageNotFoundError):
            version = metadata.version(getattr(module, "__name__", name).split(".")[0])
    return {"module": name, "version": version}
