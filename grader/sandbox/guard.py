"""What keeps the worker's record of a call out of the candidate's reach, in the process they share.

The record (recorder.py) is a TorchFunctionMode on this thread's mode stack, fed by the worker's own
frames. The candidate's code runs in the same interpreter, so it could reach the record through the
interpreter's back doors: the frames below its own (sys._getframe, a traceback's tb_frame, a
generator's gi_frame, a signal handler's frame), the garbage collector's lists of every object, the
C level (ctypes), tracing hooks, the mode stack itself, or a second copy of a module loaded afresh.
Once armed, for the rest of a child's life, before the candidate's file is imported:

- an audit hook (PEP 578: once added it cannot be removed) refuses frames, the object graph, ctypes,
  tracing and profiling hooks, code objects or defaults swapped into torch's functions, and importing again a module the
  child has loaded (a fresh copy of torch._C would carry the original mode-stack functions);
- the functions that pop, peek at or switch off the torch-function mode stack, or run a callable as
  though it were a torch function (in torch._C and torch.overrides, under every name a torch module
  imported them by), refuse a caller outside torch's own package;
- signal handlers (which receive the interrupted frame) cannot be set, nor threads started (the kernel
  refuses them too, where seccomp.py's filter is in place);
- a tensor's or a storage's bytes reach Python outside a torch call only through the hook, which tells the
  record (`STORAGE_READERS`, `C_READERS`).

A refusal is `Refused`, which is both an AttributeError and a ValueError: library code that asks for
its caller's frame only to name a module (collections.namedtuple, typing) catches those and goes on.
Threads are refused by the kernel (seccomp.py). What this does not defend is in docs/sandbox.md.

Loaded by path by worker.py (never as part of the grader package).
"""

import importlib
import marshal
import os
import sys
import types

FRAME_ATTRIBUTES = ("tb_frame", "gi_frame", "cr_frame", "ag_frame")
REFUSED_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
                  "sys.setprofile", "sys._getframemodulename", "sys.addaudithook", "cpython.PyInterpreterState_New")
# A subinterpreter runs without this interpreter's audit hook (hooks are per interpreter): its modules are refused
SUBINTERPRETERS = ("_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
                   "_xxinterpqueues", "interpreters")
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
# torch._C's ways to run operators where no torch-function mode sees them: the dispatcher's boxed call (any aten op by
# its schema), and TorchScript's compilers and loaders, reached without naming torch.jit (the twenty-fourth review).
# Refused to a caller outside torch, as MODE_STACK is; a TorchScript function, method or module made any other way
# hides its calls from the record when it runs (HIDING).
MODE_STACK["torch._C"] += ("_dispatch_call_boxed", "parse_ir", "_create_function_from_graph", "_jit_script_compile",
                           "_jit_script_class_compile", "import_ir_module", "import_ir_module_from_buffer",
                           "_load_jit_module_from_bytes", "_load_jit_module_from_file", "_load_for_lite_interpreter",
                           "_load_for_lite_interpreter_from_buffer", "_load_mobile_module_from_bytes",
                           "_load_mobile_module_from_file", "_import_ir_module_from_package")
# functorch's transforms by their C entry points: vmap's levels and batched tensors, whose calls the record sees one
# slice of, and grad's and jvp's wrappers (the twenty-fifth review). torch.func reaches them from torch's own code.
MODE_STACK["torch._C._functorch"] = (
    "_vmap_increment_nesting", "_vmap_decrement_nesting", "_add_batch_dim", "_remove_batch_dim", "_unwrap_batched",
    "_grad_increment_nesting", "_grad_decrement_nesting", "_jvp_increment_nesting", "_jvp_decrement_nesting",
    "_func_increment_nesting", "_func_decrement_nesting", "_wrap_for_grad", "_unwrap_for_grad",
    "_wrap_functional_tensor", "_unwrap_functional_tensor")
