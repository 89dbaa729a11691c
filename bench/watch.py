"""Watch benchmark: the time from saving a file to `attn-grade watch` showing its new grade.

Goal (issue 4): within half a second of the save on a 2-core machine. Each round saves
a different version (reference, one buggy step, the stub) and times the screen's total
line; the baseline in the same run is `python -c "pass"`, the floor of any command.

    python bench/watch.py [--rounds 10]
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def next_total(process) -> None:
    while True:
        line = process.stdout.readline()
        if not line:
            sys.exit("watch stopped")
        if line.startswith("Total:"):
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    grader = shutil.which("attn-grade") or sys.exit("attn-grade is not on PATH: pip install -e . first")
    reference = (ROOT / "solutions" / "mha.py").read_text()
    versions = [reference, reference + "\ndef scale_scores(scores, head_dim):\n    return scores\n",
                (ROOT / "exercises" / "mha.py").read_text()]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mha.py"
        path.write_text(versions[-1])
        watcher = subprocess.Popen([grader, "watch", str(path)], stdout=subprocess.PIPE, text=True)
        next_total(watcher)
        latencies = []
        for i in range(args.rounds):
            time.sleep(0.3)
            start = time.perf_counter()
            path.write_text(versions[i % len(versions)])
            next_total(watcher)
            latencies.append(time.perf_counter() - start)
        watcher.terminate()
        watcher.wait()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"])
    floor = time.perf_counter() - start
    print(json.dumps({
        "rounds": args.rounds,
        "save_to_screen_median_s": round(statistics.median(latencies), 3),
        "save_to_screen_max_s": round(max(latencies), 3),
        "python_startup_s": round(floor, 3),
        "goal_s": 0.5,
    }, indent=2))


if __name__ == "__main__":
    main()
