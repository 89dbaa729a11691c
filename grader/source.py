"""The candidate's source as the grader reads it: parsed, never run.

Python's parser can fail on a hostile file in more ways than a SyntaxError: ten thousand unary minus
signs exhaust its memory (MemoryError), deep nesting its recursion (RecursionError), a null byte is a
ValueError. Each means the same to the grader: the file does not parse, and it is the candidate's.

The text the grader reads must be the program Python runs. Python decodes a file by its coding line
(PEP 263) or byte-order mark; a file that declares another encoding than UTF-8 (`# coding: utf-7`)
would run as one program and be read by the rules as another, so it is refused as a usage error.

So is a file the grader cannot read in bounded time and memory: more than MAX_BYTES of code (3 MB held the
grader's own process at 1.9 GB), or code nested more than MAX_DEPTH levels deep (a chain of 600 attributes in a
decorator, which the rules' recursive readers of the tree cannot follow: the fifty-third review's F2 and F5). An
exercise's answer is a few kilobytes nested a few dozen levels.
"""

from __future__ import annotations

import ast
import io
import os
import re
import stat
import tokenize
from pathlib import Path

from grader.exercise import UsageError

UNPARSEABLE = (SyntaxError, ValueError, MemoryError, RecursionError)
MAX_BYTES = 512 * 1024
MAX_FILE = 16 * 1024 * 1024  # a notebook's JSON, its outputs' pictures and all
MAX_DEPTH = 100  # levels of the syntax tree: statements in blocks, expressions in expressions


def parse(source: str) -> ast.Module | None:
    """The file's syntax tree, or None when it does not parse."""
    try:
        return ast.parse(source)
    except UNPARSEABLE:
        return None


def segments(source: str, nodes) -> list[str]:
    """`ast.get_source_segment(source, node)` of each node, the source split into lines once (that function splits it
    again at every call: a file's steps, read at every save in watch, cost a split each)."""
    lines = re.split(r"(?<=\r\n)|(?<=\r)(?!\n)|(?<=\n)", source)  # as the parser counts them, each with its end
    found = []
    for node in nodes:
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            found.append(lines[first].encode()[node.col_offset:node.end_col_offset].decode())
        else:
            found.append(lines[first].encode()[node.col_offset:].decode() + "".join(lines[first + 1:last])
                         + lines[last].encode()[:node.end_col_offset].decode())
    return found


def read(path: Path) -> str:
    """The file's text as Python decodes it: UTF-8, a byte-order mark dropped. UsageError for a file that
    declares another encoding."""
    return decoded(file_bytes(Path(path)), Path(path).name)


def file_bytes(path: Path) -> bytes:
    """The file's bytes, read only from a regular file and at most MAX_FILE of them: a FIFO put in its place would
    block the reader, and a link to /dev/zero fill its memory (the fifty-third review's F8). UsageError otherwise."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise UsageError(f"cannot read {path.name} ({error.strerror}): check the path and run it again.") from None
    with os.fdopen(handle, "rb") as opened:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise UsageError(f"{path.name} is not a regular file (a pipe, a device or a folder): grade a saved file.")
        data = opened.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise UsageError(f"{path.name} is larger than {MAX_FILE // 2**20} MiB: the grader reads files up to that size.")
    return data


def decoded(data: bytes, name: str) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:  # an unknown encoding, or a coding line that disagrees with the byte-order mark
        encoding = "unknown"
    if encoding not in ("utf-8", "utf-8-sig"):
        raise UsageError(f"{name} declares the encoding {encoding} in a coding line: save it as UTF-8 and remove "
                         f"that line (the grader reads only UTF-8 files).")
    if len(data) > MAX_BYTES:
        raise UsageError(f"{name} holds {len(data) // 1024} KiB of code; the grader reads at most {MAX_BYTES // 1024} "
                         "KiB: keep data out of the file.")
    text = data.decode("utf-8-sig", errors="replace")
    levels = depth(parse(text))
    if levels > MAX_DEPTH:
        raise UsageError(f"{name} nests its code {levels} levels deep; the grader reads at most {MAX_DEPTH}: flatten "
                         "the deepest chain of blocks, calls or attributes.")
    return text


def depth(tree: ast.AST | None) -> int:
    """The syntax tree's levels, counted without recursion (0 for no tree)."""
    deepest, nodes = 0, [(tree, 1)] if tree is not None else []
    while nodes:
        node, level = nodes.pop()
        deepest = max(deepest, level)
        nodes.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return deepest
