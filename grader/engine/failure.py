"""The one way a check fails: CheckFailed, raised by every expectation and rule and read by the grader's plugin."""

from __future__ import annotations


class CheckFailed(AssertionError):
    """The candidate's answer is wrong (or its code raised: outcome "error"); `mistake` names a
    known mistake that explains it; `details` carry the numbers (max abs error, where, ...);
    `breach` marks a broken rule, which costs the whole step.
    """

    def __init__(self, message: str, mistake=None, details: dict | None = None, outcome: str = "failed",
                 breach: bool = False):
        message = capped(message)
        super().__init__(message)
        self.message = message
        self.mistake = mistake
        self.details = details or {}
        self.outcome = outcome
        self.breach = breach


MESSAGE_LIMIT = 1000  # characters: a value of the candidate's a message shows is cut there (a string of 1 MB, the
# thirty-ninth review's f03, made a report of 781 KB)


def capped(message: str) -> str:
    """A check's message, at most MESSAGE_LIMIT characters and a note of how many more were cut."""
    if len(message) <= MESSAGE_LIMIT:
        return message
    return f"{message[:MESSAGE_LIMIT]}… ({len(message) - MESSAGE_LIMIT:,} characters cut)"


def exactly(value, expected: int) -> bool:
    """The candidate's answer is this whole number, as a plain int: a tensor, a float or a bool of the same value is
    not (comparing a tensor of several entries with == gives no truth value, and raises)."""
    return type(value) is int and value == expected
