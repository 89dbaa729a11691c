"""The catalogue of named mistakes: every exercise's own, by step, and the general ones.

Read from the same declarations the checks run from (grader/course/NAME/spec.py and
grader/engine/diagnose.py), so `attn-grade mistakes`, the generated docs (grader/docs.py)
and the grader can never disagree. Each entry has its message ("what is wrong: how to fix
it", what the reports show) and its why, the reasoning the message has no room for
(`attn-grade mistakes --why` shows it under the message).
"""

from __future__ import annotations

import importlib
import textwrap
from dataclasses import dataclass

WHY_WIDTH = 100  # a why is wrapped to this many characters, under its message


@dataclass(frozen=True)
class Entry:
    exercise: str  # "" for the general mistakes
    step: str
    id: str
    message: str
    recognised_by: str
    why: str = ""


def exercise_mistakes(exercise: str) -> list[Entry]:
    """An exercise's own named mistakes, in step order, each once."""
    spec = importlib.import_module(f"grader.course.{exercise}.spec").SPEC
    entries, seen = [], set()
    for step in spec.steps:
        located = {c.situation.id: f"its check {c.name} failing while the plain case passes"
                   for c in step.checks if c.situation is not None}
        located.update({m.id: f"the parts {', '.join(right)} right, the others wrong" for right, m in step.parts})
        located.update({p.mistake.id: f"the simpler case {p.params} right while the plain case fails"
                        for p in step.probes})
        for m in step.named:
            if m.id not in seen:
                seen.add(m.id)
                way = m.recognised_by
                if m.id in located and way == "its own check":
                    way = located[m.id]
                entries.append(Entry(exercise, step.id, m.id, m.message, way, m.why))
    return entries


def gated_checks(exercise: str, where: str) -> dict[str, list[str]]:
    """Step id -> its checks gated `where` (ALWAYS or ON_META, grader/engine/spec.py): those that earn their points
    only beside a right answer (grader/score.py)."""
    spec = importlib.import_module(f"grader.course.{exercise}.spec").SPEC
    found = {step.id: [c.name for c in step.checks if c.gated == where] for step in spec.steps}
    return {step: names for step, names in found.items() if names}


def general_mistakes() -> list[Entry]:
    """The mistakes any step of any exercise can show (an exception, a dtype, a shape, a device)."""
    from grader.engine.diagnose import CATALOGUE

    return [Entry("", "any", m.id, m.message, m.recognised_by, m.why) for m in CATALOGUE]


def all_ids(exercise: str) -> set[str]:
    return {e.id for e in exercise_mistakes(exercise)} | {e.id for e in general_mistakes()}


def to_text(exercises: list[str], why: bool = False) -> str:
    """The catalogue as `attn-grade mistakes` prints it; with `why`, each mistake's why under its message."""
    lines = []
    for name in exercises:
        entries = exercise_mistakes(name)
        lines.append(f"{name}: {len(entries)} named mistakes of its own")
        step = None
        for entry in entries:
            if entry.step != step:
                step = entry.step
                lines.append(f"  {step}")
            lines.append(f"    {entry.id}: {entry.message}")
            lines += _why(entry, why, "        ")
        lines.append("")
    general = general_mistakes()
    lines.append(f"every exercise: {len(general)} general mistakes")
    for entry in general:
        lines.append(f"    {entry.id}: {entry.message} (from {entry.recognised_by})")
        lines += _why(entry, why, "        ")
    return "\n".join(lines)


def _why(entry: Entry, shown: bool, indent: str) -> list[str]:
    if not (shown and entry.why):
        return []
    return textwrap.wrap(f"why: {entry.why}", WHY_WIDTH, initial_indent=indent, subsequent_indent=indent + "     ",
                         break_long_words=False, break_on_hyphens=False)
