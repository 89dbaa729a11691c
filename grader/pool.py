"""The processes that run a candidate's code: a zygote that imports torch once, and the children it forks.

`Zygote` is the grader's end of the zygote (grader/sandbox/worker.py): requests go over a
socket with the file descriptors they need, and replies come back in order. `Pool` holds one
candidate's worker children: the live one answering calls, and a spare forked ahead for the
next step. A child is killed with everything it started; what the children print is kept,
capped. A candidate's code can kill or stop the zygote itself (a child without a PID namespace
of its own can reach it): that is `ZygoteGone`, and the pool ends what the dead zygote left and
starts a fresh one in its place.

Nothing here imports torch.
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

from grader import wire
from grader.exercise import GraderBug

WORKER_PATH = Path(__file__).resolve().parent / "sandbox" / "worker.py"
OUTPUT_CAP = 64 * 1024  # bytes of the candidate's stdout and stderr kept
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME")
ZYGOTE_REPLY_TIMEOUT = 10.0
CHILD_END_GRACE = 0.5  # seconds a child whose pipe closed gets to end by itself, so its cause of death is its own
STOP_CHECK_INTERVAL = 0.5  # how soon a zygote a candidate stopped (SIGSTOP) is noticed


class ZygoteGone(GraderBug):
    """The zygote process died; if a candidate's child was running, the candidate killed it."""


class Zygote:
    """The process that imports torch once and forks a worker child per request (grader/sandbox/worker.py).

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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(HOME=self._private, TMPDIR=self._private, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
        if self.warm_device:
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
class Child:
    """A worker child: the zygote's ticket for its pid, the pipes to it, its pid and hello once known."""

    ticket: int
    fds: tuple[int, int]  # (send, receive)
    pid: int | None = None
    namespaced: bool = False  # the zygote made its PID namespace: out of reach of the zygote and the grader
    fs_isolated: bool = False  # the zygote says its file system is the allowlist (sandbox/worker.py, `_allowlist_root`)
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
    ):
        self.memory_limit_mb = memory_limit_mb
        self.import_timeout = import_timeout  # how long a child's pid may take: the zygote forks it at once
        self.warm_device = warm_device
        self.stand_ins = stand_ins  # the exercise's stand-ins file, which each child may load
        self.zygote = zygote  # borrowed, or started (and closed) by this pool
        self._owns_zygote = zygote is None
        self.live: Child | None = None  # the child answering calls
        self.serving: str | None = None  # the one function or class it has been called for
        self.spare: Child | None = None  # forked ahead, for the next step
        self.cuda = False  # the children see CUDA (their hello says so): a killed one is waited for
        self.fs_isolated: bool | None = None  # every child so far saw only the allowlist (None: no child yet)
        self.workers_started = 0
        self._output = bytearray()
        self._output_total = 0
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
        request = {
            "op": "spawn",
            "candidate": str(self._copy),
            "workdir": self.workdir,
            "memory_limit": self.memory_limit_mb * 1024 * 1024,
            "pid_namespace": self.zygote.pid_namespace,
            "fs_isolation": self.zygote.fs_isolation,
            "cuda": self.warm_device,  # where torch sees CUDA, start it before the candidate's code runs
            "stand_ins": str(self.stand_ins) if self.stand_ins is not None else None,
        }
        try:
            ticket = self.zygote.send(request, (to_child_r, from_child_w, output_w))
        finally:
            for fd in (to_child_r, from_child_w, output_w):
                os.close(fd)
        os.set_blocking(to_child_w, False)
        self.workers_started += 1
        threading.Thread(target=self._drain, args=(output_r,), daemon=True).start()
        return Child(ticket, (to_child_w, from_child_r))

    def pid(self, child: Child) -> int:
        if child.pid is None:
            reply = self.zygote.reply(child.ticket, time.monotonic() + self.import_timeout)
            child.pid, child.namespaced = int(reply["pid"]), reply.get("namespaced") is True
            child.fs_isolated = reply.get("fs_isolated") is True
            self.fs_isolated = self.fs_isolated is not False and child.fs_isolated
            if reply.get("cuda_error"):  # the zygote's word, before any candidate code ran
                raise GraderBug(f"CUDA works in the grader but would not start in its worker ({reply['cuda_error']}); "
                                "grade with --device cpu, or see docs/sandbox.md")
        return child.pid

    def kill(self, child: Child, wait: bool = False, grace: float = 0) -> str:
        """End a child and all it started. Only `wait` waits for the zygote, to learn how it ended."""
        request = {"op": "kill", "pid": self.pid(child), "wait": wait, "grace": grace}
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
            _kill_group(pid)
        self.live = self.spare = None
        self.serving = None
        self.zygote.restart()

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


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"  # the state follows the command name


def _kill_group(pid: int) -> None:
    """End a child its dead zygote can no longer end, and remove its pids cgroup once empty."""
    from grader.sandbox.isolation import cgroup  # the zygote's naming, in the one place it is defined

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(50):  # the child's new parent reaps it in a moment
        try:
            os.rmdir(cgroup(pid))
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
