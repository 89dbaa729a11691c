"""What keeps the worker's record of a call out of the candidate's reach, in the process they share.

The record (recorder.py) is a TorchFunctionMode on this thread's mode stack, fed by the worker's own
frames. The candidate's code runs in the same interpreter, so it could reach the record through the
interpreter's back doors: the frames below its own (sys._getframe, a traceback's tb_frame, a
generator's gi_frame, a signal handler's frame), the garbage collector's lists of every object, the
C level (ctypes), tracing hooks, the mode stack itself, or a second copy of a module loaded afresh.
Once armed, for the rest of a child's life, before the candidate's file is imported:

- an audit hook (PEP 578: once added it cannot be removed) refuses frames, the object graph, ctypes,
  tracing and profiling hooks, code objects swapped into functions, and importing again a module the
  child has loaded (a fresh copy of torch._C would carry the original mode-stack functions);
- the functions that pop, peek at or switch off the torch-function mode stack, or run a callable as
  though it were a torch function (in torch._C and torch.overrides, under every name a torch module
  imported them by), refuse a caller outside torch's own package;
- signal handlers (which receive the interrupted frame) cannot be set, nor threads started (the kernel
  refuses them too, where seccomp.py's filter is in place).

A refusal is `Refused`, which is both an AttributeError and a ValueError: library code that asks for
its caller's frame only to name a module (collections.namedtuple, typing) catches those and goes on.
Threads are refused by the kernel (seccomp.py). What this does not defend is in docs/sandbox.md.

Loaded by path by worker.py (never as part of the grader package).
"""

import contextlib
import importlib
import os
import sys

FRAME_ATTRIBUTES = ("tb_frame", "gi_frame", "cr_frame", "ag_frame")
REFUSED_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
                  "sys.setprofile", "sys._getframemodulename", "sys.addaudithook")
# The standard library's ways to a stack: they see none in a worker (torch asks for one only to keep it as
# text, in case a lazy CUDA call fails later; anything that patched their helpers would be handed frames).
FRAMELESS = ("format_stack", "extract_stack", "print_stack", "walk_stack")
# The functions that pop, peek at or switch off the torch-function mode stack, or run a callable of the
# caller's as though it were a torch function (so with the record stashed), by where torch defines them.
MODE_STACK = {
    "torch._C": ("DisableTorchFunction", "_EnableTorchFunction", "_get_function_stack_at", "_pop_torch_function_stack",
                 "_len_torch_function_stack",
                 "_set_torch_function_state", "_set_skip_next_torch_function", "_skip_one_hop_torch_function",
                 "_maybe_call_torch_function_for_op_packet"),
    "torch.overrides": ("_get_current_function_mode", "_get_current_function_mode_stack", "_pop_mode",
                        "_pop_mode_temporarily", "handle_torch_function"),
}
ORIGINAL = "attn_grade.original"  # the audit event by which a guarded function asks the hook for its original
# Refused once armed, to torch's code too: a signal handler gets the interrupted frame, and a thread runs where
# the record (per thread) cannot see. The kernel refuses threads too (seccomp.py); these say so on every system.
# signal.signal calls _signal.signal, and threading holds its own name for _thread's: each is guarded.
REFUSED_CALLS = ("signal.signal", "_signal.signal", "_thread.start_new_thread", "_thread.start_new",
                 "threading._start_new_thread")


class Refused(AttributeError, ValueError):
    """What the sandbox refuses the candidate's code."""


