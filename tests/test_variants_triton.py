"""triton_attention graded on its variants: tests/test_variants.py's tests, on that exercise alone (the slowest, in
a module of its own, a process of its own under `--dist loadfile`)."""

from tests.test_variants import *  # noqa: F403 (the tests, their fixture and pytest_generate_tests)
from tests.test_variants import TRITON

EXERCISES = TRITON

# Triton's device checks are its values checks on CUDA: it has no device variants, and an empty set of them would
# show as skipped tests
del test_device_bug_loses_only_device_checks, test_device_correct_variant_scores_full_marks  # noqa: F821
