"""A worker child's system-call filter: what no candidate may ask of the kernel, whatever the language it uses.

- The kernel keyring (add_key, request_key, keyctl) fails with EPERM: keys are the user's (root's, for a
  grader run as root) across every namespace, so a candidate could read the machine's keys, or leave one
  for its next grade.
- Reading or writing another process's memory fails with EPERM (ptrace, process_vm_readv and _writev): a
  process the candidate starts (a fresh Python, which has no audit hook) could otherwise read its worker's
  memory, and the key that signs the worker's frames in it.
- A new thread fails: clone with CLONE_THREAD fails with EPERM, and clone3, whose flags a filter cannot
  read, with ENOSYS, so the C library falls back to clone (Python's `threading` then raises "can't start
  new thread"). The worker's record of a call's torch functions is per thread: a call on a thread of the
  candidate's would go unrecorded.
- So does a new process (fork, vfork, clone without CLONE_THREAD, execve, execveat): what a process of the
  candidate's computes, no record in the worker sees (the thirty-fourth review's F1: untiled attention in a
  fork, its answer sent back through a pipe). `_posixsubprocess.fork_exec` raises no audit event, so only
  the kernel can refuse it. Where a child must start processes (`processes`: Triton's C compiler and ptxas
  on CUDA), they are bound by the pids cgroup or RLIMIT_NPROC instead, and are not recorded.
- System calls of another ABI than the native one (i386's on x86_64, x32's) fail the same way, so the
  numbers cannot be dodged.

The filter is installed after the child has dropped its capabilities (no_new_privs is set), before the
candidate's file is imported, and holds for the child and all it starts. Linux only: the portable sandbox
has none (docs/sandbox.md).

Loaded by path by worker.py (never as part of the grader package).
"""

import ctypes
import platform

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
CLONE_THREAD = 0x00010000
EPERM, ENOSYS = 1, 38
# By architecture: its audit number, the calls refused outright (the keyring's add_key, request_key and keyctl;
# ptrace, process_vm_readv and process_vm_writev), those that start a process other than by clone (fork, vfork,
# execve, execveat; aarch64 has only the last two), clone and clone3.
CALLS = {
    "x86_64": (0xC000003E, (248, 249, 250, 101, 310, 311), (57, 58, 59, 322), 56, 435),
    "aarch64": (0xC00000B7, (217, 218, 219, 117, 270, 271), (221, 281), 220, 435),
}.get(platform.machine())

# BPF: load a word of seccomp_data, jump if ==, if >=, if any bit set, return
LOAD, EQUAL, AT_LEAST, ANY_BIT, GIVE = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno
NR, ARCH, FLAGS = 0, 4, 16  # offsets in seccomp_data: the call's number, the ABI, the low word of args[0]


def install(processes: bool = False) -> bool:
    """Install the filter; False where this machine's architecture has no table here (nothing is refused). With
    `processes`, a process may be started (a clone without CLONE_THREAD, fork, exec): threads are refused still."""
    if CALLS is None:
        return False
    arch, refused, starts, clone, clone3 = CALLS
    refused = refused if processes else refused + starts
    # Each instruction is (label, code, jump if true, jump if false, value); a jump names its target's
    # label, turned into the count of instructions it skips below.
    program = [
        ("", LOAD, 0, 0, ARCH),
        ("", EQUAL, "abi ok", 0, arch),
        ("", GIVE, 0, 0, ERRNO | EPERM),  # another ABI: refuse everything it asks
        ("abi ok", LOAD, 0, 0, NR),
        ("", AT_LEAST, "refuse", 0, 0x40000000),  # x32's numbers
        *[("", EQUAL, "refuse", 0, number) for number in refused],
        ("", EQUAL, "no clone3", 0, clone3),
        ("", EQUAL, "clone", 0, clone),
        ("", GIVE, 0, 0, ALLOW),
        ("no clone3", GIVE, 0, 0, ERRNO | ENOSYS),
        *([("clone", LOAD, 0, 0, FLAGS),  # a thread, or a process?
           ("", ANY_BIT, "refuse", "allow", CLONE_THREAD)] if processes else [("clone", GIVE, 0, 0, ERRNO | EPERM)]),
        ("refuse", GIVE, 0, 0, ERRNO | EPERM),
        ("allow", GIVE, 0, 0, ALLOW),
    ]
    labels = {label: index for index, (label, *_) in enumerate(program) if label}

    def skip(target, index):
        return labels[target] - index - 1 if isinstance(target, str) else target

    return _load([(code, skip(true, i), skip(false, i), value)
                  for i, (_, code, true, false, value) in enumerate(program)])


def _load(program: list) -> bool:
    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Instruction))]

    instructions = (Instruction * len(program))(*[Instruction(*i) for i in program])
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), instructions)), 0, 0) == 0
