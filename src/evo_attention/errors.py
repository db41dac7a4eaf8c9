"""The one exception type for bad user input.

Anything a user can get wrong (a missing file, an unknown component name, an impossible size, a
broken config) raises :class:`UserError` with a one-line message that says what is wrong and what
to do. The CLI prints that line and exits non-zero; it never shows a traceback for it.
``UserError`` subclasses ``ValueError`` so library callers may catch either.
"""


class UserError(ValueError):
    """Bad input: the message is one line naming the value and the fix."""
