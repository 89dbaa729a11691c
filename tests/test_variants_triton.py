"""triton_attention graded on its variants: tests/test_variants.py's tests, on that exercise alone (the slowest, in
a module of its own, a process of its own under `--dist loadfile`)."""

from tests.test_variants import *  # noqa: F403 (the tests, their fixture and pytest_generate_tests)
from tests.test_variants import SEPARATE

EXERCISES = SEPARATE
