"""The command line: parse arguments, call the library, print, exit with a well-defined code.

Exit codes: 0 every step has full marks; 1 a point was lost; 2 a usage error (a one-line
message on stderr says what to do); 3 an internal error of the grader's; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

import click

from grader import workspace
from grader.candidate import DEFAULT_FILE_TIMEOUT, DEFAULT_MEMORY_LIMIT_MB, DEFAULT_TIMEOUT
from grader.exercise import UsageError, find_exercise, load_course
from grader.progress import Progress
from grader.report import FORMATS, render

EXIT_FULL_MARKS, EXIT_POINTS_LOST, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
INTERRUPTED = "attn-grade: interrupted (Ctrl-C); run the command again to finish it."
BUG_REPORT = "This is a bug in attn-grade, not in your code: please report it with the output above."
DEPENDENCIES = ("torch", "numpy", "pytest", "pytest_timeout")  # pyproject.toml's, which grading imports late
GRADING_COMMANDS = ("grade", "watch", "interview", "batch")  # they run candidate code (see `resolve_command`)


class DefaultGroup(click.Group):
    """`attn-grade FILE` means `attn-grade grade FILE`: a first argument that is no command is a file."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["grade", *args]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        """A command that runs candidate code, where none can run (Windows without WSL): one line, exit 2."""
        name, command, rest = super().resolve_command(ctx, args)
        if name in GRADING_COMMANDS:
            from grader.pool import cannot_grade_here

            problem = cannot_grade_here()
            if problem:
                raise click.UsageError(problem)
        return name, command, rest

    def main(self, args=None, prog_name="attn-grade", **extra):
        """Run a command; a usage error is one line on stderr and exit 2, Ctrl-C one line and exit 130."""
        try:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError:
            click.echo("attn-grade: give a file to grade (attn-grade exercises/mha.py) or a command; "
                       "attn-grade --help lists them.", err=True)
            sys.exit(EXIT_USAGE)
        except click.UsageError as error:
            click.echo(f"attn-grade: {error.format_message()}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort as abort:  # a declined confirmation, or Ctrl-C (at a prompt or mid-command)
            if isinstance(abort.__cause__ or abort.__context__, KeyboardInterrupt):
                if abort.__cause__ is None:  # at a prompt: click has not ended the line of its ^C
                    click.echo(err=True)
                raise KeyboardInterrupt from None  # entry: one line and exit 130
            click.echo("Aborted.", err=True)
            sys.exit(EXIT_POINTS_LOST)


def _show_version(ctx, _param, value) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_line())
        ctx.exit()


def version_line() -> str:
    """attn-grade's version, torch's and Python's: torch's read from its installed metadata, never imported."""
    import importlib.metadata
    import platform

    from grader.grade import kit_version

    try:
        torch = f"torch {importlib.metadata.version('torch')}"
    except importlib.metadata.PackageNotFoundError:
        torch = "torch not installed"
    return f"attn-grade {kit_version()} ({torch}, Python {platform.python_version()})"


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show attn-grade's version, torch's and Python's, and exit.")
def main() -> None:
    """Grade your attention exercises step by step: attn-grade exercises/mha.py"""


RUN_OPTIONS = [
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                 help="Where the device checks run: auto is CUDA if present, else the meta device."),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of the grader's random inputs."),
    click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT, show_default=True,
                 help="Seconds one call into the candidate's code may take before it is killed."),
    click.option("--file-timeout", "file_timeout", type=click.FloatRange(min=0.1), default=DEFAULT_FILE_TIMEOUT,
                 show_default=True, help="Seconds all the calls into one file may take together."),
    click.option("--memory-limit", "memory_limit_mb", type=click.IntRange(min=0), default=DEFAULT_MEMORY_LIMIT_MB,
                 show_default=True, metavar="MB",
                 help="Memory cap of the process running the candidate's code (0: none)."),
]
GRADE_OPTIONS = [
    *RUN_OPTIONS,
    click.option("--exercise", metavar="NAME",
                 help="Which exercise the file is (default: from its name, mha.py is mha)."),
]


def grade_options(command):
    for option in reversed(GRADE_OPTIONS):
        command = option(command)
    return command


def run_options(command):
    """The grading options but --exercise, for commands that name the exercise themselves."""
    for option in reversed(RUN_OPTIONS):
        command = option(command)
    return command


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@grade_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True, help="Report format.")
@click.option("--output", type=click.Path(dir_okay=False, writable=True),
              help="Write the report to this file, not stdout.")
@click.option("-v", "--verbose", is_flag=True,
              help="Show every check, and under each what the code printed while it ran.")
def grade(file, fmt, output, verbose, **options) -> None:
    """Grade FILE and report a score for every step."""
    from grader.grade import grade as run_grade  # imported here: `attn-grade --help` stays instant

    result = _run(run_grade, file, **options)
    progress = _run(workspace.record_grade, Path(file), result)
    text = render(fmt, result, verbose, progress)
    if output:
        _write(output, click.unstyle(text) if text.endswith("\n") else click.unstyle(text) + "\n")
    else:
        click.echo(text)
    sys.exit(EXIT_FULL_MARKS if result.full_marks else EXIT_POINTS_LOST)


@main.command(name="list")
@click.option("--workspace", "folder", type=click.Path(file_okay=False), default=".", show_default=True,
              help="The folder whose progress to show.")
def list_(folder) -> None:
    """List the exercises with their steps, points and, in a workspace, the best score so far."""
    progress = Progress.find(Path(folder))
    exercises = list(load_course().values())
    steps = [(e, s) for e in exercises for s in e.steps]

    def best(exercise, step) -> str:  # "" outside a workspace, "–" for a step not graded yet
        found = progress.best(exercise.name, step.id) if progress else None
        return "" if progress is None else "–" if found is None else str(found)

    id_width = max(len(s.id) for _, s in steps)
    best_width = max(len(best(e, s)) for e, s in steps)
    points_width = max(len(str(s.points)) for _, s in steps)
    for exercise in exercises:
        scores = [progress.best(exercise.name, s.id) for s in exercise.steps] if progress else []
        seen = any(b is not None for b in scores)
        total = f"  best {sum(b or 0 for b in scores)}/{exercise.max_score}" if seen else ""
        title = f"{exercise.name}: {exercise.title} ({exercise.file}, {exercise.max_score} points){total}"
        click.echo(click.style(title, bold=True))
        for step in exercise.steps:
            if progress:
                score = f"{best(exercise, step):>{best_width}}/{step.points:<{points_width}}"
            else:
                score = f"{step.points:>{points_width}}"
            click.echo(f"  {step.id:<{id_width}}  {score}  {step.title}")


@main.command()
@click.argument("exercise", required=False)
@click.option("--why", is_flag=True, help="Show under each message its why: the reasoning behind the fix.")
def mistakes(exercise, why) -> None:
    """List the named mistakes the grader recognises: an exercise's own, by step, and the general ones.

    Each says what is wrong and how to fix it, as a report shows it; --why adds the reasoning behind the fix.
    """
    from grader import catalogue

    click.echo(catalogue.to_text([e.name for e in _exercises(exercise)], why=why))


@main.command()
@click.argument("folder", type=click.Path(file_okay=False), default=".")
@click.option("--exercise", metavar="NAME", help="Copy only this exercise's stub (default: all).")
@click.option("--force", is_flag=True,
              help="Replace files that already hold work; each is kept in FILE.bak-YYYYmmdd-HHMMSS beside it.")
@click.option("--notebook", is_flag=True,
              help="Write practice notebooks (NAME.ipynb: a cell per step, a check after each), not .py stubs.")
def init(folder, exercise, force, notebook) -> None:
    """Copy fresh stubs into FOLDER (default: here) and start tracking progress there."""
    if notebook:
        from grader import notebook as notebook_

        written = _run(notebook_.init, Path(folder), _exercises(exercise), force)
    else:
        written = _run(workspace.init, Path(folder), _exercises(exercise), force)
    for path, backup in written:
        click.echo(f"wrote {path}" + (f"; your version is in {backup}" if backup else ""))
    into = "" if Path(folder).resolve() == Path.cwd() else f"cd {folder} && "  # hint and list read the workspace here
    if notebook:  # the kernel needs the notebook extra: pip install "attn-grade[notebook]"
        click.echo(f"Next: {into}jupyter lab {written[0][0].name} (run its cells in order)")
    else:
        click.echo(f"Next: {into}attn-grade watch {written[0][0].name}")


@main.command()
@click.argument("exercise")
@click.argument("step", required=False)
@click.option("--level", type=click.IntRange(min=1), metavar="N",
              help="1 the idea, 2 the plan, 3 code (default: the next level not seen in the workspace).")
@click.option("--workspace", "folder", type=click.Path(file_okay=False), default=".", show_default=True,
              help="The workspace that records hints used.")
def hint(exercise, step, level, folder) -> None:
    """Show the next hint for one STEP of EXERCISE (1 the idea, 2 the plan, 3 code); without STEP, list
    the steps with their hint levels and those seen. Past the last level: where the model answer is."""
    from grader.progress import hint_line, next_hint_level, no_more_hints

    progress = Progress.find(Path(folder))
    if step is None:
        found = _exercises(exercise)[0]
        width = max(len(s.id) for s in found.steps)
        click.echo(f"{exercise}: hints by step, 1 the idea, 2 the plan, 3 code. Next: attn-grade hint {exercise} STEP")
        for s in found.steps:
            levels = progress.hint_levels(exercise, s.id) if progress else None
            seen = "" if levels is None else "  seen " + (", ".join(map(str, levels)) or "none")
            click.echo(f"  {s.id:<{width}}  {len(s.hints)} levels{seen}")
        if progress is None:
            click.echo(f"(hints seen are unknown: {folder} is no attn-grade workspace; pass --workspace DIR)",
                       err=True)
        return
    found = _step(exercise, step)
    count = len(found.hints)
    if level is not None and level > count:
        raise click.UsageError(f"{step} has {count} hint levels; pass --level 1 to {count}, "
                               f"or see the model answer: attn-grade solution {exercise} {step}")
    if level is None:
        level = next_hint_level(progress.hint_levels(exercise, step) if progress else (), count)
        if level is None:  # every level seen: the model answer is next, and nothing more is recorded
            click.echo(no_more_hints(exercise, step, count))
            return
    click.echo(hint_line(exercise, step, found.hints, level))
    if progress:
        if progress.record_hint(exercise, step, level):
            progress.save()
    elif level < count:
        click.echo(f"(not recorded: {folder} is no attn-grade workspace; --level {level + 1} shows the next hint)",
                   err=True)
    else:
        _not_recorded(folder)


@main.command()
@click.argument("exercise")
@click.argument("step", required=False)
@click.option("--yes", is_flag=True, help="Show it without asking.")
@click.option("--workspace", "folder", type=click.Path(file_okay=False), default=".", show_default=True,
              help="The workspace whose progress tells whether you solved the step.")
def solution(exercise, step, yes, folder) -> None:
    """Show the model answer for SPEC, or one STEP of it."""
    found = _exercises(exercise)[0]
    steps = [_step(exercise, step)] if step else list(found.steps)
    progress = Progress.find(Path(folder))
    solved = progress is not None and all(progress.full_marks(exercise, s.id) for s in steps)
    if not (yes or solved):
        what = f"the model answer for {exercise}/{step}" if step else f"the whole model answer for {exercise}"
        click.confirm(f"Show {what}? Trying first teaches more", abort=True, err=True)
    reference = found.stub_path.parent.parent / "solutions" / found.file
    click.echo(workspace.step_source(reference, step) if step else reference.read_text(encoding="utf-8"))
    if progress:
        progress.record_solution(exercise, step)
        progress.save()
    else:
        _not_recorded(folder)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--step", metavar="STEP", help="Reset only this step (default: the whole file).")
@click.option("--exercise", metavar="NAME", help="Which exercise the file is (default: from its name).")
@click.option("--yes", is_flag=True, help="Reset without asking.")
def reset(file, step, exercise, yes) -> None:
    """Put a fresh stub back into FILE (or only one STEP of it); your version is kept in a backup beside it."""
    found = _run(find_exercise, Path(file), exercise)
    if step:
        _step(found.name, step)
    backup = workspace.backup_path(Path(file))
    name = Path(file).name
    if not yes:
        what = f"your {step} in {name} with the stub's" if step else f"all of {name} with a fresh stub"
        click.confirm(f"Replace {what}? A backup is kept in {backup.name}.", abort=True, err=True)
    _run(workspace.reset, Path(file), found, step, backup)
    click.echo(f"reset {file}" + (f" ({step})" if step else "") + f"; your version is in {backup}")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@grade_options
def watch(file, **options) -> None:
    """Regrade FILE on every save (Ctrl-C to stop)."""
    from grader.watch import watch as run_watch

    _run(find_exercise, Path(file), options.get("exercise"))
    run_watch(Path(file), options)


@main.command()
@click.argument("exercise")
@click.argument("folder", type=click.Path(), default=".")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), required=True, metavar="N",
              help="How long the interview lasts; the same command in the same folder resumes the clock.")
@click.option("--candidate", required=True, metavar="NAME", help="The candidate's name, for the scorecard.")
@run_options
def interview(exercise, folder, minutes, candidate, **options) -> None:
    """Run an interview on SPEC in FOLDER (default: here): a fresh stub, a countdown over the live
    step table, and a scorecard for the interviewer at the end (markdown and HTML)."""
    from grader import interview as interview_

    paths = _run(interview_.run, Path(folder), exercise, minutes, candidate, options)
    click.echo(f"Scorecard: {paths[0]} and {paths[1]}")


@main.command()
@click.argument("paths", nargs=-1, required=True)
@grade_options
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="Files graded at once.")
@click.option("--output", type=click.Path(dir_okay=False, writable=True),
              help="Write the CSV here (a row as each file finishes), not stdout.")
@click.option("--resume", is_flag=True,
              help="Keep the rows --output already holds for files unchanged since, and grade only the rest.")
def batch(paths, jobs, output, resume, **options) -> None:
    """Grade every file in PATHS (every .py and .ipynb under a folder) into one CSV row each."""
    from grader import batch as batch_

    files, links = _run(batch_.find_files, list(paths))
    for link in links:
        click.echo(f"not graded: {link} is a link; grade the file it points at by its own path if it is the "
                   "student's", err=True)
    if not files:
        raise click.UsageError("no .py or .ipynb files found in those paths.")
    if resume and not output:
        raise click.UsageError("--resume needs --output: the CSV of the run to resume.")
    earlier = _run(batch_.read_earlier, Path(output)) if resume else []
    skip = batch_.already_graded(earlier, files)
    kept = [row for row in earlier if row["file"] in skip or row["file"] not in {str(f) for f in files}]
    todo = [path for path in files if str(path) not in skip]
    steps = _run(batch_.step_columns, todo, options.get("exercise"), kept)
    sink = None
    if output:
        try:
            sink = batch_.CsvOutput(Path(output), steps, batch_.in_order(files, kept))
        except OSError as error:
            raise click.UsageError(f"cannot write {output}: {error.strerror}. "
                                   "Pass --output a path in a folder you can write to.") from None
    if skip:
        click.echo(f"resuming: {len(skip)} {batch_.plural(len(skip), 'file')} already graded in {output}, "
                   f"{len(todo)} to grade", err=True)
    new: list[dict] = []
    started = time.monotonic()

    def add(row: dict) -> None:  # written as its file finishes: an interrupt keeps it
        new.append(row)
        if sink:
            sink.add(row)

    def show(done: int, total: int, graded: list, running: list) -> None:  # one line, redrawn
        line = batch_.progress_line(done, total, time.monotonic() - started, graded, running)
        click.echo("\r\x1b[K" + line, err=True, nl=done == total)

    interrupted = False
    if todo:
        try:
            batch_.grade_all(todo, jobs, options, on_row=add, on_progress=show if _terminal() else None)
        except KeyboardInterrupt:
            interrupted = True
    with batch_.ctrl_c_ignored():  # a second Ctrl-C must not cut the CSV short
        rows = batch_.in_order(files, kept + [batch_.flat(row) for row in new])
        if sink:
            sink.finish(rows)
        else:
            click.echo(batch_.to_csv(rows, steps), nl=False)
    if interrupted:
        if _terminal():
            click.echo(err=True)  # end the progress line
        if not new:
            said = f"interrupted before any of the {len(todo)} {batch_.plural(len(todo), 'file')} was graded"
        elif output:
            said = (f"interrupted with {len(new)} of {len(todo)} files graded: their rows are in {output}; "
                    "run the same command with --resume to grade only the rest")
        else:
            said = (f"interrupted with {len(new)} of {len(todo)} files graded: their rows are above; "
                    "pass --output FILE to be able to resume with only the rest")
        click.echo(f"attn-grade: {said}.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    errors = sum(row["status"] in ("usage error", "internal error") for row in new)
    note = f" ({errors} {batch_.plural(errors, 'error')}: see the status column)" if errors else ""
    also = f"; kept the rows of {len(skip)} {batch_.plural(len(skip), 'file')} already in {output}" if skip else ""
    count = f"{len(new)} {batch_.plural(len(new), 'file')}"
    click.echo(f"graded {count} in {time.monotonic() - started:.1f} s{note}{also}", err=True)


def _terminal() -> bool:
    return sys.stderr.isatty()


@main.command(name="gradescope-bundle")
@click.argument("out", type=click.Path(dir_okay=False, writable=True))
@click.option("--exercise", default="mha", show_default=True, help="The exercise students submit.")
def gradescope_bundle(out, exercise) -> None:
    """Write OUT.zip, a ready Gradescope autograder for one exercise."""
    from grader.bundle import write_bundle

    names = write_bundle(Path(out), _exercises(exercise)[0])
    click.echo(f"wrote {out} ({len(names)} files): upload it as the assignment's autograder")


def _not_recorded(folder: str) -> None:
    click.echo(f"(not recorded: {folder} is no attn-grade workspace; pass --workspace DIR to record it)", err=True)


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8", errors="backslashreplace")  # a file name that is no UTF-8 too
    except OSError as error:
        raise click.UsageError(
            f"cannot write {path}: {error.strerror}. Pass --output a path in a folder you can write to."
        ) from None


def _run(function, *args, **kwargs):
    """Call the library; a usage error is one line and exit 2, anything else a grader bug and exit 3."""
    try:
        return function(*args, **kwargs)
    except UsageError as error:
        raise click.UsageError(str(error)) from None
    except ModuleNotFoundError as error:
        if str(error.name).split(".")[0] not in DEPENDENCIES:
            raise
        # run from a checkout without the kit installed (python -m grader): the environment's fault, not a bug
        raise click.UsageError(
            f"{error.name} is not installed in this Python ({sys.executable}): install the kit with its "
            "dependencies, as the README says (pip install -e . after PyTorch's CPU wheel)") from None
    except Exception:
        click.echo(traceback.format_exc(), err=True)
        click.echo(f"attn-grade: internal error. {BUG_REPORT}", err=True)
        sys.exit(EXIT_INTERNAL)


def _exercises(name: str | None) -> list:
    exercises = load_course()
    if name is None:
        return list(exercises.values())
    if name not in exercises:
        raise click.UsageError(f"unknown exercise '{name}' (known: {', '.join(exercises)}).")
    return [exercises[name]]


def _step(exercise: str, step: str):
    found = _exercises(exercise)[0]
    try:
        return found.step(step)
    except KeyError:
        steps = ", ".join(s.id for s in found.steps)
        raise click.UsageError(f"{exercise} has no step '{step}' (steps: {steps}).") from None


def entry() -> None:
    """The console script: run the command, then leave without tearing torch down.

    Python's orderly exit unloads torch and pytest, about half a second after the
    report is out; every file is flushed and every worker reaped by then.
    """
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a polite kill stops like Ctrl-C: cleaned up
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            click.echo(exit_.code, err=True)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the workers are reaped on the way out; no traceback
        click.echo(INTERRUPTED, err=True)  # click has ended the terminal's ^C line
        code = EXIT_INTERRUPTED
    except Exception:  # outside the library calls: still a grader bug, never a traceback with exit 1
        click.echo(traceback.format_exc(), err=True)
        click.echo(f"attn-grade: internal error. {BUG_REPORT}", err=True)
        code = EXIT_INTERNAL
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # python -m grader.cli, as the attn-grade command (review 50's F8 exited 0, doing nothing)
    entry()
