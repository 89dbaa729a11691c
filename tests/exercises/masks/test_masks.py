"""The masks exercise's own test: dropout is graded by properties of a random draw, so correct code must
pass with other seeds too. Its variants are graded with every other exercise's in tests/test_variants.py."""

from tests.conftest import ROOT, explain
from tests.exercises.masks.variants import CORRECT

BASE = (ROOT / "solutions" / "masks.py").read_text()


def test_correct_variants_score_full_marks_with_another_seed(grade_source):
    for variant in CORRECT:
        result = grade_source(variant.code, base=BASE, name="masks.py", seed=1)
        assert result.full_marks, f"{variant.name}:\n{explain(result)}"
