"""The word-level reading of a text: the one rule every word-level tokenization follows.

* Lines: ``\\r\\n``, ``\\r`` and ``\\n`` each end a line (universal newlines). A final newline ends
  the last line, it does not open an empty one; an empty text has no lines. Other Unicode line
  separators (``\\u2028``, ``\\x85``, ...) do not end a line: inside a line they are whitespace.
* Words: the words of a line are ``line.split()``, the runs of non-whitespace.
* A corpus (``corpus_words``): every line's words followed by ``EOS``, empty lines included.
* A prompt (``prompt_words``): the same, except that the last line gets no ``EOS`` unless the
  text ends with a newline, so that a model continues the last line.

The corpus rule decides the token streams and so the token cache: changing it changes every
word-level stream, and needs ``corpus.RECIPE_VERSION`` bumped.
"""

from __future__ import annotations

EOS = "<eos>"  # the word that ends every line of a corpus


def text_lines(text: str) -> list[str]:
    """The lines of ``text``, without their newlines (see the module docstring)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text:
        return []
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def line_words(line: str) -> list[str]:
    """The words of one line: its runs of non-whitespace."""
    return line.split()


def corpus_words(text: str) -> list[str]:
    """Every line's words, each line followed by ``EOS``; ``[]`` for an empty text."""
    return [word for line in text_lines(text) for word in (*line_words(line), EOS)]


def prompt_words(text: str) -> list[str]:
    """``corpus_words`` without the last line's ``EOS`` unless ``text`` ends with a newline."""
    words = corpus_words(text)
    if words and not text.endswith(("\n", "\r")):
        words.pop()
    return words
