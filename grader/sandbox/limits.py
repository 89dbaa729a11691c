"""A worker child's bounds taken together: its processes and its memory, for the child and all it starts.

RLIMIT_DATA (isolation.cap_memory) bounds each process on its own, and RLIMIT_NPROC a user's processes;
neither binds a child that forks: 64 processes of 4 GB each are 256 GB. Where the grader may make
cgroups (root, with cgroup v1's pids and memory hierarchies), each child gets one of each of its own,
which every process below it joins: at most CHILD_PROCESS_LIMIT processes and MEMORY_SLACK beyond the
memory limit, all together (the kernel's OOM killer ends a child past it, which the grader reports as
a worker that died). Elsewhere a non-root child has RLIMIT_NPROC and each process its RLIMIT_DATA, and
`bound` says so: the grader's report carries it. The working folder is bounded in total by the tmpfs
it is (isolation.allowlist_root).

Loaded by path by worker.py (never as part of the grader package).
"""

import os
import resource

CHILD_PROCESS_LIMIT = 64  # processes a worker child may have below it: a fork bomb stops there
MEMORY_SLACK = 512 * 1024 * 1024  # bytes beyond the memory limit for a child and its processes together
HIERARCHIES = "/sys/fs/cgroup"  # cgroup v1: a folder per controller
GROUP_PREFIX = "attn-grade-"
TOGETHER = "processes and memory bounded together (cgroups)"
APART = "memory bounded per process (RLIMIT_DATA), processes per user (RLIMIT_NPROC)"
PROCESSES_ONLY = "processes bounded together (pids cgroup), memory per process (RLIMIT_DATA)"


def bound(memory_limit: int) -> str:
    """Put this child (and all it will start) in cgroups of its own; say which bounds hold."""
    if os.geteuid() != 0:
        mine = own_threads()
        resource.setrlimit(resource.RLIMIT_NPROC, (mine + CHILD_PROCESS_LIMIT,) * 2)
        return APART
    pid = int(os.readlink("/proc/self"))  # the pid the zygote knows (in a PID namespace os.getpid() is 1)
    pids = _join("pids", pid, {"pids.max": str(CHILD_PROCESS_LIMIT)})
    memory = memory_limit > 0 and _join("memory", pid, {"memory.limit_in_bytes": str(memory_limit + MEMORY_SLACK)})
    return TOGETHER if pids and memory else PROCESSES_ONLY if pids else APART


def _join(controller: str, pid: int, settings: dict) -> bool:
    """Make this child's group under the zygote's own in `controller`, set it, and move into it."""
    group = group_of(controller, pid)
    if group is None:
        return False
    try:
        os.mkdir(group)
        for name, value in settings.items():
            with open(f"{group}/{name}", "w") as f:
                f.write(value)
        with open(f"{group}/cgroup.procs", "w") as f:
            f.write("0")  # this process
    except OSError:
        return False  # no writable cgroup: the zygote's sweep still ends every process (see docs/sandbox.md)
    return True


def group_of(controller: str, pid: int) -> str | None:
    """The folder of the child `pid`'s group in `controller`, under the group the grader runs in (a container's
    limits still hold); None where this system has no cgroup v1 hierarchy for it."""
    base = _own_group(controller)
    return None if base is None else f"{base}/{GROUP_PREFIX}{pid}"


def remove(pid: int) -> None:
    """Remove the child's groups, once empty (rmdir spares a full one)."""
    for controller in ("pids", "memory"):
        group = group_of(controller, pid)
        if group is not None:
            try:
                os.rmdir(group)
            except OSError:
                pass


def remove_stale() -> None:
    """Empty groups left by a zygote that was killed (a candidate can do that)."""
    for controller in ("pids", "memory"):
        base = _own_group(controller)
        try:
            names = [n for n in os.listdir(base) if n.startswith(GROUP_PREFIX)] if base else []
        except OSError:
            continue
        for name in names:
            try:
                os.rmdir(f"{base}/{name}")
            except OSError:
                pass


def _own_group(controller: str) -> str | None:
    """This process's group folder in a cgroup v1 hierarchy, from /proc/self/cgroup ("4:memory:/path")."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            folder = f"{HIERARCHIES}/{controller}{path.rstrip('/')}"
            return folder if os.path.isdir(folder) else None
    return None


def own_threads() -> int:
    """Linux counts threads against RLIMIT_NPROC: those of every process of this user."""
    return sum(_threads(p) for p in os.listdir("/proc") if p.isdigit() and _owner(p) == os.geteuid())


def _threads(pid: str) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def _owner(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1
