"""Stage 2 of a grade: run the candidate's code in its worker process and bring back plain data.

`Candidate` is the grader's handle on one worker (grader/worker.py). Every call has a
wall-clock deadline; a worker that misses it, dies or sends garbage is killed with its
whole process group, and the next call starts a fresh one. A function that hung or
killed its worker once is not called again: its later checks fail at once with the same
message, so no step waits twice on a hang or pays twice for a restart.

Nothing here imports torch at module level: `start()` runs before the grader imports
torch, so the worker and the grader import it side by side.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from grader import wire

WORKER_PATH = Path(__file__).resolve().parent / "worker.py"
DEFAULT_TIMEOUT = 10.0  # seconds per call
DEFAULT_IMPORT_TIMEOUT = 60.0  # seconds for torch and the candidate file to import
DEFAULT_MEMORY_LIMIT_MB = 4096
OUTPUT_CAP = 64 * 1024  # bytes of the candidate's stdout and stderr kept
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME")


class CandidateError(Exception):
    """The candidate's code gave no answer: it raised, was not implemented, hung, died or sent garbage."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # raised | not_implemented | memory | timeout | died | import | protocol
        self.message = message


@dataclass(frozen=True)
class Answer:
    value: object
    called: frozenset[str]  # names of the torch functions the candidate's code called


@dataclass(frozen=True)
class Strided:
    """An input the worker hands to the candidate as a non-contiguous tensor."""

    tensor: object


