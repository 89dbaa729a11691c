"""A candidate's workspace: fresh stubs, a step's stub or model answer, by step name.

A step is a top-level function or class of the exercise file; its source is found with
`ast`, never by running the file.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from grader.exercise import Exercise, UsageError
from grader.progress import Progress


def init(folder: Path, exercises: list[Exercise], force: bool = False) -> list[Path]:
    """Copy fresh stubs into `folder` and start its progress file; refuse to overwrite work without force."""
    folder.mkdir(parents=True, exist_ok=True)
    targets = [(e, folder / e.file) for e in exercises]
    changed = [t for e, t in targets if t.exists() and t.read_bytes() != e.stub_path.read_bytes()]
    if changed and not force:
        names = ", ".join(str(t) for t in changed)
        raise UsageError(f"{names} already has work in it; pass --force to replace it with a fresh stub.")
    progress = Progress.find(folder) or Progress(folder)
    for exercise, target in targets:
        shutil.copyfile(exercise.stub_path, target)
        progress.exercise(exercise.name)
    progress.save()
    return [t for _, t in targets]


def step_source(path: Path, step_id: str) -> str:
    """The source of the top-level function or class `step_id` in the file at `path`."""
    text = path.read_text(encoding="utf-8")
    node = _find(text, step_id, path)
    return "\n".join(text.splitlines()[_first_line(node) - 1 : node.end_lineno]) + "\n"


def reset_step(path: Path, stub: Path, step_id: str) -> None:
    """Put the stub's version of one step back into the candidate's file, leaving the rest as it is."""
    text = path.read_text(encoding="utf-8")
    try:
        node = _find(text, step_id, path)
    except UsageError:
        raise UsageError(f"{path} has no {step_id} to reset (it does not parse, or the step is gone); reset the whole file.")
    lines = text.splitlines()
    fresh = step_source(stub, step_id).rstrip("\n").splitlines()
    lines[_first_line(node) - 1 : node.end_lineno] = fresh
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _find(text: str, step_id: str, path: Path):
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise UsageError(f"{path} does not parse (line {error.lineno}): fix it or reset the whole file.") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == step_id:
            return node
    raise UsageError(f"{path} has no step {step_id}.")


def _first_line(node) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])
