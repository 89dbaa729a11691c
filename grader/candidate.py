"""Stage 2 of a grade: run the candidate's code in a worker process and bring back plain data.

`Candidate` is the grader's handle on one candidate file. It starts a zygote
(grader/worker.py) that imports torch once, and asks it to fork a worker child that
imports a private copy of the file and answers calls. Each function or class is called
in a child of its own, so what one step's code patches, starts or breaks never reaches
another step. Every call has a wall-clock
deadline, and the whole file one more; a child that misses it, dies or sends garbage is
killed with everything it started, and the next call gets a fresh child, forked in
milliseconds. A function that hung or killed its child once is not called again: its later
checks fail at once with the same message, so no step waits twice on a hang.

Nothing here imports torch at module level: `start()` runs before the grader imports
torch, so the zygote and the grader import it side by side.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from grader import notebook, wire
from grader.exercise import GraderBug

WORKER_PATH = Path(__file__).resolve().parent / "worker.py"
DEFAULT_TIMEOUT = 10.0  # seconds per call
DEFAULT_FILE_TIMEOUT = 300.0  # seconds for all of a file's calls together
DEFAULT_IMPORT_TIMEOUT = 60.0  # seconds for torch and the candidate file to import
DEFAULT_MEMORY_LIMIT_MB = 4096
OUTPUT_CAP = 64 * 1024  # bytes of the candidate's stdout and stderr kept
NOT_IMPORTED = "not run: the file could not be imported"  # each check's message; `import_error` says why, once
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME")
ZYGOTE_REPLY_TIMEOUT = 10.0
CHILD_END_GRACE = 0.5  # seconds a child whose pipe closed gets to end by itself, so its cause of death is its own
STOP_CHECK_INTERVAL = 0.5  # how soon a zygote a candidate stopped (SIGSTOP) is noticed
MAX_QUESTIONS = 10_000  # step functions one call may ask the grader to answer
MAX_SCRIPT_ACTIONS = 256  # actions in one script (the worker refuses more)


class CandidateError(Exception):
    """The candidate's code gave no answer: it raised, was not implemented, hung, died or sent garbage."""

    def __init__(self, kind: str, message: str, type: str = "", line: int | None = None):
        super().__init__(message)
        self.kind = kind  # raised | not_implemented | missing | memory | timeout | died | import | protocol
        self.message = message
        self.type = type  # the exception's class name, when the candidate's code raised
        self.line = line  # the candidate's own line that raised it, if known
        self.action: int | None = None  # in a script, the action that raised
        self.results: list = []  # in a script, the results of the actions before it


@dataclass(frozen=True)
class Answer:
    value: object
    called: frozenset[str]  # names of the torch functions the candidate's code called
    shapes: dict | None = None  # asked for (invoke(shapes=True)): {"created": [shape, ...], "more": n}, see grader/worker.py
    changed_in_place: tuple[str, ...] = ()  # the arguments (positions as "0", "1", ..., or keywords) the call changed


@dataclass(frozen=True)
class Strided:
    """An input the worker hands to the candidate as a non-contiguous tensor."""

    tensor: object


@dataclass(frozen=True)
class Seeded:
    """An input the worker hands to the candidate as a torch.Generator seeded with `seed`."""

    seed: int


class ZygoteGone(GraderBug):
    """The zygote process died; if a candidate's child was running, the candidate killed it."""