class Candidate:
    def __init__(
        self,
        path: Path,
        timeout: float = DEFAULT_TIMEOUT,
        memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
        import_timeout: float = DEFAULT_IMPORT_TIMEOUT,
        warm_device: bool = False,
    ):
        self.path = Path(path).resolve()
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.import_timeout = import_timeout
        self.warm_device = warm_device
        self.info: dict = {}  # the worker's hello: torch version, CUDA availability
        self.workers_started = 0
        self._proc: subprocess.Popen | None = None
        self._hello_pending = False
        self._import_error: CandidateError | None = None
        self._broken: dict[str, tuple[str, str]] = {}  # function name -> (kind, message) of its hang or crash
        self._output = bytearray()
        self._output_total = 0
        self._workdir = tempfile.mkdtemp(prefix="attn-grade-")

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start a worker; it imports torch and the candidate file while the caller goes on."""
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(HOME=self._workdir, TMPDIR=self._workdir, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
        if self.warm_device:
            env["ATTN_GRADE_WARM"] = "device"
        limit = self.memory_limit_mb * 1024 * 1024
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-u", str(WORKER_PATH), str(to_worker_r), str(from_worker_w), wire.__file__, str(self.path)],
            pass_fds=(to_worker_r, from_worker_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self._workdir,
            env=env,
            start_new_session=True,  # one process group to kill, away from the terminal's Ctrl-C
            preexec_fn=(lambda: _limit_memory(limit)) if limit > 0 else None,
        )
        os.close(to_worker_r)
        os.close(from_worker_w)
        os.set_blocking(to_worker_w, False)
        self._send_fd, self._recv_fd = to_worker_w, from_worker_r
        self._hello_pending = True
        self.workers_started += 1
        threading.Thread(target=self._drain, args=(self._proc.stdout,), daemon=True).start()

    def close(self) -> None:
        self._kill()
        shutil.rmtree(self._workdir, ignore_errors=True)

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
        """Wait for the worker's hello; raise CandidateError if the candidate file cannot be imported."""
        if self._import_error:  # a fresh exception each time: re-raising one would grow its traceback
            raise CandidateError(self._import_error.kind, self._import_error.message)
        if self._proc is None or self._proc.poll() is not None and not self._hello_pending:
            self.start()
        if self._hello_pending:
            self._hello_pending = False
            try:
                hello, _ = wire.read_frame(self._recv_fd, time.monotonic() + self.import_timeout)
            except wire.Timeout:
                self._kill()
                self._import_error = CandidateError("import", f"timed out after {self.import_timeout:g} s while importing")
                raise self._import_error from None
            except wire.Closed:
                self._import_error = CandidateError("import", f"candidate exited while importing ({self._exit_status()})")
                raise self._import_error from None
            except wire.WireError as exc:
                self._kill()
                raise CandidateError("protocol", f"worker sent malformed data: {exc}") from None
            if not hello.get("ok"):
                error = hello.get("error") or {}
                self._import_error = CandidateError("import", f"could not import: {_text(error.get('message'))}")
                raise self._import_error
            self.info = {"torch": _text(hello.get("torch")), "cuda": hello.get("cuda") is True}
        return self.info

    # -- calls ---------------------------------------------------------------------------

    def call(self, name: str, *args, device: str = "cpu", **kwargs) -> Answer:
        """Call the candidate's function `name` on `device` with the grader's inputs."""
        return self._request({"op": "call", "name": name, "device": device}, name, args, kwargs, {})

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
    ) -> Answer:
        """Build the candidate's module `name`, load `state`, run forward (and backward with `grad_output`).

        The answer's value is a dict: "output", "children" (child name to type name) and, with
        grad_output, "arg_grads" and "param_grads".
        """
        header = {"op": "module", "name": name, "device": device, "grad_args": list(grad_args)}
        extra = {"init": list(init), "init_kwargs": init_kwargs or {}, "state": state or {}, "grad_output": grad_output}
        answer = self._request(header, name, args, kwargs or {}, extra)
        value = answer.value
        shaped = isinstance(value, dict) and "output" in value and isinstance(value.get("children"), dict)
        if shaped and grad_output is not None:
            shaped = isinstance(value.get("arg_grads"), list) and isinstance(value.get("param_grads"), dict)
        if not shaped:
            self._kill()
            raise CandidateError("protocol", "worker sent a malformed module result")
        return answer

    def _request(self, header: dict, name: str, args, kwargs, extra) -> Answer:
        if name in self._broken:  # it hung or killed its worker once: no check waits on it again
            kind, message = self._broken[name]
            raise CandidateError(kind, f"{message} (an earlier call to {name} did)")
        self.ready()
        blobs: list[bytes] = []
        header = dict(header, args=[_encode_arg(a, blobs) for a in args])
        header["kwargs"] = {k: _encode_arg(v, blobs) for k, v in kwargs.items()}
        for key, value in extra.items():
            header[key] = wire.encode(value, blobs)
        deadline = time.monotonic() + self.timeout
        try:
            wire.write_frame(self._send_fd, header, blobs, deadline)
            answer, answer_blobs = wire.read_frame(self._recv_fd, deadline)
        except wire.Timeout:
            self._kill()
            self._broken[name] = ("timeout", f"timed out after {self.timeout:g} s")
            raise CandidateError(*self._broken[name]) from None
        except wire.Closed:
            self._broken[name] = ("died", f"worker died ({self._exit_status()})")
            raise CandidateError(*self._broken[name]) from None
        except wire.WireError as exc:
            self._kill()
            raise CandidateError("protocol", f"worker sent malformed data: {exc}") from None
        called = frozenset(_text(n) for n in answer.get("called", []) if isinstance(n, str))
        if not answer.get("ok"):
            error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
            kind = {"NotImplementedError": "not_implemented", "MemoryError": "memory"}.get(error.get("type"), "raised")
            message = _text(error.get("message")) or "raised an exception"
            if kind == "not_implemented":
                line = error.get("line")
                message = "not implemented yet" + (f" (NotImplementedError at line {line})" if type(line) is int else "")
            if kind == "memory":
                message = f"memory limit exceeded ({self.memory_limit_mb} MB): {message}"
            raise CandidateError(kind, message)
        try:
            value = wire.decode(answer.get("value"), answer_blobs)
        except wire.WireError as exc:
            self._kill()
            raise CandidateError("protocol", f"worker sent malformed data: {exc}") from None
        return Answer(value, called)

    # -- internals -----------------------------------------------------------------------

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._hello_pending = False
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for fd in (self._send_fd, self._recv_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _exit_status(self) -> str:
        """How the worker ended, for a message; reaps it and starts none."""
        proc = self._proc
        if proc is None:
            return "killed"
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        if code is None:
            return "closed its pipe"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}" if -code in signal.Signals._value2member_map_ else f"signal {-code}"
        return f"exit code {code}"

    def _drain(self, stream) -> None:
        """Keep the first OUTPUT_CAP bytes of the candidate's output; read and drop the rest."""
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                stream.close()
                return
            self._output_total += len(chunk)
            room = OUTPUT_CAP - len(self._output)
            if room > 0:
                self._output += chunk[:room]


def _encode_arg(value, blobs: list[bytes]):
    if isinstance(value, Strided):
        return dict(wire.encode(value.tensor, blobs), strided=True)
    return wire.encode(value, blobs)


def _text(value) -> str:
    """A string from the worker, made safe to print: capped, no control characters."""
    text = value if isinstance(value, str) else ""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:500])


def _limit_memory(limit_bytes: int) -> None:
    # RLIMIT_DATA, not RLIMIT_AS: CUDA reserves huge address ranges it never fills,
    # which RLIMIT_AS would refuse; RLIMIT_DATA counts the memory the process can write to.
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))