ORIGINAL = "attn_grade.original"  # the audit event by which a guarded function asks the hook for its original
# Refused once armed, to torch's code too: a signal handler gets the interrupted frame, and a thread runs where
# the record (per thread) cannot see. The kernel refuses threads too (seccomp.py); these say so on every system.
# signal.signal calls _signal.signal, and threading holds its own name for _thread's: each is guarded.
# A library of operators of the file's own (torch.library.Library) runs its Python kernels inside torch's dispatch,
# where the record is stashed; an automatic garbage collection could start there too (serve.py turns it off).
# Starting a process, refused where the child may not (seccomp.py refuses it in the kernel, on Linux): what a process
# computes, no record sees. These say so; `_posixsubprocess.fork_exec` raises no event, and only the kernel stops it.
PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
                  "os.startfile")
REFUSED_CALLS = ("signal.signal", "_signal.signal", "_thread.start_new_thread", "_thread.start_new",
                 "threading._start_new_thread", "torch._C._dispatch_library", "gc.enable")
# The ways a tensor's or a storage's bytes reach Python with no torch call to record, each replaced by a stand-in
# that asks the hook to run it (STORAGE_EVENT): the hook alone holds the original, and tells the record first. By
# where they are:
# - methods of torch._C.StorageBase, a C type, under every storage class and every spelling of the call: a storage's
#   items, its file, its shared memory, and a copy between storages (told only where one of them is on memory torch
#   did not allocate, as NumPy's: Triton's interpreter copies between torch's own). Its layout stays as it is;
# - functions of torch._C, under every name a torch module holds them by: DLPack's exporters, the serialisers, a
#   storage made on an address;
# - the zip writer's method (torch.save's), torch._C.PyTorchFileWriter.write_record.
STORAGE_READERS = ("__getitem__", "_write_file", "_share_fd_cpu_", "_share_filename_cpu_", "_share_cuda_",
                   "_get_shared_fd", "_new_shared_fd_cpu", "_new_shared_filename_cpu", "_new_using_fd_cpu",
                   "_new_using_filename_cpu", "_new_shared_cuda", "_new_with_file", "from_file", "copy_")
C_READERS = ("_to_dlpack", "_to_dlpack_versioned", "_pickle_save", "_save_parameters", "_save_jit_module",
             "_save_jit_module_to_bytes", "_save_mobile_module", "_save_mobile_module_to_bytes",
             "_construct_storage_from_data_pointer", "_gds_save_storage")
WRITER_READERS = ("write_record",)
# What runs TorchScript, whose calls no torch-function mode sees: each call tells the record that it hid them
HIDING = {"ScriptFunction": ("__call__",), "ScriptMethod": ("__call__",), "ScriptClassFunction": ("__call__",),
          "LiteScriptModule": ("__call__", "forward", "run_method")}
# So does calling an autograd graph's node by hand (`out.grad_fn(grad)`): its backward formula runs in C++, where no
# mode sees it, with no engine, backward or grad to record (the twenty-fifth review). Every node type of
# torch._C._functions, by the name HIDING's keys take
NODE = "autograd node"
# And so does running autograd's engine by hand (`Variable._execution_engine.run_backward`, by a name built at run
# time, on a graph built at import where no record ran: the forty-fifth review): the record runs the engine for every
# backward pass it follows (recorder.py's `_autograd`) and expects it; any other run hid its backward formulas. A
# callback queued on the engine runs the caller's code at its end, unrecorded.
ENGINE = "_EngineBase"
ENGINE_METHODS = ("run_backward", "queue_callback")
STORAGE_EVENT = "attn_grade.storage"
IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: set on a C type, its attributes cannot be set
TYPE_FLAGS_AT = 21  # tp_flags follows 21 pointer-sized fields in CPython's PyTypeObject


# The ways to a new code object: the record trusts code from torch's own files (it runs inside a torch call), so a
# code object may claim one of them only as that file's own compiled text (a lazy import of torch's)
CODE_EVENTS = ("compile", "code.__new__", "marshal.loads")
FUNCTION_GLOBALS = types.FunctionType.__dict__["__globals__"].__get__  # a C getter: runs none of the file's code
CACHE_TAG = sys.implementation.cache_tag


