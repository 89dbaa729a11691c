"""The README stays true: its points table and its count of named mistakes match the grader."""

import re

from grader.checks import mha as mha_checks
from grader.checks.expect import Mistake
from grader.exercise import load_manifest
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_points_table_matches_the_manifest():
    table = README.split("<!-- points-table")[1].split("<!-- /points-table -->")[0]
    rows = dict(re.findall(r"\| `(\w+)` \| (\d+) \|", table))
    manifest = load_manifest()["mha"]
    assert {k: int(v) for k, v in rows.items()} == {s.id: s.points for s in manifest.steps}


def test_named_mistake_count_matches_the_checks():
    found = set()
    for value in vars(mha_checks).values():
        items = value if isinstance(value, tuple) else (value,)
        found |= {m.id for m in items if isinstance(m, Mistake)}
    assert f"There are {len(found)} named mistakes" in README
