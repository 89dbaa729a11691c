"""The command line: parse arguments, call the library, print, exit with a well-defined code.

Exit codes: 0 every step has full marks; 1 a point was lost; 2 a usage error (a one-line
message on stderr says what to do); 3 an internal error of the grader's.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from grader.candidate import DEFAULT_FILE_TIMEOUT, DEFAULT_MEMORY_LIMIT_MB, DEFAULT_TIMEOUT
from grader.exercise import UsageError

EXIT_FULL_MARKS, EXIT_POINTS_LOST, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
BUG_REPORT = "This is a bug in attn-grade, not in your code: please report it with the output above."


class DefaultGroup(click.Group):
    """`attn-grade FILE` means `attn-grade grade FILE`: a first argument that is no command is a file."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["grade", *args]
        return super().parse_args(ctx, args)

    def main(self, args=None, prog_name="attn-grade", **extra):
        """Run a command; a usage error is one line on stderr and exit 2."""
        try:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as error:
            click.echo(error.format_message(), err=True)
            sys.exit(EXIT_USAGE)
        except click.UsageError as error:
            click.echo(f"attn-grade: {error.format_message()}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(EXIT_POINTS_LOST)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Grade your attention exercises step by step: attn-grade exercises/mha.py"""


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--exercise", metavar="NAME", help="Which exercise the file is (default: from its name, mha.py is mha).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True, help="Report format.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the device checks run: auto is CUDA if present, else the meta device.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the grader's random inputs.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds one call into your code may take before it is killed.")
@click.option("--file-timeout", "file_timeout", type=click.FloatRange(min=0.1), default=DEFAULT_FILE_TIMEOUT,
              show_default=True, help="Seconds all the calls into your file may take together.")
@click.option("--memory-limit", "memory_limit", type=click.IntRange(min=0), default=DEFAULT_MEMORY_LIMIT_MB,
              show_default=True, metavar="MB", help="Memory cap of the process running your code (0: none).")
@click.option("-v", "--verbose", is_flag=True, help="Show every check and what your code printed.")
def grade(file, exercise, fmt, device, seed, timeout, file_timeout, memory_limit, verbose) -> None:
    """Grade FILE and report a score for every step."""
    from grader.grade import grade as run_grade  # imported here: `attn-grade --help` stays instant
    from grader import report

    try:
        result = run_grade(file, exercise, device, seed, timeout, memory_limit, file_timeout)
    except UsageError as error:
        raise click.UsageError(str(error)) from None
    except Exception:
        click.echo(traceback.format_exc(), err=True)
        click.echo(f"attn-grade: internal error. {BUG_REPORT}", err=True)
        sys.exit(EXIT_INTERNAL)
    click.echo(report.to_json(result, verbose) if fmt == "json" else report.to_text(result, verbose))
    sys.exit(EXIT_FULL_MARKS if result.full_marks else EXIT_POINTS_LOST)


def entry() -> None:
    """The console script: run the command, then leave without tearing torch down.

    Python's orderly exit unloads torch and pytest, about half a second after the
    report is out; every file is flushed and every worker reaped by then.
    """
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            click.echo(exit_.code, err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
