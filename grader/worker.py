"""The worker side: a zygote that imports torch once, and the forked children that run candidate code.

The grader starts `python -I -u worker.py CONTROL_FD WIRE_PY` in a new session with a
scrubbed environment. This zygote never runs candidate code. It imports torch (and warms
the device the checks will use), then answers the grader on its control socket:

    {"op": "spawn", ...} with three file descriptors -> {"pid": N, "namespaced": bool, "fs_isolated": bool,
                                                         "cuda_error": str | None}
        fork a child that drops into its own sandbox (below), imports the candidate file,
        says hello on its pipe and answers requests there. As root, the zygote gives each
        child a PID namespace of its own, whose first process the child is. "fs_isolated"
        says whether the child's file system is the allowlist (`_allowlist_root`): the child
        tells the zygote before any candidate code runs, so no candidate can forge it; so
        does "cuda_error", why CUDA would not start in the child (a fault of the grader's).
    {"op": "kill", "pid": N, "wait": bool, "grace": seconds} -> {"status": "exit code 0" | "killed by signal SIGSEGV" | ...}
        kill that child's process group, then every process below the zygote but the other
        children and theirs, and (with "wait") say how the child ended.
    {"op": "ping"} -> {"alive": true}
        so the grader knows no child's code has killed (or stopped) the zygote.

The zygote is a child subreaper, so a process the candidate starts in a new session or
double-forks is re-parented here and found by `_kill_descendants`. When the grader goes
away (the control socket closes) the zygote kills everything below it and exits.

A child answers requests one at a time:

    {"op": "call", "name": "softmax", "args": [...], "kwargs": {...}, "device": "meta"}
    {"op": "module", "name": "MultiHeadAttention", "init": [...], "init_kwargs": {...},
     "state": {...}, "args": [...], "kwargs": {...}, "device": "cpu",
     "grad_output": <tensor or None>, "grad_args": [0, 1]}
    {"op": "script", "name": "CachedSelfAttention", "device": "cpu", "answered": [...], "actions": [...]}

"script" runs a list of plain-data actions in order, for a stateful class (a KV cache, a
module that fills one), under torch.no_grad as inference runs: see `_script`.

with {"ok": true, "value": ..., "called": [...]} or {"ok": false, "error": {...}}.
"called" names every torch function the candidate's code called (seen through a
TorchFunctionMode, so aliases and getattr do not hide a call); the grader decides which
were forbidden. A "call" answer also says, as "changed_in_place", which arguments (by
position or keyword) the call changed. Nothing here decides a score: everything in a
child is untrusted.
"""

import ctypes
import gc
import importlib.util
import inspect
import json
import os
import platform
import pwd
import re
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import sysconfig
import tempfile
import time
import traceback

BLOCKED_PACKAGES = ("grader", "solutions")
HIDDEN_FROM_CANDIDATES = ("grader", "solutions", "tests", ".git")  # the kit's parts, covered where an allowed folder holds them
MAX_MESSAGE = 500
CHILD_PROCESS_LIMIT = 64  # processes a worker child may have below it: a fork bomb stops there
PIDS_CGROUP = "/sys/fs/cgroup/pids"  # cgroup v1's pids hierarchy, used when the grader runs as root
FILE_SIZE_LIMIT = 64 * 1024 * 1024  # bytes a child may write to one file
SHM_SIZE = "64m"  # its own /dev/shm
# /proc stays writable (the CUDA driver writes to its process's own files there, and fails
# with error 304 where it cannot), but not these: root's uid could change the kernel through them.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
MINIMAL_DEVICES = ("null", "zero", "full", "random", "urandom")  # the /dev of a worker without CUDA
SANDBOX_SETUP_TIMEOUT = 10.0  # seconds the zygote waits for a child to say whether it is isolated
BUG_EXIT = 70  # the zygote's exit status for "a bug here, not the candidate's doing" (EX_SOFTWARE)
PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 36, 24, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC = 0x08000000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# The kernel keyring's system calls (add_key, request_key, keyctl) by architecture: a child
# refuses them, since keys are the user's across every namespace the child has.
KEYRING_SYSCALLS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}.get(platform.machine())
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_NOATIME, MS_NODIRATIME, MS_REC, MS_RELATIME, MS_PRIVATE = 1024, 2048, 16384, 1 << 21, 1 << 18
ST_RELATIME = 4096  # statvfs's name for a relatime mount
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(platform.machine())


# -- the zygote ------------------------------------------------------------------------


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    wire = _load_by_path("_attn_grade_wire", sys.argv[2])
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # ask NVML, so no CUDA context exists to break fork
    own_pid_namespace = _own_pid_namespace()

    # No garbage collection while torch loads: it makes hundreds of thousands of objects, and
    # each full collection on the way walks them all (a tenth of the import's time). Then the
    # lot is frozen, so no child's collection walks (and copies) the pages it shares with us.
    gc.disable()
    import numpy  # noqa: F401  (imported once here, not in every child)
    import torch

    torch.set_num_threads(1)  # the grader needs the other core; the inputs are small
    cuda = torch.cuda.is_available()  # asked once, here: NVML's handles would not survive the sandbox
    if os.environ.get("ATTN_GRADE_WARM") == "device" and not cuda:
        _warm_meta(torch)
    gc.freeze()
    gc.enable()
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _remove_stale_cgroups()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    spawned = set()
    workdirs, home = set(), os.getcwd()  # the candidates' folders and ours, all the grader's temporary ones
    plan = _sandbox_plan(home, cuda)  # once: every module the children need is loaded by now

    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 65536, 3)
        except OSError:
            data, fds = b"", []
        if not data:  # the grader is gone (killed, maybe, with no time to clean up after us)
            for pid in spawned:
                _kill(pid)
            _kill_descendants(keep=set())
            for pid in spawned:
                _remove_cgroup(pid)
            for folder in (*workdirs, home):  # gone already unless the grader was killed
                shutil.rmtree(folder, ignore_errors=True)
            os._exit(0)
        request = json.loads(data)
        if request["op"] == "spawn":
            workdirs.add(request["workdir"])
            # The next child is the first process of a PID namespace of its own: no process
            # outside has a pid it can name (`os.kill(-1, ...)`, the grader's or the zygote's
            # pid read from /proc reach nothing), and when it dies, all it started die too.
            wanted = request.get("pid_namespace", True) and own_pid_namespace is not None
            namespaced = wanted and _libc().unshare(CLONE_NEWPID) == 0
            status_read, status_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                control.close()
                os.close(status_read)
                _child(wire, torch, request, fds, cuda, status_write, plan)  # never returns
            os.close(status_write)
            if namespaced and _libc().setns(own_pid_namespace, CLONE_NEWPID) != 0:
                # Back to our own failed: the next child would join this one's namespace.
                print("attn-grade zygote: cannot return to its own PID namespace", flush=True)
                os._exit(BUG_EXIT)
            spawned.add(pid)
            for fd in fds:
                os.close(fd)
            status = _isolation_status(status_read)
            _reply(control, {"pid": pid, "namespaced": namespaced, "fs_isolated": not status.get("fs"),
                             "cuda_error": status.get("cuda")})
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
            _remove_cgroup(pid)  # empty only now that the sweep has ended what the child left