class Refused(AttributeError, ValueError):
    """What the sandbox refuses the candidate's code."""


def install(torch):
    """Ready the guard in the zygote, once; return `arm` and `lifted`, to be held in locals (a frame is the only
    way to them). A child calls `arm(record, processes)` before the candidate's file is imported: from then on the
    back doors are closed (and processes, unless it may start them), and a storage's bytes read are told to
    `record` (its `storage_read()`); under `lifted()` the
    worker's own code may read frames and the mode stack. Until armed, nothing is refused: the zygote and the
    child's setup use ctypes and the object graph freely.

    The originals of the guarded functions are held by the hook alone (no object the candidate can reach
    refers to them): a guarded function asks for its original with an audit event, and the hook hands it
    over only when the event comes from a guarded function's frame called from torch's own code.
    """
    torch_folder = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    loaded = set()
    torch_globals = set()  # ids of torch's modules' namespaces, once armed
    lifted_now = [True]
    unmarshalling = [False]  # the hook's own marshal.loads, which raises its event again
    originals = {}
    guard_code = _guarded("").__code__
    readers, resizable = _readers(torch)
    storage_type = torch._C.StorageBase
    watched = [None]  # the record a storage's bytes read are told to, once armed
    starts = [True]  # may the child start processes (until armed, and where `arm` says so)?

    def hook(event, args):
        if event == "builtins.id":  # the commonest event by far (the record compares types by id): nothing to refuse
            return
        if event == STORAGE_EVENT:  # whoever raises it, the record hears of it before the original runs
            key = _plain(args[0]) if len(args) == 4 else None
            original = readers.get(key) if type(key) is str else None
            given, named, box = args[1:] if original is not None else (None, None, None)
            if original is None or type(given) is not tuple or type(named) is not dict or type(box) is not list:
                raise Refused("the sandbox refuses this reading of a storage")
            # a copy between storages is a read where one of them is on memory torch did not allocate
            told = (key != "StorageBase.copy_"
                    or any(issubclass(type(s), storage_type) and not resizable(s) for s in given[:2]))
            owner = key.split(".")[0]
            if watched[0] is not None and owner == ENGINE:
                watched[0].engine_entered(key == f"{ENGINE}.run_backward")
            elif watched[0] is not None and (owner in HIDING or owner.startswith(NODE)):
                watched[0].hide("TorchScript, whose calls the record cannot see" if owner in HIDING else
                                "an autograd node called by hand, whose backward formula the record cannot see")
            elif told and watched[0] is not None:
                watched[0].storage_read()
            box.append(original(*given, **named))
            return
        if event == ORIGINAL:
            given = lifted_now[0]  # before arming, or the worker's own code
            if not given and args[0] not in REFUSED_CALLS:
                lifted_now[0] = True
                try:
                    frame = sys._getframe(1)  # the guarded function's, which called sys.audit
                    caller = frame.f_back
                    # torch's code, run with torch's own globals (a function built from torch's code object and
                    # globals of the file's own would call whatever those globals name)
                    given = (frame.f_code is guard_code and caller is not None and _in(caller, torch_folder)
                             and id(caller.f_globals) in torch_globals)
                finally:
                    lifted_now[0] = False
            if given and isinstance(args[1], list):
                args[1].append(originals.get(args[0]))
            return
        if lifted_now[0] or (event == "marshal.loads" and unmarshalling[0]):
            return
        # A name the event hands over may be a subclass of str of the file's own, whose == and startswith would
        # answer for themselves: read as its plain value, by str's own methods
        args = tuple(_plain(a) for a in args)
        if event in REFUSED_EVENTS or event.startswith("ctypes."):
            raise Refused(f"the sandbox refuses {event}")
        if event in PROCESS_EVENTS and not starts[0]:
            raise Refused(f"the sandbox refuses starting a process ({event}): what it computes, no record sees")
        # No one gets a frame, torch's code included: what asks for one in torch (torch.library, torch._dynamo) is
        # never needed to grade, and any of its functions can be rebuilt by the file from torch's own compiled text
        if event == "sys._getframe":
            raise Refused("the sandbox refuses sys._getframe")
        if event == "object.__getattr__" and args[1] in FRAME_ATTRIBUTES:
            raise Refused(f"the sandbox refuses {args[1]}")
        if event == "object.__setattr__" and args[1] == "__code__":
            raise Refused("the sandbox refuses replacing a function's code")
        # a default of torch's function is read inside the call, where the record is stashed
        if (event == "object.__setattr__" and args[1] in ("__defaults__", "__kwdefaults__")
                and type(args[0]) is types.FunctionType and id(FUNCTION_GLOBALS(args[0])) in torch_globals):
            raise Refused("the sandbox refuses replacing the defaults of torch's functions")
        if event == "open" and isinstance(args[0], (str, bytes)) and _memory_file(args[0]):
            raise Refused("the sandbox refuses reading the process's memory")
        if event in CODE_EVENTS and not _own_code(event, args, torch_folder, unmarshalling):
            raise Refused("the sandbox refuses code that claims to be one of torch's own files")
        if event == "import" and type(args[0]) is str and args[0].split(".")[0] in SUBINTERPRETERS:
            raise ImportError(f"the sandbox refuses {args[0]}: a subinterpreter has no audit hook")
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

    def arm(record, processes: bool = False):
        watched[0] = record
        starts[0] = processes
        loaded.update(sys.modules)
        torch_globals.update(id(vars(m)) for n, m in list(sys.modules.items())
                             if (n == "torch" or n.startswith("torch.")) and hasattr(m, "__dict__"))
        lifted_now[0] = False

    class Lifted:
        """`with lifted():` the worker's own code may read frames and the mode stack. A class of this file's, not
        contextlib's: what runs on entering and leaving must be nothing the candidate's code could have replaced
        (contextlib is a module it shares)."""

        __slots__ = ()

        def __enter__(self):
            lifted_now[0] = True

        def __exit__(self, *exc):
            lifted_now[0] = False
            return False

    lifted_once = Lifted()

    def lifted():
        return lifted_once

    return arm, lifted


