"""The README stays a front door, and true: short, every exercise of the course listed in order with its page,
every command in its synopsis, and the install and test commands CI runs.

The points of each step and the named mistakes live on the generated pages (docs/exercises/NAME.md,
docs/scoring.md); tests/test_docs.py keeps those current.
"""

import re

from grader.bundle import TESTED_TORCH
from grader.cli import main as cli
from grader.exercise import load_course
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
MAX_LINES = 250


def test_the_readme_is_a_front_door():
    lines = len(README.splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move the detail to docs/ (at most {MAX_LINES})"


def test_the_exercise_table_is_the_course_in_order():
    rows = re.findall(r"^\| \[`(\w+)`\]\(docs/exercises/(\w+)\.md\) \| (.+) \|$", README, re.M)
    assert [(name, page) for name, page, _ in rows] == [(name, name) for name in load_course()]


def test_the_synopsis_names_every_command():
    synopsis = README.split("## Commands")[1].split("```")[1]
    for name in cli.commands:
        assert name == "grade" or f"attn-grade {name}" in synopsis, f"the README's synopsis lacks {name}"


def test_install_and_test_commands_are_the_ones_ci_runs():
    """The same torch and the same kit; CI's machine provides the torch wheel, so .ci/run names no index
    (tests/test_install.py checks the README's, which takes the CPU-only build from PyTorch's index)."""
    ci = (ROOT / ".ci" / "run").read_text()
    torch = f"torch=={TESTED_TORCH}"
    assert f"pip install {torch} --index-url" in README and f"pip install -q {torch}\n" in ci
    assert 'pip install -e ".[test]"' in README  # the kit, to grade
    extras = ".[test,triton,notebook]"  # and what the whole suite needs
    assert f'pip install -e "{extras}" && python -m pytest -q -n 2 --dist loadfile\n' in README
    assert f'pip install -q -e "{extras}"' in ci and "\npython -m pytest -q -n 2 --dist loadfile\n" in ci
