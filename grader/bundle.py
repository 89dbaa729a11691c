"""A Gradescope autograder zip: setup.sh and run_autograder at its root, the kit beside them.

Gradescope unpacks the zip into /autograder/source, runs setup.sh once to build the image,
then run_autograder for each submission, which reads /autograder/submission and writes
/autograder/results/results.json. AUTOGRADER_ROOT moves that root, for tests.

run_autograder hands over to `python3 -m grader.bundle ROOT EXERCISE` (run_submission below), which picks the
submitted file, grades it with the attn-grade on PATH and says in the results which file it graded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from grader.exercise import CANDIDATE_SUFFIXES, GRADER_DIR, Exercise, linked

KIT_ROOT = GRADER_DIR.parent
KIT_PARTS = ("pyproject.toml", "README.md", "docs", "grader", "solutions", "exercises")

MIN_PYTHON = (3, 10)  # as pyproject.toml's requires-python
# The torch the kit is tested with, and PyTorch's CPU-only wheel index: the README's install command, setup.sh
# and the README's GitHub workflow install exactly this (tests/test_install.py checks all three against these).
TESTED_TORCH = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

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
# The tested torch, CPU build: Gradescope has no GPU, and PyPI's Linux wheel brings several GB of CUDA.
# --index-url takes torch from PyTorch's CPU-only index alone; the kit's other dependencies come from PyPI next.
/autograder/venv/bin/pip install -q torch=={torch} --index-url {index}
/autograder/venv/bin/pip install -q /autograder/source/kit
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade it, write results/results.json.
set -u
root="${{AUTOGRADER_ROOT:-/autograder}}"
if [ -d "$root/venv/bin" ]; then  # made by setup.sh; a test's root has none and uses the attn-grade on PATH
  export PATH="$root/venv/bin:$PATH"
fi
mkdir -p "$root/results"
# Picks the submitted file (mha.py, mha.ipynb, a browser's mha (1).py), grades it, names it in the results.
if ! python3 -m grader.bundle "$root" {exercise}; then  # the runner itself failed: never a silent zero
  message="The autograder failed; ask your instructor to rerun it."
  printf '{{"score": 0, "output": "%s", "tests": []}}\\n' "$message" > "$root/results/results.json"
fi
exit 0
"""


def write_bundle(out: Path, exercise: Exercise) -> list[str]:
    """Write the zip; return the names in it."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        _add_script(zf, "setup.sh", setup_script())
        _add_script(zf, "run_autograder", RUN.format(exercise=exercise.name))
        for part in KIT_PARTS:
            path = KIT_ROOT / part
            files = [path] if path.is_file() else sorted(
                p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            )
            for file in files:
                zf.write(file, f"kit/{file.relative_to(KIT_ROOT)}")
        return zf.namelist()


def setup_script() -> str:
    return SETUP.format(major=MIN_PYTHON[0], minor=MIN_PYTHON[1], torch=TESTED_TORCH, index=TORCH_CPU_INDEX)


def _add_script(zf: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16  # executable once unpacked
    zf.writestr(info, text)


# -- run_autograder ----------------------------------------------------------------------


def _copy_number(stem: str, exercise: Exercise) -> int | None:
    """0 for the exercise's own stem (mha), N for a browser's or system's renamed copy (mha (N), mha(N), mha-N,
    mha_N, mha N), None for any other name (mha_numpy, mha-checkpoint, attention)."""
    own = Path(exercise.file).stem
    match = re.fullmatch(re.escape(own) + r"(?:\s?\((\d+)\)|[-_ ](\d+))?", stem)
    if match is None:
        return None
    return int(match.group(1) or match.group(2) or 0)


def submission_files(folder: Path, exercise: Exercise) -> list[Path]:
    """The files under `folder` that are the exercise's, the one to grade first: the highest copy number (a
    browser's newest download; the plain name counts 0), a .py before an .ipynb, then the shallower path.
    Hidden files and folders (macOS's ._mha.py, .ipynb_checkpoints) and __MACOSX are passed over."""
    found = []
    for path in folder.rglob("*") if folder.is_dir() else ():
        parts = path.relative_to(folder).parts
        if any(p.startswith(".") or p == "__MACOSX" for p in parts) or path.suffix not in CANDIDATE_SUFFIXES:
            continue
        number = _copy_number(path.stem, exercise)
        if number is not None and path.is_file() and not linked(path, folder):
            found.append((-number, CANDIDATE_SUFFIXES.index(path.suffix), len(parts), str(path), path))
    return [entry[-1] for entry in sorted(found)]


def _others(folder: Path, limit: int = 5) -> str:
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    if not names:
        return "it holds nothing"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return "it holds " + ", ".join(names[:limit]) + more


def run_submission(root: Path, exercise: Exercise) -> None:
    """Grade the submission under `root` as run_autograder does; write root/results/results.json."""
    folder, results = root / "submission", root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    own = Path(exercise.file)
    files = submission_files(folder, exercise)
    if not files:
        links = sorted(str(p.relative_to(folder)) for p in (folder.rglob("*") if folder.is_dir() else ())
                       if p.suffix in CANDIDATE_SUFFIXES and _copy_number(p.stem, exercise) is not None
                       and linked(p, folder))
        said = f"; {', '.join(links)} {'is a link' if len(links) == 1 else 'are links'}, not graded" if links else ""
        _write_zero(results, f"No {own.name} or {own.stem}.ipynb in the submission ({_others(folder)}{said}): "
                             f"upload your {own.name} (or {own.stem}.ipynb) itself.")
        return
    chosen = files[0]
    command = ["attn-grade", str(chosen), "--exercise", exercise.name, "--format", "gradescope", "--output",
               str(results)]
    results.unlink(missing_ok=True)
    try:
        code = subprocess.run(command, check=False).returncode
        data = json.loads(results.read_text()) if code < 2 else None
    except (OSError, ValueError):
        code, data = 3, None
    if not isinstance(data, dict):
        _write_zero(results, f"The autograder failed (attn-grade exit {code}); ask your instructor to rerun it.")
        return
    data["output"] = f"{_which(folder, files)}\n{data.get('output', '')}".rstrip()
    results.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _which(folder: Path, files: list[Path]) -> str:
    """The line that says which file was graded, and which were not."""
    names = [str(path.relative_to(folder)) for path in files]
    line = f"Graded {names[0]}."
    if len(names) > 1:
        line += (f" Not graded: {', '.join(names[1:])} (of several, the highest copy number is "
                 f"graded, the browser's newest download; a .py before an .ipynb). Upload one file to be sure.")
    return line


def _write_zero(results: Path, message: str) -> None:
    results.write_text(json.dumps({"score": 0, "output": message, "tests": []}, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> int:
    """python3 -m grader.bundle ROOT EXERCISE: what run_autograder runs. Exit 0 once results.json is written."""
    from grader.exercise import load_course

    try:
        root, name = argv
        run_submission(Path(root), load_course()[name])
    except Exception as error:  # one line for the log; run_autograder then writes the zero that says so
        print(f"run_autograder: {type(error).__name__}: {error}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
