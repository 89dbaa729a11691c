"""The account's secret keys, kept in its state folder (never in a project's or an interview's folder, never in
the worker's reach: its file system holds no home folder, and no grader variable reaches its environment).

- `interview.key` signs interview session files (grader/interview.py).
- `draw.key` keys the sizes a file cannot know (inputs.Gen.unknown): drawn from the file's text and this key, so the
  same file grades the same on one account, while its author, who knows the text but not the key, cannot work out
  the sizes beforehand and steer them (review 63). ATTN_GRADE_DRAW_KEY sets it instead (the test suite's own, or
  one shared by the machines that grade one class, so that each grades a file the same)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from grader.exercise import UsageError

DRAW_KEY_ENV = "ATTN_GRADE_DRAW_KEY"


def state_folder() -> Path:
    """The account's attn-grade folder: $XDG_STATE_HOME/attn-grade, ~/.local/state/attn-grade by default."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "attn-grade"


def account_key(name: str) -> bytes:
    """The key `name` of the account, made (32 random bytes, readable by the account alone) on its first use."""
    path = state_folder() / name
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as error:
        raise UsageError(f"cannot read the key {path} ({error.strerror}): make it readable, or set XDG_STATE_HOME "
                         "to a folder of your own.") from None
    key = secrets.token_bytes(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key)
        return key
    except FileExistsError:  # another grade made it meanwhile
        return path.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot write the key {path} ({error.strerror}): make its folder writable, or set "
                         "XDG_STATE_HOME to a folder of your own.") from None


def draw_key() -> bytes:
    """The key of the sizes a file cannot know: ATTN_GRADE_DRAW_KEY's text where it is set, else the account's; where
    the account can keep no key (a home folder it cannot write), one of this process's own, so the grade goes on and
    only its sizes differ from run to run."""
    chosen = os.environ.get(DRAW_KEY_ENV)
    if chosen:
        return chosen.encode("utf-8", "surrogatepass")
    try:
        return account_key(DRAW_KEY)
    except UsageError:
        return _PROCESS_KEY


DRAW_KEY = "draw.key"
_PROCESS_KEY = secrets.token_bytes(32)