def _reply(control, answer: dict) -> None:
    """Answer the grader; one that has gone away reads nothing, and the next receive sees it gone."""
    try:
        control.sendall(json.dumps(answer).encode())
    except OSError:
        pass


def _kill(pid: int, grace: float = 0.0) -> str:
    """Kill a child's process group and whatever the candidate left; say how the child ended.

    With `grace`, a child that is ending by itself first gets that long to end: one passing
    on its candidate's death (`_fork_into_pid_namespace`) must not be killed mid-way.
    """
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


def _own_pid_namespace() -> int | None:
    """A handle on the zygote's PID namespace, where it may make new ones for its children (root).

    Each spawn unshares a new one for the next fork, then enters this one again (only then
    is the following child's namespace new too): tried once here, so a spawn cannot fail so.
    """
    if os.geteuid() != 0:
        return None  # the children make their own, through a user namespace (`_enter_sandbox`)
    try:
        handle = os.open("/proc/self/ns/pid", os.O_RDONLY)
    except OSError:
        return None
    if _libc().unshare(CLONE_NEWPID) != 0:
        os.close(handle)
        return None
    if _libc().setns(handle, CLONE_NEWPID) != 0:
        print("attn-grade zygote: cannot return to its own PID namespace", flush=True)
        os._exit(BUG_EXIT)
    return handle


def _kill_descendants(keep: set) -> None:
    """SIGKILL every process below the zygote but the children in `keep` and theirs, until none is left."""
    me = os.getpid()
    for _ in range(100):
        parents = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        stat = f.read()
                    parents[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
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


def _warm_meta(torch) -> None:
    """Pay for the meta device's first use now, while the grader is still importing torch."""
    _skip_lazy_dynamo_import(torch)
    x = torch.ones(2, 2, device="meta")
    (x @ x.T).exp().amax(-1, keepdim=True).masked_fill(x[:, :1] > 0, 0.0)


def _skip_lazy_dynamo_import(torch) -> None:
    """Spare the meta device's first elementwise op an import of torch._dynamo (over a second).

    torch wraps its Python meta kernels in torch._disable_dynamo, which imports
    torch._dynamo on a function's first call only to wrap it so torch.compile will not
    trace it. Nothing is compiled here, so each wrapper gets its function as is.
    """
    inner = torch._compile._disable_dynamo(_warm_meta).__code__
    slot = inner.co_freevars.index("fn")
    for obj in gc.get_objects():
        if type(obj) is type(_warm_meta) and obj.__code__ is inner:
            fn = obj.__closure__[slot].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                fn.__dynamo_disable = fn


# -- a child: the sandbox, then the candidate ------------------------------------------


def _child(wire, torch, request, fds, cuda: bool, status_fd: int, plan: dict) -> None:
    read_fd, write_fd, output_fd = fds
    try:
        if _enter_sandbox(request, output_fd, keep=(read_fd, write_fd, status_fd), cuda=cuda):
            _fork_into_pid_namespace()
        # Told before any candidate code runs: the zygote's word, never the candidate's.
        failure = _allowlist_root(request["workdir"], plan, cuda) if request.get("fs_isolation", True) else "turned off"
        cuda_error = _cap_memory(torch, request["memory_limit"], cuda, cuda and request.get("cuda", True))
        status = {"fs": failure and failure[:400], "cuda": cuda_error and cuda_error[:400]}
        os.write(status_fd, json.dumps(status).encode())
        os.close(status_fd)
        _drop_capabilities()
        _serve(wire, torch, request["candidate"], read_fd, write_fd, cuda)
    finally:
        os._exit(0)


def _cap_memory(torch, limit: int, cuda: bool, start_cuda: bool) -> str | None:
    """Cap the memory the candidate's process can write to (RLIMIT_DATA) at `limit` bytes.

    Where torch sees CUDA, its build already holds over a GB of writable mappings (1.26 GB
    measured on an H100, where a 1 GB cap stopped CUDA's start), so the cap is `limit` on top
    of what the process holds; and where the device checks run on CUDA (`start_cuda`), CUDA
    starts here first, before any candidate code. Returns why CUDA would not start, if it did not.
    """
    error = None
    if start_cuda:
        os.environ["CUDA_CACHE_DISABLE"] = "1"  # no JIT cache to fill (the driver still makes an empty ~/.nv)
        try:
            torch.zeros(1, device="cuda")
        except Exception as exc:  # the sandbox's fault, or the machine's: never the candidate's
            error = f"{type(exc).__name__}: {exc}"
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit + _data_size(),) * 2 if cuda else (limit,) * 2)
    return error


