"""The worker's entry point: a zygote that imports torch once, and forks the children that run candidate code.

The grader starts `python -I -u worker.py CONTROL_FD WIRE_PY [portable]` in a new session with
a scrubbed environment. This zygote never runs candidate code. It imports torch (and warms
the device the checks will use), then answers the grader on its control socket:

    {"op": "spawn", "workdir": ..., "candidate": ..., "memory_limit": bytes, "stand_ins": path | null, ...}
        with three file descriptors -> {"pid": N, "namespaced": bool, "fs_isolated": bool, "cuda_error": str | None}
        fork a child that drops into its own sandbox (isolation.py), imports the candidate file,
        says hello on its pipe and answers requests there (serve.py). As root, the zygote gives
        each child a PID namespace of its own, whose first process the child is. "fs_isolated"
        says whether the child's file system is the allowlist (`isolation.allowlist_root`): the
        child tells the zygote before any candidate code runs, so no candidate can forge it; so
        does "cuda_error", why CUDA would not start in the child (a fault of the grader's).
        "stand_ins" is the exercise's file of stand-in classes (grader code, loaded here by path
        once, before any child's sandbox hides it), which a script may build (scripts.py).
    {"op": "kill", "pid": N, "wait": bool, "grace": seconds}
        -> {"status": "exit code 0" | "killed by signal SIGSEGV" | ...}
        kill that child's process group, then every process below the zygote but the other
        children and theirs, and (with "wait") say how the child ended.
    {"op": "ping"} -> {"alive": true}
        so the grader knows no child's code has killed (or stopped) the zygote.

The zygote is a child subreaper, so a process the candidate starts in a new session or
double-forks is re-parented here and found by `_kill_descendants`. When the grader goes
away (the control socket closes) the zygote kills everything below it and exits.

With "portable" (macOS, or ATTN_GRADE_SANDBOX=portable on Linux) the zygote and its children use
nothing Linux-only: no namespaces, subreaper, seccomp, cgroups or allowlist root, only a session
of its own, an empty directory and the rlimits (`isolation.enter_portable_sandbox`); the control
socket is a stream (macOS has no SOCK_SEQPACKET), each message after its length; and the processes
below the zygote are found with `ps`, not /proc. Every child says it has no file-system isolation.

This file never imports the grader package: its sibling modules, like the wire module, are
loaded by path under private names (`_load_siblings`), all before any child's sandbox hides
grader/ from it.
"""

import builtins
import gc
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import NoReturn

# this folder's modules the worker runs
SIBLINGS = ("limits", "isolation", "seccomp", "guard", "kernels", "recorder", "answered", "serve", "scripts", "warm")
PRIVATE_PREFIX = "_attn_grade_sandbox_"  # their names here: no import of the grader package finds them
SANDBOX_SETUP_TIMEOUT = 10.0  # seconds the zygote waits for a child to say whether it is isolated
BUG_EXIT = 70  # the zygote's exit status for "a bug here, not the candidate's doing" (EX_SOFTWARE)
PORTABLE = __name__ == "__main__" and sys.argv[3:4] == ["portable"]  # the portable sandbox: see above
NOT_ISOLATED = "the portable sandbox has no file-system isolation"  # each child's word, in portable
FRAME_HEADER = 4  # bytes of a message's length on the portable sandbox's stream socket (big-endian)
PORTABLE_LINGER = 10.0  # seconds a portable child whose grader hung up waits for the zygote's kill (see `_child`)


def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__builtins__ = dict(builtins.__dict__)  # as the siblings' (`_load_siblings`)
    spec.loader.exec_module(module)
    return module


