"""The one way a check fails: CheckFailed, raised by every expectation and rule and read by the grader's plugin."""

from __future__ import annotations


class CheckFailed(AssertionError):
    """The candidate's answer is wrong (or its code raised: outcome "error"); `mistake` names a
    known mistake that explains it; `details` carry the numbers (max abs error, where, ...);
    `breach` marks a broken rule, which costs the whole step.
    """

    def __init__(self, message: str, mistake=None, details: dict | None = None, outcome: str = "failed",
                 breach: bool = False):
        super().__init__(message)
        self.message = message
        self.mistake = mistake
        self.details = details or {}
        self.outcome = outcome
        self.breach = breach


def exactly(value, expected: int) -> bool:
    """The candidate's answer is this whole number, as a plain int: a tensor, a float or a bool of the same value is
    not (comparing a tensor of several entries with == gives no truth value, and raises)."""
    return type(value) is int and value == expected
