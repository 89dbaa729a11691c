"""A candidate's progress in a workspace: best score per step, when each step first went green, how many
versions of it were graded (attempts), and every grade, hint and model answer seen, with its time.

It lives in `.attn-grade.json` in the workspace folder (the folder `attn-grade init`
fills, which holds the exercise files). Grading a file in a folder that has one updates
it; a folder without one is left alone, so an interviewer grading a candidate's file
writes nothing beside it. The format (version 1):

    {"version": 1,
     "exercises": {"mha": {
        "started": "2026-11-22T10:00:00+00:00",            # init, or the first grade here
        "steps": {"project": {"best": 10, "max": 10,
                              "first_green": "2026-11-22T10:04:10+00:00",
                              "attempts": 2, "version": "9f2c…"}},   # versions graded, the last one's hash
        "hints": [{"step": "softmax", "level": 1, "at": "2026-11-22T10:07:00+00:00"}],
        "solutions": [{"step": "softmax", "at": "2026-11-22T10:09:00+00:00"}],  # step null: the whole answer
        "grades": [{"at": "2026-11-22T10:04:10+00:00", "score": 10, "edited": ["project"]}]}}}

`attempts`, `version`, `solutions` and `grades` came later: a file without them is read as before.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path

FILE_NAME = ".attn-grade.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Progress:
    def __init__(self, folder: Path, data: dict | None = None):
        self.path = Path(folder) / FILE_NAME
        self.data = data or {"version": 1, "exercises": {}}

    @classmethod
    def find(cls, folder: Path) -> Progress | None:
        """The workspace's progress, or None where the folder is no workspace (or the file is unreadable)."""
        path = Path(folder) / FILE_NAME
        try:
            data = json.loads(read_regular(path).decode("utf-8"))
        except (OSError, ValueError, RecursionError, MemoryError):  # JSON nested past the parser's depth is unreadable
            return None
        if not _well_formed(data):
            return None  # not ours, or broken: treated as no workspace, and never overwritten
        return cls(folder, data)

    def exercise(self, name: str) -> dict:
        entry = self.data["exercises"].setdefault(name, {})
        entry.setdefault("started", now())
        entry.setdefault("steps", {})
        entry.setdefault("hints", [])
        entry.setdefault("solutions", [])
        entry.setdefault("grades", [])
        return entry

    def restart(self, exercise: str) -> None:
        """Forget what was recorded of `exercise`: it starts now (an interview on a fresh stub)."""
        self.data["exercises"][exercise] = {}
        self.exercise(exercise)

    def record_grade(self, grade, versions: dict[str, str] | None = None) -> None:
        """Record a grade. `versions` holds a hash of each step's source where it differs from the stub's
        (workspace.step_versions): a step graded in a version not seen last time is one more attempt at it."""
        entry = self.exercise(grade.exercise)
        edited = []
        for step in grade.steps:
            seen = entry["steps"].setdefault(step.id, {"best": 0, "max": step.max_score, "first_green": None})
            _mended(seen)
            seen["best"], seen["max"] = max(seen["best"], step.score), step.max_score
            if step.score == step.max_score and not seen["first_green"]:
                seen["first_green"] = now()
            version = (versions or {}).get(step.id)
            if version and version != seen.get("version"):
                seen["version"], seen["attempts"] = version, seen.get("attempts", 0) + 1
                edited.append(step.id)
        entry["grades"].append({"at": now(), "score": grade.score, "edited": edited})

    def record_hint(self, exercise: str, step: str, level: int) -> bool:
        """Record that a hint level was shown, the first time only: False where it was recorded before."""
        if level in self.hint_levels(exercise, step):
            return False
        self.exercise(exercise)["hints"].append({"step": step, "level": level, "at": now()})
        return True

    def hint_levels(self, exercise: str, step: str) -> list[int]:
        """The hint levels of `step` shown so far, in order."""
        return sorted({h["level"] for h in self.hints(exercise)
                       if isinstance(h, dict) and h.get("step") == step and isinstance(h.get("level"), int)})

    def record_solution(self, exercise: str, step: str | None) -> None:
        """A model answer was shown: one step's, or (None) the whole file's."""
        self.exercise(exercise)["solutions"].append({"step": step, "at": now()})

    def best(self, exercise: str, step: str) -> int | None:
        return self.data["exercises"].get(exercise, {}).get("steps", {}).get(step, {}).get("best")

    def full_marks(self, exercise: str, step: str) -> bool:
        seen = self.data["exercises"].get(exercise, {}).get("steps", {}).get(step)
        return bool(seen) and seen["best"] == seen["max"]

    # The file lies in the learner's folder and anything may have edited it: the readers below give only the
    # records of the shape this module writes, and leave the rest in the file untouched.
    def hints(self, exercise: str) -> list[dict]:
        """{"step": str, "level": int, "at": ISO time} each."""
        return [h for h in self._records(exercise, "hints")
                if _text(h.get("step")) and _whole(h.get("level")) and _time(h.get("at"))]

    def solutions(self, exercise: str) -> list[dict]:
        """{"step": str, or None for the whole file, "at": ISO time} each."""
        return [s for s in self._records(exercise, "solutions")
                if (s.get("step") is None or _text(s.get("step"))) and _time(s.get("at"))]

    def grades(self, exercise: str) -> list[dict]:
        """{"at": ISO time, "score": int, "edited": [step, ...]} each."""
        return [g for g in self._records(exercise, "grades") if _time(g.get("at")) and _whole(g.get("score"))]

    def _records(self, exercise: str, kind: str) -> list[dict]:
        return [r for r in self.data["exercises"].get(exercise, {}).get(kind, []) if isinstance(r, dict)]

    def attempts(self, exercise: str, step: str) -> int:
        return self.data["exercises"].get(exercise, {}).get("steps", {}).get(step, {}).get("attempts", 0)

    def time_to_green(self, exercise: str) -> dict[str, float]:
        """Seconds from the start of the exercise to each step's first full marks."""
        entry = self.data["exercises"].get(exercise, {})
        start = _time(entry.get("started"))
        if start is None:
            return {}
        return {step: (green - start).total_seconds() for step, seen in entry.get("steps", {}).items()
                if (green := _time(seen.get("first_green"))) is not None}

    def save(self) -> None:
        """Write atomically: a crash mid-write never leaves half a file."""
        replace_file(self.path, json.dumps(self.data, indent=2) + "\n")


