"""GPU benchmark: every exercise's reference graded with `--device cuda` and with `--device cpu`, side by side.

Each grade is a fresh `attn-grade solutions/NAME.py --format json` process; the table gives its wall
time and score on each device (the score must be 100 on both) and the ratio. With `--device cuda` the
device checks run on CUDA, and triton_attention's kernels are compiled (its speed check runs); with
`--device cpu` everything runs on the CPU, triton_attention's kernels in Triton's interpreter. Without
a CUDA device torch can see it says so and exits 1.

    python bench/gpu.py [--exercise NAME ...] [--repeats 1]
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
sys.path.insert(0, str(ROOT))

from grader.exercise import course_order  # noqa: E402


def cuda_available() -> bool:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True)
    return done.stdout.strip() == "True"


def timed_grade(grader: str, name: str, device: str) -> tuple[float, int | None, str]:
    """Seconds, score (None if no report came back) and the first line of what went wrong, if anything."""
    start = time.perf_counter()
    done = subprocess.run([grader, f"solutions/{name}.py", "--device", device, "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    try:
        score = json.loads(done.stdout)["score"]
    except (ValueError, KeyError, TypeError):
        return seconds, None, (done.stderr.strip().splitlines() or ["no report"])[-1]
    return seconds, score, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercise", action="append", help="only these exercises (default: the whole course)")
    parser.add_argument("--repeats", type=int, default=1, help="grades per exercise and device; the median is shown")
    args = parser.parse_args()
    grader = shutil.which("attn-grade") or sys.exit("attn-grade is not on PATH: pip install -e . first")
    if not cuda_available():
        sys.exit("bench/gpu.py needs a CUDA device that torch can see (torch.cuda.is_available() is False here): "
                 "run it on a GPU machine with a CUDA build of torch")
    names = args.exercise or course_order()
    rows, problems = [], []
    for name in names:
        results = {}
        for device in ("cuda", "cpu"):
            runs = [timed_grade(grader, name, device) for _ in range(args.repeats)]
            results[device] = (statistics.median(r[0] for r in runs), runs[-1][1])
            problems += [f"{name} --device {device}: {r[2] or f'scored {r[1]}'}" for r in runs
                         if r[1] != 100]
        (cuda_s, cuda_score), (cpu_s, cpu_score) = results["cuda"], results["cpu"]
        rows.append((name, cuda_s, cuda_score, cpu_s, cpu_score, cuda_s / cpu_s))
    width = max(len(r[0]) for r in rows)
    print(f"{'exercise':<{width}}  {'cuda s':>7} {'score':>5}  {'cpu s':>7} {'score':>5}  {'cuda/cpu':>8}")
    for name, cuda_s, cuda_score, cpu_s, cpu_score, ratio in rows:
        print(f"{name:<{width}}  {cuda_s:>7.2f} {cuda_score!s:>5}  {cpu_s:>7.2f} {cpu_score!s:>5}  {ratio:>8.2f}")
    for problem in problems:
        print(f"not 100: {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
