"""Watch benchmark: the time from saving a file to `attn-grade watch` showing its new grade.

Goal (issue 8): a median regrade of at most 0.3 s on a 2-core machine. A candidate in the
drill loop edits one step and saves; watch reruns only the checks whose source changed
(that step's, and the module's, which depend on the whole file). So each round saves a
version never seen before: the reference with one step changed (a new line in its body,
rotating through the steps), and every fourth round a change outside every step, which
regrades everything. Saves are atomic (write, then rename), as editors do. The baseline in
the same run is `python -c "pass"`, the floor of any command.

    python bench/watch.py [--rounds 12]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("project", "split_heads", "attention_scores", "scale_scores", "apply_mask", "softmax", "weighted_sum",
         "merge_heads")


def next_total(process) -> None:
    while True:
        line = process.stdout.readline()
        if not line:
            sys.exit("watch stopped")
        if line.startswith("Total:"):
            return


def edited(reference: str, round_: int) -> tuple[str, str]:
    """The reference with one step's body changed (a new first line), or a change outside every step."""
    if round_ % 4 == 3:
        return reference + f"\nEDIT = {round_}  # outside every step: everything is regraded\n", "whole file"
    step = STEPS[round_ % len(STEPS)]
    match = re.search(rf'def {step}\(.*?\n    """.*?"""\n', reference, re.S)  # the signature and docstring
    return reference[: match.end()] + f"    _edit = {round_}\n" + reference[match.end():], step


def save(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    grader = shutil.which("attn-grade") or sys.exit("attn-grade is not on PATH: pip install -e . first")
    reference = (ROOT / "solutions" / "mha.py").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mha.py"
        save(path, reference)
        watcher = subprocess.Popen([grader, "watch", str(path)], stdout=subprocess.PIPE, text=True)
        next_total(watcher)
        one_step, whole = [], []
        for i in range(args.rounds):
            time.sleep(0.3)
            text, what = edited(reference, i)
            start = time.perf_counter()
            save(path, text)
            next_total(watcher)
            (whole if what == "whole file" else one_step).append(time.perf_counter() - start)
        watcher.terminate()
        watcher.wait()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"])
    floor = time.perf_counter() - start
    every = one_step + whole
    print(json.dumps({
        "rounds": args.rounds,
        "save_to_screen_median_s": round(statistics.median(every), 3),
        "one_step_edit_median_s": round(statistics.median(one_step), 3),
        "whole_file_regrade_median_s": round(statistics.median(whole), 3) if whole else None,
        "save_to_screen_max_s": round(max(every), 3),
        "python_startup_s": round(floor, 3),
        "goal_s": 0.3,
    }, indent=2))


if __name__ == "__main__":
    main()
