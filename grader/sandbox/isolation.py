"""The sandbox a worker child enters before any candidate code runs, and the zygote's part in it.

Namespaces (PID, user, network, IPC, mount), the allowlist root (each child's file system: read-only
bind mounts of what torch needs, on a fresh tmpfs, entered with pivot_root), capabilities given up for
good (seccomp.py's filter follows), a pids cgroup (root) or RLIMIT_NPROC (another
user) against fork bombs, and the rlimits on file size, core dumps and writable memory.

The portable sandbox (`enter_portable_sandbox`: macOS, or ATTN_GRADE_SANDBOX=portable on Linux) is
what a system without Linux namespaces can have: a session of its own, an empty working directory and the
rlimits, with none of the rest (no namespaces, prctl, seccomp, cgroups or allowlist root).

Loaded by path by worker.py (never as part of the grader package): it imports nothing of the grader.
"""

import ctypes
import os
import platform
import pwd
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile

try:
    import _attn_grade_sandbox_limits as limits  # this folder's, loaded by path by worker.py
except ImportError:  # imported as part of the grader package, by a test
    from grader.sandbox import limits

# The kit's parts, covered where an allowed folder holds them (a kit installed in site-packages).
HIDDEN_FROM_CANDIDATES = ("grader", "solutions", "tests", ".git")
KIT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder grader/ is in
WORKDIR_SIZE = "256m"  # the working folder, a tmpfs of each child's own: all it may write, together
FILE_SIZE_LIMIT = 64 * 1024 * 1024  # bytes a child may write to one file
SHM_SIZE = "64m"  # its own /dev/shm
# /proc stays writable (the CUDA driver writes to its process's own files there, and fails
# with error 304 where it cannot), but not these: root's uid could change the kernel through them.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
SPECIAL_FILE_SYSTEMS = ("/dev/", "/proc/", "/sys/")  # mapped files that are no library
MINIMAL_DEVICES = ("null", "zero", "full", "random", "urandom")  # the /dev of a worker without CUDA
PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 36, 24, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC = 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_NOATIME, MS_NODIRATIME, MS_REC, MS_RELATIME, MS_PRIVATE = 1024, 2048, 16384, 1 << 21, 1 << 18
ST_RELATIME = 4096  # statvfs's name for a relatime mount
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(platform.machine())


def _libc():
    return ctypes.CDLL(None, use_errno=True)


# -- the zygote's part: PID namespaces for its children, a subreaper, stale cgroups -----


def become_subreaper() -> None:
    """Processes a candidate starts in a new session, or double-forks, are re-parented to the zygote."""
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def own_pid_namespace() -> int | None:
    """A handle on the zygote's PID namespace, where it may make new ones for its children (root).

    Each spawn unshares a new one for the next fork, then enters this one again (only then
    is the following child's namespace new too): tried once here, so a spawn cannot fail so.
    Raises OSError where the zygote could not return to its own (a bug of the grader's).
    """
    if os.geteuid() != 0:
        return None  # the children make their own, through a user namespace (`enter_sandbox`)
    try:
        handle = os.open("/proc/self/ns/pid", os.O_RDONLY)
    except OSError:
        return None
    if not pid_namespace_for_next_fork():
        os.close(handle)
        return None
    if not return_to_pid_namespace(handle):
        raise OSError("cannot return to its own PID namespace")
    return handle


def pid_namespace_for_next_fork() -> bool:
    """Make a new PID namespace, whose first process the next fork is."""
    return _libc().unshare(CLONE_NEWPID) == 0


def return_to_pid_namespace(handle: int) -> bool:
    """Make the PID namespace of `handle` the one later forks go to again."""
    return _libc().setns(handle, CLONE_NEWPID) == 0


def fork_into_pid_namespace() -> None:
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


# -- a child: limits and namespaces ----------------------------------------------------


def enter_sandbox(request, output_fd, keep, cuda: bool = False) -> bool:
    """A session of its own, output to the grader's pipe, an empty directory, limits, no
    network, and (not root) a user namespace, where the system allows one.

    True when it made a PID namespace that only its next fork enters (`fork_into_pid_namespace`).
    """
    _session_and_limits(request, output_fd, keep)
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


