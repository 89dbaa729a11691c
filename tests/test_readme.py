"""The README stays true: its points table matches the manifest, and its named mistakes are the catalogue's."""

import re

from grader import catalogue
from grader.exercise import load_course
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_points_table_matches_the_manifest():
    table = README.split("<!-- points-table")[1].split("<!-- /points-table -->")[0]
    rows = dict(re.findall(r"\| `(\w+)` \| (\d+) \|", table))
    manifest = load_course()["mha"]
    assert {k: int(v) for k, v in rows.items()} == {s.id: s.points for s in manifest.steps}


def test_named_mistakes_section_is_the_catalogue():
    start, end = README.index(catalogue.README_START), README.index(catalogue.README_END) + len(catalogue.README_END)
    assert README[start:end] == catalogue.to_readme(), "regenerate it: python -m grader.catalogue"
