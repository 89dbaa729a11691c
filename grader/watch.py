"""Grade a file on every save, with a warm zygote so a regrade costs only the checks.

The file is polled (every 20 ms) rather than watched through an OS API: no extra
dependency, and editors that save by rename are seen the same way.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from grader.candidate import Zygote
from grader.exercise import UsageError
from grader.grade import grade
from grader.progress import Progress
from grader.report import to_text

POLL_SECONDS = 0.02


def watch(path: Path, options: dict, rounds: int | None = None) -> None:
    """Regrade `path` whenever it changes, until Ctrl-C (or `rounds` grades, for tests)."""
    on_terminal = click.get_text_stream("stdout").isatty()
    zygote = Zygote(warm_device=options.get("device") != "cpu")
    cache: dict = {}  # checks whose step did not change are not run again
    seen, graded = None, 0
    try:
        while rounds is None or graded < rounds:
            try:
                stamp = path.stat().st_mtime_ns, path.stat().st_size
            except OSError:
                stamp = None
            if stamp is not None and stamp != seen:
                seen = stamp
                started = time.monotonic()
                try:
                    result = grade(path, zygote=zygote, cache=cache, **options)
                except UsageError as error:
                    click.echo(f"attn-grade: {error}", err=True)
                else:
                    progress = Progress.find(path.parent)
                    if progress:
                        progress.record_grade(result)
                        progress.save()
                    if on_terminal:
                        click.clear()
                    click.echo(_screen(result, time.monotonic() - started))
                graded += 1
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        click.echo("\nStopped watching.")
    finally:
        zygote.close()


def _screen(result, seconds: float) -> str:
    """The step table (no check details) and the first failing message."""
    table = to_text(result).split("\n")
    rows = [line for line in table if not click.unstyle(line).startswith("      ")]
    first = next(
        ((s, c) for s in result.steps for c in s.checks if c.points < c.max_points), None
    ) if not result.environment.get("file_error") else None  # the table's head says it once for the file
    lines = rows[:-1]
    if first:
        step, check = first
        lines += ["First failing check:", f"  {step.id}/{check.name}: {check.message}"]
        if check.mistake:
            lines.append(f"  → likely mistake: {check.mistake}")
        lines.append("")
    lines.append(f"{rows[-1]}   (graded in {seconds:.2f} s; save to regrade, Ctrl-C to stop)")
    return "\n".join(lines)