def _data_size() -> int:
    """The bytes RLIMIT_DATA counts for this process now (VmData)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


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
        status = {"fs": "no answer", "cuda": None}
    if status.get("fs"):
        print("attn-grade zygote: a worker runs without file-system isolation:", status["fs"], flush=True)
    if status.get("cuda"):
        print("attn-grade zygote: CUDA did not start in a worker:", status["cuda"], flush=True)
    return status


def _fork_into_pid_namespace() -> None:
    """Where this child could make a PID namespace only itself (not root): run the candidate
    as its first process, and here only pass on how it ended, so the zygote reports that.
    """
    pid = os.fork()
    if pid == 0:
        return
    for fd in range(1024):  # the pipes stay open in the candidate's process only
        try:
            os.close(fd)
        except OSError:
            pass
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: die of the same one
        try:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        except (OSError, ValueError):
            pass
        os._exit(128 - code)
    os._exit(code)


def _enter_sandbox(request, output_fd, keep, cuda: bool = False) -> bool:
    """A session of its own, output to the grader's pipe, an empty directory, limits, no
    network, and (not root) a user namespace, where the system allows one.

    True when it made a PID namespace that only its next fork enters (`_fork_into_pid_namespace`).
    """
    os.setsid()
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    for fd in range(3, 1024):  # nothing of the zygote's stays open (its control socket included)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    workdir = request["workdir"]
    os.chdir(workdir)
    os.environ.update(HOME=workdir, TMPDIR=workdir)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash is reported, not dumped
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails instead of killing
    _limit_processes()
    # A network namespace of its own has only a loopback that is down; an IPC namespace of its
    # own, so no System V shared memory, semaphore or message queue reaches another child or
    # outlives this one (a candidate could leave answers there for its next grade). Root may
    # make them (its PID namespace the zygote made); another user only inside a user
    # namespace, where the system allows those, and a PID namespace there too. unshare makes
    # all or none.
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        _libc().unshare(CLONE_NEWNET | CLONE_NEWIPC)
        return False
    own = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC
    if request.get("pid_namespace", True) and _libc().unshare(own | CLONE_NEWPID) == 0:
        _map_own_ids(uid, gid)
        return True
    if _libc().unshare(own) == 0:
        _map_own_ids(uid, gid)
    return False


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace, be the same user and group as outside: files it makes (the
    new root's mount points) need an owner, and its uid stays the grader's user's."""
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass  # then building the new root fails, and the child says it is not isolated


# -- the allowlist: what a child's file system holds -----------------------------------


def _sandbox_plan(home: str, cuda: bool) -> dict:
    """What each child's new root shows, read-only, worked out once in the zygote.

    The interpreter and its standard library; the site folders torch and numpy came from
    (with the packages beside them, which torch imports lazily); the folder of every shared
    library loaded now, and the loader's cache, so a library loaded later is found; and with
    CUDA, LD_LIBRARY_PATH and CUDA_HOME. Never the temporary folder, a home folder or /:
    a library loaded from one of those is shown alone. The kit's own parts are covered where
    an allowed folder holds them (a kit installed in site-packages).
    """
    import numpy
    import torch

    paths = sysconfig.get_paths()
    wanted = [paths["stdlib"], paths["platstdlib"], sys.executable, os.path.join(sys.prefix, "pyvenv.cfg"), "/etc/ld.so.cache"]
    wanted.append(_elf_interpreter(os.path.realpath(sys.executable)))  # so the candidate may run python again
    wanted += [os.path.dirname(os.path.dirname(module.__file__)) for module in (torch, numpy)]
    for library in _mapped_files():
        wanted += [os.path.dirname(library), library]
    if cuda:
        wanted += os.environ.get("LD_LIBRARY_PATH", "").split(":") + [os.environ.get("CUDA_HOME", "")]
    never = [tempfile.gettempdir(), os.path.dirname(home), _home_folder(), "/"]
    allowed = set()
    for path in filter(None, wanted):
        for candidate in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.exists(candidate) and not any(_within(folder, candidate) for folder in never):
                allowed.add(candidate)
    allowed = sorted(p for p in allowed if not any(p != q and _within(p, q) for q in allowed))
    kit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    hidden = [os.path.join(kit, part) for part in HIDDEN_FROM_CANDIDATES]
    hidden = [h for h in hidden if os.path.isdir(h) and any(_within(h, p) for p in allowed)]
    new_root = os.path.join(home, "new-root")  # the mount point each child's new root is built on
    os.makedirs(new_root, exist_ok=True)
    devices = list(MINIMAL_DEVICES)
    if cuda:  # nvidia0, nvidiactl, nvidia-uvm, nvidia-caps/...: the GPU's device files, no other
        devices += sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    return {"allowed": allowed, "hidden": hidden, "new_root": new_root, "devices": devices}


def _home_folder() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # a uid with no name (containers run some)
        return "/"


