"""The candidate's source as the grader reads it: parsed, never run.

Python's parser can fail on a hostile file in more ways than a SyntaxError: ten thousand unary minus
signs exhaust its memory (MemoryError), deep nesting its recursion (RecursionError), a null byte is a
ValueError. Each means the same to the grader: the file does not parse, and it is the candidate's.

The text the grader reads must be the program Python runs. Python decodes a file by its coding line
(PEP 263) or byte-order mark; a file that declares another encoding than UTF-8 (`# coding: utf-7`)
would run as one program and be read by the rules as another, so it is refused as a usage error.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from grader.exercise import UsageError

UNPARSEABLE = (SyntaxError, ValueError, MemoryError, RecursionError)


def parse(source: str) -> ast.Module | None:
    """The file's syntax tree, or None when it does not parse."""
    try:
        return ast.parse(source)
    except UNPARSEABLE:
        return None


def read(path: Path) -> str:
    """The file's text as Python decodes it: UTF-8, a byte-order mark dropped. UsageError for a file that
    declares another encoding."""
    return decoded(Path(path).read_bytes(), Path(path).name)


def decoded(data: bytes, name: str) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:  # an unknown encoding, or a coding line that disagrees with the byte-order mark
        encoding = "unknown"
    if encoding not in ("utf-8", "utf-8-sig"):
        raise UsageError(f"{name} declares the encoding {encoding} in a coding line: save it as UTF-8 and remove "
                         f"that line (the grader reads only UTF-8 files).")
    return data.decode("utf-8-sig", errors="replace")