def install(torch):
    """Ready the guard in the zygote, once; return `arm` and `lifted`, to be held in locals (a frame is the only
    way to them). A child calls `arm()` before the candidate's file is imported: from then on the back doors
    are closed; under `lifted()` the worker's own code may read frames and the mode stack. Until armed,
    nothing is refused: the zygote and the child's setup use ctypes and the object graph freely.

    The originals of the guarded functions are held by the hook alone (no object the candidate can reach
    refers to them): a guarded function asks for its original with an audit event, and the hook hands it
    over only when the event comes from a guarded function's frame called from torch's own code.
    """
    torch_folder = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    loaded = set()
    lifted_now = [True]
    originals = {}
    guard_code = _guarded("").__code__

    def hook(event, args):
        if event == ORIGINAL:
            given = lifted_now[0]  # before arming, or the worker's own code
            if not given and args[0] not in REFUSED_CALLS:
                lifted_now[0] = True
                try:
                    frame = sys._getframe(1)  # the guarded function's, which called sys.audit
                    given = frame.f_code is guard_code and frame.f_back is not None and _in(frame.f_back, torch_folder)
                finally:
                    lifted_now[0] = False
            if given and isinstance(args[1], list):
                args[1].append(originals.get(args[0]))
            return
        if lifted_now[0]:
            return
        if event in REFUSED_EVENTS or event.startswith("ctypes."):
            raise Refused(f"the sandbox refuses {event}")
        if event == "sys._getframe":  # torch's own code may ask (to name a caller); no one else
            lifted_now[0] = True
            try:
                asked = _in(sys._getframe(1), torch_folder)
            finally:
                lifted_now[0] = False
            if not asked:
                raise Refused("the sandbox refuses sys._getframe")
        if event == "object.__getattr__" and args[1] in FRAME_ATTRIBUTES:
            raise Refused(f"the sandbox refuses {args[1]}")
        if event == "object.__setattr__" and args[1] == "__code__":
            raise Refused("the sandbox refuses replacing a function's code")
        if event == "open" and isinstance(args[0], (str, bytes)) and _memory_file(args[0]):
            raise Refused("the sandbox refuses reading the process's memory")
        if event == "import" and (args[0] in loaded or args[0].startswith("_test")):
            raise ImportError(f"the sandbox refuses importing {args[0]} again")  # one the import system passes on

    guards = {}  # id of an original -> its guarded stand-in
    for module_name, names in MODE_STACK.items():
        module = sys.modules[module_name]
        for name in names:
            if hasattr(module, name):
                originals[f"{module_name}.{name}"] = original = getattr(module, name)
                guards[id(original)] = _guarded(f"{module_name}.{name}")
    # Every torch module that imported one of them holds its own name for it (torch.nn.functional's
    # handle_torch_function): each is replaced, and torch's own calls through it still pass.
    kept = {id(o) for o in originals.values()}
    for name, module in list(sys.modules.items()):
        if name == "torch" or name.startswith("torch."):
            namespace = getattr(module, "__dict__", None)
            for key, value in list(namespace.items()) if isinstance(namespace, dict) else ():
                if id(value) in kept:
                    namespace[key] = guards[id(value)]
    traceback = importlib.import_module("traceback")
    for name in FRAMELESS:
        setattr(traceback, name, _frameless(getattr(traceback, name)))
    for name in REFUSED_CALLS:
        module_name, attribute = name.rsplit(".", 1)
        module = importlib.import_module(module_name)
        if hasattr(module, attribute):
            originals[name] = getattr(module, attribute)
            setattr(module, attribute, _guarded(name))
    sys.addaudithook(hook)

    def arm():
        loaded.update(sys.modules)
        lifted_now[0] = False

    @contextlib.contextmanager
    def lifted():
        lifted_now[0] = True
        try:
            yield
        finally:
            lifted_now[0] = False

    return arm, lifted


def _frameless(function):
    def frameless(*args, **kwargs):
        return iter(()) if function.__name__ == "walk_stack" else [] if "print" not in function.__name__ else None

    frameless.__name__ = function.__name__
    return frameless


def _memory_file(path) -> bool:
    """A process's memory in /proc (where the key that signs the worker's frames lies); the Linux sandbox also
    covers its own with /dev/null (isolation.py), which a relative path or a dir_fd would reach around this."""
    real = os.path.realpath(os.fsdecode(path))
    return real.startswith("/proc/") and os.path.basename(real) in ("mem", "pagemap") or "/map_files" in real


def _in(frame, folder: str) -> bool:
    return frame.f_code.co_filename.startswith(folder)


def _guarded(name: str):
    """A stand-in for the function `name` that only torch's own code may call through (REFUSED_CALLS: none)."""

    def guarded(*args, **kwargs):
        box = []
        sys.audit(ORIGINAL, name, box)
        if not box or box[0] is None:
            raise Refused(f"the sandbox refuses {name}: it would hide what the code does from the grader's record")
        return box[0](*args, **kwargs)

    guarded.__name__ = guarded.__qualname__ = name.rsplit(".", 1)[-1]
    return guarded
