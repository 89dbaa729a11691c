"""Where a Triton kernel run by Triton's interpreter may write while a record runs: its launch's tensors, no more.

The interpreter runs a kernel's loads and stores on raw addresses, in this process. A pointer made from an
integer (`x.to(p.dtype)`, `tl.cast`, a pointer type built by hand: the thirty-second and thirty-third reviews'
f01), or moved past its tensor's memory, reaches memory no launch argument names: a score matrix made at import,
which no record of the call sees. So each store (and atomic) of an interpreted kernel launched inside a record is
checked against the storages of its launch's tensors; one outside them hides the record (`Recorder.hide`), and every
check that reads the record fails. Loads are not: what a kernel reads outside its tensors, nothing wrote there for
it (no store outside, no Python in a kernel: rules.foreign_kernel_calls), and an unmasked lane past a tensor's end
reads garbage that the value checks catch, and name.

An interpreted kernel's body is Python too: at each launch, every global its code loads must be Triton's own (a
module as Triton's package imported it, an object of one of its classes), another kernel, a constant or a builtin
the compiler takes; anything else (a function of the file's, under whatever decorator's name: the thirty-fifth and
thirty-sixth reviews) hides the record. So does an argument, or a default of the kernel's, that is not plain data (a
tensor, a number, a string, a Triton dtype or constant of those, a tuple of them): a list the grid function fills
with the file's functions, or one that keeps every tile of scores, reaches the kernel's body as a parameter (the
fifty-third review's F0), which the compiler would refuse as well.

Every block the interpreter makes is told to the record's shapes, when it keeps them (`made`): what a kernel holds
in its registers at once, for the checks of its tiles (a kernel that loads every key at once: review 50's F1). So is
what each load reads, as the most distinct elements of one launch tensor it took in (`read`): a block's shape says
nothing of how many keys it folds (review 52's F1 held them all in a block of a constant shape, (block_m, 512 /
block_n, block_n)), but a load of every key reads each of them, however it lays them out (an atomic's old values
are read too; and one load's elements count together over every tensor of the launch). And so is how many bytes
its blocks hold at once (`Shapes.hold`): a kernel that keeps each tile of scores in a list of its own (review 54's
F2) holds more of them over more keys, where one with an online softmax holds as many.

Compiled kernels (CUDA) are not checked: what they touch, no Python sees. Python that reaches the interpreter's
own loads (triton._C.libtriton) is refused by name (rules.TAMPERING).

Loaded by path by worker.py (never as part of the grader package).
"""

import builtins
import dis
import sys
import types

OUTSIDE = ("a Triton kernel stored outside its launch's tensors (a pointer made from an integer, or a lane past a "
           "tensor's end that no mask covers): what it wrote there, no record sees")
CHANGED = "Triton's interpreter was changed while the call ran: what its kernels touched, no record sees"
FOREIGN = ("a Triton kernel reaches {name}, which is not Triton's: interpreted, a kernel's body runs as Python, "
           "and what it does there no record sees")
UNPLAIN = ("a Triton kernel was given an argument (or has a default) of type {kind}, not a tensor, a number or a "
           "constant: interpreted, a kernel's body runs it as Python, and what it does there no record sees")
# What a kernel may load as a global besides Triton's own (the compiler takes these as constants); a copy of
# rules.KERNEL_BUILTINS, for this module is loaded by path, apart from the grader
KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "bool", "abs", "isinstance", "zip",
                             "enumerate", "tuple", "list", "print"})
# The interpreter's writes, each with the positions of its pointers and its mask (None: every lane), and whether it
# reads as well (an atomic answers the old values)
OPERATIONS = {"create_masked_store": (0, 2, False), "create_atomic_rmw": (1, 3, True),
              "create_atomic_cas": (0, None, True)}
LOAD = "create_masked_load"  # the interpreter's every load (create_load's, an atomic's, a tensor descriptor's)