def enter_portable_sandbox(request, output_fd, keep) -> None:
    """The portable sandbox: what a child can have without Linux namespaces (macOS).

    A session of its own, output to the grader's pipe, an empty working directory, the limits on
    file size and core dumps, and (not root) RLIMIT_NPROC against fork bombs, where the system
    has it. Nothing Linux-only: no namespace, prctl, seccomp, capability or cgroup. The memory
    cap (`cap_memory`) comes later, as in the full sandbox.
    """
    _session_and_limits(request, output_fd, keep)
    if os.geteuid() != 0:  # root ignores RLIMIT_NPROC, and there is no cgroup here: swept only
        mine = limits.own_threads() if os.path.isdir("/proc/self/task") else _own_processes()
        if mine is not None:
            try:
                resource.setrlimit(resource.RLIMIT_NPROC, (mine + limits.CHILD_PROCESS_LIMIT,) * 2)
            except (ValueError, OSError):  # above the system's hard limit (kern.maxprocperuid): none
                pass


def _own_processes() -> int | None:
    """How many processes this user has, by `ps` (macOS counts processes, not threads, against
    RLIMIT_NPROC); None where ps cannot tell."""
    try:
        done = subprocess.run(["ps", "-A", "-o", "ruid="], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return sum(line.strip() == str(os.getuid()) for line in done.stdout.splitlines())


def _session_and_limits(request, output_fd, keep) -> None:
    """A session of its own, output to the grader's pipe, only the `keep` descriptors, the working
    directory as home, and the limits on file size and core dumps: both sandboxes' first steps."""
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


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace, be the same user and group as outside: files it makes (the
    new root's mount points) need an owner, and its uid stays the grader's user's."""
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass  # then building the new root fails, and the child says it is not isolated


def cap_memory(torch, limit: int, cuda: bool, start_cuda: bool, portable: bool = False) -> str | None:
    """Cap the memory the candidate's process can write to (RLIMIT_DATA) at `limit` bytes.

    Where torch sees CUDA, its build already holds over a GB of writable mappings (1.26 GB
    measured on an H100, where a 1 GB cap stopped CUDA's start), so the cap is `limit` on top
    of what the process holds; and where the device checks run on CUDA (`start_cuda`), CUDA
    starts here first, before any candidate code. Returns why CUDA would not start, if it did not.
    In the portable sandbox a system that refuses the cap leaves the process without one (recent
    macOS refuses it; older macOS ignores mmap'd memory): the call's timeout still bounds it.
    """
    error = None
    if start_cuda:
        os.environ["CUDA_CACHE_DISABLE"] = "1"  # no JIT cache to fill (the driver still makes an empty ~/.nv)
        try:
            torch.zeros(1, device="cuda")
        except Exception as exc:  # the sandbox's fault, or the machine's: never the candidate's
            error = f"{type(exc).__name__}: {exc}"
    if limit > 0 and portable:
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (limit + _data_size(),) * 2 if cuda else (limit,) * 2)
        except (ValueError, OSError):
            pass
    elif limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit + _data_size(),) * 2 if cuda else (limit,) * 2)
    return error


