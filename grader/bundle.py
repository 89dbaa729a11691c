"""A Gradescope autograder zip: setup.sh and run_autograder at its root, the kit beside them.

Gradescope unpacks the zip into /autograder/source, runs setup.sh once to build the image,
then run_autograder for each submission, which reads /autograder/submission and writes
/autograder/results/results.json. AUTOGRADER_ROOT moves that root, for tests.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from grader.exercise import GRADER_DIR, Exercise

KIT_ROOT = GRADER_DIR.parent
KIT_PARTS = ("pyproject.toml", "README.md", "docs", "grader", "solutions", "exercises")

MIN_PYTHON = (3, 10)  # as pyproject.toml's requires-python

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, to build the autograder image.
set -euo pipefail
apt-get update -q && apt-get install -y -q python3 python3-pip python3-venv
version="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
major="${{version%%.*}}"
minor="${{version#*.}}"
if [ "$major" -lt {major} ] || {{ [ "$major" -eq {major} ] && [ "$minor" -lt {minor} ]; }}; then
  echo "attn-grade needs Python {major}.{minor} or newer; this image's python3 is $version." \\
       "Pick a newer base image in the autograder settings (Ubuntu 22.04 has 3.10)." >&2
  exit 1
fi
python3 -m venv /autograder/venv
# The CPU build of torch: Gradescope has no GPU, and the CUDA build is several GB.
/autograder/venv/bin/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -q /autograder/source/kit
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade it, write results/results.json.
set -u
root="${{AUTOGRADER_ROOT:-/autograder}}"
if [ -d "$root/venv/bin" ]; then  # made by setup.sh; a test's root has none and uses the attn-grade on PATH
  export PATH="$root/venv/bin:$PATH"
fi
results="$root/results/results.json"
mkdir -p "$root/results"
file="$(find "$root/submission" -name '{file}' -type f | head -n 1)"
if [ -z "$file" ]; then
  message="No {file} in the submission: upload a file named {file}."
  printf '{{"score": 0, "output": "%s", "tests": []}}\\n' "$message" > "$results"
  exit 0
fi
attn-grade "$file" --exercise {exercise} --format gradescope --output "$results"
code=$?
if [ "$code" -ge 2 ]; then  # a usage or internal error: say so in the results, never a silent zero
  message="The autograder failed (attn-grade exit $code); ask your instructor to rerun it."
  printf '{{"score": 0, "output": "%s", "tests": []}}\\n' "$message" > "$results"
fi
exit 0
"""


def write_bundle(out: Path, exercise: Exercise) -> list[str]:
    """Write the zip; return the names in it."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        _add_script(zf, "setup.sh", SETUP.format(major=MIN_PYTHON[0], minor=MIN_PYTHON[1]))
        _add_script(zf, "run_autograder", RUN.format(file=exercise.file, exercise=exercise.name))
        for part in KIT_PARTS:
            path = KIT_ROOT / part
            files = [path] if path.is_file() else sorted(
                p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            )
            for file in files:
                zf.write(file, f"kit/{file.relative_to(KIT_ROOT)}")
        return zf.namelist()


def _add_script(zf: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16  # executable once unpacked
    zf.writestr(info, text)
