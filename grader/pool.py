"""The processes that run a candidate's code: a zygote that imports torch once, and the children it forks.

`Zygote` is the grader's end of the zygote (grader/sandbox/worker.py): requests go over a
socket with the file descriptors they need, and replies come back in order. `Pool` holds one
candidate's worker children: the live one answering calls, and a spare forked ahead for the
next step. A child is killed with everything it started; what the children print is kept,
capped. A candidate's code can kill or stop the zygote itself (a child without a PID namespace
of its own can reach it): that is `ZygoteGone`, and the pool ends what the dead zygote left and
starts a fresh one in its place.

The sandbox the zygote gives its children is Linux's (namespaces, seccomp, an allowlist root:
docs/sandbox.md) on Linux, and the portable one elsewhere (macOS): a session, an empty folder and
rlimits, no file-system isolation. ATTN_GRADE_SANDBOX=portable forces the portable one on Linux,
so it is tested there (`portable_sandbox`). Windows needs WSL (`cannot_grade_here`).

Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import select
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

from grader import wire
from grader.exercise import GraderBug

WORKER_PATH = Path(__file__).resolve().parent / "sandbox" / "worker.py"
OUTPUT_CAP = 64 * 1024  # bytes of the candidate's stdout and stderr kept
CHECK_OUTPUT_CAP = 4 * 1024  # of them, bytes kept for one check (`Pool.take_output`)
READ_ROUND = 1 << 20  # bytes read from one child's output at a time: a flood never holds the lock for long
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME")
ZYGOTE_REPLY_TIMEOUT = 10.0
CHILD_END_GRACE = 0.5  # seconds a child whose pipe closed gets to end by itself, so its cause of death is its own
STOP_CHECK_INTERVAL = 0.5  # how soon a zygote a candidate stopped (SIGSTOP) is noticed
SANDBOX_ENV = "ATTN_GRADE_SANDBOX"  # "portable": the portable sandbox even on Linux (unset: chosen by the system)
FRAME_HEADER = 4  # bytes of a message's length on the portable sandbox's stream socket (as worker.py)
MAX_REPLY = 1 << 20  # bytes a zygote's reply may have there: its replies are a few hundred
WINDOWS_NEEDS_WSL = ("grading needs Linux or macOS: on Windows, install WSL (wsl --install) "
                     "and run attn-grade inside it.")


def portable_sandbox() -> bool:
    """Whether the zygote's children get the portable sandbox: where the system is not Linux (macOS,
    whose kernel has no namespaces), or where ATTN_GRADE_SANDBOX=portable asks for it on Linux."""
    return os.environ.get(SANDBOX_ENV, "").strip().lower() == "portable" or platform.system() != "Linux"


def cannot_grade_here() -> str | None:
    """Why no candidate code can be run here, as one line; None where it can (Linux, WSL, macOS).

    Windows (and Cygwin or MSYS2 on it) has no fork, no Unix sockets to pass descriptors over and
    no rlimits: the worker runs under WSL, a Linux, where the full sandbox is. A value of
    ATTN_GRADE_SANDBOX that means nothing is a usage error too, not silently the default.
    """
    if platform.system().startswith(("Windows", "CYGWIN", "MSYS", "MINGW")):
        return WINDOWS_NEEDS_WSL
    chosen = os.environ.get(SANDBOX_ENV, "").strip().lower()
    if chosen not in ("", "auto", "portable"):
        return (f"{SANDBOX_ENV}={os.environ[SANDBOX_ENV]!r} is not a sandbox: "
                f"set it to portable (no namespaces, as on macOS), or unset it.")
    return None


class ZygoteGone(GraderBug):
    """The zygote process died; if a candidate's child was running, the candidate killed it."""


class SetupFailed(GraderBug):
    """A worker child could not set up its sandbox, before any of the candidate's code ran: the grader's fault."""


