"""Cold-start benchmark: `attn-grade solutions/mha.py` against a bare `python -c "import torch"`.

Both are timed in the same run, alternating, each a fresh process, so the ratio holds on
a noisy machine. The goal (issue 8): a median ratio of at most 1.3.

A second baseline, `import torch` with the garbage collector off, is timed beside them: the
grader imports torch that way (grader/grade.py), so this ratio says what is left once that
saving is taken out of the comparison.

    python bench/cold_start.py [--rounds 7] [--file solutions/mha.py] [-- extra attn-grade args]
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--file", default="solutions/mha.py")
    parser.add_argument("extra", nargs="*", help="extra arguments for attn-grade")
    args = parser.parse_args()
    grader = shutil.which("attn-grade") or sys.exit("attn-grade is not on PATH: pip install -e . first")

    baseline_cmd = [sys.executable, "-c", "import torch"]
    no_gc_cmd = [sys.executable, "-c", "import gc; gc.disable(); import torch"]
    grade_cmd = [grader, args.file, *args.extra]
    timed(baseline_cmd), timed(grade_cmd)  # warm the page cache; not counted
    baseline, no_gc, grade = [], [], []
    for _ in range(args.rounds):
        baseline.append(timed(baseline_cmd))
        grade.append(timed(grade_cmd))
        no_gc.append(timed(no_gc_cmd))
    ratios = [g / b for g, b in zip(grade, baseline, strict=True)]
    result = {
        "command": " ".join(["attn-grade", args.file, *args.extra]),
        "rounds": args.rounds,
        "import_torch_median_s": round(statistics.median(baseline), 3),
        "grade_median_s": round(statistics.median(grade), 3),
        "ratio_of_medians": round(statistics.median(grade) / statistics.median(baseline), 3),
        "ratio_per_round_median": round(statistics.median(ratios), 3),
        "goal": 1.3,
        "import_torch_without_gc_median_s": round(statistics.median(no_gc), 3),
        "ratio_to_import_torch_without_gc": round(statistics.median(grade) / statistics.median(no_gc), 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
