"""The docs stay true: the generated pages are current, they show what the course declares, and every link
between the project's Markdown files lands on a file and a heading that exist."""

import re
import shutil

import pytest

from grader import catalogue, docs
from grader.cli import main as cli
from grader.exercise import load_course
from tests.conftest import ROOT

COURSE = load_course()
MARKDOWN = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md",
            *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_generated_page_is_current():
    stale = [str(path.relative_to(ROOT)) for path in docs.stale_pages()]
    assert not stale, f"stale docs {stale}: regenerate them with python -m grader.docs"


def test_the_check_finds_an_edited_page_a_lost_page_and_a_page_of_no_exercise(tmp_path):
    copy = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", copy)
    (copy / "exercises" / "mha.md").write_text("edited by hand\n")
    (copy / "exercises" / "gqa.md").unlink()
    (copy / "exercises" / "retired.md").write_text("an exercise no longer in the course\n")
    assert {p.name for p in docs.stale_pages(copy)} == {"mha.md", "gqa.md", "retired.md"}
    docs.write_pages(copy)
    assert docs.stale_pages(copy) == [] and not (copy / "exercises" / "retired.md").exists()


@pytest.mark.parametrize("exercise", COURSE.values(), ids=lambda e: e.name)
def test_an_exercise_page_shows_its_steps_points_and_mistakes(exercise):
    page = (ROOT / "docs" / "exercises" / f"{exercise.name}.md").read_text()
    table = page.split("## Steps and points")[1].split("\n\n")[1]
    rows = re.findall(r"^\| `(\w+)` \| .* \| (\d+) \| .*\|$", table, re.M)
    assert [(step_id, int(points)) for step_id, points in rows] == [(s.id, s.points) for s in exercise.steps]
    assert f"| **Total** | | **{exercise.max_score}** | |" in table
    named = page.split("## Named mistakes")[1]
    assert re.findall(r"^- `([\w.]+)`", named, re.M) == [e.id for e in catalogue.exercise_mistakes(exercise.name)]


@pytest.mark.parametrize("exercise", COURSE.values(), ids=lambda e: e.name)
def test_a_contract_states_every_step(exercise):
    contract = (exercise.folder / "contract.md").read_text()
    assert not contract.startswith("#"), "the page gives the title; a contract starts with its prose"
    table = contract.split("## Contract")[1]
    for step in exercise.steps:
        assert re.search(rf"^\| `{step.id}[(`]", table, re.M), f"{exercise.name}'s contract has no row for {step.id}"


def test_the_scoring_page_lists_every_general_mistake():
    section = (ROOT / "docs" / "scoring.md").read_text().split("### General mistakes")[1]
    assert re.findall(r"^- `(\w+)`", section, re.M) == [e.id for e in catalogue.general_mistakes()]


def test_the_command_line_page_names_every_command_and_option():
    page = (ROOT / "docs" / "cli.md").read_text()
    for name, command in cli.commands.items():
        assert f"attn-grade {name}" in page or name == "grade", name
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert opt in page, f"docs/cli.md never mentions {name}'s {opt}"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_land_on_a_file_and_a_heading(path):
    where = path.relative_to(ROOT)
    for target in LINK.findall(_without_code(path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        landing = (path.parent / file).resolve() if file else path
        assert landing.exists(), f"{where} links to {target}, which does not exist"
        if anchor and landing.is_file():
            assert anchor in _anchors(landing.read_text()), f"{where} links to {target}: no such heading"


def _without_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
