"""Two checkouts' cold grades of one reference, alternately, beside `python -c "import torch"`.

Each round times a cold `attn-grade solutions/NAME.py` from the other checkout (a `git worktree` of the commit to
compare with), one from this one, and `import torch`, each a fresh process, so the two ratios share the machine's
noise. Both run with this checkout's Python and packages.

    git worktree add ../before COMMIT
    python bench/versus.py ../before --file solutions/flash_attention.py [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the grader of the checkout the command runs in, whatever the installed package points at
GRADE = ("import sys; sys.path.insert(0, '.'); from grader.cli import entry; sys.argv[0] = 'attn-grade'; "
         "sys.exit(entry())")


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} in {cwd} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (a git worktree)")
    parser.add_argument("--file", default="solutions/mha.py")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    commands = {"other": ([sys.executable, "-c", GRADE, args.file], args.other.resolve()),
                "this": ([sys.executable, "-c", GRADE, args.file], ROOT),
                "import_torch": ([sys.executable, "-c", "import torch"], ROOT)}
    for command, cwd in commands.values():  # warm the page cache; not counted
        timed(command, cwd)
    times = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, (command, cwd) in commands.items():
            times[name].append(timed(command, cwd))
    medians = {name: statistics.median(t) for name, t in times.items()}
    result = {"file": args.file, "rounds": args.rounds, **{f"{n}_median_s": round(m, 3) for n, m in medians.items()},
              "ratio_other": round(medians["other"] / medians["import_torch"], 3),
              "ratio_this": round(medians["this"] / medians["import_torch"], 3)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