def _readers(torch) -> tuple[dict, object]:
    """Replace the readers (STORAGE_READERS, C_READERS, WRITER_READERS), the autograd nodes' calls, TorchScript's
    (HIDING) and the engine's (ENGINE_METHODS) by stand-ins that ask the hook to run them; return the originals by
    key, and StorageBase's own `resizable`. StorageBase is immutable, as C types are: its flag
    is lifted for the change (ctypes, before the guard is armed) and set again; where the flags are not where CPython
    keeps them, its methods are left alone."""
    found = {}
    base = torch._C.StorageBase
    with _mutable(base):
        _replace_methods(base, "StorageBase", STORAGE_READERS, found)
    nodes = torch._C._functions
    for name, kind in list(vars(nodes).items()):
        if isinstance(kind, type) and "__call__" in vars(kind):
            with _mutable(kind):
                _replace_methods(kind, f"{NODE} {name}", ("__call__",), found)
    _replace_methods(torch._C.PyTorchFileWriter, "PyTorchFileWriter", WRITER_READERS, found)
    engine = type(torch.autograd.Variable._execution_engine)  # torch._C's _EngineBase, by no name of torch._C's
    with _mutable(engine):
        _replace_methods(engine, ENGINE, ENGINE_METHODS, found)
    for name, methods in HIDING.items():
        if hasattr(torch._C, name):
            _replace_methods(getattr(torch._C, name), name, methods, found)
    originals = {id(getattr(torch._C, name)): f"torch._C.{name}" for name in C_READERS if hasattr(torch._C, name)}
    for module_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None) if module_name.split(".")[0] == "torch" else None
        for attribute, value in list(namespace.items()) if isinstance(namespace, dict) else ():
            key = originals.get(id(value))
            if key is not None:
                found[key] = value
                namespace[attribute] = _reader(key)
    return found, vars(base)["resizable"]


