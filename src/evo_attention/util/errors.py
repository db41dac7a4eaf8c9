"""The one exception type for bad user input.

Anything a user can get wrong (a missing file, an unknown component name, an impossible size, a
broken config) raises :class:`UserError` with a one-line message that says what is wrong and what
to do. The CLI prints that line and exits non-zero; it never shows a traceback for it.
``UserError`` subclasses ``ValueError`` so library callers may catch either.
"""


class UserError(ValueError):
    """Bad input: the message is one line naming the value and the fix.

    ``setting``: the Config field(s) or argument(s) the message names, as a Python caller knows them
    (one name or a tuple of them; the first is the one at fault), so the CLI can name its flag instead.
    """

    def __init__(self, message: str, *, setting: str | tuple[str, ...] | None = None):
        super().__init__(message)
        self.settings: tuple[str, ...] = (setting,) if isinstance(setting, str) else tuple(setting or ())

    @property
    def setting(self) -> str | None:
        return self.settings[0] if self.settings else None


def check_argument(name: str, value, kinds, wanted: str) -> None:
    """TypeError naming the argument ``name`` unless ``value`` is an instance of ``kinds`` (a bool
    is never taken for a number): the library's front door checks its arguments here."""
    numbers = kinds in (int, float) or (isinstance(kinds, tuple) and set(kinds) <= {int, float})
    if not isinstance(value, kinds) or (numbers and isinstance(value, bool)):
        raise TypeError(f"{name} must be {wanted}, not {value!r} ({type(value).__name__})")
