"""The ``evo-attention`` command: one module per subcommand, each with ``register(subparsers)``.

Each subcommand parses flags into a Config (defaults < --preset < --config FILE < flags, see
``common``) and calls the library; bad input ends with one line ``evo-attention: error: ...``
(the library's message, with settings named by their flags) and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
from contextlib import suppress

from evo_attention.util.errors import UserError
from evo_attention.util.version import __version__

# The subcommands, in the order ``--help`` lists them: evo_attention/cli/<module>.py each.
COMMAND_MODULES = ("baseline", "search", "status", "report", "validate", "ablate", "transfer", "maps", "bench",
                   "compare", "curve", "fitness", "generate", "export", "study")
COMMAND_NAMES = {**{name: name for name in COMMAND_MODULES}, "attention-maps": "maps", "train": "baseline",
                 "fitness-check": "fitness"}  # command -> module


class _Store(argparse._StoreAction):
    """A flag's value, stored; an empty one is refused where the flag has no type (a typed flag's check refuses it
    in its own words): a command that tests such a flag by its truth would take it as not given."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.type is None and (values == "" or isinstance(values, list) and "" in values):  # nargs: a list
            raise UserError(f"{option_string or self.dest} is empty: give {self.metavar or 'a value'}"
                            + (", or leave the flag out" if option_string else ""))
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad flag said in one line that points at --help (not the whole usage first), and an
    empty value refused (``_Store``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _Store)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``only``: register just that command (what it runs needs no other
    command's module, and each one imported costs start-up time)."""
    parser = _Parser(prog="evo-attention", description="Evolve attention mechanisms for small transformer language "
                                                       "models.")
    parser.add_argument("--version", action="version", version=f"evo-attention {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES if only not in COMMAND_NAMES else (COMMAND_NAMES[only],):
        importlib.import_module(f"evo_attention.cli.{name}").register(sub)
    return parser


def main(argv=None) -> int:
    program, argv = argv is None, list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # answered before any command module loads
        print(f"evo-attention {__version__}")
        return 0
    from evo_attention.cli.common import (GIVEN_FLAGS, HANDLED_SIGNALS, KEPT_ON_INTERRUPT, NOTED, SETTING_ORIGINS,
                                          install_sigterm_handler)

    # one command's state, filled as it reads its settings; put back as it was when the command ends, so
    # that nothing after it (the library, the next command, the study that ran it) reads its flags
    states = (SETTING_ORIGINS, KEPT_ON_INTERRUPT, NOTED, GIVEN_FLAGS)
    before = [state.copy() for state in states]
    for state in states:
        state.clear()
    GIVEN_FLAGS.update(token.split("=", 1)[0] for token in argv if str(token).startswith("--"))
    handlers = {number: signal.getsignal(number) for number in HANDLED_SIGNALS}
    install_sigterm_handler()  # SIGTERM ends every command as Ctrl-C does: with its interrupted line
    try:
        # the plugins named are imported before the parser is built: their tasks (--data), strategies and
        # schedules are in its help
        if (named := _named_plugins(argv)) and (code := _run(argparse.Namespace(plugin=named), plugins_only=True)):
            return code
        try:
            args = build_parser(only=argv[0] if argv else None).parse_args(argv)
        except UserError as exc:  # an empty value (``_Store``)
            print(f"evo-attention: error: {exc}", file=sys.stderr)
            return 2
        return _run(args)
    finally:
        for state, old in zip(states, before):
            state.clear()
            (state.extend if isinstance(state, list) else state.update)(old)
        # the process's own command line: it only exits now, and a signal then would raise KeyboardInterrupt in
        # code run at exit (Ray's, torch's finalizers), which prints a traceback
        for number, handler in handlers.items():
            with suppress(ValueError, TypeError):  # not the main thread; a handler not set from Python (None)
                signal.signal(number, signal.SIG_IGN if program else handler)


def _named_plugins(argv) -> list[str]:
    """The values of ``--plugin M`` and ``--plugin=M`` in ``argv`` (the parser reads them again, and refuses a
    missing or empty one in its words)."""
    return [token[9:] if token[8:9] == "=" else value for token, value in zip(argv, [*argv[1:], ""])
            if token[9:] and token.startswith("--plugin=") or token == "--plugin" and value[:1] not in ("", "-")]


def _run(args, *, plugins_only: bool = False) -> int:
    """The command ``args`` names (``plugins_only``: its plugins only), its errors said in one line (``main``'s exit
    codes)."""
    from evo_attention.cli.common import (EXIT_INTERRUPTED, EXIT_USAGE, KEPT_ON_INTERRUPT, note_unused_flags,
                                          user_message)
    from evo_attention.util.plugins import load_plugins
    from evo_attention.util.progress import user_warnings  # warnings as one line each

    try:
        with user_warnings():
            if getattr(args, "plugin", None):  # before any flag names a gene of theirs (--genes, --gene, ...)
                load_plugins(args.plugin)
            if plugins_only:
                return 0
            note_unused_flags(args)
            return int(args.func(args) or 0)
    except UserError as exc:
        print(f"evo-attention: error: {user_message(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("; ".join(["evo-attention: interrupted", *KEPT_ON_INTERRUPT]), file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # code run by the command (a plugin's) ended it: say so rather than exit silently
        if exc.code in (None, 0):
            raise
        with suppress(OSError):
            print(f"evo-attention: error: the command was ended by sys.exit({exc.code!r}) in code it ran (a plugin?)",
                  file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader of our output went away (e.g. `status | head`): nothing to say
        with suppress(OSError, ValueError):  # stdout not a file (captured): nothing will be flushed to a closed pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except OSError as exc:  # after BrokenPipeError, one of them
        if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):  # a path no file system call can use
            raise
        print(f"evo-attention: error: {exc.filename}: {exc.strerror}: give a shorter path, or one without a "
              "symbolic-link loop", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
