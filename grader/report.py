"""Stage 5 of a grade: reports. Each format is a function from a Grade to text."""

from __future__ import annotations

import json

import click

from grader.score import Grade, StepResult

DEVICE_NOTE = {
    "cuda": "device checks ran on CUDA",
    "meta": "device checks ran on the meta device (no CUDA device here)",
    "cpu": "device checks ran on the CPU (--device cpu)",
    "none": "no device checks (a NumPy exercise)",
}


def to_json(grade: Grade, verbose: bool = False) -> str:
    data = {
        "exercise": grade.exercise,
        "file": grade.file,
        "score": grade.score,
        "max_score": grade.max_score,
        "steps": [
            {
                "id": step.id,
                "title": step.title,
                "score": step.score,
                "max_score": step.max_score,
                "checks": [_check_json(c) for c in step.checks],
            }
            for step in grade.steps
        ],
        "environment": grade.environment,
    }
    if verbose:
        data["candidate_output"] = grade.candidate_output
    return json.dumps(data, indent=2, ensure_ascii=False)


def _check_json(check) -> dict:
    data = {
        "name": check.name,
        "outcome": check.outcome,
        "points": check.points,
        "max_points": check.max_points,
        "message": check.message,
    }
    if check.mistake_id:
        data["mistake"] = {"id": check.mistake_id, "message": check.mistake}
    return data


def to_text(grade: Grade, verbose: bool = False) -> str:
    """A table of steps, the failed checks under each with their named mistake, then the total.

    Colour codes are added here; click.echo strips them when stdout is not a terminal.
    """
    env = grade.environment
    lines = [
        click.style(f"{grade.title} ({grade.exercise}): {grade.file}", bold=True),
        f"torch {env.get('torch', '?')}; {DEVICE_NOTE.get(env.get('device'), env.get('device'))}",
        "",
    ]
    width = max(len(s.id) for s in grade.steps)
    for step in grade.steps:
        mark, colour = _mark(step)
        lines.append(
            f"  {click.style(mark, fg=colour)} {step.id:<{width}}  {step.score:>3}/{step.max_score:<3} {step.title}"
        )
        lines.extend(_details(step, verbose))
    lines += ["", click.style(f"Total: {grade.score}/{grade.max_score}", bold=True)]
    if verbose and grade.candidate_output:
        lines += ["", "Candidate output (capped, escaped):", _escape(grade.candidate_output)]
    return "\n".join(lines)


def _mark(step: StepResult) -> tuple[str, str]:
    if step.score == step.max_score:
        return "✓", "green"
    return ("✗", "red") if step.score == 0 else ("~", "yellow")


def _details(step: StepResult, verbose: bool) -> list[str]:
    """Lines under a step: every check with -v; otherwise the lost ones, same message said once."""
    groups: dict[tuple, list[str]] = {}  # (outcome, message, mistake) -> check names; with -v one per check
    for check in step.checks:
        if not verbose and check.points == check.max_points:
            continue
        key = (check.outcome, check.message, check.mistake) + ((check.name,) if verbose else ())
        groups.setdefault(key, []).append(check.name)
    lines = []
    for (outcome, message, mistake, *_), names in groups.items():
        label = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
        tag = {"passed": "ok", "skipped": "skipped"}.get(outcome, outcome)
        text = f"      {tag} {label}" + (f": {_escape(message)}" if message else "")
        lines.append(click.style(text, fg=None if outcome in ("passed", "skipped") else "red"))
        if mistake:
            lines.append(click.style(f"        → likely mistake: {_escape(mistake)}", fg="yellow"))
    return lines


def _escape(text: str) -> str:
    """Show control characters (ANSI escapes included) as escapes, keep newlines."""
    return "\n".join("".join(c if c.isprintable() else repr(c)[1:-1] for c in line) for line in text.split("\n"))
