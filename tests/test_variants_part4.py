"""attention_backward, mla and paged_attention graded on their variants: tests/test_variants.py's tests, on those
exercises alone (a module of their own, a process of their own under `--dist loadfile`)."""

from tests.test_variants import *  # noqa: F403 (the tests, their fixture and pytest_generate_tests)
from tests.test_variants import PART4

EXERCISES = PART4