def _mapped_files() -> list[str]:
    """Every file mapped into this process now: the interpreter, libpython, torch's and numpy's libraries."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/") and not fields[5].startswith(("/dev/", "/proc/", "/sys/")):
                path = fields[5].strip()
                if os.path.isfile(path):  # not "(deleted)"
                    found.add(path)
    return sorted(found)


def _elf_interpreter(path: str) -> str | None:
    """The dynamic loader a 64-bit ELF executable names (PT_INTERP): exec looks for it at that very path."""
    try:
        with open(path, "rb") as f:
            head = f.read(65536)
        if head[:5] != b"\x7fELF\x02":
            return None
        order = "<" if head[5] == 1 else ">"
        (table,), (size, count) = struct.unpack_from(order + "Q", head, 32), struct.unpack_from(order + "HH", head, 54)
        for i in range(count):
            kind, _, offset, _, _, length = struct.unpack_from(order + "IIQQQQ", head, table + i * size)
            if kind == 3:  # PT_INTERP
                return head[offset : offset + length].rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        pass
    return None


def _within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _allowlist_root(workdir: str, plan: dict, cuda: bool) -> str | None:
    """Make this child's file system the allowlist: a new root on a fresh tmpfs, holding
    read-only bind mounts of the plan's folders, a /proc, a /dev of five character devices
    (with CUDA, the GPU's device files too, and /sys), a small /dev/shm of its own, and the
    working directory, the only place it may write. Entered with pivot_root; the old root
    is unmounted, so no path leads back to it.

    None when done; else why not: the system allows no mount namespace, or the root could
    not be built. The candidate then runs with the file system as it is, and every report
    says so.
    """
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return "no mount namespace"  # see "What it is not" in the README
    try:
        new_root = plan["new_root"]
        for path in plan["hidden"]:  # empty and read-only, before the bind mounts below copy what covers them
            _mount(libc, "none", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
        _mount(libc, "none", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for path in [*plan["allowed"], workdir]:
            _bind(libc, path, new_root + path)
        for name in os.listdir("/"):  # /lib -> usr/lib and the like, for paths the loader's cache names
            if os.path.islink("/" + name) and not os.path.lexists(new_root + "/" + name):
                os.symlink(os.readlink("/" + name), new_root + "/" + name)
        os.mkdir(new_root + "/proc")
        if libc.mount(b"proc", (new_root + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
            _bind(libc, "/proc", new_root + "/proc")  # no proc of its own here (a container's masked /proc)
        for name in PROC_READ_ONLY:  # each its own mount, made read-only below with the rest
            path = f"{new_root}/proc/{name}"
            if os.path.exists(path):
                _mount(libc, path, path, None, MS_BIND | MS_REC, None)
        for name in plan["devices"]:  # never a disk: with CUDA, only the GPU's own files besides
            _bind(libc, f"/dev/{name}", f"{new_root}/dev/{name}")
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"{new_root}/dev/{name}")
        os.mkdir(new_root + "/dev/shm")
        _mount(libc, "none", new_root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={SHM_SIZE}")
        if cuda:  # what the driver reads about the GPU (read-only below, like every mount)
            _bind(libc, "/sys", new_root + "/sys")
        os.chdir(new_root)
        if SYS_PIVOT_ROOT is None or libc.syscall(SYS_PIVOT_ROOT, b".", b".") != 0:
            raise OSError(ctypes.get_errno(), f"pivot_root failed on {platform.machine()}")
        if libc.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked on the new one by pivot_root
            raise OSError(ctypes.get_errno(), "cannot unmount the old root")
        os.chdir(workdir)
        for mount_point in _mount_points():
            if mount_point not in (workdir, "/dev/shm", "/proc"):  # CUDA's driver writes its own /proc/self
                _read_only(libc, mount_point)
    except OSError as error:
        return str(error)
    return None


def _mount(libc, source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags, data and data.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot mount {fstype or source} on {target}: {os.strerror(errno)}")


def _bind(libc, source: str, target: str) -> None:
    """Bind `source` (a folder or a file, with every mount below it) at `target`, making the mount point."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(libc, source, target, None, MS_BIND | MS_REC, None)


def _read_only(libc, mount_point: str) -> None:
    """Remount read-only, restating the flags a user namespace locks (a remount must not drop them)."""
    try:
        flags = os.statvfs(mount_point).f_flag
    except OSError:
        return  # covered by a later mount: out of sight
    kept = flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    kept |= MS_RELATIME if flags & ST_RELATIME else 0
    _mount(libc, "none", mount_point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept, None)


def _mount_points() -> list[str]:
    """Every mount point this process sees (the fifth field of mountinfo, octal escapes undone)."""
    with open("/proc/self/mountinfo", "rb") as f:
        fields = [line.split()[4] for line in f]
    return [re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), field).decode() for field in fields]


def _drop_capabilities() -> None:
    """Give up every capability, for good: root's (or a user namespace's) powers end here.

    The uid stays (files the grader's user owns stay readable), but nothing can raise the
    rlimits back, leave the namespaces (setns), or read the grader's memory or environment
    through /proc (that needs all the capabilities the grader holds); exec regains none.
    """
    libc = _libc()
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the kernel's last capability
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)  # this process
    libc.capset(header, (ctypes.c_uint32 * 6)())  # effective, permitted, inheritable: all empty
    _refuse_keyrings()


def _refuse_keyrings() -> None:
    """A seccomp filter: add_key, request_key and keyctl fail with EPERM, for this process and all it starts.

    The kernel keyring is the user's (root's, for a grader run as root) across every
    namespace: a candidate could read the keys of the machine's user, or leave one for its
    next grade. System calls of another ABI than the native one (i386's on x86_64, x32's)
    fail the same way, so the numbers cannot be dodged.
    """
    if KEYRING_SYSCALLS is None:
        return
    arch, numbers = KEYRING_SYSCALLS
    load, equal, at_least, give = 0x20, 0x15, 0x35, 0x06  # BPF: load a word of seccomp_data, jump if ==, if >=, return
    allow, refuse = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    n = len(numbers)
    # (code, jump if true, jump if false, value): a jump skips that many instructions; the last is "refuse"
    program = [
        (load, 0, 0, 4),  # seccomp_data.arch
        (equal, 0, n + 3, arch),  # another ABI: refuse everything it asks
        (load, 0, 0, 0),  # seccomp_data.nr
        (at_least, n + 1, 0, 0x40000000),  # x32's numbers
        *[(equal, n - i, 0, number) for i, number in enumerate(numbers)],
        (give, 0, 0, allow),
        (give, 0, 0, refuse),
    ]

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Instruction))]

    instructions = (Instruction * len(program))(*[Instruction(*i) for i in program])
    _libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), instructions)), 0, 0)


