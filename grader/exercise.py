"""Stage 1 of a grade: find the exercise a candidate file belongs to, and its manifest entry.

Nothing here imports torch: the command line resolves the exercise and starts the
worker before the grader pays for importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

GRADER_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = GRADER_DIR / "manifest.toml"
CHECKS_DIR = GRADER_DIR / "checks"
CANDIDATE_SUFFIXES = (".py", ".ipynb")  # a notebook's code cells are graded (grader/notebook.py)


class UsageError(Exception):
    """A mistake in how the grader was called: one line that says what to do (exit 2)."""


class GraderBug(Exception):
    """The grader itself failed: reported as an internal error (exit 3), never as the candidate's zero."""


@dataclass(frozen=True)
class Step:
    id: str
    title: str
    points: int
    hints: tuple[str, ...]
    forbidden: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exercise:
    name: str
    title: str
    file: str
    device_checks: bool
    steps: tuple[Step, ...]

    @property
    def max_score(self) -> int:
        return sum(step.points for step in self.steps)

    @property
    def checks_path(self) -> Path:
        return CHECKS_DIR / f"{self.name}.py"

    @property
    def stub_path(self) -> Path:
        return GRADER_DIR.parent / "exercises" / self.file

    @property
    def solution_module(self) -> str:
        return f"solutions.{self.name}"

    def step(self, step_id: str) -> Step:
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)


def load_manifest(path: Path = MANIFEST_PATH) -> dict[str, Exercise]:
    """Every exercise in the manifest, by name, in manifest order."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    exercises = {}
    for name, entry in data.items():
        steps = tuple(
            Step(
                id=s["id"],
                title=s["title"],
                points=int(s["points"]),
                hints=tuple(s["hints"]),
                forbidden=tuple(s.get("forbidden", ())),
            )
            for s in entry["steps"]
        )
        exercises[name] = Exercise(
            name=name,
            title=entry["title"],
            file=entry["file"],
            device_checks=bool(entry.get("device_checks", True)),
            steps=steps,
        )
    return exercises


def find_exercise(candidate: Path, name: str | None = None) -> Exercise:
    """The exercise for a candidate file: `name` if given, else the file's stem (mha.py is mha)."""
    if not candidate.exists():
        raise UsageError(f"no such file: {candidate}. Pass the path to your exercise file, e.g. exercises/mha.py.")
    if not candidate.is_file():
        raise UsageError(f"{candidate} is not a file. Pass the path to your exercise file, e.g. exercises/mha.py.")
    try:
        candidate.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {candidate}: {error.strerror}. Check its permissions.") from None
    if candidate.suffix not in CANDIDATE_SUFFIXES:
        raise UsageError(
            f"{candidate.name} is neither a Python file (.py) nor a Jupyter notebook (.ipynb). "
            f"Save your code as a .py file, e.g. mha.py, and grade that."
        )
    exercises = load_manifest()
    known = ", ".join(exercises)
    if name is not None:
        if name not in exercises:
            raise UsageError(f"unknown exercise '{name}' (known: {known}). Pick one with --exercise.")
        return exercises[name]
    if candidate.stem not in exercises:
        raise UsageError(
            f"cannot tell the exercise from the file name '{candidate.name}' (known: {known}). "
            f"Name the file after the exercise or pass --exercise NAME."
        )
    return exercises[candidate.stem]