def _data_size() -> int:
    """The bytes RLIMIT_DATA counts for this process now (VmData)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


# -- the allowlist: what a child's file system holds -----------------------------------


def sandbox_plan(home: str, cuda: bool) -> dict:
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
    wanted = [paths["stdlib"], paths["platstdlib"], sys.executable, os.path.join(sys.prefix, "pyvenv.cfg"),
              "/etc/ld.so.cache"]
    wanted.append(_elf_interpreter(os.path.realpath(sys.executable)))  # so the candidate may run python again
    wanted += [os.path.dirname(os.path.dirname(module.__file__)) for module in (torch, numpy)]
    for library in _mapped_files():
        wanted += [os.path.dirname(library), library]
    if cuda:
        wanted += os.environ.get("LD_LIBRARY_PATH", "").split(":") + [os.environ.get("CUDA_HOME", "")]
        wanted += triton_build_paths()
    never = [tempfile.gettempdir(), os.path.dirname(home), _home_folder(), "/"]
    allowed = set()
    for path in filter(None, wanted):
        for candidate in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.exists(candidate) and not any(_within(folder, candidate) for folder in never):
                allowed.add(candidate)
    allowed = sorted(p for p in allowed if not any(p != q and _within(p, q) for q in allowed))
    hidden = [os.path.join(KIT, part) for part in HIDDEN_FROM_CANDIDATES]
    hidden = [h for h in hidden if os.path.isdir(h) and any(_within(h, p) for p in allowed)]
    new_root = os.path.join(home, "new-root")  # the mount point each child's new root is built on
    os.makedirs(new_root, exist_ok=True)
    devices = list(MINIMAL_DEVICES)
    if cuda:  # nvidia0, nvidiactl, nvidia-uvm, nvidia-caps/...: the GPU's device files, no other
        devices += sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    return {"allowed": allowed, "hidden": hidden, "new_root": new_root, "devices": devices,
            "libcuda": libcuda_folder() if cuda else None}


def triton_build_paths() -> list[str]:
    """With CUDA, what Triton needs to compile a kernel's launcher (the exercise triton_attention): the C compiler
    it would pick (CC, else gcc, else clang) with the assembler and linker, the compiler's own folders, the C and
    Python headers, and the folder of libcuda.so (`libcuda_folder`). Its own package (ptxas and the CUDA headers
    it bundles) lies beside torch. Only paths that exist. Not yet run on a GPU."""
    import shutil

    tools = [os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang"), shutil.which("as"),
             shutil.which("ld")]
    folders = ["/usr/lib/gcc", "/usr/libexec/gcc", "/usr/include", sysconfig.get_paths()["include"], libcuda_folder()]
    return [p for p in tools + folders if p and os.path.exists(p)]


def libcuda_folder() -> str | None:
    """The folder of libcuda.so.1, as the loader's cache names it (Triton asks /sbin/ldconfig, absent in a child:
    the worker hands the answer over as TRITON_LIBCUDA_PATH)."""
    try:
        listing = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = [line.split("=>")[-1].strip() for line in listing.splitlines() if "libcuda.so.1 " in line]
    return os.path.dirname(found[0]) if found else None


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
            if len(fields) == 6 and fields[5].startswith("/") and not fields[5].startswith(SPECIAL_FILE_SYSTEMS):
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


def allowlist_root(workdir: str, plan: dict, cuda: bool) -> str | None:
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
        return "no mount namespace"  # see docs/sandbox.md, "What it is not"
    try:
        new_root = plan["new_root"]
        for path in plan["hidden"]:  # empty and read-only, before the bind mounts below copy what covers them
            _mount(libc, "none", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
        _mount(libc, "none", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for path in plan["allowed"]:
            _bind(libc, path, new_root + path)
        _fresh_workdir(libc, workdir, new_root + workdir)
        for name in os.listdir("/"):  # /lib -> usr/lib and the like, for paths the loader's cache names
            if os.path.islink("/" + name) and not os.path.lexists(new_root + "/" + name):
                os.symlink(os.readlink("/" + name), new_root + "/" + name)
        os.mkdir(new_root + "/proc")
        if libc.mount(b"proc", (new_root + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
            _bind(libc, "/proc", new_root + "/proc")  # no proc of its own here (a container's masked /proc)
        for path in (f"{new_root}/proc/{os.getpid()}/mem", f"{new_root}/proc/{os.getpid()}/task/{os.getpid()}/mem"):
            if os.path.exists(path):  # its own memory, where the key that signs its frames lies: /dev/null instead
                _mount(libc, "/dev/null", path, None, MS_BIND, None)
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


def _fresh_workdir(libc, workdir: str, target: str) -> None:
    """The working folder as the child sees it: a tmpfs of WORKDIR_SIZE, all the child may write in total (the
    folder it came from stays as the grader made it), holding copies of the files the grader put there."""
    os.makedirs(target, exist_ok=True)
    _mount(libc, "none", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={WORKDIR_SIZE},mode=700")
    for name in os.listdir(workdir):
        source = os.path.join(workdir, name)
        if os.path.isfile(source) and not os.path.islink(source):
            shutil.copyfile(source, os.path.join(target, name))


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


# -- powers given up -------------------------------------------------------------------


def drop_capabilities() -> None:
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