def _limit_processes() -> None:
    """At most CHILD_PROCESS_LIMIT processes below this child: a fork bomb stops there.

    RLIMIT_NPROC counts a user's processes, and does not bind root at all; for root a
    pids cgroup of the child's own does the job, where the system has one we may write.
    """
    if os.geteuid() != 0:
        mine = sum(_threads(p) for p in os.listdir("/proc") if p.isdigit() and _owner(p) == os.geteuid())
        resource.setrlimit(resource.RLIMIT_NPROC, (mine + CHILD_PROCESS_LIMIT,) * 2)
        return
    group = _cgroup(int(os.readlink("/proc/self")))  # the pid the zygote knows (here, os.getpid() is 1)
    try:
        os.mkdir(group)
        with open(f"{group}/pids.max", "w") as f:
            f.write(str(CHILD_PROCESS_LIMIT))
        with open(f"{group}/cgroup.procs", "w") as f:
            f.write("0")  # this process
    except OSError:
        pass  # no writable pids cgroup: the zygote's sweep still ends every process (see the README)


def _cgroup(pid: int) -> str:
    return f"{PIDS_CGROUP}/attn-grade-{pid}"


def _remove_stale_cgroups() -> None:
    """Empty cgroups left by a zygote that was killed (a candidate can do that): rmdir spares full ones."""
    try:
        names = [n for n in os.listdir(PIDS_CGROUP) if n.startswith("attn-grade-")]
    except OSError:
        return
    for name in names:
        try:
            os.rmdir(f"{PIDS_CGROUP}/{name}")
        except OSError:
            pass


def _remove_cgroup(pid: int) -> None:
    try:
        os.rmdir(_cgroup(pid))
    except OSError:
        pass


def _threads(pid: str) -> int:
    """RLIMIT_NPROC counts threads, not processes."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def _owner(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _serve(wire, torch, candidate_path, read_fd, write_fd, cuda: bool) -> None:
    sys.meta_path.insert(0, _BlockGrader())
    spy = _make_spy(torch)
    hello = {"ok": True, "torch": torch.__version__, "cuda": cuda}
    module, error = _import_candidate(candidate_path)
    if error:
        hello = dict(hello, ok=False, error=error)
    wire.write_frame(write_fd, hello, [])
    if error:
        return
    while True:
        try:
            request, blobs = wire.read_frame(read_fd)
        except wire.Closed:
            return
        blobs_out: list[bytes] = []
        spy.shapes = _Shapes() if request.get("shapes") is True else None
        spy.changed = []
        try:
            value, called = _handle(torch, wire, spy, module, request, blobs, blobs_out, (read_fd, write_fd))
            answer = {"ok": True, "value": value, "called": sorted(called)}
            if spy.shapes is not None:
                answer["shapes"] = spy.shapes.data()
            if spy.changed:
                answer["changed_in_place"] = spy.changed
        except BaseException as exc:  # the candidate's exception, even SystemExit, is an answer
            blobs_out = []
            answer = {"ok": False, "error": _describe(exc, candidate_path), "called": sorted(spy.seen)}
        wire.write_frame(write_fd, answer, blobs_out)


def _handle(torch, wire, spy, module, request, blobs, blobs_out, fds):
    device = request.get("device", "cpu")
    args = [_to_device(torch, _decode(wire, a, blobs), device, a) for a in request.get("args", [])]
    kwargs = {k: _to_device(torch, _decode(wire, v, blobs), device, v) for k, v in request.get("kwargs", {}).items()}
    target = getattr(module, request["name"])
    spy.seen = set()
    spy.device = device
    answered = _Answered(torch, wire, spy, module, request.get("answered", []), fds)

    if request["op"] == "script":
        return _script(torch, wire, spy, module, request, blobs, blobs_out, answered), spy.seen

    if request["op"] == "call":
        before = _snapshot(torch, [*enumerate(args), *kwargs.items()])
        with spy, answered:
            value = target(*args, **kwargs)
        spy.changed = _changed_in_place(torch, before)
        return wire.encode(value, blobs_out), spy.seen

    # op == "module": build it on the CPU, load the grader's weights, move it, run forward (and backward)
    # in eval mode, as inference code runs: dropout is off.
    init_args = wire.decode(request.get("init"), blobs) or []
    init_kwargs = wire.decode(request.get("init_kwargs"), blobs) or {}
    state = wire.decode(request.get("state"), blobs) or {}
    grad_args = request.get("grad_args", [])
    for i in grad_args:
        args[i] = args[i].detach().requires_grad_(True)
    with spy:
        instance = target(*init_args, **init_kwargs)
        # every class a layer is, so the grader can ask isinstance (nn.LazyLinear is an nn.Linear)
        children = {name: [wire.type_name_of(t) for t in type(child).__mro__] for name, child in instance.named_children()}
        if not request.get("forward", True):
            return wire.encode({"output": None, "children": children}, blobs_out), spy.seen
        unloaded = _load(instance, state) if state else []
        instance.to(device)
        instance.eval()
        with answered:
            output = instance(*args, **kwargs)
            again = instance(*args, **kwargs) if request.get("repeat") else None  # the same input once more
    result = {"output": output, "children": children, "unloaded": unloaded}
    if request.get("repeat"):
        result["again"] = again
    grad_output = request.get("grad_output")
    if grad_output is not None:
        # sum(output * grad) has the same gradients as backward(grad), without the lazy
        # import (sympy, 0.7 s) that backward with an explicit gradient pays.
        with spy, answered:
            (output * wire.decode(grad_output, blobs).to(device)).sum().backward()
        result["arg_grads"] = [args[i].grad for i in grad_args]
        result["param_grads"] = {name: p.grad for name, p in instance.named_parameters()}
    return wire.encode(result, blobs_out), spy.seen


def _snapshot(torch, named: list) -> list:
    """The bytes of each tensor or array argument (by position or keyword) before the call, to tell which it changed."""
    import numpy

    kept = []
    for key, value in named:
        if isinstance(value, torch.Tensor) and value.device.type != "meta":  # a meta tensor has no bytes
            kept.append((str(key), value, tuple(value.shape), _bytes_of(torch, value)))
        elif isinstance(value, numpy.ndarray):
            kept.append((str(key), value, value.shape, value.tobytes()))
    return kept


def _changed_in_place(torch, kept: list) -> list[str]:
    """The arguments whose shape or bytes the call changed (masked_fill_, x /= s, a[mask] = v on the caller's data)."""
    changed = []
    for key, value, shape, data in kept:
        if isinstance(value, torch.Tensor):
            same = tuple(value.shape) == shape and torch.equal(_bytes_of(torch, value), data)
        else:
            same = value.shape == shape and value.tobytes() == data
        if not same:
            changed.append(key)
    return changed


def _bytes_of(torch, tensor):
    # bytes, not values: NaN equals itself here, and -0.0 differs from 0.0
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).clone()


