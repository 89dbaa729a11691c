"""The warm grader a notebook's kernel talks to: `python -m grader.notebook_grader`, one request a line on stdin.

`attn_grade.check` (the kernel's side, attn_grade/__init__.py) starts this process once per kernel
and keeps it: the kernel itself never imports the grader, the references or the specs, and never
runs a check. A request is the Python source the learner's cells make; this process writes it to a
file of its own and grades it exactly as `attn-grade FILE` grades a file (the candidate's code runs
in the sandboxed worker, never here), keeping a zygote and, per exercise, watch's cache of checks
whose step did not change, so a second check costs what a `watch` regrade costs.

Protocol, one JSON object a line each way. In: {"exercise": "mha", "source": "...", "steps": ["softmax"],
"workspace": "/path" or null, "name": "attempt.ipynb", "options": {"device": "cpu", ...}}. Out: {"ok": true,
"score", "max_score", "steps": {id: [score, max]}, "text", "html", "json", "recorded"} or {"ok": false,
"error": "..."}. The reply channel is a duplicate of the original stdout: everything else this process
(or a library) prints goes to stderr, so it can never corrupt a reply.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

OPTIONS = ("device", "seed", "timeout", "memory_limit_mb", "file_timeout")


class Server:
    """A zygote and a folder kept across requests; a cache of check results per exercise."""

    def __init__(self):
        from grader.pool import Zygote

        self.zygote = Zygote(warm_device=True)
        self.folder = Path(tempfile.mkdtemp(prefix="attn-grade-notebook-"))
        self.caches: dict[tuple, dict] = {}

    def close(self) -> None:
        self.zygote.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def handle(self, request: dict) -> dict:
        from grader import notebook, workspace
        from grader.exercise import UsageError, load_course
        from grader.grade import grade
        from grader.html import fragment
        from grader.progress import Progress
        from grader.report import to_json, to_text

        exercises = load_course()
        name, steps = request.get("exercise"), request.get("steps") or []
        if not isinstance(name, str) or not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
            return {"ok": False, "error": "the exercise and the steps are names, e.g. check('mha', 'softmax')."}
        if name not in exercises:
            return {"ok": False, "error": f"unknown exercise {name!r} (known: {', '.join(exercises)})."}
        exercise = exercises[name]
        steps = tuple(steps)
        unknown = [s for s in steps if s not in {step.id for step in exercise.steps}]
        if unknown:
            known = ", ".join(step.id for step in exercise.steps)
            return {"ok": False, "error": f"{name} has no step {', '.join(map(repr, unknown))} (steps: {known})."}
        source = request.get("source")
        if not isinstance(source, str):
            return {"ok": False, "error": "no source to grade."}
        if not notebook.utf8(source):  # review 65's F2: a lone surrogate made write_text raise, an internal error
            return {"ok": False, "error": "the cells hold a character that is not text (a lone surrogate such as "
                                          "\\ud800): delete it and check again."}
        options = {k: v for k, v in (request.get("options") or {}).items() if k in OPTIONS}
        path = self.folder / exercise.file
        path.write_text(source, encoding="utf-8")
        cache = self.caches.setdefault((name, json.dumps(options, sort_keys=True)), {})
        try:
            result = grade(path, exercise=name, zygote=self.zygote, cache=cache, **options)
        except UsageError as error:
            return {"ok": False, "error": str(error)}
        shown_as = request.get("name") or "the notebook's cells"
        result = replace(result, file=str(shown_as))
        recorded = None
        folder = request.get("workspace")
        progress = Progress.find(Path(folder)) if folder else None
        if progress:  # as watch records a save: the grade, and each step's version
            progress.record_grade(result, workspace.step_versions(path, exercise))
            progress.save()
            recorded = str(progress.path)
        return {
            "ok": True,
            "score": result.score,
            "max_score": result.max_score,
            "steps": {s.id: [s.score, s.max_score] for s in result.steps},
            "text": _plain(to_text(result)),
            "html": fragment(result, steps=steps),
            "json": json.loads(to_json(result)),
            "recorded": recorded,
        }


def _plain(text: str) -> str:
    import click

    return click.unstyle(text)


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # a stray print (ours, a library's) lands on stderr, never in a reply
    sys.stdout = sys.stderr
    server = Server()
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                reply = server.handle(json.loads(line))
            except Exception as error:  # a grader bug: said in the reply, and the server goes on
                import traceback

                traceback.print_exc()
                reply = {"ok": False, "error": f"internal error of attn-grade ({type(error).__name__}: {error}); "
                                               "this is a bug in attn-grade, not in your code: please report it."}
            replies.write(json.dumps(reply) + "\n")
    except KeyboardInterrupt:  # the kernel was interrupted: the process group's Ctrl-C reached us too
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
