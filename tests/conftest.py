"""Shared helpers: write a candidate file and grade it in this process (the worker is still a subprocess);
play a watch or interview session (`save`, `script`) without sleeping.

ATTN_GRADE_SANDBOX=portable runs the whole suite's workers in the portable sandbox, as on macOS: a test
that needs Linux namespaces is marked `needs_namespaces` and skips, saying so."""

from __future__ import annotations

import itertools
import json
import os
import signal
import tempfile
import textwrap
from pathlib import Path

import pytest

from grader import report
from grader.grade import grade
from grader.pool import Zygote, portable_sandbox

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = (ROOT / "solutions" / "mha.py").read_text()
STUB = (ROOT / "exercises" / "mha.py").read_text()
_stamps = itertools.count(1)
PORTABLE = portable_sandbox()  # ATTN_GRADE_SANDBOX=portable, or not Linux: every zygote's children have no namespaces
LINUX_SANDBOX_ONLY = ("needs the Linux sandbox (namespaces, subreaper, seccomp): the portable sandbox "
                      "(ATTN_GRADE_SANDBOX=portable, or not Linux) has none of them, see docs/sandbox.md")
needs_namespaces = pytest.mark.skipif(PORTABLE, reason=LINUX_SANDBOX_ONLY)

# The interviewer's key for interview sessions (grader/interview.py key_path) is the account's: the suite's own, in a
# folder of its own, never the one in the home of whoever runs it
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="attn-grade-state-")
# The draw key of the sizes a file cannot know (grader/keys.py): one the suite fixes, so that every run of it draws the
# same sizes (tests/test_hostile.py's test of the key grades without it)
os.environ["ATTN_GRADE_DRAW_KEY"] = "attn-grade's test suite"

# A suite started in the background (a shell's `cmd &`) inherits SIGINT ignored, and so would every command it
# starts: the tests of Ctrl-C would then test nothing a terminal does. Handled here, the commands get it back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config):
    if PORTABLE:
        return ("sandbox: portable (no namespaces, seccomp, cgroups or file-system isolation, as on macOS); "
                "tests that need Linux namespaces skip")
    return None


def written(text: str, **bodies: str) -> str:
    """`text` with the stub's body of each named step replaced."""
    for step, body in bodies.items():
        stub_body = f'    # TODO\n    raise NotImplementedError("{step}: not implemented yet")'
        assert stub_body in text, step
        text = text.replace(stub_body, body)
    return text


def save(path, text: str) -> None:
    """Write `text` with a modification time never seen before: watch sees the save, however coarse the clock."""
    path.write_text(text)
    stamp = 10**18 + next(_stamps) * 10**9
    os.utime(path, ns=(stamp, stamp))


def script(*actions):
    """A read_key doing one action a call, then q: a string is the keys pressed; a function is a thing done,
    and the keys pressed if it returns a string."""
    todo = list(actions)

    def read_key(timeout):
        if not todo:
            return "q"
        action = todo.pop(0)
        keys = action() if callable(action) else action
        return keys if isinstance(keys, str) else ""

    return read_key


def lost(result) -> dict[str, int]:
    """Points lost per step, for steps that lost any."""
    return {s.id: s.max_score - s.score for s in result.steps if s.score < s.max_score}


def mistakes(result, step_id: str) -> set[str]:
    step = next(s for s in result.steps if s.id == step_id)
    return {c.mistake_id for c in step.checks if c.mistake_id}


def explain(result) -> str:
    """Every lost check, for assertion messages."""
    return "\n".join(
        f"{s.id}/{c.name}: {c.outcome} {c.message} [{c.mistake_id}]"
        for s in result.steps
        for c in s.checks
        if c.points < c.max_points
    )


def report_but_when(result) -> dict:
    """The JSON report without what tells two grades apart by design: when they ran and the file's hash."""
    data = json.loads(report.to_json(result))
    del data["graded_at"], data["sha256"]
    return data


@pytest.fixture(scope="session")
def zygote():
    """One torch import for the whole session: every grade forks its workers from it."""
    with Zygote(warm_device=True) as shared:
        yield shared


# Triton's checks run its interpreter, the suite's slowest grades: a step of triton_attention that a test's file leaves
# as an earlier grade had it is taken from that grade, as `attn-grade watch` does (grader/run_checks.py check_keys)
TRITON_CACHE: dict = {}


def _grader_of(tmp_path, zygote):
    def run(override: str = "", *, base: str = REFERENCE, name: str = "mha.py", **options):
        path = tmp_path / name
        path.write_text(base + "\n\n" + textwrap.dedent(override))
        options.setdefault("device", "cpu")  # device checks have tests of their own; this keeps the suite fast
        if name == "triton_attention.py":
            options.setdefault("cache", TRITON_CACHE)
        return grade(path, zygote=zygote, **options)

    return run


@pytest.fixture
def grade_source(tmp_path, zygote):
    """Grade a candidate made of the reference with `override` appended (later definitions win)."""
    return _grader_of(tmp_path, zygote)


@pytest.fixture(scope="session")
def process_zygote():
    """A zygote whose children may start processes, as one grading Triton on CUDA does (its compilers): for the
    bounds that hold only there (a process limit, memory shared with children, what outlives a grade)."""
    with Zygote(processes=True) as shared:
        yield shared


@pytest.fixture
def grade_with_processes(tmp_path, process_zygote):
    """`grade_source`, in children that may start processes."""
    return _grader_of(tmp_path, process_zygote)