MAX_SCRIPT_ACTIONS = 256  # actions in one script
MAX_RESULT_HEADER = 64 * 1024  # bytes of JSON one action's result may take
MAX_SCRIPT_BYTES = 64 * 1024 * 1024  # tensor bytes all of a script's results may take together
SCRIPT_ATTRIBUTE = re.compile(r"[A-Za-z][A-Za-z0-9_]*|__call__")  # what an action may call or read


def _script(torch, wire, spy, module, request, blobs, blobs_out, answered):
    """Run the grader's actions in order on objects built here; each action's result is plain data.

    Actions (every one a dict; objects are numbered in the order they are built):
      {"do": "build", "class": "KVCache", "init": [...], "init_kwargs": {...}, "state": {...} or None,
       "stand_in": false}   the candidate's class (or, with stand_in, the worker's own KV cache, `_stand_in_cache`);
                            with a state, a module: weights loaded, moved to the device, in eval mode
      {"do": "call", "object": 0, "method": "append" | "__call__", "args": [...], "kwargs": {...},
       "refs": {"cache": 1}, "may_raise": false}   tensors in args and kwargs go to the device; refs pass objects
      {"do": "get", "object": 0, "attribute": "length"}
      {"do": "fill_unused", "object": 0}   the slots [length:] on axis 2 of the object's k and v become NaN

    The reply's value: {"results": [one per action run], "raised": {"index": error}, "stopped": index or None}.
    An action marked may_raise that raises records its error in "raised" and the script goes on
    (the result is None); any other exception ends the script there ("stopped"). Every result is
    encoded as soon as its action returns (a view of a buffer the next action writes is sent as
    it was), and is bounded.
    """
    actions = wire.decode(request.get("actions"), blobs)
    device = request.get("device", "cpu")
    if not isinstance(actions, list) or len(actions) > MAX_SCRIPT_ACTIONS:
        raise ValueError(f"a script is a list of at most {MAX_SCRIPT_ACTIONS} actions")
    objects, encoded, raised, stopped = [], [], {}, None
    stand_in = _stand_in_cache(torch, spy)
    path = getattr(module, "__file__", "")
    with torch.no_grad(), spy, answered:
        for index, action in enumerate(actions):
            mark = len(blobs_out)
            try:
                value = _act(torch, wire, spy, module, stand_in, objects, action, device)
                item = wire.encode(value, blobs_out)
                _bounded(item, blobs_out)
                encoded.append(item)
            except BaseException as exc:  # the candidate's exception, even SystemExit, is an answer
                del blobs_out[mark:]  # a result that could not be sent leaves no bytes behind
                raised[str(index)] = _describe(exc, path)
                encoded.append(None)
                if not (isinstance(action, dict) and action.get("may_raise") is True):
                    stopped = index
                    break
    return {"kind": "dict", "items": {
        "results": {"kind": "list", "items": encoded},
        "raised": wire.encode(raised, blobs_out),
        "stopped": stopped,
    }}