class Zygote:
    """The process that imports torch once and forks a worker child per request (grader/sandbox/worker.py).

    One zygote serves one candidate at a time: killing a child also ends every process
    left below the zygote but the other children it has forked. Reuse one for many files in
    a row (tests, watch, batch).
    """

    def __init__(self, warm_device: bool = False, pid_namespace: bool = True, fs_isolation: bool = True,
                 portable: bool | None = None, processes: bool = False):
        self.warm_device = warm_device
        self.pid_namespace = pid_namespace  # False only to test the grader where the system has none
        self.fs_isolation = fs_isolation  # likewise: False as where the system allows no mount namespace
        self.processes = processes  # True only to test the bounds on processes that hold where a child may start them
        self.portable = portable_sandbox() if portable is None else portable  # see `portable_sandbox`
        self._start()

    def _start(self) -> None:
        self._private = tempfile.mkdtemp(prefix="attn-grade-")  # its home and its log
        # macOS has no SOCK_SEQPACKET: the portable sandbox frames its messages on a stream
        kind = socket.SOCK_STREAM if self.portable else socket.SOCK_SEQPACKET
        ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(HOME=self._private, TMPDIR=self._private, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
        if self.warm_device:
            env["ATTN_GRADE_WARM"] = "device"
        if self.portable and platform.system() == "Darwin":  # fork after torch loaded Apple's frameworks
            env["OBJC_DISABLE_INITIALIZE_FORK_SAFETY"] = "YES"
        sandbox = ["portable"] if self.portable else []
        with open(Path(self._private) / "zygote.log", "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-u", str(WORKER_PATH), str(theirs.fileno()), wire.__file__, *sandbox],
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
        self._buffer = bytearray()  # the portable sandbox's stream: bytes of replies not yet whole

    def send(self, request: dict, fds: tuple[int, ...] = (), reply: bool = True) -> int:
        """Send a request; its reply comes back, in order, through `reply(ticket)` (or is dropped)."""
        try:
            if self.portable:
                self._send_frame(json.dumps(request).encode(), fds)
            else:
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
                    data = self._receive_frame() if self.portable else self._control.recv(65536)
                except TimeoutError:
                    if time.monotonic() < deadline and not self._stopped():
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

    def _send_frame(self, data: bytes, fds) -> None:
        """One message on the portable sandbox's stream: its length, then it; the descriptors go with
        the first bytes, in one sendmsg (the zygote reads them with the length)."""
        frame = len(data).to_bytes(FRAME_HEADER, "big") + data
        sent = socket.send_fds(self._control, [frame], list(fds))
        if sent < len(frame):
            self._control.sendall(frame[sent:])

    def _receive_frame(self) -> bytes:
        """The next whole reply on the portable sandbox's stream (b"" once the zygote closed it).

        A timeout (TimeoutError) keeps the bytes read so far: the next call goes on from them.
        """
        while True:
            if len(self._buffer) >= FRAME_HEADER:
                size = int.from_bytes(self._buffer[:FRAME_HEADER], "big")
                if size > MAX_REPLY:
                    raise ValueError(f"a reply of {size} bytes")
                if len(self._buffer) >= FRAME_HEADER + size:
                    data = bytes(self._buffer[FRAME_HEADER : FRAME_HEADER + size])
                    del self._buffer[: FRAME_HEADER + size]
                    return data
            chunk = self._control.recv(65536)
            if not chunk:
                return b""
            self._buffer += chunk

    def _stopped(self) -> bool:
        return _stopped_by_ps(self._process.pid) if self.portable else _stopped(self._process.pid)

    def _fail(self, exc: Exception):
        """A zygote killed from outside (a candidate can signal it) is ZygoteGone; anything else a grader bug."""
        try:
            self._process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            if not self._stopped():
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
class Child:
    """A worker child: the zygote's ticket for its pid, the pipes to it, its pid and hello once known."""

    ticket: int
    fds: tuple[int, int]  # (send, receive)
    pid: int | None = None
    namespaced: bool = False  # the zygote made its PID namespace: out of reach of the zygote and the grader
    fs_isolated: bool = False  # the zygote says its file system is the allowlist (sandbox/worker.py, `_allowlist_root`)
    key: bytes | None = None  # what it signs its frames with: a frame without the signature is the candidate's
    greeted: bool = False


class Pool:
    """One candidate's worker children, forked by a zygote lent to it or started (and closed) by it.

    Each child imports a private copy of the candidate file, alone in a folder of its own:
    nothing beside the file is seen. Each function or class is called in a child of its own
    (`leave_other_step`), so what one step's code patches, starts or breaks never reaches another.
    """

    def __init__(
        self,
        python: Path,
        memory_limit_mb: int,
        import_timeout: float,
        warm_device: bool,
        zygote: Zygote | None,
        stand_ins: Path | None,
        processes: bool = False,
    ):
        self.memory_limit_mb = memory_limit_mb
        self.import_timeout = import_timeout  # how long a child's pid may take: the zygote forks it at once
        self.warm_device = warm_device
        self.processes = processes  # each child may start processes (seccomp.py): else the kernel refuses them
        self.stand_ins = stand_ins  # the exercise's stand-ins file, which each child may load
        self.zygote = zygote  # borrowed, or started (and closed) by this pool
        self._owns_zygote = zygote is None
        self.live: Child | None = None  # the child answering calls
        self.serving: str | None = None  # the one function or class it has been called for
        self.spare: Child | None = None  # forked ahead, for the next step
        self.cuda = False  # the children see CUDA (their hello says so): a killed one is waited for
        self.fs_isolated: bool | None = None  # every child so far saw only the allowlist (None: no child yet)
        self.limits: str | None = None  # how each child's processes and memory are bounded (sandbox/limits.py)
        self.workers_started = 0
        self.zygotes_started = 0  # zygotes started again since the first (`replace_zygote`)
        self._output = bytearray()
        self._output_total = 0
        self._check_output = bytearray()  # what the greeted children printed since the last `take_output`
        self._check_output_total = 0
        self._streams: dict[int, Child] = {}  # each child's output pipe still open, and the child
        self._streams_lock = threading.Lock()  # held while a pipe is read: a take sees every byte before it
        self.workdir = tempfile.mkdtemp(prefix="attn-grade-worker-")  # the candidate's
        self._copy = Path(self.workdir) / python.name
        shutil.copyfile(python, self._copy)

    def start(self) -> None:
        """Start a zygote unless one was lent, and ask for a first child."""
        if self.zygote is None:
            self.zygote = Zygote(self.warm_device)
        elif self.zygote.exited:  # a borrowed one, ended by the last file in a way no one noticed
            self.zygote.restart()
        self.live = self.spawn()

    def close(self) -> None:
        try:
            for child in (self.live, self.spare):
                if child is not None:
                    try:
                        self.kill(child)
                    except GraderBug:
                        pass  # the zygote is gone: closing it below ends what is left
            self.live = self.spare = None
        finally:
            if self._owns_zygote and self.zygote is not None:
                self.zygote.close()
            self.zygote = None
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def output(self) -> str:
        """What the candidate printed, capped; never parsed."""
        text = self._output.decode("utf-8", errors="replace")
        if self._output_total > OUTPUT_CAP:
            text += f"\n[... {self._output_total - OUTPUT_CAP} more bytes not kept]"
        return text

    # -- the live child ------------------------------------------------------------------

    def take_live(self) -> Child:
        """The child answering calls: once the last was dropped, the spare (or a fresh one if none is spare)."""
        if self.live is None:
            self.live, self.spare = self.spare or self.spawn(), None
        return self.live

    def leave_other_step(self, name: str) -> None:
        """Drop a live child that served another step: nothing one step's code patched, started or left
        behind reaches the next."""
        if self.serving not in (None, name):
            self.drop_live()

    def serve(self, name: str) -> Child:
        """The live child, now `name`'s; the next step's child is forked while this step runs."""
        self.serving = name
        if self.spare is None:
            self.spare = self.spawn()
        return self.live

    def check_zygote(self, child: Child) -> None:
        """Raise ZygoteGone if the candidate's code in `child` killed or stopped the zygote.

        Only a child without a PID namespace of its own can reach the zygote: ask about it here,
        where its code has just run, and not at the next step.
        """
        if not child.namespaced:
            self.zygote.check_alive()

    @contextlib.contextmanager
    def aside(self):
        """Calls made inside go to a fresh child, killed after them; the live child, and what its process holds
        (the file's caches), answers again as before. Where the zygote had to be replaced meanwhile, that child is
        gone too: it is ended, and the next call takes a fresh one."""
        kept, serving, zygotes = self.live, self.serving, self.zygotes_started
        self.live = self.serving = None
        try:
            yield
        finally:
            self.drop_live()
            if self.zygotes_started == zygotes:
                self.live, self.serving = kept, serving
            elif kept is not None:
                for fd in kept.fds:
                    os.close(fd)
                if kept.pid is not None:
                    _kill_group(kept.pid, cgroups=not self.zygote.portable)

    def drop_live(self, ended: bool = False) -> str:
        """Kill the live child (the next call takes the spare); if it `ended` (closed its pipe), say how.

        With CUDA, always wait: the next child must not meet a dying child's CUDA context.
        """
        child, self.live, self.serving = self.live, None, None
        if child is None:
            return "killed"
        return self.kill(child, wait=ended or self.cuda, grace=CHILD_END_GRACE if ended else 0)

    # -- children ------------------------------------------------------------------------

    def spawn(self) -> Child:
        """Ask the zygote for a fresh worker child; its pid and hello are read when it is needed."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        output_r, output_w = os.pipe()
        key = secrets.token_bytes(32)  # the child signs every frame with it (grader/wire.py, `signature`)
        request = {
            "op": "spawn",
            "key": key.hex(),
            "candidate": str(self._copy),
            "workdir": self.workdir,
            "memory_limit": self.memory_limit_mb * 1024 * 1024,
            "pid_namespace": self.zygote.pid_namespace,
            "fs_isolation": self.zygote.fs_isolation,
            "cuda": self.warm_device,  # where torch sees CUDA, start it before the candidate's code runs
            "processes": self.processes or self.zygote.processes,
            "stand_ins": str(self.stand_ins) if self.stand_ins is not None else None,
        }
        try:
            ticket = self.zygote.send(request, (to_child_r, from_child_w, output_w))
        finally:
            for fd in (to_child_r, from_child_w, output_w):
                os.close(fd)
        os.set_blocking(to_child_w, False)
        self.workers_started += 1
        child = Child(ticket, (to_child_w, from_child_r), key=key)
        os.set_blocking(output_r, False)
        with self._streams_lock:
            self._streams[output_r] = child
        threading.Thread(target=self._drain, args=(output_r, child), daemon=True).start()
        return child

    def pid(self, child: Child, setup: bool = True) -> int:
        """The child's pid, once the zygote says it forked it; SetupFailed (with `setup`) if its sandbox failed."""
        if child.pid is None:
            reply = self.zygote.reply(child.ticket, time.monotonic() + self.import_timeout)
            child.pid, child.namespaced = int(reply["pid"]), reply.get("namespaced") is True
            child.fs_isolated = reply.get("fs_isolated") is True
            self.fs_isolated = self.fs_isolated is not False and child.fs_isolated
            if isinstance(reply.get("limits"), str) and self.limits is None:
                self.limits = reply["limits"][:200]
            if reply.get("setup_error") and setup:  # the zygote's word, before any candidate code ran
                raise SetupFailed(f"a worker could not set up its sandbox: {str(reply['setup_error'])[:400]}")
            if reply.get("cuda_error"):
                raise GraderBug(f"CUDA works in the grader but would not start in its worker ({reply['cuda_error']}); "
                                "grade with --device cpu, or see docs/sandbox.md")
        return child.pid

    def kill(self, child: Child, wait: bool = False, grace: float = 0) -> str:
        """End a child and all it started. Only `wait` waits for the zygote, to learn how it ended."""
        request = {"op": "kill", "pid": self.pid(child, setup=False), "wait": wait, "grace": grace}
        ticket = self.zygote.send(request, reply=wait)
        for fd in child.fds:
            os.close(fd)
        if not wait:
            return "killed"
        return str(self.zygote.reply(ticket, time.monotonic() + ZYGOTE_REPLY_TIMEOUT)["status"])

    def replace_zygote(self) -> None:
        """End what the dead zygote left (it can no longer) and start a fresh one for the rest."""
        orphans = [c.pid for c in (self.live, self.spare) if c is not None and c.pid is not None]
        for child in (self.live, self.spare):
            if child is not None:
                for fd in child.fds:
                    os.close(fd)
        for pid in orphans:
            _kill_group(pid, cgroups=not self.zygote.portable)
        self.live = self.spare = None
        self.serving = None
        self.zygotes_started += 1
        self.zygote.restart()

    def take_output(self) -> str:
        """What the children printed since the last take, once they had imported the file: a check's calls'
        output, capped at CHECK_OUTPUT_CAP bytes. The worker runs unbuffered and answers after its prints,
        so once a call has answered, what it printed is in the pipe and read here."""
        with self._streams_lock:
            for fd, child in list(self._streams.items()):
                self._read(fd, child)
            text = self._check_output.decode("utf-8", errors="replace")
            if self._check_output_total > CHECK_OUTPUT_CAP:
                text += f"\n[... {self._check_output_total - CHECK_OUTPUT_CAP} more bytes not kept]"
            self._check_output, self._check_output_total = bytearray(), 0
        return text

    def collect_output(self) -> None:
        """Read what the children have printed so far (a child about to be greeted: its import's output)."""
        with self._streams_lock:
            for fd, child in list(self._streams.items()):
                self._read(fd, child)

    def _drain(self, fd: int, child: Child) -> None:
        """Read a child's output as it comes until the child closes it (see `_read`)."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            try:
                poller.poll()
            except InterruptedError:
                continue
            with self._streams_lock:
                if not self._read(fd, child):
                    del self._streams[fd]
                    os.close(fd)
                    return

    def _read(self, fd: int, child: Child) -> bool:
        """Read what is in a child's output pipe now (with the lock held); False once the child closed it.

        The first OUTPUT_CAP bytes of all are kept, and of a greeted child's the first CHECK_OUTPUT_CAP
        bytes since the last take; the rest is read and dropped."""
        for _ in range(READ_ROUND // 65536):
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:
                return False
            self._output_total += len(chunk)
            room = OUTPUT_CAP - len(self._output)
            if room > 0:
                self._output += chunk[:room]
            if child.greeted:
                self._check_output_total += len(chunk)
                room = CHECK_OUTPUT_CAP - len(self._check_output)
                if room > 0:
                    self._check_output += chunk[:room]
        return True


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"  # the state follows the command name


def _stopped_by_ps(pid: int) -> bool:
    """As `_stopped`, where there is no /proc (macOS): ps's state begins with T for a stopped process."""
    try:
        done = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.stdout.strip().startswith("T")


def _kill_group(pid: int, cgroups: bool = True) -> None:
    """End a child its dead zygote can no longer end, and remove its cgroups once empty (Linux's sandbox)."""
    from grader.sandbox.limits import group_of  # the zygote's naming, in the one place it is defined

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not cgroups:
        return
    for _ in range(50):  # the child's new parent reaps it in a moment
        try:
            for controller in ("pids", "memory"):
                group = group_of(controller, pid)
                if group is not None and os.path.isdir(group):
                    os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