def read_regular(path: Path, limit: int = 16 * 2**20) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them; OSError for anything else. What a candidate
    can put in a folder the kit reads (a FIFO, a link to /dev/zero, a sparse file of gigabytes) would block the reader
    or fill its memory (the fifty-fourth review's F7)."""
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(handle, "rb") as opened:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        data = opened.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def replace_file(path: Path, text: str) -> None:
    """`text` written to a new file of a random name beside `path`, then moved onto it: a crash mid-write leaves no
    half a file, and whatever stood at `path` or at a temporary name (a link a candidate made to the interviewer's
    key, or to a file outside the folder) is replaced, never written through (the fifty-third review's F7)."""
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


HINT_LEVELS = ("the idea", "the plan", "code")  # what hint levels 1, 2 and 3 of every step give


def next_hint_level(seen, count: int) -> int | None:
    """The lowest of levels 1 .. count not in `seen`, or None once every level was seen."""
    return next((level for level in range(1, count + 1) if level not in seen), None)


def hint_line(exercise: str, step: str, hints, level: int) -> str:
    """`mha/softmax, hint 2 of 3 (the plan): ...`"""
    name = f" ({HINT_LEVELS[level - 1]})" if level <= len(HINT_LEVELS) else ""
    return f"{exercise}/{step}, hint {level} of {len(hints)}{name}: {hints[level - 1]}"


def no_more_hints(exercise: str, step: str, count: int) -> str:
    """What past the last hint level says: where the model answer is (and nothing is recorded)."""
    return f"{exercise}/{step}: all {count} hints seen; the model answer is next: attn-grade solution {exercise} {step}"


def _text(value) -> bool:
    return isinstance(value, str)


def _whole(value) -> bool:
    return type(value) is int


def _time(value) -> datetime | None:
    """An ISO time as this module writes it (aware, so that two subtract), else None."""
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


def _mended(seen: dict) -> None:
    """A step's record with every field this module reads back of the type it writes: the file is the learner's
    (a field missing or of another type is started afresh, rather than crash the grade that records)."""
    if not isinstance(seen.get("first_green"), str):
        seen["first_green"] = None
    if type(seen.get("attempts", 0)) is not int:
        seen["attempts"] = 0
    if not isinstance(seen.get("version"), str):
        seen.pop("version", None)


def _well_formed(data) -> bool:
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("exercises"), dict):
        return False
    for entry in data["exercises"].values():
        if not isinstance(entry, dict) or not isinstance(entry.get("steps", {}), dict):
            return False
        if not isinstance(entry.get("started", ""), str):
            return False
        if not all(isinstance(entry.get(key, []), list) for key in ("hints", "solutions", "grades")):
            return False
        for seen in entry.get("steps", {}).values():
            if not isinstance(seen, dict) or not all(isinstance(seen.get(key), int) for key in ("best", "max")):
                return False
    return True
