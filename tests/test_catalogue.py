"""Every named mistake of the catalogue, every exercise's own and the general ones, says in a few words what is wrong
and how to fix it ("what: fix"); what that has no room for is its why, which `attn-grade mistakes --why` shows."""

import re

import pytest
from click.testing import CliRunner

from grader import catalogue
from grader.cli import main as cli
from grader.engine.spec import MESSAGE_WORDS
from grader.exercise import load_course

ENTRIES = [e for name in load_course() for e in catalogue.exercise_mistakes(name)] + catalogue.general_mistakes()
WHAT_THEN_FIX = re.compile(r"\S: \S")  # something said, a colon, then the fix


def label(entry) -> str:
    return f"{entry.exercise or 'general'}:{entry.id}"


@pytest.mark.parametrize("entry", ENTRIES, ids=label)
def test_a_message_says_what_is_wrong_then_how_to_fix_it_in_a_few_words(entry):
    words = len(entry.message.split())
    assert words <= MESSAGE_WORDS, f"{words} words: keep what and fix, move the reasoning to why= ({entry.message})"
    assert WHAT_THEN_FIX.search(entry.message), f"no 'what: fix' colon in {entry.message!r}"
    assert entry.message == entry.message.strip() and not entry.message.endswith("."), entry.message


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.why], ids=label)
def test_a_why_is_sentences_that_add_to_the_message(entry):
    assert entry.why == entry.why.strip() and entry.why.endswith("."), entry.why
    assert entry.why.rstrip(".") not in entry.message


def test_the_mistakes_command_shows_the_why_only_when_asked():
    exercise, shown = next((e.exercise, e) for e in ENTRIES if e.exercise and e.why)
    plain = CliRunner().invoke(cli, ["mistakes", exercise])
    assert plain.exit_code == 0, plain.output
    assert f"{shown.id}: {shown.message}" in plain.output and "why:" not in plain.output
    with_why = CliRunner().invoke(cli, ["mistakes", exercise, "--why"])
    assert with_why.exit_code == 0, with_why.output
    after = with_why.output.split(f"{shown.id}: {shown.message}", 1)[1]
    assert " ".join(after.split("\n", 2)[1].split()).startswith(f"why: {shown.why.split()[0]}")
    assert " ".join(with_why.output.split()).count(f"why: {shown.why}") == 1
