"""Stage 2 of a grade: run the candidate's code in a worker process and bring back plain data.

`Candidate` is the grader's handle on one candidate file: the checks call its functions and
classes through it and get an `Answer`, or a `CandidateError` saying why there is none. The
processes behind it are grader/pool.py's: a zygote that imports torch once forks a worker child
that imports a private copy of the file, and each function or class is called in a child of
its own, so what one step's code patches, starts or breaks never reaches another step.

Every call has a wall-clock deadline, and the whole file one more; a child that misses it,
dies or sends garbage is killed with everything it started, and the next call gets a fresh
child, forked in milliseconds. A function that hung or killed its child once is not called
again: its later checks fail at once with the same message, so no step waits twice on a hang.

Nothing here imports torch at module level: `start()` runs before the grader imports
torch, so the zygote and the grader import it side by side.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from grader import errors, notebook, wire
from grader.answers import Malformed, module_result, script_result, shape_record
from grader.errors import CandidateError
from grader.pool import Child, Pool, SetupFailed, Zygote, ZygoteGone

DEFAULT_TIMEOUT = 10.0  # seconds per call
DEFAULT_FILE_TIMEOUT = 300.0  # seconds for all of a file's calls together
DEFAULT_IMPORT_TIMEOUT = 60.0  # seconds for torch and the candidate file to import
DEFAULT_MEMORY_LIMIT_MB = 4096
NOT_IMPORTED = "not run: the file could not be imported"  # each check's message; `import_error` says why, once
MAX_QUESTIONS = 10_000  # step functions one call may ask the grader to answer
MAX_SCRIPT_ACTIONS = 256  # actions in one script (the worker refuses more)
HIDDEN = "hidden: "  # in `called`, before why the worker's record of the call may be incomplete
MALFORMED = "the worker's answer was malformed"  # a check's message when an answer is not what the check asked for
# An answer's tensors, as bytes: a check's answers are kilobytes (the course's largest, 141 KB, masks' attention), so
# one far larger than what the call was given is refused unread, before the grader copies it (issue 11: 256 MiB from
# every step made a grade of 4.3 GB and 108 s). What a call builds from integers alone (a mask, a cache) fits the floor.
ANSWER_FLOOR = 4 << 20
ANSWER_FACTOR = 64  # times the bytes of tensors the call was given


def answer_limit(given: int) -> int:
    """The most bytes of tensors an answer to a call given `given` bytes of them may hold."""
    return min(wire.MAX_BLOB_BYTES, max(ANSWER_FLOOR, ANSWER_FACTOR * given))


@dataclass(frozen=True)
class Answer:
    value: object
    called: frozenset[str]  # names of the torch functions the candidate's code called
    shapes: dict | None = None  # asked for (invoke(shapes=True)): {"created": [shape, ...], "more": n, "scores": [...]}
    changed_in_place: tuple[str, ...] = ()  # the arguments (positions as "0", "1", ..., or keywords) the call changed


@dataclass(frozen=True)
class Strided:
    """An input the worker hands to the candidate as a non-contiguous tensor: the same values, with two axes
    transposed in memory (the last two by default; (1, 2) gives a (B, H, T, D) tensor the layout of a
    (B, T, H, D) one's transpose, as heads split from a projection have)."""

    tensor: object
    axes: tuple[int, int] = (-1, -2)


@dataclass(frozen=True)
class Seeded:
    """An input the worker hands to the candidate as a torch.Generator seeded with `seed`."""

    seed: int


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
        stand_ins: str | Path | None = None,
        processes: bool = False,
    ):
        """`zygote`: one to borrow (else the candidate starts its own); `stand_ins`: the exercise's stand-ins
        file, which the worker loads in place of a candidate's class that lost points; `processes`: the file's
        code may start processes (Triton's compilers, on CUDA), which no record sees."""
        self._source = notebook.PythonSource.of(Path(path).resolve())  # UsageError for a broken notebook
        self.path = self._source.path  # the Python the checks read: for a notebook, its code cells
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.file_timeout = file_timeout
        self.import_timeout = import_timeout
        self.info: dict = {}  # the worker's hello: torch version, CUDA availability
        self.import_error: str | None = None  # why the file could not be imported, once it is known
        self.missing: set[str] = set()  # the functions and classes asked for that the file does not define
        self._broken: dict[str, tuple[str, str]] = {}  # function name -> (kind, message) of why it is not called again
        stand_ins = Path(stand_ins).resolve() if stand_ins is not None else None
        self._pool = Pool(self.path, memory_limit_mb, import_timeout, warm_device, zygote, stand_ins, processes)
        self._file_deadline: float | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start a zygote unless one was lent, and ask for a first worker; both go on while the caller imports torch."""
        self._file_deadline = time.monotonic() + self.file_timeout  # the whole file's clock starts now
        self._pool.start()

    def close(self) -> None:
        try:
            self._pool.close()
        finally:
            self._source.remove()

    def __enter__(self) -> Candidate:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def output(self) -> str:
        """What the candidate printed, capped; never parsed."""
        return self._pool.output

    def take_output(self) -> str:
        """What the candidate's calls printed since the last take (a check's own output), capped; not what a
        worker printed while importing the file, which `output` alone holds."""
        return self._pool.take_output()

    @property
    def fs_isolated(self) -> bool | None:
        """Whether every worker child so far saw only the allowlist (None: no child yet)."""
        return self._pool.fs_isolated

    @property
    def limits(self) -> str | None:
        """How the worker children's processes and memory are bounded, in words (None: no child yet)."""
        return self._pool.limits

    def where(self, line: int) -> str:
        """A line of the file the checks read, as its author knows it: "line N", or "cell C, line M" in a notebook."""
        return self._source.where(line)

    def ready(self) -> dict:
        """Wait for the live worker's hello; raise CandidateError if the candidate file cannot be imported.

        The reason is said once, in `import_error`; each check that asks only says NOT_IMPORTED.
        """
        if self.import_error:  # a fresh exception each time: re-raising one would grow its traceback
            raise CandidateError("import", NOT_IMPORTED)
        child = self._pool.take_live()
        if child.greeted:
            return self.info
        try:
            try:
                self._pool.pid(child)
            except SetupFailed:  # once more, in a fresh child; twice is the grader's fault to report (exit 3)
                self._pool.drop_live()
                child = self._pool.take_live()
                self._pool.pid(child)
            self._greet(child)
            self._pool.check_zygote(child)  # its import-time code has run
        except ZygoteGone:  # killed by the file's import-time code: every child would do it again
            self._pool.replace_zygote()
            self.import_error = "the worker's zygote was killed or stopped while importing"
            raise CandidateError("import", NOT_IMPORTED) from None
        return self.info

    def _greet(self, child: Child) -> None:
        """Read the child's hello into `info`; raise CandidateError if the file did not import."""
        try:
            hello, _ = wire.read_frame(child.fds[1], self._deadline(self.import_timeout), key=child.key)
            self._pool.collect_output()  # what it printed while importing, before its output counts as a check's
            child.greeted = True
        except wire.Timeout:
            self._pool.drop_live()
            late = time.monotonic() >= self._file_deadline
            limit = self._file_time_out if late else f"timed out after {self.import_timeout:g} s"
            self.import_error = f"{limit} while importing"
        except wire.Closed:
            self.import_error = f"candidate exited while importing ({self._pool.drop_live(ended=True)})"
        except wire.WireError as exc:
            self._pool.drop_live()
            raise CandidateError("protocol", f"{MALFORMED}: {errors.printable(str(exc))}") from None
        except BaseException:  # interrupted mid-read: this child's next frame could be its hello
            self._pool.drop_live()
            raise
        else:
            if hello.get("ok") is True:
                self.info = {"torch": errors.printable(hello.get("torch")), "cuda": hello.get("cuda") is True}
                self._pool.cuda = self.info["cuda"]
                return
            self._pool.drop_live()
            error = hello.get("error") if isinstance(hello.get("error"), dict) else {}
            message = errors.locate(errors.printable(error.get("message")), error.get("line"), self.where)
            self.import_error = f"could not import: {message}"
        raise CandidateError("import", NOT_IMPORTED)

    def _deadline(self, seconds: float) -> float:
        """Now plus `seconds`, but never past the whole file's deadline once it runs."""
        return min(time.monotonic() + seconds, self._file_deadline)

    @property
    def _file_time_out(self) -> str:
        return f"the whole-file time limit ({self.file_timeout:g} s) ran out"

    # -- calls ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def aside(self):
        """Calls made inside run in a fresh child (nothing earlier calls left in a process is there), which is then
        dropped: the live child, and whether a function is broken (hung, out of memory), are as they were."""
        broken = dict(self._broken)
        try:
            with self._pool.aside():
                yield
        finally:
            self._broken = broken

    def call(self, name: str, *args, device: str = "cpu", **kwargs) -> Answer:
        """Call the candidate's function `name` on `device` with the grader's inputs."""
        return self.invoke(name, args, kwargs, device)

    def invoke(
        self, name: str, args: tuple, kwargs: dict, device: str = "cpu", answers=None, shapes: bool = False
    ) -> Answer:
        """`call`, with the keyword arguments as a dict (one of them may be called `device`).

        `answers` (the oracle, grader/engine/runner.py) answers the step functions the call asks the grader for;
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
        """Build the candidate's module `name`, load `state`, run forward in eval mode (and backward, `grad_output`).

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
        expected = {"forward": forward, "repeat": repeat, "grads": len(grad_args) if grad_output is not None else None}
        value = self._checked(module_result, answer.value, **expected)
        return Answer(value, answer.called, answer.shapes, answer.changed_in_place)

    def script(self, name: str, actions: list[dict], device: str = "cpu", answers=None, shapes: bool = False) -> Answer:
        """Run `actions` in order in the worker (grader/sandbox/worker.py, `_script`): build the candidate's objects,
        or the exercise's stand-ins, call their methods, read their attributes, fill a cache's unused slots.

        `name` is the step the script grades (its worker, its time limit). The answer's value is
        a list, one entry per action: its result as plain data, or, for an action marked may_raise
        that raised, the CandidateError that says what it raised. Any other exception ends the
        script: it is raised here as a CandidateError whose `action` says which action raised and
        whose `results` are those before it.
        `answers` and `shapes` (of what the whole script's recorded calls created) as in `invoke`.
        """
        if len(actions) > MAX_SCRIPT_ACTIONS:
            raise ValueError(f"a script of {len(actions)} actions: at most {MAX_SCRIPT_ACTIONS}")
        header = {"op": "script", "name": name, "device": device, "answered": list(answers.names) if answers else []}
        if shapes:
            header["shapes"] = True
        answer = self._request(header, name, (), {}, {"actions": actions}, answers)
        results, raised, stopped = self._checked(script_result, answer.value, actions=actions)
        failures = {i: self._script_failure(e, actions[i]) for i, e in raised.items()}
        results = [failures.get(i, result) for i, result in enumerate(results)]
        if stopped is not None:
            error = failures[stopped]
            error.action, error.results = stopped, results[:stopped]
            raise self._remember(name, error)
        return Answer(results, answer.called, answer.shapes)

    def _checked(self, validate, value, **expected):
        """`validate(value, **expected)`: the answer as the check may use it, every field checked against what the
        check asked for. A malformed answer (a forged frame, a worker gone wrong) costs that check, never the
        grader: the child that sent it is dropped, and the check fails with what was wrong."""
        try:
            return validate(value, **expected)
        except Malformed as why:
            self._pool.drop_live()
            raise CandidateError("protocol", f"{MALFORMED}: {why}"[:300]) from None

    def _remember(self, name: str, error: CandidateError) -> CandidateError:
        """A function that ran out of memory is not called again: like a hang, another call would only fill it again."""
        if error.kind == "memory":
            self._broken[name] = (error.kind, error.message)
        return error

    def _script_failure(self, error: dict, action: dict) -> CandidateError:
        """The CandidateError (also a script's `Raised` result) for an exception one action raised."""
        built = action.get("class") if action.get("do") == "build" and not action.get("stand_in") else None
        return self._failure(error, built)

    def _failure(self, error, name: str | None) -> CandidateError:
        """The CandidateError for an exception the candidate's code raised; `missing` if it was for want of `name`."""
        if name and errors.names_missing(error, name):
            self.missing.add(name)
            return CandidateError("missing", f"the file defines no {name}")
        return errors.raised(error, self.memory_limit_mb, self.where)

    def _request(self, header: dict, name: str, args, kwargs, extra, answers=None) -> Answer:
        try:
            return self._call_child(header, name, args, kwargs, extra, answers)
        except ZygoteGone:  # the candidate's code killed the zygote (os.kill(os.getppid(), ...))
            self._pool.replace_zygote()
            self._broken[name] = ("died", f"the worker's zygote was killed or stopped while running {name}")
            raise CandidateError(*self._broken[name]) from None

    def _call_child(self, header: dict, name: str, args, kwargs, extra, answers=None) -> Answer:
        if name in self._broken:  # it hung, ran out of memory or killed the zygote once: no check waits on it again
            kind, message = self._broken[name]
            raise CandidateError(kind, f"{message} (an earlier call to {name} did)")
        if time.monotonic() >= self._file_deadline:
            raise CandidateError("timeout", self._file_time_out)
        self._pool.leave_other_step(name)
        self.ready()
        child = self._pool.serve(name)
        blobs: list[bytes] = []
        header = dict(header, args=[_encode_arg(a, blobs) for a in args])
        header["kwargs"] = {k: _encode_arg(v, blobs) for k, v in kwargs.items()}
        for key, value in extra.items():
            header[key] = wire.encode(value, blobs)
        deadline = min(time.monotonic() + self.timeout, self._file_deadline)
        send, receive = child.fds
        given = sum(map(len, blobs))
        try:
            wire.write_frame(send, header, blobs, deadline)
            answer, answer_blobs = self._read_answer(send, receive, deadline, answers, answer_limit(given), child.key)
        except wire.Timeout:
            self._pool.drop_live()
            if deadline == self._file_deadline:
                raise CandidateError("timeout", self._file_time_out) from None
            self._broken[name] = ("timeout", f"timed out after {self.timeout:g} s")
            raise CandidateError(*self._broken[name]) from None
        except wire.Closed:  # a crash costs only this check: the next call gets a fresh child
            raise CandidateError("died", f"worker died ({self._pool.drop_live(ended=True)})") from None
        except wire.TooLarge as exc:  # refused unread, and the child that was writing it dropped. Like a hang, it is
            # not called again: each call would make the candidate's code build the answer once more, for nothing
            self._pool.drop_live()
            self._broken[name] = ("protocol", f"{MALFORMED}: {exc.size} bytes of tensors in the answer to a call "
                                              f"given {given}: more than a check reads (at most {exc.limit})")
            raise CandidateError(*self._broken[name]) from None
        except wire.WireError as exc:
            self._pool.drop_live()
            raise CandidateError("protocol", f"{MALFORMED}: {errors.printable(str(exc))}") from None
        except BaseException:  # pytest-timeout or Ctrl-C mid-call: that child's next answer would be stale
            self._pool.drop_live()
            raise
        self._pool.check_zygote(child)  # killed by this call's code: say so here, not at the next step
        try:
            called = answer.get("called")
            if not isinstance(called, list) or len(called) > 100_000 or not all(type(n) is str for n in called):
                self._pool.drop_live()  # every answer records its calls: without a list of names, none is kept
                raise CandidateError("protocol", f"{MALFORMED}: the record of torch calls is no list of names")
            called = frozenset(errors.printable(n) for n in called)
            if answer.get("hidden") is not None:  # the record may lack calls: see grader/sandbox/recorder.py
                called |= {HIDDEN + errors.printable(str(answer["hidden"]))[:200]}
            if answer.get("ok") is not True:
                raise self._remember(name, self._failure(answer.get("error"), name))
            changed = answer.get("changed_in_place")
            changed = (tuple(errors.printable(n)[:64] for n in changed[:16] if isinstance(n, str))
                       if isinstance(changed, list) else ())
            value = wire.decode(answer.get("value"), answer_blobs, meta=header.get("device") == "meta")
            return Answer(value, called, shape_record(answer.get("shapes")), changed)
        except CandidateError:
            raise
        except Exception as exc:  # anything a forged frame can make the decoding do
            self._pool.drop_live()
            why = errors.printable(f"{type(exc).__name__}: {exc}")
            raise CandidateError("protocol", f"{MALFORMED}: {why}"[:300]) from None

    def _read_answer(self, send: int, receive: int, deadline: float, answers, limit: int = wire.MAX_BLOB_BYTES,
                     key: bytes | None = None):
        """The child's answer; before it, the questions it asks the grader (a composite's step functions). An answer
        of more than `limit` bytes of tensors raises wire.TooLarge before they are read; a question, refused, has
        them read past."""
        asked = 0
        while True:
            try:
                frame, blobs = wire.read_frame(receive, deadline, limit, key=key)
            except wire.TooLarge as exc:
                if exc.header.get("op") not in ("answer", "answer_grad"):
                    raise
                wire.skip(receive, exc.size, deadline)  # a question too large to answer: read past, never kept
                frame, blobs = exc.header, None
            if frame.get("op") not in ("answer", "answer_grad"):
                return frame, blobs
            asked += 1
            if blobs is None:
                reply, reply_blobs = {"ok": False, "error": "inputs too large to answer"}, []
            elif answers is None or asked > MAX_QUESTIONS:
                why = ("no step is answered by the grader here" if answers is None
                       else f"more than {MAX_QUESTIONS} questions")
                reply, reply_blobs = {"ok": False, "error": why}, []
            else:
                reply_blobs = []
                reply = answers.reply(frame, blobs, reply_blobs)
            wire.write_frame(send, reply, reply_blobs, deadline)


def _encode_arg(value, blobs: list[bytes]):
    if isinstance(value, Strided):
        return dict(wire.encode(value.tensor, blobs), strided=[int(a) for a in value.axes])
    if isinstance(value, Seeded):
        return {"kind": "generator", "seed": int(value.seed)}
    return wire.encode(value, blobs)
