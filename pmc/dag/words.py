"""Shell words: ``split_command``, how a task's command becomes its argument list.

Quotes and backslashes as a POSIX shell takes them, without any expansion, at the blanks
of C's isspace(); used by the worker at launch and by the reader for a TASK line's options.
"""

from __future__ import annotations

import re

# Where the words of a command end: the blanks of C's isspace() in the C locale, as the
# reference's argument splitter uses. Not str.split()'s set, which also holds NBSP,
# U+3000, \x1c-\x1f and other Unicode spaces: a shell keeps those inside a word.
SPACE = " \t\n\r\x0b\x0c"
SPACE_RUN = re.compile("[" + SPACE + "]+")
# Characters str.split() takes for blanks that SPACE does not hold, in ASCII text.
_NOT_SPACE = re.compile("[\x1c-\x1f]")


def split_words(text: str) -> list[str]:
    """``text.split()`` at ``SPACE`` only."""
    if text.isascii() and _NOT_SPACE.search(text) is None:
        return text.split()  # the same split, in C
    return [word for word in SPACE_RUN.split(text) if word]


def has_quoting(text: str) -> bool:
    # Three substring scans run in C; iterating the characters would not.
    return "'" in text or '"' in text or "\\" in text


def split_command(command: str) -> list[str]:
    """Split a task's command as a shell would split words (quotes, backslashes), but
    without any expansion: ``<``, ``|`` and ``$X`` reach the program literally.

    The rules are those of ``shlex.split(command, posix=True)`` with the blanks of C's
    isspace() (``SPACE``); a bad quote raises ValueError. In linear time: shlex grows a
    word a character at a time, which takes minutes for a quoted argument a megabyte
    long.
    """
    if not has_quoting(command):
        return split_words(command)
    return shell_words(command)[0]


_SPECIAL = re.compile("[" + re.escape(SPACE + "'\"\\") + "]")
_IN_DOUBLE = re.compile(r'["\\]')


def shell_words(text: str) -> tuple[list[str], list[int]]:
    """The shell words of ``text`` and the offset where each starts."""
    words: list[str] = []
    starts: list[int] = []
    word: list[str] = []
    in_word = False
    pos = 0
    n = len(text)
    while pos < n:
        m = _SPECIAL.search(text, pos)
        end = m.start() if m else n
        char = text[end] if m else ""
        if not in_word and (end > pos or (char and char not in SPACE)):
            in_word = True
            starts.append(pos)
        word.append(text[pos:end])
        if char == "'":
            close = text.find("'", end + 1)
            if close < 0:
                raise ValueError("unterminated quote")
            word.append(text[end + 1 : close])
            pos = close + 1
        elif char == '"':
            pos = end + 1
            while True:
                q = _IN_DOUBLE.search(text, pos)
                if q is None or (q.end() == n and q.group() == "\\"):
                    raise ValueError("unterminated quote")
                k = q.start()
                word.append(text[pos:k])
                if text[k] == '"':
                    pos = k + 1
                    break
                # Inside double quotes a backslash escapes only " and itself.
                after = text[k + 1]
                word.append(after if after in '"\\' else "\\" + after)
                pos = k + 2
        elif char == "\\":
            if end + 1 == n:
                raise ValueError("backslash at end of line")
            word.append(text[end + 1])
            pos = end + 2
        else:  # a blank, or the end, ends the word
            if in_word:
                words.append("".join(word))
                in_word = False
            word.clear()
            pos = end + 1
    if in_word:  # the text ended inside a word, after a quote or an escape
        words.append("".join(word))
    return words, starts