def watch(torch, record):
    """Check the stores of every kernel the interpreter runs from now on; return the function that puts
    the interpreter back and tells `record` if it was changed meanwhile (None where Triton's interpreter is not
    loaded: nothing to check)."""
    interpreter = sys.modules.get("triton.runtime.interpreter")
    builder = getattr(interpreter, "InterpreterBuilder", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if builder is None or executor is None or not all(name in vars(builder) for name in (*OPERATIONS, LOAD)):
        return None
    import numpy

    tensor_base = torch._C.TensorBase
    storage_of, storage_pointer, storage_bytes = (tensor_base.untyped_storage, torch._C.StorageBase.data_ptr,
                                                   torch._C.StorageBase.nbytes)
    spans = []  # the [start, end) of each storage the running launch was given, innermost launch last
    unwrap = getattr(interpreter, "_unwrap_tensor", lambda t: t)
    descriptor = getattr(interpreter, "TensorDescriptor", None)

    def given(value, found, depth=0):
        if depth > 4:
            return
        if isinstance(value, (tuple, list)):
            for item in value:
                given(item, found, depth + 1)
            return
        if isinstance(value, dict):
            for item in dict.values(value):
                given(item, found, depth + 1)
            return
        value = unwrap(value.base if descriptor is not None and type(value) is descriptor else value)
        if issubclass(type(value), tensor_base):
            storage = storage_of(value)
            start = storage_pointer(storage)
            found.append((start, start + storage_bytes(storage)))

    def took_in(addresses) -> None:
        """Tell the record's shapes how many distinct elements of the launch's tensors one operation read, all of
        them together (K split into four storages, each a quarter of the keys, is still every key: review 55's F2)."""
        shapes = record.shapes
        if shapes is None or not spans or not addresses.size:
            return
        inside = numpy.zeros(addresses.shape, dtype=bool)
        for start, end in spans[-1]:
            inside |= (addresses >= start) & (addresses < end)
        if int(inside.sum()) > shapes.loaded:  # distinct: a lane read twice takes in nothing more
            shapes.load(numpy.unique(addresses[inside]).size)

    def checked(original, pointers_at, mask_at, reads):
        def operation(self, *args, **kwargs):
            pointers = args[pointers_at]
            width = max(1, pointers.get_element_ty().primitive_bitwidth // 8)
            addresses = numpy.asarray(pointers.data, dtype=numpy.uint64)
            if mask_at is not None and len(args) > mask_at and args[mask_at] is not None:
                addresses = addresses[numpy.broadcast_to(numpy.asarray(args[mask_at].data, dtype=bool),
                                                         addresses.shape)]
            if addresses.size:
                inside = numpy.zeros(addresses.shape, dtype=bool)
                for start, end in spans[-1] if spans else ():
                    inside |= (addresses >= start) & (addresses + numpy.uint64(width) <= end)
                if not inside.all():
                    record.hide(OUTSIDE)
            if reads:  # an atomic answers what was there: a read as well (review 55's F1 read every key so)
                took_in(addresses)
            return original(self, *args, **kwargs)
        return operation

    run = vars(executor)["__call__"]
    jit = getattr(sys.modules.get("triton.runtime.jit"), "JITFunction", None)
    kernel_kinds = (jit, getattr(interpreter, "InterpretedFunction", None))  # triton.jit's, compiled or interpreted
    core = sys.modules.get("triton.language.core")
    constexpr, dtype = getattr(core, "constexpr", None), getattr(core, "dtype", None)
    function_globals = types.FunctionType.__dict__["__globals__"].__get__
    function_code = types.FunctionType.__dict__["__code__"].__get__
    class_dict, class_mro = type.__dict__["__dict__"].__get__, type.__dict__["__mro__"].__get__
    interpreters_own = {id(v) for v in list(vars(interpreter).values())}
    home = sys.modules["triton"].__file__.rsplit("/", 1)[0] + "/"

    def triton_module(value) -> bool:
        """One of Triton's own modules, as imported from its package (not one made to look like it)."""
        name = getattr(value, "__name__", "")
        return (type(value) is types.ModuleType and (name == "triton" or str.startswith(name, "triton."))
                and sys.modules.get(name) is value and str.startswith(getattr(value, "__file__", "") or "", home))

    def triton_own(function) -> bool:
        """A function of Triton's own: its globals one of Triton's modules, its code from Triton's files."""
        if type(function) is not types.FunctionType:
            return False
        namespaces = {id(vars(m)) for m in list(sys.modules.values()) if triton_module(m)}
        return (id(function_globals(function)) in namespaces
                and str.startswith(function_code(function).co_filename, home))

    def fine(value, name: str, seen: set) -> bool:
        if value is None or type(value) in (bool, int, float, str):
            return True
        # another kernel (compiled or interpreted): its own code is held to the same
        if any(kind is not None and isinstance(value, kind) for kind in kernel_kinds):
            if id(value) in seen or triton_own(getattr(value, "fn", None)):  # Triton's standard library's
                return True
            seen.add(id(value))
            return not foreign(getattr(value, "fn", None), seen)
        if name in KERNEL_BUILTINS and getattr(builtins, name, None) is value:
            return True
        if triton_module(value):
            return True
        if type(value) is types.FunctionType:  # one of Triton's language functions
            return triton_own(value)
        if isinstance(value, type):  # one of Triton's classes (tl.static_range): every function in it Triton's
            home_module = sys.modules.get(getattr(value, "__module__", "") or "")
            return (home_module is not None and triton_module(home_module)
                    and all(triton_own(f) for c in class_mro(value) if c is not object
                            for f in class_dict(c).values() if type(f) is types.FunctionType))
        owner = sys.modules.get(getattr(type(value), "__module__", ""))
        if owner is None or not triton_module(owner) or getattr(owner, type(value).__name__, None) is not type(value):
            return False
        if type(value) is constexpr:  # a constant, if what it holds is one (the thirty-seventh review's f06 held
            return fine(value.value, "", seen)  # a function of the file's)
        # Triton's types, and the interpreter's own objects (its semantic, which it gives each kernel)
        return (dtype is not None and isinstance(value, dtype)) or id(value) in interpreters_own

    def foreign(fn, seen: set) -> str:
        """The first global a kernel's code (and the code inside it, and the kernels it calls) loads that is not
        Triton's, another kernel, a constant or an allowed builtin ('' if none): Python of the file's own, which the
        compiler would refuse."""
        names = getattr(fn, "__globals__", {})
        codes = [getattr(fn, "__code__", None)]
        while codes:
            code = codes.pop()
            if code is None:
                continue
            codes += [c for c in code.co_consts if type(c) is types.CodeType]
            value, path = None, ""  # a Triton module loaded, and the attributes read from it since
            for instruction in dis.get_instructions(code):
                if instruction.opname == "LOAD_GLOBAL":
                    name = instruction.argval
                    value = names[name] if name in names else getattr(builtins, name, None)
                    if not fine(value, name, seen):
                        return name
                    path = name
                elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and path and triton_module(value):
                    # what a Triton module holds must be Triton's too: a file can put its own functions there
                    # (tl.keep_tile = keep: the thirty-eighth review's f01)
                    held, path = vars(value), f"{path}.{instruction.argval}"
                    value = held.get(instruction.argval)
                    if instruction.argval not in held or not fine(value, "", seen):  # none there: a __getattr__'s
                        return path
                else:
                    value, path = None, ""
        for cell in getattr(fn, "__closure__", None) or ():
            if not fine(cell.cell_contents, "", seen):
                return "a value it closes over"
        return ""

    def read(original):
        def operation(self, pointers, mask, *args, **kwargs):
            if record.shapes is not None and spans:
                addresses = numpy.asarray(pointers.data, dtype=numpy.uint64)
                if mask is not None:
                    addresses = addresses[numpy.broadcast_to(numpy.asarray(mask.data, dtype=bool), addresses.shape)]
                took_in(addresses)
            return original(self, pointers, mask, *args, **kwargs)
        return operation

    function_defaults = types.FunctionType.__dict__["__defaults__"].__get__
    function_kwdefaults = types.FunctionType.__dict__["__kwdefaults__"].__get__
    tensor_kinds = (torch.Tensor, torch.nn.Parameter)

    def plain(value, depth=0) -> bool:
        """What a launch may hand a kernel: nothing mutable, nothing of the file's (checked by exact type)."""
        kind = type(value)
        if value is None or kind in (bool, int, float, str) or kind in tensor_kinds:
            return True
        if descriptor is not None and kind is descriptor:
            return plain(value.base, depth + 1)
        if kind is tuple and depth < 4:
            return all(plain(item, depth + 1) for item in value)
        if constexpr is not None and kind is constexpr:
            return plain(value.value, depth + 1)
        owner = sys.modules.get(getattr(kind, "__module__", "") or "")  # one of Triton's own types (tl.float16)
        return (dtype is not None and isinstance(value, dtype) and owner is not None and triton_module(owner)
                and getattr(owner, kind.__name__, None) is kind)

    def unplain(fn, args, kwargs) -> str:
        """The type of the first argument, or default of the kernel's, that is not plain data ('' if none)."""
        defaults = ()
        if type(fn) is types.FunctionType:
            defaults = (*(function_defaults(fn) or ()), *dict.values(function_kwdefaults(fn) or {}))
        for value in (*args, *dict.values(kwargs), *defaults):
            if not plain(value):
                return type(value).__name__
        return ""

    def launch(self, *args, **kwargs):
        fn = getattr(self, "fn", None)
        reached = foreign(fn, set())
        if reached:
            record.hide(FOREIGN.format(name=reached))
        kind = unplain(fn, args, kwargs)
        if kind:
            record.hide(UNPLAIN.format(kind=kind))
        found = []
        given((args, kwargs), found)
        spans.append(found)
        try:
            return run(self, *args, **kwargs)
        finally:
            spans.pop()

    handle = getattr(interpreter, "TensorHandle", None)
    made_before = vars(handle).get("__post_init__") if handle is not None else None

    def made(self):
        """Every block the interpreter makes: its shape, for the checks of what a kernel holds at once (its tiles)."""
        made_before(self)
        shapes = record.shapes
        if shapes is not None:
            shapes.block(getattr(self.data, "shape", ()))
            if spans:  # inside a launch: what the kernel holds at once
                shapes.hold(self, int(getattr(self.data, "nbytes", 0)))

    patches = [(executor, "__call__", run, launch)]
    if made_before is not None:
        patches.append((handle, "__post_init__", made_before, made))
    patches += [(builder, name, vars(builder)[name], checked(vars(builder)[name], *at))
                for name, at in OPERATIONS.items()]
    patches.append((builder, LOAD, vars(builder)[LOAD], read(vars(builder)[LOAD])))
    for owner, name, _, patched in patches:
        setattr(owner, name, patched)

    def done():
        changed = any(vars(owner).get(name) is not patched for owner, name, _, patched in patches)
        for owner, name, original, _ in patches:
            setattr(owner, name, original)
        if changed:
            record.hide(CHANGED)

    return done