def _bounded(item, blobs_out) -> None:
    """One action's encoded result is small enough to send: JSON-able, short, and the script's bytes in bounds."""
    try:
        size = len(json.dumps(item, allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        raise TypeError("the result is not plain data that can be sent (an integer too large?)") from None
    if size > MAX_RESULT_HEADER:
        raise ValueError(f"the result takes {size} bytes to describe: more than the grader reads")
    if sum(len(b) for b in blobs_out) > MAX_SCRIPT_BYTES:
        raise ValueError(f"the results hold more than {MAX_SCRIPT_BYTES >> 20} MB of tensors: more than the grader reads")


def _act(torch, wire, spy, module, stand_in, objects, action, device):
    """One action of a script; its result (None for build and fill_unused)."""
    if not isinstance(action, dict):
        raise ValueError("an action is a dict")
    do = action.get("do")
    if do == "build":
        cls = stand_in if action.get("stand_in") is True else getattr(module, _name(action.get("class")))
        instance = cls(*(action.get("init") or ()), **(action.get("init_kwargs") or {}))
        state = action.get("state")
        if isinstance(state, dict) and state:
            unloaded = _load(instance, state)
            if unloaded:
                raise LookupError(f"the grader's weights did not fill {', '.join(unloaded)}")
        if isinstance(instance, torch.nn.Module):
            instance.to(device)
            instance.eval()
        objects.append(instance)
        return None
    index = action.get("object")
    if type(index) is not int or not 0 <= index < len(objects):
        raise ValueError("an action names an object that was not built")
    target = objects[index]
    if do == "call":
        args = [_to_device(torch, a, device, None) for a in action.get("args") or ()]
        kwargs = {k: _to_device(torch, v, device, None) for k, v in (action.get("kwargs") or {}).items()}
        kwargs.update({k: objects[i] for k, i in (action.get("refs") or {}).items()})
        method = _name(action.get("method"))
        return target(*args, **kwargs) if method == "__call__" else getattr(target, method)(*args, **kwargs)
    if do == "get":
        return getattr(target, _name(action.get("attribute")))
    if do == "fill_unused":  # the candidate's length, k and v are read as it wrote them; the filling is the grader's
        length = target.length
        if type(length) is not int:
            raise TypeError(f"the cache's length is {wire.type_name(length)}, not an int")
        for name in ("k", "v"):
            buffer = getattr(target, name)
            if type(buffer) is not torch.Tensor or buffer.dim() != 4:
                raise TypeError(f"the cache's {name} is not a 4-dimensional torch.Tensor (B, H, max_len, Dh)")
            seen, spy.seen = spy.seen, set()
            try:
                if buffer.is_floating_point():
                    buffer[:, :, length:] = float("nan")
            finally:
                spy.seen = seen
        return None
    raise ValueError(f"unknown action {str(do)[:40]!r}")


def _name(value) -> str:
    if type(value) is not str or not SCRIPT_ATTRIBUTE.fullmatch(value):
        raise ValueError(f"{str(value)[:40]!r} is not a name an action may use")
    return value


def _stand_in_cache(torch, spy):
    """The worker's own KV cache: what the stub's docstring promises, nothing more.

    A module that fills a cache is graded with this one while the candidate's KVCache has lost
    points, so a bug in the cache is charged to the cache alone. Its torch calls are not the
    candidate's: the call record leaves them out.
    """

    class KVCache:
        def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
            shape = (batch_size, num_heads, max_len, head_dim)
            seen, spy.seen = spy.seen, set()
            try:
                self.k = torch.zeros(shape, dtype=dtype, device=device)
                self.v = torch.zeros(shape, dtype=dtype, device=device)
            finally:
                spy.seen = seen
            self.max_len, self.length = max_len, 0

        def append(self, k_new, v_new):
            t = k_new.shape[2]
            if self.length + t > self.max_len:
                raise ValueError(f"{self.length} + {t} tokens pass max_len {self.max_len}")
            seen, spy.seen = spy.seen, set()
            try:
                self.k[:, :, self.length:self.length + t] = k_new
                self.v[:, :, self.length:self.length + t] = v_new
                self.length += t
                return self.k[:, :, :self.length], self.v[:, :, :self.length]
            finally:
                spy.seen = seen

    return KVCache


def _load(instance, state) -> list:
    """Load the grader's weights by the contract's names; the module may hold more (a causal-mask buffer).

    Returns the names of its parameters the grader's weights did not fill.
    """
    missing, unexpected = instance.load_state_dict(state, strict=False, assign=True)  # assign keeps the state's dtype
    parameters = [name for name, _ in instance.named_parameters()]
    if unexpected:
        raise LookupError(f"Unexpected key(s) in the grader's weights: {', '.join(unexpected)}; "
                          f"the module's parameters are: {', '.join(parameters) or 'none'}")
    return [name for name in missing if name in parameters]


class _Answered:
    """While active, the candidate's step functions named in `names` are answered by the grader.

    A composite (the module) that calls `softmax` gets the reference's softmax of its own
    inputs, asked for over the pipe: the grader computes it and sends the result back as
    plain data, so no reference code is ever in this process. Gradients flow through these
    answers too: backward asks the grader for the reference's vector-Jacobian product.
    """

    def __init__(self, torch, wire, spy, module, names, fds):
        self.torch, self.wire, self.spy, self.module, self.names = torch, wire, spy, module, list(names)
        self.read_fd, self.write_fd = fds
        self.saved = {}

    def __enter__(self):
        for name in self.names:
            if hasattr(self.module, name):
                self.saved[name] = getattr(self.module, name)
                setattr(self.module, name, self._proxy(name))
        return self

    def __exit__(self, *exc):
        for name, function in self.saved.items():
            setattr(self.module, name, function)
        self.saved = {}

    def ask(self, header):
        """One question to the grader, and its answer; the torch calls made here are the grader's, not the candidate's."""
        seen, self.spy.seen = self.spy.seen, set()
        shapes, self.spy.shapes = self.spy.shapes, None  # nor the tensors they create
        try:
            blobs = []
            header = {k: self.wire.encode(self._plain(v), blobs) if k in ("args", "kwargs", "grads") else v
                      for k, v in header.items()}
            self.wire.write_frame(self.write_fd, header, blobs)
            reply, reply_blobs = self.wire.read_frame(self.read_fd)
            if reply.get("ok") is not True:
                raise RuntimeError(f"{header.get('name', 'a step')} (answered by the grader): {reply.get('error')}")
            return self.wire.decode(reply.get("value"), reply_blobs), reply.get("index")
        finally:
            self.spy.seen = seen
            self.spy.shapes = shapes

    def _proxy(self, name):
        torch, answered = self.torch, self

        class Answer(torch.autograd.Function):
            @staticmethod
            def forward(ctx, args, kwargs, *tensors):
                value, ctx.index = answered.ask({"op": "answer", "name": name, "args": args, "kwargs": kwargs, "grad": True})
                return answered.placed(value, answered.target(tensors, {}))

            @staticmethod
            def backward(ctx, *grads):
                value, _ = answered.ask({"op": "answer_grad", "index": ctx.index, "grads": grads})
                return (None, None, *answered.placed(tuple(value), answered.target(grads, {})))

        signature = inspect.signature(self.saved[name])

        def proxy(*args, **kwargs):
            # Bound by the candidate's own parameter names, sent by position: the grader binds them to the contract's.
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args, kwargs = tuple(bound.args), dict(bound.kwargs)
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if not any(t.requires_grad for t in tensors):  # nothing to differentiate (NumPy, or no grad wanted)
                question = {"op": "answer", "name": name, "args": args, "kwargs": kwargs, "grad": False}
                return answered.placed(answered.ask(question)[0], answered.target(tensors, bound.arguments))
            return Answer.apply(args, kwargs, *tensors)

        proxy.__name__ = name
        return proxy

    def _plain(self, value):
        """nn.Parameter and other tensor subclasses as plain tensors: only those cross."""
        if isinstance(value, self.torch.Tensor) and type(value) is not self.torch.Tensor:
            return self.torch.Tensor._make_subclass(self.torch.Tensor, value.detach())
        if isinstance(value, self.torch.device):  # crosses as its name: the grader answers on the CPU anyway
            return str(value)
        if isinstance(value, (tuple, list)):
            return type(value)(self._plain(v) for v in value)
        if isinstance(value, dict):
            return {k: self._plain(v) for k, v in value.items()}
        return value

    def target(self, tensors, arguments) -> object:
        """Where an answer belongs: the device a `device` argument asks for, else the inputs' device."""
        asked = arguments.get("device")
        if isinstance(asked, (str, self.torch.device)):
            return self.torch.device(asked)
        return next((t.device for t in tensors if isinstance(t, self.torch.Tensor)), None)

    def placed(self, value, device):
        """Tensors of an answer moved to `device` (the grader answers on the CPU; a meta answer comes as meta)."""
        if device is None or device.type == "cpu":
            return value
        if isinstance(value, tuple):
            return tuple(v.to(device) if isinstance(v, self.torch.Tensor) else v for v in value)
        return value.to(device) if isinstance(value, self.torch.Tensor) else value


def _decode(wire, item, blobs):
    """An input as the grader described it; a generator is built in _to_device."""
    return None if isinstance(item, dict) and item.get("kind") == "generator" else wire.decode(item, blobs)


def _to_device(torch, value, device, description):
    """Move a decoded input tensor to the device under test; 'strided' asks for a non-contiguous copy."""
    if isinstance(description, dict) and description.get("kind") == "generator":
        return torch.Generator(device=device if device != "meta" else "cpu").manual_seed(description["seed"])
    if type(value) is not torch.Tensor:
        return value
    value = value.to(device)
    if isinstance(description, dict) and description.get("strided") and value.dim() >= 2:
        value = value.transpose(-1, -2).contiguous().transpose(-1, -2)
    return value


def _make_spy(torch):
    from torch.overrides import TorchFunctionMode

    class Spy(TorchFunctionMode):
        """Records the name of every torch function called while it is active.

        On the meta device it also lets a 0-dim CPU tensor meet a meta one, as CUDA lets it
        meet a CUDA tensor (torch.tensor(d).sqrt() is fine on a GPU; the meta device alone
        would refuse it).
        """

        seen: set = set()
        device: str = "cpu"
        shapes = None  # a _Shapes while a request asks for the shapes of what the call creates (`"shapes": true`)
        changed: list = []  # the arguments a call changed in place

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(getattr(func, "__name__", "?")))
            kwargs = kwargs or {}
            if self.device == "meta":
                args, kwargs = _scalars_to_meta(torch, args, kwargs)
            value = func(*args, **kwargs)
            if self.shapes is not None:
                self.shapes.add(torch, value)
            return value

    return Spy()


class _Shapes:
    """The shapes of the tensors a call's torch functions create, for checks of what a step materialises
    (flash_attention's tiles). A view counts as itself (a transpose or reshape holds as many elements
    as the memory it views, einsum's answer among them; a slice fewer), but a view larger than that
    memory (an expand of a small tensor) counts as the tensor it views: no more is held. Plain data,
    bounded: each distinct shape once, in the order first seen, at most MAX_SHAPES of them; `more`
    counts the distinct shapes left out:
    {"created": [[2, 2, 16, 24], [2, 2, 16], ...], "more": 0}.
    """

    MAX_SHAPES = 256

    def __init__(self):
        self.seen = {}
        self.more = 0

    def add(self, torch, value) -> None:
        for t in value if isinstance(value, (tuple, list)) else (value,):
            if not isinstance(t, torch.Tensor):
                continue
            base = t._base if t._base is not None and t._base.numel() < t.numel() else t  # an expand: its memory
            key = tuple(int(n) for n in base.shape)
            if key in self.seen:
                continue
            if len(self.seen) >= self.MAX_SHAPES:
                self.more += 1
                continue
            self.seen[key] = True

    def data(self) -> dict:
        return {"created": [list(s) for s in self.seen], "more": self.more}


def _scalars_to_meta(torch, args, kwargs):
    values = [*args, *kwargs.values()]
    if not any(type(v) is torch.Tensor and v.is_meta for v in values):
        return args, kwargs

    def moved(v):
        return v.to("meta") if type(v) is torch.Tensor and v.dim() == 0 and v.device.type == "cpu" else v

    return tuple(moved(a) for a in args), {k: moved(v) for k, v in kwargs.items()}


def _import_candidate(path):
    """The candidate module, or a description of why it could not be imported."""
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        return None, {"type": "SyntaxError", "message": f"SyntaxError at line {exc.lineno}: {exc.msg}", "line": exc.lineno}
    except SystemExit:
        return None, {"type": "SystemExit", "message": "candidate exited while importing", "line": None}
    except BaseException as exc:
        return None, _describe(exc, path)
    return module, None


def _describe(exc, candidate_path):
    """Type, message and the candidate's line for an exception the candidate's code raised."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == candidate_path:
            line = frame.lineno
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    if isinstance(exc, SystemExit):
        text = f"called sys.exit({text})"
    name = type(exc).__name__
    if isinstance(exc, MemoryError) or "can't allocate memory" in text:
        name = "MemoryError"  # the grader reports it as the memory limit
    where = f" (line {line})" if line else ""
    return {"type": name, "message": (f"{name}: {text}" if text else name)[:MAX_MESSAGE] + where, "line": line}


class _BlockGrader:
    """An import hook that refuses the grader and the reference solutions."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED_PACKAGES:
            raise ImportError(f"the candidate may not import '{name}' while being graded")
        return None


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
