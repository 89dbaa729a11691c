"""Stage 5 of a grade: reports. Each format is a function from a Grade to text."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

import click

from grader.candidate import NOT_IMPORTED
from grader.score import CheckResult, Grade, StepResult

DEVICE_NOTE = {
    "cuda": "device checks ran on CUDA",
    "meta": "device checks ran on the meta device (no CUDA device here)",
    "cpu": "device checks ran on the CPU (--device cpu)",
    "none": "no device checks (the exercise declares none)",
}
UNKNOWN = "unknown (not graded in a workspace)"
NO_FS_ISOLATION = (
    "ran without file-system isolation: the candidate's code could read every file this user can "
    "(the portable sandbox, or a system that gave the worker no mount namespace; see docs/sandbox.md)"
)


def to_json(grade: Grade, verbose: bool = False) -> str:
    data = {
        "exercise": grade.exercise,
        "file": grade.file,
        "sha256": grade.sha256,
        "seed": grade.seed,
        "graded_at": grade.graded_at,
        "kit_version": grade.kit_version,
        "score": grade.score,
        "max_score": grade.max_score,
        "steps": [
            {
                "id": step.id,
                "title": step.title,
                "score": step.score,
                "max_score": step.max_score,
                **({"rule_broken": step.breach} if step.breach else {}),
                "checks": [_check_json(c, verbose) for c in step.checks],
            }
            for step in grade.steps
        ],
        "environment": grade.environment,
    }
    if verbose:
        data["candidate_output"] = grade.candidate_output
    return json.dumps(data, indent=2, ensure_ascii=False)


def _check_json(check, verbose: bool = False) -> dict:
    data = {
        "name": check.name,
        "outcome": check.outcome,
        "points": check.points,
        "max_points": check.max_points,
        "message": check.message,
    }
    if check.mistake_id:
        data["mistake"] = {"id": check.mistake_id, "message": check.mistake}
    if check.details:
        data["details"] = check.details
    if check.breach:
        data["rule_broken"] = True
    if check.end_to_end:
        data["end_to_end"] = True
    if check.charged_elsewhere:
        data["charged_elsewhere"] = list(check.charged_elsewhere)
    if verbose and check.output:
        data["output"] = check.output
    return data


def to_text(grade: Grade, verbose: bool = False) -> str:
    """A table of steps, the failed checks under each with their named mistake, then the total.

    Colour codes are added here; click.echo strips them when stdout is not a terminal.
    """
    env = grade.environment
    lines = [
        click.style(f"{grade.title} ({grade.exercise}): {grade.file}", bold=True),
        f"torch {env.get('torch', '?')}; {DEVICE_NOTE.get(env.get('device'), env.get('device'))}",
        *([click.style(NO_FS_ISOLATION, fg="yellow")] if env.get("fs_isolation") is False else []),
        *([click.style(_escape(env["file_error"]), fg="red")] if env.get("file_error") else []),
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
        lines += ["", "Everything the code printed, in order, each worker's import of the file included "
                  "(capped, escaped):", _escape(grade.candidate_output)]
    return "\n".join(lines)


def _mark(step: StepResult) -> tuple[str, str]:
    if step.score == step.max_score:
        return "✓", "green"
    return ("✗", "red") if step.score == 0 else ("~", "yellow")


def _details(step: StepResult, verbose: bool) -> list[str]:
    """Lines under a step: a broken rule first; then every check with -v, otherwise the lost ones, one line for
    each diagnosis: checks with the same named mistake (or, unnamed, the same message) are said once, with a count.
    """
    lines = []
    if step.breach:
        breach = f"      RULE BROKEN, the step earns nothing: {_escape(step.breach)}"
        lines.append(click.style(breach, fg="red", bold=True))
    for first, names in _groups(step, verbose):
        label = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
        tag = {"passed": "ok", "skipped": "skipped"}.get(first.outcome, first.outcome)
        text = f"      {tag} {label}" + (f": {_escape(first.message)}" if first.message else "")
        lines.append(click.style(text, fg=None if first.outcome in ("passed", "skipped") else "red"))
        if first.mistake:
            count = f" ({len(names)} checks)" if len(names) > 1 else ""
            lines.append(click.style(f"        → likely mistake{count}: {_escape(first.mistake)}", fg="yellow"))
        lines += ["        " + line for line in grid(first.details)]
        if verbose and first.output:  # -v: what the code printed while this check ran
            lines.append("        printed (escaped):")
            lines += ["        │ " + line for line in _escape(first.output.rstrip("\n")).split("\n")]
    return lines


def _groups(step: StepResult, verbose: bool = False) -> list[tuple[CheckResult, list[str]]]:
    """(the first check, the names of all) per diagnosis: one failure, one diagnosis."""
    groups: dict[tuple, tuple] = {}
    for check in step.checks:
        if not verbose and check.points == check.max_points:
            continue
        # unnamed: the same message, whatever inputs it was called with
        gist = re.sub(r" \[called with .*\]$", "", check.message)
        key = (check.name,) if verbose else (check.mistake_id,) if check.mistake_id else (check.outcome, gist)
        groups.setdefault(key, (check, []))[1].append(check.name)
    return list(groups.values())


GRID_SIZE = 12  # rows and columns shown at most
SHADES = " ░▒▓█"  # a weight of 0; about 0.25, 0.5, 0.75 (never 0 or 1); 1


def grid(details: dict) -> list[str]:
    """A mask or attention weights that came back, beside the expected ones, a row per query: for a mask a
    character per key (■ may attend, · blocked), for weights a shade per cell. [] when `details` hold no
    grid ({"grid": {"expected": [[...]], "got": [[...]]}}, 2-D lists of bools or numbers in [0, 1])."""
    found = details.get("grid") if isinstance(details, dict) else None
    sides = [found.get("expected"), found.get("got")] if isinstance(found, dict) else []
    if not sides or not all(_matrix(side) for side in sides):
        return []
    rows = max(len(side) for side in sides)
    cols = max(len(row) for side in sides for row in side)
    drawn = [["│" + "".join(_cell(v) for v in row[:GRID_SIZE]) + "│" for row in side[:GRID_SIZE]] for side in sides]
    width = max(len("expected"), min(cols, GRID_SIZE) + 2)
    lines = [f"{'expected':<{width}}  got"]
    for i in range(min(rows, GRID_SIZE)):
        left, right = (side[i] if i < len(side) else "" for side in drawn)
        lines.append(f"{left:<{width}}  {right}".rstrip())
    values = [v for side in sides for row in side for v in row]
    legend = ("■ may attend, · blocked" if all(isinstance(v, bool) for v in values)
              else f"shade by weight: '{SHADES[0]}' 0, {' '.join(SHADES[1:-1])} between, {SHADES[-1]} 1")
    cut = f"; first {GRID_SIZE} shown of {rows} × {cols}" if rows > GRID_SIZE or cols > GRID_SIZE else ""
    return lines + [f"({legend}; a row per query, a column per key{cut})"]


def _matrix(side) -> bool:
    return (isinstance(side, list) and len(side) > 0 and all(isinstance(row, list) for row in side)
            and all(isinstance(v, (bool, int, float, str)) for row in side for v in row))


def _cell(value) -> str:
    if isinstance(value, bool):
        return "■" if value else "·"
    if isinstance(value, str) or not math.isfinite(value):  # "nan", "inf", "-inf"
        return "?"
    if value <= 1e-6 or value >= 1 - 1e-6:  # 0 and 1 (as float32 rounds them) have shades of their own
        return SHADES[0] if value <= 1e-6 else SHADES[-1]
    return SHADES[min(max(round(value * (len(SHADES) - 1)), 1), len(SHADES) - 2)]


def _escape(text: str) -> str:
    """Show control characters (ANSI escapes included) as escapes, keep newlines."""
    return "\n".join("".join(c if c.isprintable() else repr(c)[1:-1] for c in line) for line in text.split("\n"))


def to_markdown(grade: Grade, progress=None) -> str:
    """A report to paste into an interview scorecard."""
    env = grade.environment
    lines = [
        f"# {grade.title} ({grade.exercise}): {grade.score}/{grade.max_score}",
        "",
        f"- File: `{grade.file.replace('`', chr(39))}` (sha256 `{grade.sha256[:16] or 'unknown'}`)",  # no ` ends it
        f"- Graded: {_utc(grade.graded_at)}",
        f"- torch {env.get('torch', '?')}; {DEVICE_NOTE.get(env.get('device'), env.get('device'))}",
        *([f"- **The whole file**: {markdown_text(env['file_error'])}"] if env.get("file_error") else []),
        "",
    ]
    green = progress.time_to_green(grade.exercise) if progress else {}
    lines += ["| Step | Score | Max | Time to green |", "| --- | ---: | ---: | ---: |"]
    for step in grade.steps:
        mark = _mark(step)[0]
        to_green = green.get(step.id) if step.score == step.max_score else None  # green once, failing now: none
        when = _duration(to_green) if progress else "unknown"
        lines.append(f"| {mark} `{step.id}` | {step.score} | {step.max_score} | {when} |")
    lines.append(f"| **Total** | **{grade.score}** | **{grade.max_score}** | |")
    if progress is None:  # nothing was recorded, which is not "none"
        lines += ["", f"Time to green: {UNKNOWN}."]
    broken = [s for s in grade.steps if s.breach]
    if broken:
        lines += ["", "## Rules broken", ""]
        lines += [f"- **`{s.id}` earns nothing**: {markdown_text(s.breach)}" for s in broken]
    if any(c.points < c.max_points for s in grade.steps for c in s.checks):
        lines += ["", "## Failed checks", ""]
        for step in grade.steps:
            for first, names in _groups(step):
                more = f" and {len(names) - 1} more" if len(names) > 1 else ""
                lines.append(f"- `{step.id}` / `{names[0]}`{more} ({first.outcome}): {markdown_text(first.message)}")
                if first.mistake:
                    count = f' ({len(names)} checks)' if len(names) > 1 else ''
                    lines.append(f"  - likely mistake{count}: {markdown_text(first.mistake)}")
                drawn = grid(first.details)
                if drawn:
                    lines += ["", "  ```text", *("  " + line for line in drawn), "  ```"]
    nothing = "- none recorded" if progress else f"- {UNKNOWN}"
    hints = progress.hints(grade.exercise) if progress else []
    lines += ["", "## Hints used", ""]
    lines += [f"- `{h['step']}` level {h['level']} at {h['at']}" for h in hints] or [nothing]
    seen = progress.solutions(grade.exercise) if progress else []
    lines += ["", "## Solutions viewed", ""]
    lines += [f"- {_solution(s['step'])} at {s['at']}" for s in seen] or [nothing]
    return "\n".join(lines) + "\n"


def _solution(step: str | None) -> str:
    return f"`{step}`" if step else "the whole model answer"


def to_junit(grade: Grade) -> str:
    """JUnit XML: a testsuite per step, a testcase per check; a broken rule is a failing testcase of its own."""
    broken = sum(1 for s in grade.steps if s.breach)
    file_error = grade.environment.get("file_error")
    suites = ET.Element("testsuites", name=f"attn-grade {grade.exercise}", tests=str(_count(grade) + broken),
                        failures=str(_count(grade, "failed") + broken), errors=str(_count(grade, "error")),
                        time=_seconds(sum(s.seconds for s in grade.steps)))
    for step in grade.steps:
        suite = ET.SubElement(
            suites, "testsuite", name=f"{grade.exercise}.{step.id}", tests=str(len(step.checks) + bool(step.breach)),
            failures=str(sum(c.outcome == "failed" for c in step.checks) + bool(step.breach)),
            errors=str(sum(c.outcome == "error" for c in step.checks)),
            skipped=str(sum(c.outcome == "skipped" for c in step.checks)), time=_seconds(step.seconds),
        )
        if step.breach:
            case = ET.SubElement(
                suite, "testcase", classname=f"{grade.exercise}.{step.id}", name="rule_broken", time="0"
            )
            message = f"RULE BROKEN, the step earns nothing: {step.breach}"
            ET.SubElement(case, "failure", message=_xml(message)).text = _xml(message)
        for check in step.checks:
            case = ET.SubElement(suite, "testcase", classname=f"{grade.exercise}.{step.id}", name=check.name,
                                 time=_seconds(check.seconds))
            text = check.message + (f"\nlikely mistake: {check.mistake}" if check.mistake else "")
            if check.outcome in ("failed", "error", "skipped"):
                tag = {"failed": "failure", "error": "error", "skipped": "skipped"}[check.outcome]
                message = check.message
                if file_error and check.outcome != "skipped":  # what stopped the whole file, in every case it cost
                    text = f"{file_error}\n{text}"
                    message += f"; {file_error}" if check.message == NOT_IMPORTED else ""
                ET.SubElement(case, tag, message=_xml(message)).text = _xml(text)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def to_gradescope(grade: Grade) -> str:
    """Gradescope's results.json: one test per step."""
    env = grade.environment
    problem = [_escape(env["file_error"])] if env.get("file_error") else []  # said in every test: each is read alone
    tests = [
        {
            "name": f"{step.id}: {step.title}",
            "score": step.score,
            "max_score": step.max_score,
            "status": "passed" if step.score == step.max_score else "failed",
            "output": click.unstyle("\n".join(problem + _details(step, verbose=False))).strip()
            or "All checks passed.",
            "visibility": "visible",
        }
        for step in grade.steps
    ]
    where = f"torch {env.get('torch')}; {DEVICE_NOTE.get(env.get('device'))}"
    output = "\n".join([f"{grade.title}: {grade.score}/{grade.max_score} ({where})", *problem])
    return json.dumps({"score": grade.score, "output": output, "tests": tests}, indent=2, ensure_ascii=False)


