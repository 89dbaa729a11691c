"""Batch benchmark: `attn-grade batch` over 50 submissions, against the cold start of one grade.

The submissions mix the reference, the stubs and buggy files (one mistake each), like a
class's folder. The goal (issue 4): well under a minute on a 2-core machine. The baseline
in the same run is one cold `attn-grade solutions/mha.py`.

    python bench/batch.py [--files 50] [--jobs 2]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.exercises.mha.variants import BUGGY  # noqa: E402  (the same buggy files the tests use)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    grader = shutil.which("attn-grade") or sys.exit("attn-grade is not on PATH: pip install -e . first")
    reference = (ROOT / "solutions" / "mha.py").read_text()
    sources = [reference, (ROOT / "exercises" / "mha.py").read_text()]
    sources += [reference + "\n\n" + v.code for v in BUGGY]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.files):
            folder = Path(tmp) / f"student{i:03d}"
            folder.mkdir()
            (folder / "mha.py").write_text(sources[i % len(sources)])
        start = time.perf_counter()
        subprocess.run([grader, "solutions/mha.py"], cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
        one = time.perf_counter() - start
        start = time.perf_counter()
        done = subprocess.run([grader, "batch", tmp, "--jobs", str(args.jobs), "--output", f"{tmp}/results.csv"],
                              cwd=ROOT, capture_output=True, text=True)
        total = time.perf_counter() - start
        rows = (Path(tmp) / "results.csv").read_text().count("\n") - 1 if done.returncode == 0 else 0
    print(json.dumps({
        "files": args.files, "jobs": args.jobs, "rows": rows,
        "batch_s": round(total, 1), "per_file_s": round(total / args.files, 2),
        "one_cold_grade_s": round(one, 2), "batch_over_one_cold_grade": round(total / one, 1),
        "goal_s": 60,
    }, indent=2))


if __name__ == "__main__":
    main()