class Zygote:
    """The process that imports torch once and forks a worker child per request (grader/worker.py).

    One zygote serves one candidate at a time: killing a child also ends every process
    left below the zygote but the other children it has forked. Reuse one for many files in
    a row (tests, watch, batch).
    """

    def __init__(self, warm_device: bool = False, pid_namespace: bool = True, fs_isolation: bool = True):
        self.warm_device = warm_device
        self.pid_namespace = pid_namespace  # False only to test the grader where the system has none
        self.fs_isolation = fs_isolation  # likewise: False as where the system allows no mount namespace
        self._start()

    def _start(self) -> None:
        self._private = tempfile.mkdtemp(prefix="attn-grade-")  # its home and its log
        warm_device = self.warm_device
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(HOME=self._private, TMPDIR=self._private, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
        if warm_device:
            env["ATTN_GRADE_WARM"] = "device"
        with open(Path(self._private) / "zygote.log", "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-u", str(WORKER_PATH), str(theirs.fileno()), wire.__file__],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._private,
                env=env,
                start_new_session=True,  # away from the terminal's Ctrl-C; the grader ends it
            )
        theirs.close()
        self._control = ours
        self._sent = self._received = 0  # requests sent and replies read: the zygote answers in order
        self._replies: dict[int, dict] = {}
        self._unwanted: set[int] = set()

    def send(self, request: dict, fds: tuple[int, ...] = (), reply: bool = True) -> int:
        """Send a request; its reply comes back, in order, through `reply(ticket)` (or is dropped)."""
        try:
            socket.send_fds(self._control, [json.dumps(request).encode()], list(fds))
        except OSError as exc:
            self._fail(exc)
        self._sent += 1
        if not reply:
            self._unwanted.add(self._sent)
        return self._sent

    def reply(self, ticket: int, deadline: float) -> dict:
        """The zygote's reply to request `ticket`, reading (and keeping or dropping) those before it."""
        while ticket not in self._replies:
            try:
                self._control.settimeout(min(STOP_CHECK_INTERVAL, max(0.01, deadline - time.monotonic())))
                try:
                    data = self._control.recv(65536)
                except TimeoutError:
                    if time.monotonic() < deadline and not _stopped(self._process.pid):
                        continue
                    raise
                if not data:
                    raise OSError("it closed its socket")
                self._received += 1
                if self._received not in self._unwanted:
                    self._replies[self._received] = json.loads(data)
                self._unwanted.discard(self._received)
            except (OSError, ValueError) as exc:
                self._fail(exc)
        return self._replies.pop(ticket)

    def _fail(self, exc: Exception):
        """A zygote killed from outside (a candidate can signal it) is ZygoteGone; anything else a grader bug."""
        try:
            self._process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            if not _stopped(self._process.pid):
                raise GraderBug(f"the worker zygote stopped answering: {exc}\n{self.log()}") from None
            os.killpg(self._process.pid, signal.SIGKILL)  # SIGSTOP from a candidate: as good as dead
            self._process.wait()
        if self._process.returncode >= 0:  # it exited (BUG_EXIT, a traceback): its own failure, never the candidate's
            raise GraderBug(f"the worker zygote failed (exit code {self._process.returncode}):\n{self.log()}")
        raise ZygoteGone(f"the worker zygote died ({self._process.returncode})") from None

    def check_alive(self) -> None:
        """Raise ZygoteGone if the zygote was sent a signal that ends or stops it.

        A signal a child sends is pending before the child can answer, and a zygote with a
        fatal signal pending answers nothing more: a ping is exact where poll() would race.
        """
        self.reply(self.send({"op": "ping"}), time.monotonic() + ZYGOTE_REPLY_TIMEOUT)

    @property
    def exited(self) -> bool:
        return self._process.poll() is not None

    def restart(self) -> None:
        """A fresh zygote in place of a dead one, for whoever holds this object."""
        self.close()
        self._start()

    def log(self) -> str:
        try:
            return (Path(self._private) / "zygote.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        self._control.close()  # the zygote kills what is left below it and exits
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        shutil.rmtree(self._private, ignore_errors=True)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class _Child:
    """A worker child: the zygote's ticket for its pid, the pipes to it, its pid and hello once known."""

    ticket: int
    fds: tuple[int, int]  # (send, receive)
    pid: int | None = None
    namespaced: bool = False  # the zygote made its PID namespace: out of reach of the zygote and the grader
    fs_isolated: bool = False  # the zygote says its file system is the allowlist (worker.py, `_allowlist_root`)
    greeted: bool = False


class Candidate:
    def __init__(
        self,
        path: Path,
        timeout: float = DEFAULT_TIMEOUT,
        memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
        file_timeout: float = DEFAULT_FILE_TIMEOUT,
        import_timeout: float = DEFAULT_IMPORT_TIMEOUT,
        warm_device: bool = False,
        zygote: Zygote | None = None,
    ):
        self.path = Path(path).resolve()  # the Python the checks read: for a notebook, its code cells (below)
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.file_timeout = file_timeout
        self.import_timeout = import_timeout
        self.warm_device = warm_device
        self.info: dict = {}  # the worker's hello: torch version, CUDA availability
        self.fs_isolated: bool | None = None  # every child so far saw only the allowlist (None: no child yet)
        self.workers_started = 0
        self._zygote = zygote  # borrowed, or started (and closed) by this candidate
        self._owns_zygote = zygote is None
        self._live: _Child | None = None  # the child answering calls
        self._serving: str | None = None  # the one function or class it has been called for
        self._spare: _Child | None = None  # forked ahead, for the next step
        self.import_error: str | None = None  # why the file could not be imported, once it is known
        self.missing: set[str] = set()  # the functions and classes asked for that the file does not define
        self._broken: dict[str, tuple[str, str]] = {}  # function name -> (kind, message) of why it is not called again
        self._output = bytearray()
        self._output_total = 0
        # A notebook's code cells become a Python file (UsageError if it is no notebook), kept
        # where the worker cannot rewrite it, since the checks read it for the rules.
        self._notebook = notebook.read(self.path) if self.path.suffix == notebook.SUFFIX else None
        self._source_dir = None
        if self._notebook is not None:
            self._source_dir = tempfile.mkdtemp(prefix="attn-grade-source-")
            self.path = Path(self._source_dir) / f"{self.path.stem}.py"
            self.path.write_text(self._notebook.source, encoding="utf-8")
        self._workdir = tempfile.mkdtemp(prefix="attn-grade-worker-")  # the candidate's
        self._copy = Path(self._workdir) / self.path.name  # a private copy: nothing beside the file is seen
        shutil.copyfile(self.path, self._copy)
        self._file_deadline: float | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start a zygote unless one was lent, and ask for a first worker; both go on while the caller imports torch."""
        self._file_deadline = time.monotonic() + self.file_timeout  # the whole file's clock starts now
        if self._zygote is None:
            self._zygote = Zygote(self.warm_device)
        elif self._zygote.exited:  # a borrowed one, ended by the last file in a way no one noticed
            self._zygote.restart()
        self._live = self._spawn()

    def close(self) -> None:
        try:
            for child in (self._live, self._spare):
                if child is not None:
                    try:
                        self._kill(child)
                    except GraderBug:
                        pass  # the zygote is gone: closing it below ends what is left
            self._live = self._spare = None
        finally:
            if self._owns_zygote and self._zygote is not None:
                self._zygote.close()
            self._zygote = None
            shutil.rmtree(self._workdir, ignore_errors=True)
            if self._source_dir is not None:
                shutil.rmtree(self._source_dir, ignore_errors=True)

    def __enter__(self) -> Candidate:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def output(self) -> str:
        """What the candidate printed, capped; never parsed."""
        text = self._output.decode("utf-8", errors="replace")
        if self._output_total > OUTPUT_CAP:
            text += f"\n[... {self._output_total - OUTPUT_CAP} more bytes not kept]"
        return text

    def ready(self) -> dict:
        """Wait for the live worker's hello; raise CandidateError if the candidate file cannot be imported.

        The reason is said once, in `import_error`; each check that asks only says NOT_IMPORTED.
        """
        if self.import_error:  # a fresh exception each time: re-raising one would grow its traceback
            raise CandidateError("import", NOT_IMPORTED)
        if self._live is None:
            self._live, self._spare = self._spare or self._spawn(), None
        child = self._live
        if child.greeted:
            return self.info
        try:
            self._pid(child)
            self._greet(child)
            if not child.namespaced:  # within the candidate's reach, and its import-time code has run
                self._zygote.check_alive()
        except ZygoteGone:  # killed by the file's import-time code: every child would do it again
            self._replace_zygote()
            self.import_error = "the worker's zygote was killed or stopped while importing"
            raise CandidateError("import", NOT_IMPORTED) from None
        return self.info

    def _greet(self, child: _Child) -> None:
        """Read the child's hello into `info`; raise CandidateError if the file did not import."""
        try:
            hello, _ = wire.read_frame(child.fds[1], self._deadline(self.import_timeout))
            child.greeted = True
        except wire.Timeout:
            self._drop_live()
            late = time.monotonic() >= self._file_deadline
            limit = f"the whole-file time limit ({self.file_timeout:g} s) ran out" if late else f"timed out after {self.import_timeout:g} s"
            self.import_error = f"{limit} while importing"
        except wire.Closed:
            self.import_error = f"candidate exited while importing ({self._drop_live(ended=True)})"
        except wire.WireError as exc:
            self._drop_live()
            raise CandidateError("protocol", f"worker sent malformed data: {exc}") from None
        except BaseException:  # interrupted mid-read: this child's next frame could be its hello
            self._drop_live()
            raise
        else:
            if hello.get("ok") is True:
                self.info = {"torch": _text(hello.get("torch")), "cuda": hello.get("cuda") is True}
                return
            self._drop_live()
            error = hello.get("error") if isinstance(hello.get("error"), dict) else {}
            self.import_error = f"could not import: {self._locate(_text(error.get('message')), error)}"
        raise CandidateError("import", NOT_IMPORTED)

    # -- calls ---------------------------------------------------------------------------

    def call(self, name: str, *args, device: str = "cpu", **kwargs) -> Answer:
        """Call the candidate's function `name` on `device` with the grader's inputs."""
        return self.invoke(name, args, kwargs, device)

    def invoke(self, name: str, args: tuple, kwargs: dict, device: str = "cpu", answers=None, shapes: bool = False) -> Answer:
        """`call`, with the keyword arguments as a dict (one of them may be called `device`).

        `answers` (see grader/checks/engine.py) answers the step functions the call asks the grader for;
        with `shapes` the answer also says the shapes of the tensors the call's torch functions created.
        """
        header = {"op": "call", "name": name, "device": device, "answered": list(answers.names) if answers else []}
        if shapes:
            header["shapes"] = True
        return self._request(header, name, args, kwargs, {}, answers)

    def module(
        self,
        name: str,
        init: tuple = (),
        init_kwargs: dict | None = None,
        state: dict | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        device: str = "cpu",
        grad_output=None,
        grad_args: tuple[int, ...] = (),
        forward: bool = True,
        answers=None,
        repeat: bool = False,
    ) -> Answer:
        """Build the candidate's module `name`, load `state`, run forward in eval mode (and backward with `grad_output`).

        The answer's value is a dict: "output", "children" (child name to the names of its
        classes, its own first), "unloaded" (its parameters the state did not fill), with
        repeat=True "again" (forward once more, same module and input), and with
        grad_output "arg_grads" and "param_grads". With forward=False the module is only
        built. `answers` as in `invoke`.
        """
        header = {"op": "module", "name": name, "device": device, "grad_args": list(grad_args), "forward": forward,
                  "answered": list(answers.names) if answers else [], "repeat": repeat}
        extra = {"init": list(init), "init_kwargs": init_kwargs or {}, "state": state or {}, "grad_output": grad_output}
        answer = self._request(header, name, args, kwargs or {}, extra, answers)
        value = answer.value
        shaped = isinstance(value, dict) and "output" in value and isinstance(value.get("children"), dict)
        if shaped and grad_output is not None:
            shaped = isinstance(value.get("arg_grads"), list) and isinstance(value.get("param_grads"), dict)
        if not shaped:
            self._drop_live()
            raise CandidateError("protocol", "worker sent a malformed module result")
        return answer

    def script(self, name: str, actions: list[dict], device: str = "cpu", answers=None) -> Answer:
        """Run `actions` in order in the worker (grader/worker.py, `_script`): build the candidate's objects, or
        the worker's stand-in KV cache, call their methods, read their attributes, fill a cache's unused slots.

        `name` is the step the script grades (its worker, its time limit). The answer's value is
        a list, one entry per action: its result as plain data, or, for an action marked may_raise
        that raised, the CandidateError that says what it raised. Any other exception ends the script: it is raised here as a
        CandidateError whose `action` says which action raised and whose `results` are those before it.
        `answers` as in `invoke`.
        """
        if len(actions) > MAX_SCRIPT_ACTIONS:
            raise ValueError(f"a script of {len(actions)} actions: at most {MAX_SCRIPT_ACTIONS}")
        header = {"op": "script", "name": name, "device": device, "answered": list(answers.names) if answers else []}
        answer = self._request(header, name, (), {}, {"actions": actions}, answers)
        value = answer.value
        results, raised, stopped = (value.get(k) for k in ("results", "raised", "stopped")) if isinstance(value, dict) else (None,) * 3
        well_formed = (isinstance(results, list) and len(results) <= len(actions) and isinstance(raised, dict)
                       and all(isinstance(e, dict) and k.isdigit() and int(k) < len(results) for k, e in raised.items())
                       and (stopped is None or (type(stopped) is int and str(stopped) in raised and stopped == len(results) - 1)))
        if not well_formed:
            self._drop_live()
            raise CandidateError("protocol", "worker sent a malformed script result")
        errors = {int(k): self._script_error(e, actions[int(k)]) for k, e in raised.items()}
        results = [errors.get(i, result) for i, result in enumerate(results)]
        if stopped is not None:
            error = errors[stopped]
            error.action, error.results = stopped, results[:stopped]
            raise self._remember(name, error)
        return Answer(results, answer.called)

    def _remember(self, name: str, error: CandidateError) -> CandidateError:
        """A function that ran out of memory is not called again: like a hang, the next call would only fill it again."""
        if error.kind == "memory":
            self._broken[name] = (error.kind, error.message)
        return error

    def _script_error(self, error: dict, action: dict) -> CandidateError:
        """The CandidateError (also a script's `Raised` result) for an exception one action raised."""
        failure = _error(error, self.memory_limit_mb)
        failure.message = self._locate(failure.message, error)
        failure.args = (failure.message,)
        built = action.get("class") if action.get("do") == "build" and not action.get("stand_in") else None
        if built and _names_missing(error, built):
            self.missing.add(built)
            failure = CandidateError("missing", f"the file defines no {built}")
        return failure

    def _request(self, header: dict, name: str, args, kwargs, extra, answers=None) -> Answer:
        try:
            return self._call_child(header, name, args, kwargs, extra, answers)
        except ZygoteGone:  # the candidate's code killed the zygote (os.kill(os.getppid(), ...))
            self._replace_zygote()
            self._broken[name] = ("died", f"the worker's zygote was killed or stopped while running {name}")
            raise CandidateError(*self._broken[name]) from None

    def _replace_zygote(self) -> None:
        """End what the dead zygote left (it can no longer) and start a fresh one for the rest."""
        orphans = [c.pid for c in (self._live, self._spare) if c is not None and c.pid is not None]
        for child in (self._live, self._spare):
            if child is not None:
                for fd in child.fds:
                    os.close(fd)
        for pid in orphans:
            _kill_group(pid)
        self._live = self._spare = None
        self._serving = None
        self._zygote.restart()

    def _call_child(self, header: dict, name: str, args, kwargs, extra, answers=None) -> Answer:
        if name in self._broken:  # it hung, ran out of memory or killed the zygote once: no check waits on it again
            kind, message = self._broken[name]
            raise CandidateError(kind, f"{message} (an earlier call to {name} did)")
        if time.monotonic() >= self._file_deadline:
            raise CandidateError("timeout", f"the whole-file time limit ({self.file_timeout:g} s) ran out")
        if self._serving not in (None, name):  # each step gets a fresh child: nothing one step's code
            self._drop_live()  # patched, started or left behind reaches the next step
        self.ready()
        self._serving = name
        if self._spare is None:  # fork the next step's child now, while this step runs
            self._spare = self._spawn()
        blobs: list[bytes] = []
        header = dict(header, args=[_encode_arg(a, blobs) for a in args])
        header["kwargs"] = {k: _encode_arg(v, blobs) for k, v in kwargs.items()}
        for key, value in extra.items():
            header[key] = wire.encode(value, blobs)
        deadline = min(time.monotonic() + self.timeout, self._file_deadline)
        send, receive = self._live.fds
        try:
            wire.write_frame(send, header, blobs, deadline)
            answer, answer_blobs = self._read_answer(send, receive, deadline, answers)
        except wire.Timeout:
            self._drop_live()
            if deadline == self._file_deadline:
                raise CandidateError("timeout", f"the whole-file time limit ({self.file_timeout:g} s) ran out") from None
            self._broken[name] = ("timeout", f"timed out after {self.timeout:g} s")
            raise CandidateError(*self._broken[name]) from None
        except wire.Closed:  # a crash costs only this check: the next call gets a fresh child
            raise CandidateError("died", f"worker died ({self._drop_live(ended=True)})") from None
        except wire.WireError as exc:
            self._drop_live()
            raise CandidateError("protocol", f"worker sent malformed data: {exc}") from None
        except BaseException:  # pytest-timeout or Ctrl-C mid-call: that child's next answer would be stale
            self._drop_live()
            raise
        if not self._live.namespaced:  # else the zygote is out of the candidate's reach
            self._zygote.check_alive()  # killed by this call's code: say so here, not at the next step
        try:
            called = answer.get("called")
            called = frozenset(_text(n) for n in called if isinstance(n, str)) if isinstance(called, list) else frozenset()
            if answer.get("ok") is not True:
                error = _error(answer.get("error"), self.memory_limit_mb)
                error.message = self._locate(error.message, answer.get("error"))
                error.args = (error.message,)
                if _names_missing(answer.get("error"), name):
                    self.missing.add(name)
                    error = CandidateError("missing", f"the file defines no {name}")
                raise self._remember(name, error)
            changed = answer.get("changed_in_place")
            changed = tuple(_text(n)[:64] for n in changed[:16] if isinstance(n, str)) if isinstance(changed, list) else ()
            return Answer(wire.decode(answer.get("value"), answer_blobs), called, _shapes(answer.get("shapes")), changed)
        except CandidateError:
            raise
        except Exception as exc:  # anything a forged frame can make the decoding do
            self._drop_live()
            raise CandidateError("protocol", f"worker sent malformed data: {type(exc).__name__}: {exc}"[:300]) from None

    def _read_answer(self, send: int, receive: int, deadline: float, answers):
        """The child's answer; before it, the questions it asks the grader (a composite's step functions)."""
        asked = 0
        while True:
            frame, blobs = wire.read_frame(receive, deadline)
            if frame.get("op") not in ("answer", "answer_grad"):
                return frame, blobs
            asked += 1
            if answers is None or asked > MAX_QUESTIONS:
                why = "no step is answered by the grader here" if answers is None else f"more than {MAX_QUESTIONS} questions"
                reply, reply_blobs = {"ok": False, "error": why}, []
            else:
                reply_blobs = []
                reply = answers.reply(frame, blobs, reply_blobs)
            wire.write_frame(send, reply, reply_blobs, deadline)

    # -- worker children -----------------------------------------------------------------

    def _spawn(self) -> _Child:
        """Ask the zygote for a fresh worker child; its pid and hello are read when it is needed."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        output_r, output_w = os.pipe()
        request = {
            "op": "spawn",
            "candidate": str(self._copy),
            "workdir": self._workdir,
            "memory_limit": self.memory_limit_mb * 1024 * 1024,
            "pid_namespace": self._zygote.pid_namespace,
            "fs_isolation": self._zygote.fs_isolation,
            "cuda": self.warm_device,  # where torch sees CUDA, start it before the candidate's code runs
        }
        try:
            ticket = self._zygote.send(request, (to_child_r, from_child_w, output_w))
        finally:
            for fd in (to_child_r, from_child_w, output_w):
                os.close(fd)
        os.set_blocking(to_child_w, False)
        self.workers_started += 1
        threading.Thread(target=self._drain, args=(output_r,), daemon=True).start()
        return _Child(ticket, (to_child_w, from_child_r))

    def _pid(self, child: _Child) -> int:
        if child.pid is None:
            reply = self._zygote.reply(child.ticket, time.monotonic() + self.import_timeout)
            child.pid, child.namespaced = int(reply["pid"]), reply.get("namespaced") is True
            child.fs_isolated = reply.get("fs_isolated") is True
            self.fs_isolated = self.fs_isolated is not False and child.fs_isolated
            if reply.get("cuda_error"):  # the zygote's word, before any candidate code ran
                raise GraderBug(f"CUDA works in the grader but would not start in its worker "
                                f"({reply['cuda_error']}); grade with --device cpu, or see the README's sandbox section")
        return child.pid

    def _deadline(self, seconds: float) -> float:
        """Now plus `seconds`, but never past the whole file's deadline once it runs."""
        return min(time.monotonic() + seconds, self._file_deadline)

    def _drop_live(self, ended: bool = False) -> str:
        """Kill the live child (the next call takes the spare); if it `ended` (closed its pipe), say how.

        With CUDA, always wait: the next child must not meet a dying child's CUDA context.
        """
        child, self._live, self._serving = self._live, None, None
        if child is None:
            return "killed"
        return self._kill(child, wait=ended or self.info.get("cuda", False), grace=CHILD_END_GRACE if ended else 0)

    def _kill(self, child: _Child, wait: bool = False, grace: float = 0) -> str:
        """End a child and all it started. Only `wait` waits for the zygote, to learn how it ended."""
        request = {"op": "kill", "pid": self._pid(child), "wait": wait, "grace": grace}
        ticket = self._zygote.send(request, reply=wait)
        for fd in child.fds:
            os.close(fd)
        if not wait:
            return "killed"
        return str(self._zygote.reply(ticket, time.monotonic() + ZYGOTE_REPLY_TIMEOUT)["status"])

    def where(self, line: int) -> str:
        """A line of the file the checks read, as its author knows it: "line N", or "cell C, line M" in a notebook."""
        return self._notebook.where(line) if self._notebook is not None else f"line {line}"

    def _locate(self, message: str, error) -> str:
        """For a notebook, the "line N" (of the Python made from it) in an error's message as "cell C, line M"."""
        line = error.get("line") if isinstance(error, dict) else None
        if self._notebook is None or type(line) is not int:
            return message
        before, found, after = message.rpartition(f"line {line}")
        return before + self._notebook.where(line) + after if found else message

    def _drain(self, fd: int) -> None:
        """Keep the first OUTPUT_CAP bytes of the candidate's output; read and drop the rest."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                os.close(fd)
                return
            self._output_total += len(chunk)
            room = OUTPUT_CAP - len(self._output)
            if room > 0:
                self._output += chunk[:room]


def _error(error, memory_limit_mb: int) -> CandidateError:
    """The CandidateError for an exception the candidate's code raised in the worker."""
    error = error if isinstance(error, dict) else {}
    name = _text(error.get("type"))
    message = _text(error.get("message")) or "raised an exception"
    line = error.get("line") if type(error.get("line")) is int else None
    kind = {"NotImplementedError": "not_implemented", "MemoryError": "memory"}.get(name, "raised")
    if kind == "not_implemented" and "meta tensor" in message:  # torch's own, for an op the meta device lacks
        kind = "raised"
    if kind == "not_implemented":
        message = "not implemented yet" + (f" (NotImplementedError at line {line})" if line else "")
    if kind == "memory":
        message = f"memory limit exceeded ({memory_limit_mb} MB): {message}"
    return CandidateError(kind, message, name, line)


def _names_missing(error, name: str) -> bool:
    """Whether the worker says the candidate's module has no `name` (it imports the file as `candidate`)."""
    return isinstance(error, dict) and error.get("message") == f"AttributeError: module 'candidate' has no attribute '{name}'"


def _encode_arg(value, blobs: list[bytes]):
    if isinstance(value, Strided):
        return dict(wire.encode(value.tensor, blobs), strided=True)
    if isinstance(value, Seeded):
        return {"kind": "generator", "seed": int(value.seed)}
    return wire.encode(value, blobs)


def _shapes(record) -> dict | None:
    """The worker's record of the shapes a call created, checked to be what it says: lists of whole numbers."""
    if record is None:
        return None
    created = record.get("created") if isinstance(record, dict) else None
    more = record.get("more") if isinstance(record, dict) else None
    if not isinstance(created, list) or type(more) is not int or len(created) > 4096:
        raise ValueError("a malformed record of shapes")
    if not all(isinstance(s, list) and len(s) <= 64 and all(type(n) is int and n >= 0 for n in s) for s in created):
        raise ValueError("a malformed record of shapes")
    return {"created": [tuple(s) for s in created], "more": more}


def _text(value) -> str:
    """A string from the worker, made safe to print: capped, no control characters."""
    text = value if isinstance(value, str) else ""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:500])


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"  # the state follows the command name


def _kill_group(pid: int) -> None:
    """End a child its dead zygote can no longer end, and remove its pids cgroup once empty."""
    from grader.worker import _cgroup  # the zygote's naming, in the one place it is defined

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(50):  # the child's new parent reaps it in a moment
        try:
            os.rmdir(_cgroup(pid))
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
