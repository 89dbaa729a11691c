"""Stage 1 of a grade: find the exercise a candidate file belongs to, and its entry in the course (grader/course/).

Nothing here imports torch: the command line resolves the exercise and starts the
worker before the grader pays for importing torch.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

GRADER_DIR = Path(__file__).resolve().parent
COURSE_DIR = GRADER_DIR / "course"  # one folder per exercise, and course.toml: their order
ENGINE_DIR = GRADER_DIR / "engine"
CANDIDATE_SUFFIXES = (".py", ".ipynb")  # a notebook's code cells are graded (grader/notebook.py)


def linked(path: Path, folder: Path) -> bool:
    """Whether `path`, found under `folder`, is a link or lies in a linked folder: a submission's or a class's file
    that points elsewhere (at the kit's model answers, say) is not the student's work, and is never graded."""
    try:
        inside = path.resolve().relative_to(folder.resolve())
    except (OSError, ValueError):
        return True
    return inside != path.relative_to(folder)

# Names an exercise.toml's forbidden list may use for a list of torch's names. "library_attention": every fused
# attention torch has, CPU or CUDA, public or private (tests/test_rules.py lists torch's names to keep it whole).
LIBRARY_ATTENTION = ("scaled_dot_product", "multi_head_attention", "scaled_dot_attention", "transformer_encoder_layer",
                     "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention",
                     "_cudnn_attention", "fused_attention", "flex_attention")
NAMED_LISTS = {"library_attention": LIBRARY_ATTENTION}


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
    allowed: tuple[str, ...] | None = None  # with it, every torch call not named here is forbidden too


@dataclass(frozen=True)
class Exercise:
    name: str
    title: str
    file: str
    device_checks: bool
    steps: tuple[Step, ...]
    extends: str | None = None  # the exercise whose spec this one's reuses (mha_numpy reuses mha's steps)
    requires: tuple[str, ...] = ()  # modules it needs beyond the kit's own, each the name of the kit's extra for it

    @property
    def max_score(self) -> int:
        return sum(step.points for step in self.steps)

    @property
    def folder(self) -> Path:
        """Everything the grader hides about the exercise: exercise.toml, spec.py, contract.md, stand-ins."""
        return COURSE_DIR / self.name

    @property
    def checks_path(self) -> Path:
        return self.folder / "spec.py"

    @property
    def spec_module(self) -> str:
        return f"grader.course.{self.name}.spec"

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


def course_order(course: Path = COURSE_DIR) -> list[str]:
    """The exercises' names, in course order (course.toml)."""
    return list(tomllib.loads((course / "course.toml").read_text(encoding="utf-8"))["order"])


def load_course(course: Path = COURSE_DIR) -> dict[str, Exercise]:
    """Every exercise of the course, by name, in course order: each one's exercise.toml."""
    return dict(_course(course))  # a dict of its own for each caller; the exercises are frozen


@functools.cache  # the kit's own files, read once a process: a batch or watch asks at every grade
def _course(course: Path) -> dict[str, Exercise]:
    exercises = {}
    for name in course_order(course):
        entry = tomllib.loads((course / name / "exercise.toml").read_text(encoding="utf-8"))
        steps = tuple(
            Step(
                id=s["id"],
                title=s["title"],
                points=int(s["points"]),
                hints=tuple(s["hints"]),
                forbidden=tuple(n for name in s.get("forbidden", ()) for n in NAMED_LISTS.get(name, (name,))),
                allowed=tuple(s["allowed"]) if "allowed" in s else None,
            )
            for s in entry["steps"]
        )
        exercises[name] = Exercise(
            name=name,
            title=entry["title"],
            file=entry["file"],
            device_checks=bool(entry.get("device_checks", True)),
            steps=steps,
            extends=entry.get("extends"),
            requires=tuple(entry.get("requires", ())),
        )
    return exercises


def check_requirements(exercise: Exercise) -> None:
    """A usage error that says how to install what the exercise needs beyond the kit (triton_attention: Triton).

    Asked before the worker starts: without it the candidate's file would fail to import and score 0.
    """
    for module in exercise.requires:
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"{exercise.name} needs {module.capitalize()}: pip install 'attn-grade[{module}]'")


def find_exercise(candidate: Path, name: str | None = None) -> Exercise:
    """The exercise for a candidate file: `name` if given, else the file's stem (mha.py is mha)."""
    if not candidate.exists():
        raise UsageError(f"no such file: {candidate}. Pass the path to your exercise file, e.g. exercises/mha.py.")
    if not candidate.is_file():
        raise UsageError(f"{candidate} is not a file. Pass the path to your exercise file, e.g. exercises/mha.py.")
    try:  # readable: one byte, not the whole of it (a sparse file of 2 GB filled the memory: review 54's F5)
        with open(candidate, "rb") as opened:
            opened.read(1)
    except OSError as error:
        raise UsageError(f"cannot read {candidate}: {error.strerror}. Check its permissions.") from None
    if candidate.suffix not in CANDIDATE_SUFFIXES:
        raise UsageError(
            f"{candidate.name} is neither a Python file (.py) nor a Jupyter notebook (.ipynb). "
            f"Save your code as a .py file, e.g. mha.py, and grade that."
        )
    exercises = load_course()
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
