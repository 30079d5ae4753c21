"""Tokenizer for TensorLogic programs; every token knows its line and column.

Newlines are tokens (a tensor equation ends at the end of its line) except inside brackets and
parentheses, where a statement may continue on the next line. Comments start with ``#``, ``//``
or ``%`` and run to the end of the line, or are ``/* ... */`` blocks; a ``%`` right after an
operand on the same line (a name, a number, a string or ``)``) is the modulo operator instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ProgramError
from .ast import Pos


@dataclass(frozen=True)
class Token:
    """One token: kind (IDENT, NUMBER, STRING, NEWLINE, EOF or the punctuation itself)."""

    kind: str
    text: str
    value: object
    pos: Pos


_PUNCT = (
    ":-",
    "?-",
    "\\+",
    "<=",
    ">=",
    "!=",
    "==",
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    "=",
    "+",
    "-",
    "*",
    "/",
    "<",
    ">",
    "!",
    ":",
    ";",
)
#: decimal integers and floats; hexadecimal (0x1F) and binary (0b101) integers, as in Souffle
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+\b|0[bB][01]+\b|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*'*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def parse_error(message: str, pos: Pos) -> ProgramError:
    """A ProgramError with code ``parse_error`` naming the position."""
    return ProgramError(
        f"parse error at {pos}: {message}", code="parse_error", line=pos.line, column=pos.col
    )


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens; raises ProgramError(parse_error) on a bad character."""
    tokens: list[Token] = []
    line, line_start, i, depth = 1, 0, 0, 0
    n = len(text)
    while i < n:
        ch = text[i]
        pos = Pos(line, i - line_start + 1)
        if ch == "\n":
            if depth == 0:
                tokens.append(Token("NEWLINE", "\n", None, pos))
            line, line_start, i = line + 1, i + 1, i + 1
            continue
        if ch in " \t\r\f\v":
            i += 1
            continue
        if (
            ch == "%"
            and tokens
            and tokens[-1].kind in ("IDENT", "NUMBER", "STRING", ")")
            and tokens[-1].pos.line == line
        ):
            tokens.append(Token("%", "%", None, pos))
            i += 1
            continue
        if text.startswith("/*", i):  # a block comment, possibly over several lines
            end = text.find("*/", i + 2)
            if end < 0:
                raise parse_error("unterminated block comment", pos)
            for k in range(i, end):
                if text[k] == "\n":
                    if depth == 0 and (not tokens or tokens[-1].kind != "NEWLINE"):
                        tokens.append(Token("NEWLINE", "\n", None, pos))
                    line, line_start = line + 1, k + 1
            i = end + 2
            continue
        if ch in "#%" or text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if ch in "\"'":
            j, buf = i + 1, []
            while True:
                if j >= n or text[j] == "\n":
                    raise parse_error("unterminated string literal", pos)
                c = text[j]
                if c == ch:
                    break
                if c == "\\":
                    if j + 1 >= n or text[j + 1] not in _ESCAPES:
                        raise parse_error(
                            "unknown escape sequence in string literal",
                            Pos(line, j - line_start + 1),
                        )
                    buf.append(_ESCAPES[text[j + 1]])
                    j += 2
                    continue
                buf.append(c)
                j += 1
            tokens.append(Token("STRING", text[i : j + 1], "".join(buf), pos))
            i = j + 1
            continue
        m = _NUMBER.match(text, i)
        if m:
            s = m.group()
            if s[:2] in ("0x", "0X", "0b", "0B"):
                value: object = int(s, 0)
            else:
                value = float(s) if any(c in s for c in ".eE") else int(s)
            if isinstance(value, int) and value >= 1 << 63:
                raise parse_error(f"integer {s} does not fit in 64 bits", pos)
            tokens.append(Token("NUMBER", s, value, pos))
            i = m.end()
            continue
        m = _IDENT.match(text, i)
        if m:
            tokens.append(Token("IDENT", m.group(), m.group(), pos))
            i = m.end()
            continue
        for p in _PUNCT:
            if text.startswith(p, i):
                if p in "([":
                    depth += 1
                elif p in ")]":
                    depth = max(0, depth - 1)
                tokens.append(Token(p, p, None, pos))
                i += len(p)
                break
        else:
            raise parse_error(f"unexpected character {ch!r}", pos)
    tokens.append(Token("EOF", "", None, Pos(line, n - line_start + 1)))
    return tokens