def _load_siblings() -> dict:
    """This folder's other modules, loaded by path under private names.

    Each is in sys.modules before any of them runs, so they import one another by those
    names (`import _attn_grade_sandbox_serve as serve`) whatever the order. None imports
    torch when loaded: the zygote's own `import torch` is timed (see `main`).
    """
    folder = os.path.dirname(os.path.abspath(__file__))
    loaded = []
    for name in SIBLINGS:
        spec = importlib.util.spec_from_file_location(PRIVATE_PREFIX + name, os.path.join(folder, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        module.__builtins__ = dict(builtins.__dict__)  # its own: a file that replaces a builtin changes none of these
        sys.modules[spec.name] = module
        loaded.append((spec, module))
    for spec, module in loaded:
        spec.loader.exec_module(module)
    return {name: module for name, (_, module) in zip(SIBLINGS, loaded, strict=True)}


_siblings = _load_siblings()
isolation, limits, seccomp, guard, serve, recorder, warm = (
    _siblings[n] for n in ("isolation", "limits", "seccomp", "guard", "serve", "recorder", "warm"))
# One thread for every numeric library, before any is imported: a child may start no thread (seccomp.py),
# and a pool that one of them forked without would try to start its threads again.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


# -- the zygote ------------------------------------------------------------------------


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    wire = _load_by_path("_attn_grade_wire", sys.argv[2])
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # ask NVML, so no CUDA context exists to break fork
    try:
        own_pid_namespace = None if PORTABLE else isolation.own_pid_namespace()
    except OSError as error:
        _bug(str(error))

    # No garbage collection while torch loads: it makes hundreds of thousands of objects, and
    # each full collection on the way walks them all (a tenth of the import's time). Then the
    # lot is frozen, so no child's collection walks (and copies) the pages it shares with us.
    gc.disable()
    os.environ.update({name: "1" for name in THREAD_ENV})
    import numpy  # noqa: F401  (imported once here, not in every child)
    import torch

    torch.set_num_threads(1)  # the grader needs the other core; the inputs are small
    wire.bound()  # what the codec reads of torch, bound before any candidate's code (wire.Bound)
    # A tensor printed once: its repr imports torch._subclasses.schema_check_mode lazily, whose namedtuples the
    # record cannot take for torch's (their methods' globals are collections'); loaded here, a print in a child
    # imports nothing and hides nothing.
    repr(torch.zeros(1))
    torch.set_num_interop_threads(1)
    cuda = torch.cuda.is_available()  # asked once, here: NVML's handles would not survive the sandbox
    if not cuda:
        warm.stand_ins()
        if os.environ.get("ATTN_GRADE_WARM") == "device":
            warm.warm_meta(torch)
        warm.seal()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    arm, lifted = guard.install(torch)  # held in this frame and the children's only (guard.py)
    recorder.remember_classes()  # once here, before any candidate's code: every child's record starts from them
    # The record once here too: its snapshots of torch's namespaces touch every object there, which in each child
    # would copy the pages they share with this process (20 ms a child)
    record = recorder.make_recorder(torch, lifted)
    gc.freeze()
    gc.enable()
    if not PORTABLE:
        isolation.become_subreaper()
        limits.remove_stale()
    spawned = set()
    workdirs, home = set(), os.getcwd()  # the candidates' folders and ours, all the grader's temporary ones
    plan = None if PORTABLE else isolation.sandbox_plan(home, cuda)  # once: every module the children need is loaded
    stand_ins = {}  # path -> the module of an exercise's stand-ins, loaded once

    while True:
        try:
            data, fds = _receive(control)
        except OSError:
            data, fds = b"", []
        if not data:  # the grader is gone (killed, maybe, with no time to clean up after us)
            for pid in spawned:
                _kill(pid)
            _kill_descendants(keep=set())
            for pid in spawned:
                if not PORTABLE:
                    limits.remove(pid)
            for folder in (*workdirs, home):  # gone already unless the grader was killed
                shutil.rmtree(folder, ignore_errors=True)
            os._exit(0)
        request = json.loads(data)
        if request["op"] == "spawn":
            workdirs.add(request["workdir"])
            stand_ins_module = _stand_ins(request.get("stand_ins"), stand_ins)
            # The next child is the first process of a PID namespace of its own: no process
            # outside has a pid it can name (`os.kill(-1, ...)`, the grader's or the zygote's
            # pid read from /proc reach nothing), and when it dies, all it started die too.
            wanted = request.get("pid_namespace", True) and own_pid_namespace is not None
            namespaced = wanted and isolation.pid_namespace_for_next_fork()
            status_read, status_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                control.close()
                os.close(status_read)
                _child(wire, torch, request, fds, cuda, status_write, plan, stand_ins_module, (arm, lifted, record))
            os.close(status_write)
            if namespaced and not isolation.return_to_pid_namespace(own_pid_namespace):
                _bug("cannot return to its own PID namespace")  # else the next child would join this one's
            spawned.add(pid)
            for fd in fds:
                os.close(fd)
            status = _isolation_status(status_read)
            _reply(control, {"pid": pid, "namespaced": namespaced, "fs_isolated": not status.get("fs"),
                             "cuda_error": status.get("cuda"), "limits": status.get("limits"),
                             "setup_error": status.get("setup")})
        elif request["op"] == "ping":
            _reply(control, {"alive": True})
        elif request["op"] == "kill":
            pid = request["pid"]
            spawned.discard(pid)
            if request.get("wait"):
                status = _kill(pid, grace=min(float(request.get("grace", 0)), 1.0))
                _reply(control, {"status": status})
            else:  # answer first: the grader goes on while the child is reaped and swept
                _reply(control, {"status": "killed"})
                _kill(pid)
            _kill_descendants(keep=spawned)
            if not PORTABLE:
                limits.remove(pid)  # empty only now that the sweep has ended what the child left


def _bug(message: str) -> NoReturn:
    """End the zygote for a fault of the grader's: the grader reads the log and reports an internal error."""
    print(f"attn-grade zygote: {message}", flush=True)
    os._exit(BUG_EXIT)


def _reply(control, answer: dict) -> None:
    """Answer the grader; one that has gone away reads nothing, and the next receive sees it gone."""
    data = json.dumps(answer).encode()
    try:
        control.sendall(len(data).to_bytes(FRAME_HEADER, "big") + data if PORTABLE else data)
    except OSError:
        pass


def _receive(control) -> tuple[bytes, list[int]]:
    """The grader's next request and the descriptors sent with it; b"" once the grader is gone.

    On the portable sandbox's stream the descriptors come with the first bytes of their message
    (the grader sends them in one sendmsg with its length), which are read before the rest.
    """
    if not PORTABLE:
        data, fds, _, _ = socket.recv_fds(control, 65536, 3)
        return data, fds
    head, fds = b"", []
    while len(head) < FRAME_HEADER:
        data, more, _, _ = socket.recv_fds(control, FRAME_HEADER - len(head), 3)
        fds += more
        if not data:
            return b"", fds
        head += data
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        chunk = control.recv(min(size - len(body), 65536))
        if not chunk:
            return b"", fds
        body += chunk
    return body, fds


def _stand_ins(path, loaded: dict):
    """The module of an exercise's stand-in classes (None for none), loaded by path once, in the zygote.

    Grader code, never the candidate's: it is loaded here, before a child's sandbox hides the
    kit, under a private name, and every child forked later has it. Loaded once per path, so
    a file changed while the zygote lives (by a candidate where there is no file-system
    isolation) is never run here.
    """
    if path is None:
        return None
    if path not in loaded:
        spec = importlib.util.spec_from_file_location(f"_attn_grade_stand_ins_{len(loaded)}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import would: a dataclass there looks its module up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            traceback.print_exc()
            _bug(f"cannot load the stand-ins {path}")
        loaded[path] = module
    return loaded[path]


def _kill(pid: int, grace: float = 0.0) -> str:
    """Kill a child's process group and whatever the candidate left; say how the child ended.

    With `grace`, a child that is ending by itself first gets that long to end: one passing
    on its candidate's death (`isolation.fork_into_pid_namespace`) must not be killed mid-way.
    In the portable sandbox (no subreaper) what the child started is killed first, while their
    parent lives and `ps` still shows them below it.
    """
    if PORTABLE:
        _kill_below(pid)
    deadline = time.monotonic() + grace
    ended = 0
    while not ended and time.monotonic() < deadline:
        try:
            ended, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "already reaped"
        if not ended:
            time.sleep(0.001)
    # The group, whose members outlive a reaped leader; and, not yet reaped (its pid still
    # its own), the child itself, in case it has no group yet.
    for kill in (os.killpg,) if ended else (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if not ended:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return "already reaped"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
        return f"killed by signal {name}"
    return f"exit code {os.WEXITSTATUS(status)}"


def _kill_descendants(keep: set) -> None:
    """SIGKILL every process below the zygote but the children in `keep` and theirs, until none is left."""
    me = os.getpid()
    for _ in range(100):
        parents = _parents_by_ps() if PORTABLE else _parents()
        below, frontier = set(), {me}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in below | keep}
            below |= frontier
        if not below:
            break
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in below:  # reap our own; the others' parents reap theirs
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _kill_below(pid: int) -> None:
    """SIGKILL every process below `pid` (not `pid` itself), as `ps` shows them now."""
    parents = _parents_by_ps()
    below, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier and p not in below}
        below |= frontier
    for process in below:
        try:
            os.kill(process, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                parents[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return parents


def _parents_by_ps() -> dict[int, int]:
    """Every process's parent, from `ps` (macOS has no /proc); from /proc where ps fails and it exists.

    Without a subreaper (portable) a process whose parent died is re-parented to init or launchd:
    out of sight, though still in its child's process group unless it left that too (`_kill_below`
    looks before the child dies).
    """
    try:
        ps = subprocess.Popen(["ps", "-A", "-o", "pid=,ppid="], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out, _ = ps.communicate(timeout=10)
    except (OSError, subprocess.SubprocessError):
        return _parents() if os.path.isdir("/proc") else {}
    parents = {}
    fields = out.split()
    for pid, parent in zip(fields[::2], fields[1::2], strict=False):
        try:
            parents[int(pid)] = int(parent)
        except ValueError:
            pass
    parents.pop(ps.pid, None)  # ps itself, ended and reaped by now: its pid is no longer its own
    return parents


# -- a child: the sandbox, then the candidate ------------------------------------------


def _child(wire, torch, request, fds, cuda: bool, status_fd: int, plan: dict, stand_ins, guarded) -> None:
    """A worker child, never returning: the sandbox, then the candidate's file served. `guarded` is the guard's arm
    and lifted and the record the zygote made (guard.py, recorder.py)."""
    read_fd, write_fd, output_fd = fds
    arm, lifted, record = guarded
    told = False  # the zygote has this child's status: the sandbox stands, and the candidate's code may run
    try:
        bounds = limits.APART
        if PORTABLE:
            isolation.enter_portable_sandbox(request, output_fd, keep=(read_fd, write_fd, status_fd))
        else:
            namespace = isolation.enter_sandbox(request, output_fd, keep=(read_fd, write_fd, status_fd), cuda=cuda)
            bounds = limits.bound(request["memory_limit"])
            if namespace:
                isolation.fork_into_pid_namespace()
        # Told before any candidate code runs: the zygote's word, never the candidate's.
        if PORTABLE:
            failure = NOT_ISOLATED
        elif request.get("fs_isolation", True):
            failure = isolation.allowlist_root(request["workdir"], plan, cuda)
        else:
            failure = "turned off"
        cuda_error = isolation.cap_memory(torch, request["memory_limit"], cuda, cuda and request.get("cuda", True),
                                          portable=PORTABLE)
        _triton_environment(request["workdir"], cuda and request.get("cuda", True), plan and plan.get("libcuda"))
        status = {"fs": failure and failure[:400], "cuda": cuda_error and cuda_error[:400], "limits": bounds}
        os.write(status_fd, json.dumps(status).encode())
        os.close(status_fd)
        told = True
        for name in request.get("preload", []):  # what the exercise needs loaded before the guard is armed
            importlib.import_module(name)
        processes = request.get("processes", False) is True  # Triton's compilers on CUDA start processes
        if not PORTABLE:
            isolation.drop_capabilities()
            seccomp.install(processes)
        _hide_worker()
        key = bytes.fromhex(request["key"])  # this child's frames are signed with it (wire.py, `signature`)
        armed = (lambda kept: arm(kept, processes), lifted, record)
        serve.serve(wire, torch, request["candidate"], read_fd, write_fd, cuda, stand_ins, armed, key)
        if PORTABLE:  # the grader is done with this child: the zygote kills it in a moment. Until then it
            time.sleep(PORTABLE_LINGER)  # lives, so what it started is still below it for `_kill_below`
    except BaseException as error:
        if not told:  # the sandbox failed before any candidate code ran: the grader's fault, never the candidate's
            try:
                os.write(status_fd, json.dumps({"setup": f"{type(error).__name__}: {error}"[:400]}).encode())
            except OSError:
                pass
    finally:
        os._exit(0)


def _triton_environment(workdir: str, cuda_started: bool, libcuda: str | None) -> None:
    """A generic rule for code that uses Triton (the worker knows no exercise): Triton's cache in the child's own
    folder, and, where this child does not use CUDA, Triton's interpreter (kernels run on the CPU with NumPy), set
    before the candidate's file can import triton, which reads it when a kernel is decorated."""
    os.environ["TRITON_CACHE_DIR"] = os.path.join(workdir, ".triton")
    if cuda_started:
        os.environ.pop("TRITON_INTERPRET", None)
        if libcuda:  # the allowlist hides /sbin/ldconfig, which Triton would ask
            os.environ["TRITON_LIBCUDA_PATH"] = libcuda
    else:
        os.environ["TRITON_INTERPRET"] = "1"


def _hide_worker() -> None:
    """Take the worker's modules out of sys.modules and give the child an empty __main__: nothing the
    candidate's code can import or look up names them (their functions keep their own globals)."""
    for name in [n for n in sys.modules if n.startswith("_attn_grade_")]:  # siblings, wire, stand-ins
        del sys.modules[name]
    sys.modules["__main__"] = type(sys)("__main__")


def _isolation_status(status_fd: int) -> dict:
    """What the child just forked says before any candidate code runs: why it does not see
    only the allowlist ("fs"), and why CUDA would not start ("cuda"), each None if all is
    well (and both said if it died first). Said in the zygote's log too."""
    try:
        ready, _, _ = select.select([status_fd], [], [], SANDBOX_SETUP_TIMEOUT)
        raw = os.read(status_fd, 2048) if ready else b""
    finally:
        os.close(status_fd)
    try:
        status = json.loads(raw)
    except ValueError:
        status = {"setup": "it ended or hung before it said how its sandbox stands"}
    if status.get("setup"):
        print("attn-grade zygote: a worker could not set up its sandbox:", status["setup"], flush=True)
        return status
    if status.get("fs") and status["fs"] != NOT_ISOLATED:  # expected of every portable child: no news
        print("attn-grade zygote: a worker runs without file-system isolation:", status["fs"], flush=True)
    if status.get("cuda"):
        print("attn-grade zygote: CUDA did not start in a worker:", status["cuda"], flush=True)
    return status


if __name__ == "__main__":
    main()
