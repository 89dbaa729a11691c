"""What the worker says went wrong in the candidate's code, as the grader's CandidateError.

The worker reports an exception as a dict: {"type": class name, "message": text, "line": the
candidate's own line that raised it}. None of it is trusted: every field is checked, capped
and made printable here before a check or a report shows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MAX_PRINTABLE = 600  # characters: the worker's message (at most 500) and the line it names


class CandidateError(Exception):
    """The candidate's code gave no answer: it raised, was not implemented, hung, died or sent garbage."""

    def __init__(self, kind: str, message: str, type: str = "", line: int | None = None, in_torch: bool = False):
        super().__init__(message)
        self.kind = kind  # raised | not_implemented | missing | memory | timeout | died | import | protocol
        self.message = message
        self.type = type  # the exception's class name, when the candidate's code raised
        self.line = line  # the candidate's own line that raised it, if known
        self.in_torch = in_torch  # torch's own code raised it, in a call the record saw (the worker's word)
        self.action: int | None = None  # in a script, the action that raised
        self.results: list = []  # in a script, the results of the actions before it


# What torch's own code says where the meta device cannot run the file's (no meta kernel, a value it needs, a symbolic
# size the sandbox does not load), at the start of the message as torch words it: words that only echo the file's
# (an invalid device string "meta tensors", a pad mode, torch._assert's message: review 72's F1) are no such error.
# Each can come only from a meta tensor; torch's error for a format spec can come from any tensor, so is not here.
META_ERRORS = re.compile(
    r"(RuntimeError|NotImplementedError|TypeError|ImportError): ("
    r"Tensor\.item\(\) cannot be called on meta tensors"
    r"|Cannot copy out of meta tensor"
    r"|aten::[\w.]+: attempted to run this operator with Meta tensors"
    r"|The register_meta function for torch\.\w+\(\) raises unimplemented"
    r"|Could not run '[\w:.]+' with arguments from the 'Meta' backend"
    r"|cannot repeat_interleave a meta tensor without output_size"
    r"|can't convert meta device type tensor to numpy"
    r"|Not available for 'meta' device type"
    r"|tensor_split expected tensor_indices_or_sections to be on cpu, but it's on meta"
    r"|Could not (guard on|extract specialized integer from) data-dependent expression"
    r"|unsupported scalarType"  # torch.autocast on the meta device (Hugging Face's rotary table, which a GPU runs)
    r"|[\w.]+ is not loaded in the grader's sandbox \(torch needs it for symbolic sizes)")


def meta_error(message: str, in_torch: bool) -> bool:
    """Whether a message is torch's own, where the meta device cannot run the file's code (the worker says torch's code
    raised it: `in_torch`)."""
    return in_torch and META_ERRORS.match(message) is not None


def raised(error, memory_limit_mb: int, where: Callable[[int], str]) -> CandidateError:
    """The CandidateError for an exception the candidate's code raised in the worker.

    `where` says a line of the file as its author knows it (see `locate`).
    """
    error = error if isinstance(error, dict) else {}
    name = printable(error.get("type"))
    message = printable(error.get("message")) or "raised an exception"
    line = error.get("line") if type(error.get("line")) is int else None
    in_torch = error.get("in_torch") is True
    kind = {"NotImplementedError": "not_implemented", "MemoryError": "memory"}.get(name, "raised")
    if kind == "not_implemented" and meta_error(message, in_torch):  # torch's own: the meta device lacks the op, or
        kind = "raised"  # cannot give its shape without data (a bool mask's index, torch.nonzero)
    if kind == "not_implemented":
        message = "not implemented yet" + (f" (NotImplementedError at line {line})" if line else "")
    if kind == "memory":
        message = f"memory limit exceeded ({memory_limit_mb} MB): {message}"
    return CandidateError(kind, locate(message, line, where), name, line, in_torch)


def locate(message: str, line, where: Callable[[int], str]) -> str:
    """The last "line N" in `message` (N the error's `line`) as `where(N)` says it: "cell C, line M" in a notebook."""
    if type(line) is not int:
        return message
    before, found, after = message.rpartition(f"line {line}")
    return before + where(line) + after if found else message


def names_missing(error, name: str) -> bool:
    """Whether the worker says the candidate's module has no `name` (it imports the file as `candidate`)."""
    said = f"AttributeError: module 'candidate' has no attribute '{name}'"
    return isinstance(error, dict) and error.get("message") == said


def printable(value) -> str:
    """A string from the worker, made safe to print on one line: capped, no control characters.

    torch's multi-line messages ("Error(s) in loading state_dict for M:\n\tsize mismatch for w.weight: ...",
    "expected one of:\n * (...)\n * (...)") read as one line: each line stripped, a blank one dropped, the
    next joined on with " / " (with a space after a line that ends in a colon), a tab a space. Any
    other control character (an escape sequence that would recolour the terminal) is shown escaped.
    """
    text = value if isinstance(value, str) else ""
    if str.isprintable(text):  # the common case, one line with nothing to escape (every call's name, at each call)
        return text[: 4 * MAX_PRINTABLE].strip()[:MAX_PRINTABLE]
    lines = [line.replace("\t", " ").strip() for line in text[: 4 * MAX_PRINTABLE].splitlines()]
    joined = ""
    for line in filter(None, lines):
        joined += ("" if not joined else " " if joined.endswith(":") else " / ") + line
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in joined[:MAX_PRINTABLE])