def to_github(grade: Grade) -> str:
    """The GitHub Classroom runner result (version 3): one test per step."""
    problem = [grade.environment["file_error"]] if grade.environment.get("file_error") else []
    tests = [
        {
            "name": step.id,
            "status": "pass" if step.score == step.max_score else "fail",
            "score": step.score,
            "max_score": step.max_score,
            "message": "; ".join(problem + ([f"RULE BROKEN: {step.breach}"] if step.breach else [])
                                 + [_plain(names, first.message, first.mistake) for first, names in _groups(step)])
            or None,
            "filename": grade.file,
            "line_no": 0,
            "duration": round(step.seconds, 3),  # seconds its checks ran
        }
        for step in grade.steps
    ]
    status = "pass" if grade.full_marks else "fail"
    return json.dumps({"version": 3, "status": status, "max_score": grade.max_score, "tests": tests}, indent=2)


FORMATS = ("text", "json", "markdown", "junit", "gradescope", "github", "html")


def render(fmt: str, grade: Grade, verbose: bool = False, progress=None) -> str:
    if fmt == "text":
        return to_text(grade, verbose)
    if fmt == "json":
        return to_json(grade, verbose)
    if fmt == "markdown":
        return to_markdown(grade, progress)
    if fmt == "html":  # a page with the pictures (grader/html.py), which reads this module
        from grader.html import to_html

        return to_html(grade, verbose)
    return {"junit": to_junit, "gradescope": to_gradescope, "github": to_github}[fmt](grade)


def _plain(names: list[str], message: str, mistake: str | None) -> str:
    label = names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")
    return f"{label}: {message}" + (f" (likely mistake: {mistake})" if mistake else "")


def _count(grade: Grade, outcome: str | None = None) -> int:
    return sum(1 for s in grade.steps for c in s.checks if outcome in (None, c.outcome))


def _utc(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if iso else "unknown"


def _seconds(seconds: float) -> str:
    return f"{seconds:.3f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def markdown_text(text: str) -> str:
    """The candidate's text in Markdown, one line, each character that makes markup mid-line escaped (the text never
    starts a line here, so `#`, `-` and `1.` make nothing; `_` inside a word, as in w_o, makes nothing either)."""
    return re.sub(r"([\\`*\[\]<>|~]|(?<!\w)_|_(?!\w))", r"\\\1", _escape(text)).replace("\n", " ")


def _xml(text: str) -> str:
    """XML 1.0 has no place for most control characters, surrogates, U+FFFE and U+FFFF: drop them."""
    return "".join(c for c in text if c in "\t\n\r" or 32 <= ord(c) < 0xD800 or 0xE000 <= ord(c) < 0xFFFE
                   or ord(c) >= 0x10000)
