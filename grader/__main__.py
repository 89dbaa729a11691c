"""python -m grader: the attn-grade command."""

from grader.cli import entry

entry()