class _mutable:
    """`with _mutable(kind):` a C type's attributes may be set (ctypes lifts its immutable flag, before the guard is
    armed, and sets it again); where the flags are not where CPython keeps them, nothing is lifted and the setting
    fails (kept as it was)."""

    def __init__(self, kind):
        import ctypes

        offset = TYPE_FLAGS_AT * ctypes.sizeof(ctypes.c_void_p)
        flags = ctypes.c_ulong.from_address(id(kind) + offset)
        known = flags.value == kind.__flags__ and ctypes.c_ulong.from_address(id(int) + offset).value == int.__flags__
        self.flags = flags if known and kind.__flags__ & IMMUTABLE_TYPE else None

    def __enter__(self):
        if self.flags is not None:
            self.flags.value &= ~IMMUTABLE_TYPE

    def __exit__(self, *exc):
        if self.flags is not None:
            self.flags.value |= IMMUTABLE_TYPE
        return exc[0] is TypeError  # an attribute of a type whose flags were not found: left alone


def _replace_methods(owner, owner_name: str, names, found: dict) -> None:
    for name in names:
        original = vars(owner).get(name)
        if original is None:
            continue
        key = f"{owner_name}.{name}"
        static = type(original) is staticmethod
        found[key] = original.__func__ if static else original
        stand_in = _reader(key)
        setattr(owner, name, staticmethod(stand_in) if static else stand_in)


def _reader(key: str):
    """A stand-in for the reader `key`: the hook runs the original and tells the record."""

    def read(*args, **kwargs):
        box = []
        sys.audit(STORAGE_EVENT, key, args, kwargs, box)
        if not box:
            raise Refused(f"the sandbox refuses {key}")
        return box[0]

    read.__name__ = read.__qualname__ = key.rsplit(".", 1)[-1]
    return read


def _own_code(event, args, torch_folder: str, unmarshalling) -> bool:
    """Whether new code that may claim a file of torch's is that file's own: compiled from the file's exact text,
    or unmarshalled from its own cached bytecode. code.__new__ (types.CodeType, code.replace) never may. Runs with
    the guard on, and calls nothing the file could have replaced (no os.path, no importlib)."""
    if event == "marshal.loads":
        data = args[0]
        if type(data) is not bytes or torch_folder.encode() not in data:
            return True  # marshalled code names its file in its bytes: this data claims none of torch's
        unmarshalling[0] = True
        try:
            code = marshal.loads(data)
        except Exception:
            return False
        finally:
            unmarshalling[0] = False
        filename = code.co_filename if type(code) is types.CodeType else None
        if type(filename) is not str or not filename.startswith(torch_folder):
            return False  # a torch path in the data that is not the file's name
        folder, _, name = filename.rpartition(os.sep)
        cached = _read(f"{folder}{os.sep}__pycache__{os.sep}{name.rpartition('.')[0]}.{CACHE_TAG}.pyc", bytes)
        return cached is not None and cached[16:] == data
    filename, kind = args[1], type(args[1])
    if kind is not str and kind is not bytes:
        return True  # none (ast's own compile): no claim; a subclass of str arrives here as its plain value
    name = filename if kind is str else filename.decode("utf-8", "surrogateescape")
    if not name.startswith(torch_folder) or event == "code.__new__":
        return not name.startswith(torch_folder)
    source = args[0]
    return (type(source) is bytes or type(source) is str) and _read(name, type(source)) == source


def _plain(value):
    """A subclass of str or bytes as its plain value, read by str's and bytes' own methods; anything else as it is."""
    kind = type(value)
    if kind is str or kind is bytes:
        return value
    if issubclass(kind, str):
        return str.__str__(value)
    if issubclass(kind, bytes):
        return bytes.__bytes__(value)
    return value


def _read(path: str, kind):
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return None
    return data if kind is bytes else data.decode("utf-8", "surrogateescape")


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
    name = frame.f_code.co_filename
    return type(name) is str and name.startswith(folder)  # an exact str: its startswith is str's own


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
