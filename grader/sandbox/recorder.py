"""The record of the candidate's torch calls: which functions it called, and the shapes of what they made.

A TorchFunctionMode sees every torch function called while it is active, however it is reached (an
alias, getattr, a method), and writes down its name; the grader decides which names were forbidden.
While the grader's own code runs in a child (a question to the grader, a stand-in's method, the
grader's filling of an object), the record is paused: those calls are not the candidate's.

Loaded by path by worker.py (never as part of the grader package); torch is handed in, so loading
this file costs nothing before the zygote imports torch.
"""

import functools
import hashlib
import marshal
import math
import os
import sys
import types
import weakref
from operator import is_

MAX_SHAPES = 256  # distinct shapes one request records
MAX_STORAGES = 4096  # distinct storages one request counts the bytes of
MAX_SIZES = 16  # the largest sizes of those storages one request lists
UNDER = "a torch-function mode under the record: what it runs, no record sees"
INSIDE = ("Python of the file's own ran inside a torch call (a finaliser, when torch freed an object of the file's): "
          "what it did, no record sees")
# The functions that make scores (products of two tensors) or probabilities of them (exp, what could stand in for
# it, a softmax): a tiled step's results of these must be tiles (Shapes.scores)
SCORES = frozenset({
    "matmul", "__matmul__", "__rmatmul__", "__imatmul__", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum",
    "tensordot", "inner", "outer", "ger", "chain_matmul", "linalg_multi_dot", "multi_dot", "linear", "bilinear",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "cdist", "mv", "addmv", "dot", "vdot",
    "kron", "matrix_power", "addr", "elu", "elu_", "celu", "celu_", "selu", "selu_", "silu", "mish", "glu",
    "exp", "exp_", "exp2", "exp2_", "expm1", "expm1_", "special_exp2", "special_expm1", "special_expit", "sigmoid",
    "sigmoid_", "tanh", "tanh_", "sinh", "sinh_", "cosh", "cosh_", "softplus", "logsigmoid", "pow", "pow_",
    "__pow__", "__rpow__", "__ipow__", "float_power", "float_power_", "softmax", "_softmax", "log_softmax",
    "_log_softmax", "special_softmax", "special_log_softmax", "logsumexp", "logaddexp", "logaddexp2", "ldexp"})
# Tensor methods that run a Python callable of the caller's inside the call, where the record is stashed
CALLBACKS = ("apply_", "map_", "map2_")
# Autograd's entry points: they run the caller's code inside themselves (a hook, a Function's backward), where
# the record would be stashed; the worker runs autograd's engine itself, with the record on the stack
REENTERED = ("backward", "grad")
# Names the record gives what no torch function's name says: a call whose result is part of an autograd graph
# ("autograd_graph.NAME", NAME the call's), autograd used while torch.autograd's backward pass runs (a graph built,
# or a backward pass entered, inside one), and any torch call made there (Python's, a Function's own backward)
GRAPH, GRAPH_IN_BACKWARD, CODE_IN_BACKWARD = "autograd_graph", "autograd_in_backward", "code_in_backward"
# What a backward pass the record runs differentiates: "autograd_node.NAME" for each kind of torch's own node in the
# graph (MulBackward0, AccumulateGrad), and "autograd_functions.N" for the number of nodes of autograd.Functions
# (Python's, whose backward the file wrote). A rule can then say which graph may be differentiated, whatever built it.
NODE_KIND, FUNCTION_NODES, MAX_NODES = "autograd_node", "autograd_functions", 100_000
# Two more that name what leaves torch with no torch call to record: a storage's bytes read in Python (its items,
# its file, its shared memory: guard.py's STORAGE_READERS), and a tensor on memory torch did not allocate given to or
# returned by a torch call (a NumPy array's, a bytearray's, a file's, which Python reads where no call answers).
# torch allocates resizable storages; another's memory is lent, and never resizable.
STORAGE_BYTES, FOREIGN_MEMORY = "storage_bytes", "foreign_memory"
# A call that answered a complex tensor: the complex step (f(x + ih) / h, exact to rounding) differentiates code with no
# autograd at all (the forty-sixth review), so a step that must derive its gradients by hand may forbid it
COMPLEX = "complex_tensor"
# Their parameters and defaults (torch 2.x), bound here by hand: the record's own code calls nothing the file could
# have replaced (inspect.signature is Python, and the record is stashed while it runs)
AUTOGRAD_PARAMETERS = {
    "Tensor": (("self", None), ("gradient", None), ("retain_graph", None), ("create_graph", False), ("inputs", None)),
    "backward": (("tensors", None), ("grad_tensors", None), ("retain_graph", None), ("create_graph", False),
                 ("grad_variables", None), ("inputs", None)),
    "grad": (("outputs", None), ("inputs", None), ("grad_outputs", None), ("retain_graph", None),
             ("create_graph", False), ("only_inputs", True), ("allow_unused", None), ("is_grads_batched", False),
             ("materialize_grads", False)),
}
# A tensor of one integer given where torch takes a number (a size, a stride, a dim, a bound): torch's C++ reads its
# value, as .item() would, and the shape, stride or error that comes back hands it to Python. The record names such
# a read as Python's own conversion does: "__index__". Where: any tensor inside a list, a tuple or a slice (but the
# operands of these, which take lists of tensors as data), and the tensors these take as numbers besides their first
# operand (a factory's first argument too)
READ_AS_NUMBER = "__index__"
TENSOR_LISTS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack",
                          "row_stack", "broadcast_tensors", "block_diag", "einsum", "meshgrid", "cartesian_prod",
                          "chain_matmul", "multi_dot", "linalg_multi_dot", "atleast_1d", "atleast_2d", "atleast_3d",
                          "__getitem__", "__setitem__", "index", "index_put", "index_put_", "_index_put_impl_"})
FACTORIES = frozenset({"arange", "range", "empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm",
                       "empty_strided", "eye", "linspace", "logspace", "tril_indices", "triu_indices"})
TAKES_NUMBERS = FACTORIES | frozenset({
    "view", "reshape", "expand", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "narrow",
    "narrow_copy", "select", "split", "unsafe_split", "split_with_sizes", "unsafe_split_with_sizes", "chunk",
    "unsafe_chunk", "tensor_split", "hsplit", "vsplit", "dsplit", "slice", "slice_copy", "diag_embed", "rot90",
    "broadcast_to", "diff", "vander", "combinations",
    "unflatten", "as_strided", "repeat", "tile",
    "repeat_interleave", "unfold", "transpose", "permute", "movedim", "moveaxis", "swapaxes", "swapdims", "unsqueeze",
    "squeeze", "flatten", "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "cumsum", "cumprod",
    "logsumexp", "topk", "kthvalue", "diagonal", "diag", "tril", "triu", "roll", "flip", "resize_", "size",
    "stride", "pad", "index_select", "softmax", "log_softmax", "norm", "prod", "std", "var", "all", "any"})
# Of those, the ones whose tensor of many integers is an index, not numbers: the result's shape is its count alone
INDEXES = frozenset({"index_select"})
# What hands a tensor's values back as a shape whatever its arguments: its result's size is a count of its data
DATA_SHAPED = frozenset({"masked_select", "nonzero", "nonzero_static", "argwhere", "unique", "unique_consecutive",
                         "_unique", "_unique2", "bincount", "histc", "histogram", "bucketize", "searchsorted",
                         "one_hot", "sparse_coo_tensor", "_sparse_coo_tensor_unsafe"})
# Nested and sparse tensors: their components' shapes and their index tensors' lengths are read from a tensor's data
# (the sizes of _nested_view_from_buffer, the nonzeros of to_sparse): every such call, by a part of its name
STRUCTURED = ("nested", "sparse")
# Calls whose result's size is a number they are given, by a part of their name (a window's length, an FFT's n, an
# adaptive pool's or an interpolation's output size): an integer tensor anywhere among their arguments is read
SIZED = ("window", "fft", "adaptive_", "interpolate", "upsample", "stft")
SPARSE_PARTS = frozenset({"indices", "_indices", "values", "_values", "col_indices", "crow_indices", "row_indices",
                          "ccol_indices", "coalesce", "_coalesced_"})
# A call given a tensor that answers a Python number is a read of its value too (`complex(t)`, `float(t)`,
# aten._local_scalar_dense reached by any spelling), but for these, which answer a number of its layout; a bool is one
# bit (`if mask.any():`), not a value
LAYOUT_NUMBERS = frozenset({"size", "stride", "dim", "ndimension", "numel", "nelement", "element_size",
                            "storage_offset", "data_ptr", "get_device", "__len__", "__get__", "__hash__", "_version",
                            "__sizeof__", "nbytes", "itemsize"})
PLAIN = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), range)  # arguments that run no code
# Callables of C types: their attributes are C getters, which run no Python code
C_CALLABLES = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
               types.MethodWrapperType, types.GetSetDescriptorType, types.MemberDescriptorType,
               types.ClassMethodDescriptorType)
C_CALLABLE_IDS = frozenset(map(id, C_CALLABLES))
METHOD_WRAPPER, GETSET = types.MethodWrapperType, types.GetSetDescriptorType  # a setter of torch's: t.grad = g
FUNCTION_GLOBALS, FUNCTION_DICT, FUNCTION_NAME, FUNCTION_CODE, FUNCTION_DEFAULTS, FUNCTION_KWDEFAULTS = (
    types.FunctionType.__dict__[a].__get__
    for a in ("__globals__", "__dict__", "__name__", "__code__", "__defaults__", "__kwdefaults__"))
MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
CLASS_DICT, PROXY_VALUES = type.__dict__["__dict__"].__get__, types.MappingProxyType.values
WRAPPED_FUNCTION = {kind: kind.__dict__["__func__"].__get__ for kind in (staticmethod, classmethod)}
PROPERTY_PARTS = tuple(property.__dict__[part].__get__ for part in ("fget", "fset", "fdel"))
METHOD_FUNCTION = types.MethodType.__dict__["__func__"].__get__
TYPE_NAME = type.__dict__["__name__"].__get__


TENSOR: list = []  # torch.Tensor, once a record is made: the type most arguments are


def make_recorder(torch, lifted):
    """The recorder for a child: one TorchFunctionMode, entered (`with recorder:`) around the candidate's code.

    `lifted` (guard.py) lets it read the mode stack, which the candidate's code may not.
    """
    import numpy
    from torch.overrides import TorchFunctionMode

    TENSOR[:] = [torch.Tensor]
    DTYPE_NAMES.update({v: str(v) for v in list(vars(torch).values()) if type(v) is torch.dtype})

    # Everything below is compared by identity (id), never by == or hashing, which a type of the file's own (a
    # metaclass) could answer with its own code while the record is stashed.
    own_types = {id(t) for t in _subclasses(torch.Tensor)}  # torch's own tensor types, loaded before any candidate
    # exact types (a subclass of float of the file's own runs its code when torch compares it), numpy's scalars
    plain = {id(t) for t in (*PLAIN, torch.Size, torch.dtype, torch.device, torch.layout, torch.memory_format,
                             torch.Generator, *_subclasses(numpy.generic))}
    # torch's modules' namespaces: a Python function is torch's own when its globals are one of them (its code's
    # file name the file can choose; guard.py refuses code that claims torch's files, not torch's code with other
    # globals)
    torch_globals = {id(vars(m)) for n, m in list(sys.modules.items())
                     if (n == "torch" or n.startswith("torch.")) and hasattr(m, "__dict__")}
    # torch's own classes whose instances torch dispatches as functions (torch.ops' overloads), and the classes torch
    # dispatches as functions themselves (torch.finfo, a tensor type): every class in torch's namespaces and builtins'
    torch_classes = {id(t) for n, m in list(sys.modules.items())
                     if n in ("torch", "builtins") or n.startswith("torch.")
                     for t in list(getattr(m, "__dict__", {}).values()) if issubclass(type(t), type)}
    torch_callables = {id(t) for t in vars(torch._ops).values() if isinstance(t, type)}
    passable = frozenset(own_types | plain)  # what an argument may be without running code of the file's own
    hooks = _Hooks(torch)
    kept = _Namespaces(torch, torch_globals, torch_classes, plain)
    # the torch-function mode stack, which the file may push on (the guard refuses it a look, a pop or a disable)
    modes = (torch._C._len_torch_function_stack, torch._C._get_function_stack_at)
    modules = sys.modules  # the interpreter's own dict, as the worker found it
    quiet = _quiet_warnings()
    autograd_entries = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
    grad_enabled, grad_fn_of = torch.is_grad_enabled, torch._C.TensorBase.grad_fn.__get__
    dtype_of = torch._C.TensorBase.dtype.__get__
    # an autograd.Function's node is of a Python class the file's Function made, whose attributes the file can set:
    # its inputs are read by the C getter of the base class
    function_node, function_next = torch._C._FunctionBase, vars(torch._C._FunctionBase)["next_functions"].__get__
    dispatch_modes = torch._C._len_torch_dispatch_stack  # modes below this one, whose Python runs inside a call
    reads_as_number = _number_reader(torch)
    foreign = _foreign_finder(torch)
    kernels = sys.modules["_attn_grade_sandbox_kernels"]  # this folder's, loaded by path by worker.py
    # While a C function of torch's runs, no Python runs but what it calls: torch's own (a lazy initialisation), or
    # the file's, freed by reference count inside the call (a __del__, a weakref's callback: the thirty-fifth and
    # thirty-sixth reviews), where the record is stashed. A profile function sees each Python frame start.
    set_profile, torch_folder, own_globals = sys.setprofile, os.path.dirname(torch.__file__) + os.sep, globals()
    running, ran = [False], [False]

    def started(frame, event, arg):
        """A Python frame started right inside the running C function, and it is not torch's own code."""
        if event != "call" or not running[0]:
            return
        caller = frame.f_back
        if caller is None or caller.f_globals is not own_globals:  # nested in a frame already judged
            return
        if id(frame.f_globals) in torch_globals and str.startswith(frame.f_code.co_filename, torch_folder):
            return  # torch's code, with torch's globals (guard.py refuses code that claims torch's files)
        ran[0] = True

    class Recorder(TorchFunctionMode):
        """Records the name of every torch function called while it is active.

        On the meta device it also lets a 0-dim CPU tensor meet a meta one, as CUDA lets it
        meet a CUDA tensor (torch.tensor(d).sqrt() is fine on a GPU; the meta device alone
        would refuse it).
        """

        seen: set = set()
        hidden: str = ""  # why the record may lack calls (they ran where it could not see them), once known
        raised = None  # the last exception a torch call raised, as an object: what torch says, not what the file says
        device: str = "cpu"
        shapes = None  # a Shapes while a request asks for the shapes of what the call creates (`"shapes": true`)
        changed: list = []  # the arguments a call changed in place
        gradients = 0  # how many of torch.autograd's backward passes are running (one inside another when > 1)
        engine_next = False  # the record is about to run autograd's engine itself (engine_entered)
        unwatch = None  # puts Triton's interpreter back as the record leaves (kernels.py), while it runs
        # What a torch setter replaced (an old .grad, .data), and the graph nodes of a C call's tensors: kept alive
        # until the request is answered, so that nothing of the file's they held is freed inside the call (a
        # finaliser, C callables too: the thirty-seventh review's f04 and f05, a functools.partial as __del__,
        # started no Python frame)
        replaced: list = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name, why = _name(func, torch_classes, torch_callables)
            self.seen.add(name)
            kwargs = kwargs or {}
            if not self.hidden:
                with lifted():
                    under = modes[0]()  # this record stashed while it handles a call: what is left is under it
                self.hidden = (why or _hiding(func, name, types, own_types, torch_globals) or hooks.set()
                               or (dispatch_modes() and "a torch dispatch mode, whose Python runs inside every call")
                               or (under and UNDER)
                               or kept.changed(func)
                               or _foreign_argument(numpy, name, (args, kwargs), passable, torch_globals))
            if reads_as_number(name, args, kwargs):  # before the call: what it raises hands the value back too
                self.seen.add(READ_AS_NUMBER)
            if self.device == "meta":
                args, kwargs = _scalars_to_meta(torch, args, kwargs)
            if name in REENTERED and any(func is entry for entry in autograd_entries):
                value = self._autograd(func, args, kwargs)
            else:
                # Warnings raised inside the call are dropped, by a warnings module of the worker's own: the
                # shared one calls filters, hooks and sys.stderr the file may have replaced, with the record stashed
                shared = modules.get("warnings")
                modules["warnings"] = quiet
                watched = id(type(func)) in C_CALLABLE_IDS
                if type(func) is METHOD_WRAPPER and func.__name__ in ("__set__", "__delete__") and args:
                    descriptor = func.__self__
                    if type(descriptor) is GETSET:
                        try:
                            self.replaced.append(descriptor.__get__(args[0], type(args[0])))
                        except BaseException:  # nothing there to keep
                            pass
                if watched:  # the graph nodes of its tensors, which it may free (detach_: the thirty-eighth
                    for t in (*args, *dict.values(kwargs)):  # review's f03, a finaliser on a tensor a node saved)
                        if issubclass(type(t), torch.Tensor):
                            node = grad_fn_of(t)
                            if node is not None:
                                self.replaced.append(node)
                if watched:
                    with lifted():
                        set_profile(started)
                    running[0] = True
                try:
                    value = func(*args, **kwargs)
                except BaseException as error:
                    # What it raises may name a value ("index 7 is out of bounds", "sizes=[N]") to code that catches
                    # it; a call that fails this way fails, unless caught. A missing attribute names none.
                    if not issubclass(type(error), AttributeError):
                        self.seen.add(READ_AS_NUMBER)
                    self.raised = error
                    raise
                finally:
                    modules["warnings"] = shared
                    if watched:
                        running[0] = False
                        with lifted():
                            set_profile(None)
                        if ran[0]:
                            ran[0] = False
                            self.hidden = self.hidden or INSIDE
            kind = type(value)
            if ((kind is int or kind is float or kind is complex) and str.split(name, ".")[0] not in LAYOUT_NUMBERS
                    and any(issubclass(type(a), torch.Tensor) for a in (*args, *dict.values(kwargs)))):
                self.seen.add(READ_AS_NUMBER)
            if self.shapes is not None:
                self.shapes.add(torch, value, name, given=(*args, *kwargs.values()))
                self.shapes.trace(torch, name, value)
            if foreign(args, dict.values(kwargs), (value,)):
                self.seen.add(FOREIGN_MEMORY)
            if any(issubclass(type(t), torch.Tensor) and dtype_of(t).is_complex for t in _items(value)):
                self.seen.add(COMPLEX)
            if self.gradients:
                self.seen.add(CODE_IN_BACKWARD)
            if grad_enabled() and self._builds_graph(value):
                self.seen.add(GRAPH_IN_BACKWARD if self.gradients else f"{GRAPH}.{name}")
            return value

        def engine_entered(self, runs: bool):
            """Told by the guard's hook: autograd's engine was asked to run a backward pass (or to queue a callback,
            `runs` False). Only the run this record starts itself (`_autograd`) is one it follows."""
            if runs and self.engine_next:
                self.engine_next = False
                return
            self.hidden = self.hidden or ("autograd's engine run by hand, whose backward formulas the record cannot "
                                          "see" if runs else "a callback queued on autograd's engine")

        def _graph(self, outputs):
            """Mark what the backward pass of `outputs` will differentiate (NODE_KIND, FUNCTION_NODES)."""
            stack, visited, functions = [grad_fn_of(t) for t in outputs if issubclass(type(t), torch.Tensor)], set(), 0
            while stack and len(visited) < MAX_NODES:
                node = stack.pop()
                if node is None or id(node) in visited:
                    continue
                visited.add(id(node))
                kind = type(node)
                if issubclass(kind, function_node):
                    functions += 1
                    following = function_next(node)
                else:
                    getter = vars(kind).get("next_functions")
                    following = getter.__get__(node) if type(getter) is GETSET else ()
                    self.seen.add(f"{NODE_KIND}.{kind.__name__}")
                stack.extend(edge[0] for edge in following if type(edge) is tuple and edge)
            self.seen.add(f"{FUNCTION_NODES}.{functions}")

        def storage_read(self):
            """Told by the guard's hook: the candidate's code read a storage's bytes (guard.py)."""
            self.seen.add(STORAGE_BYTES)

        def hide(self, why: str):
            """Told by the guard's hook: calls ran where this record cannot see them (guard.py's HIDING)."""
            self.hidden = self.hidden or why

        def _builds_graph(self, value) -> bool:
            """The call's result is a node of an autograd graph: gradients could be taken through it."""
            for t in _items(value):
                if issubclass(type(t), torch.Tensor) and grad_fn_of(t) is not None:
                    return True
            return False

        def __enter__(self):
            """On the mode stack, at its top. Any mode already there, under it (pushed at import, or left by an
            earlier call), gets each call after the record has passed it on, with the record stashed: what it runs
            instead, no record sees (the thirtieth review's f02 and f03). Judged by being there, not by its type: a
            mode of torch's own class can carry the file's handler (the thirty-first's f01). A mode put under it later
            shows in every call (`__torch_function__`)."""
            with lifted():
                torch._C._push_on_torch_function_stack(self)
                under = modes[0]() - 1
            if under and not self.hidden:
                self.hidden = UNDER
            self.unwatch = kernels.watch(torch, self)  # what Triton's interpreter touches (kernels.py)
            return self

        def foreign_modes(self) -> bool:
            """Is another mode on the stack than this record (one above it gets the grader's own calls first)?"""
            with lifted():
                stack = [modes[1](i) for i in range(modes[0]())]
            return any(mode is not self for mode in stack)

        def __exit__(self, *exc):
            """Leave the mode stack as it was entered; a call that popped this mode, or left another above it,
            hid what it did after that from the record."""
            unwatch, self.unwatch = self.unwatch, None
            if unwatch is not None:
                unwatch()
            with lifted():
                depth = torch._C._len_torch_function_stack()
                stack = [torch._C._get_function_stack_at(i) for i in range(depth)]
                if not stack or stack[-1] is not self:
                    self.hidden = self.hidden or "the torch-function mode stack was changed"
                while stack and stack[-1] is not self:
                    torch._C._pop_torch_function_stack()
                    stack.pop()
                if stack:
                    torch._C._pop_torch_function_stack()

        def _autograd(self, func, args, kwargs):
            """What torch.autograd.backward or grad does past its dispatch, with this mode on the stack."""
            from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
            from torch.autograd.graph import _engine_run_backward

            given = _bound(AUTOGRAD_PARAMETERS[func.__name__ if func is not torch.Tensor.backward else "Tensor"],
                           args, kwargs)
            if given is None:
                self.hidden = self.hidden or f"torch.autograd.{func.__name__} with arguments the worker does not follow"
                return func(*args, **kwargs)
            if func is torch.Tensor.backward:
                outputs, grads, inputs = (given["self"],), given["gradient"], given["inputs"]
            else:
                outputs = given["tensors"] if func is torch.autograd.backward else given["outputs"]
                outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
                grads = given["grad_tensors"] if func is torch.autograd.backward else given["grad_outputs"]
                inputs = given["inputs"]
            if given.get("is_grads_batched") or given.get("grad_variables") is not None or isinstance(inputs, dict):
                self.hidden = self.hidden or f"torch.autograd.{func.__name__} with arguments the worker does not follow"
                return func(*args, **kwargs)
            inputs = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
            create = given["create_graph"]
            retain = create if given["retain_graph"] is None else given["retain_graph"]
            if self.gradients:
                self.seen.add(GRAPH_IN_BACKWARD)
            self._graph(outputs)
            with self._reentered(), self._gradients():
                grads = _make_grads(outputs, _tensor_or_tensors_to_tuple(grads, len(outputs)), is_grads_batched=False)
                self.engine_next = True  # the engine's next run is this one (engine_entered)
                try:
                    if func is not torch.autograd.grad:
                        _engine_run_backward(outputs, grads, retain, create, inputs, allow_unreachable=True,
                                             accumulate_grad=True)
                        return None
                    unused = given["materialize_grads"] if given["allow_unused"] is None else given["allow_unused"]
                    result = _engine_run_backward(outputs, grads, retain, create, inputs, unused,
                                                  accumulate_grad=False)
                finally:
                    self.engine_next = False
                if given.get("materialize_grads"):
                    result = tuple(torch.zeros_like(i) if r is None else r for r, i in zip(result, inputs, strict=True))
                return result

        def _gradients(self):
            return Gradients(self)

        def forked(self, fresh: bool):
            """This record in a child just forked from the zygote that made it (its snapshots of torch's namespaces
            are the child's too, and cost nothing there): sys.modules snapshotted again, as the worker hid its own
            modules; made again, whole, where `fresh` (CUDA started in the child, which changes torch's)."""
            if fresh:
                return make_recorder(torch, lifted)
            kept.refresh_modules()
            return self

        def _reentered(self):
            """This mode on the stack again while a call runs that torch made with it stashed."""
            return Reentered(self)

        def paused(self):
            """While the grader's own code runs: its torch calls, and the tensors they create, go unrecorded."""
            return Paused(self)

    # Context managers of this file's own, not contextlib's (a module the candidate shares): their entering and
    # leaving run nothing the file could have replaced.
    class Reentered:
        __slots__ = ("record",)

        def __init__(self, record):
            self.record = record

        def __enter__(self):
            with lifted():
                torch._C._push_on_torch_function_stack(self.record)

        def __exit__(self, *exc):
            with lifted():
                depth = torch._C._len_torch_function_stack()
                if depth and torch._C._get_function_stack_at(depth - 1) is self.record:
                    torch._C._pop_torch_function_stack()
                else:
                    self.record.hidden = self.record.hidden or "the torch-function mode stack was changed"
            return False

    class Gradients:
        __slots__ = ("record",)

        def __init__(self, record):
            self.record = record

        def __enter__(self):
            self.record.gradients += 1

        def __exit__(self, *exc):
            self.record.gradients -= 1
            return False

    class Paused:
        __slots__ = ("record", "kept")

        def __init__(self, record):
            self.record = record

        def __enter__(self):
            record = self.record
            # The grader's code about to run calls the tensors' methods and the builtins: one the file replaced
            # would run its code here, unrecorded. A replacement undone before torch's next call leaves no other trace.
            record.hidden = record.hidden or kept.replaced() or (
                record.foreign_modes() and "a torch-function mode of the file's gets the grader's own calls")
            self.kept = (record.seen, record.shapes, record.hidden)
            record.seen, record.shapes = set(), None

        def __exit__(self, *exc):
            self.record.seen, self.record.shapes, self.record.hidden = self.kept
            return False

    return Recorder()


class _Namespaces:
    """What torch's Python code reads inside a torch call, where the record is stashed, as the worker found it: the
    builtins, torch's own namespace, the namespace of each of torch's modules, sys.modules (torch's code imports
    inside calls), the tensor's classes and those of torch's modules that are no plain module. `changed(func)` says
    whether the file has changed one since that a call of `func`, a Python function of torch's, reads (all of them
    but the other modules' namespaces, and its own module's): modules added since (a lazy import) are not changes;
    any other name added or replaced is."""

    def __init__(self, torch, torch_globals, torch_classes, plain):
        import builtins

        self.torch_globals, self.torch_classes, self.plain = torch_globals, torch_classes, plain
        # every class there is before the file runs (kept: an id is not reused), as the zygote found them
        self.known = KNOWN_CLASSES or _every_class()
        self.known_ids = None
        self.torch_folder = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.spaces = {id(vars(m)): vars(m) for n, m in list(sys.modules.items())
                       if (n == "torch" or n.startswith("torch.")) and hasattr(m, "__dict__")}
        self.kept = {key: tuple(space.values()) for key, space in self.spaces.items()}
        # and the tensor's classes, whose methods torch's Python code calls on its arguments (a class's namespace
        # is a live view, made afresh by each vars(): kept by name)
        named = {"builtins": vars(builtins), "torch": vars(torch), "Tensor": vars(torch.Tensor),
                 "TensorBase": vars(torch._C.TensorBase), "modules": sys.modules}
        # and the classes of torch's modules that are not plain modules (torch._VF's), whose attributes they answer
        for m in list(sys.modules.values()):
            if type(m) is not types.ModuleType and getattr(type(m), "__module__", "").startswith("torch"):
                named[f"class {id(type(m))}"] = vars(type(m))
        for key, space in named.items():
            self.spaces[key] = space
            self.kept[key] = tuple(space.values())
        self.always = tuple(named)

    def refresh_modules(self) -> None:
        self.kept["modules"] = tuple(sys.modules.values())

    def changed(self, func) -> str:
        if type(func) is types.MethodType:
            func = METHOD_FUNCTION(func)
        if type(func) is not types.FunctionType:
            return ""  # torch's C code reads no Python namespace
        if not self._plain_defaults(func):
            return "a default of one of torch's functions replaced: torch's code reads it inside a call"
        for key in (*self.always, id(FUNCTION_GLOBALS(func))):
            if self._changed(key):
                # a name replaced, or one added that is not a module: it may shadow a builtin, or a class's inherited
                # method (torch.Tensor.expand_as set on the subclass)
                return ("a builtin, or a name in one of torch's modules or tensor classes, replaced or added: torch's "
                        "code reads it inside a call")
        return ""

    def replaced(self) -> str:
        """Why the builtins, torch's namespace, the tensor's classes or sys.modules are not as the worker found them
        ('' if they are): what any code of torch's or the grader's reads."""
        if any(self._changed(key) for key in self.always):
            return "a builtin, or a name in torch's namespace or the tensor's classes, replaced or added"
        return ""

    def _changed(self, key) -> bool:
        kept = self.kept.get(key)
        if kept is None:
            return False
        # the values themselves are kept and compared by identity (an id alone could be a new object's, at the
        # address a freed one left)
        values, n = tuple(self.spaces[key].values()), len(kept)
        if len(values) >= n and all(map(is_, values, kept)):
            if len(values) == n:
                return False
            added = (tuple(self.spaces[key].items())[n:] if key == "modules" else
                     tuple((None, v) for v in values[n:]))
            if all(type(v) is types.ModuleType and self._genuine(name, v) for name, v in added):
                self.kept[key] = values  # a lazy import's submodules, added after them
                return False
        return True

    def _known_ids(self) -> set:
        if self.known_ids is None:  # made when first needed (a lazy import's module looked into), from the list
            self.known_ids = {id(t) for t in self.known}
        return self.known_ids

    def _plain_defaults(self, func) -> bool:
        """Are func's defaults, which its body reads inside the call, values that run none of the file's code?"""
        defaults = FUNCTION_DEFAULTS(func) or ()
        keyword = FUNCTION_KWDEFAULTS(func)
        values = (*defaults, *(dict.values(keyword) if type(keyword) is dict else ()))
        return all(self._runs_nothing(v, 3) for v in values)

    def _runs_nothing(self, value, depth: int) -> bool:
        kind = type(value)
        if id(kind) in self.plain:
            return True
        if kind is types.FunctionType:
            return id(FUNCTION_GLOBALS(value)) in self.torch_globals
        if id(kind) in C_CALLABLE_IDS:
            return True
        if issubclass(kind, type):
            return id(value) in self.torch_classes
        if kind is tuple or kind is list or kind is frozenset or kind is set:
            return depth > 0 and len(value) <= 64 and all(self._runs_nothing(v, depth - 1) for v in value)
        if kind is dict:
            return depth > 0 and len(value) <= 64 and all(
                self._runs_nothing(k, depth - 1) and self._runs_nothing(v, depth - 1) for k, v in dict.items(value))
        return id(kind) in self.torch_classes  # an instance of torch's or builtins' (a sentinel, an enum)

    def _genuine(self, name, module) -> bool:
        """A module added to sys.modules (or to a torch module's namespace) since: torch's own lazy import? Under a
        name outside torch it is not judged (the file's own imports). Under torch's, its file is one of torch's,
        its functions and its classes' are torch's code with torch's globals, and every other value is an instance
        of a class that existed before the file ran (a module of the file's own, put where torch's code imports
        from inside a call, would run the file's code there)."""
        if name is not None and not (type(name) is str and (name == "torch" or str.startswith(name, "torch."))):
            return True
        space = MODULE_DICT(module)
        where = dict.get(space, "__file__")
        if type(where) is not str or not str.startswith(where, self.torch_folder):
            return False
        return all(self._torch_value(v, space, 3) for v in tuple(dict.values(space)))

    def _torch_value(self, value, space, depth: int) -> bool:
        """Runs this value (a module's, a class's, a container's) only torch's code? Looked into `depth` levels."""
        kind = type(value)
        if kind is types.FunctionType:
            file = FUNCTION_CODE(value).co_filename
            return (type(file) is str and str.startswith(file, self.torch_folder)
                    and (FUNCTION_GLOBALS(value) is space or id(FUNCTION_GLOBALS(value)) in self.torch_globals))
        if kind is types.ModuleType or id(kind) in self.plain or id(kind) in C_CALLABLE_IDS:
            return True
        if kind is functools.partial or kind is types.MethodType:
            return False  # a callable that wraps another: torch's modules hold none that a lazy import makes
        if kind is staticmethod or kind is classmethod:
            inner = (WRAPPED_FUNCTION[kind](value),)
        elif kind is property:
            inner = tuple(getter(value) for getter in PROPERTY_PARTS)
        elif issubclass(kind, type):
            inner = tuple(PROXY_VALUES(CLASS_DICT(value)))
        elif kind is tuple or kind is list or kind is set or kind is frozenset:
            inner = tuple(value)
        elif kind is dict:
            inner = (*dict.keys(value), *dict.values(value))
        elif id(kind) not in self._known_ids():
            return False  # an instance of a class the file made
        else:
            try:  # an instance's own attributes (a SimpleNamespace holding a callable), through its class's getter
                own = object.__getattribute__(value, "__dict__")
            except AttributeError:
                return True
            if type(own) is not dict:
                return False
            inner = tuple(dict.values(own))
        if depth <= 0:  # deep inside something of torch's or of the standard library's (a logger's manager)
            return kind is not staticmethod and kind is not classmethod and kind is not property
        return all(v is None or self._torch_value(v, space, depth - 1) for v in inner)


def _quiet_warnings():
    """A warnings module of the worker's own that ignores every warning: Python's C warnings code reads its
    filters from whatever sys.modules["warnings"] is, and an "ignore" filter ends there."""
    quiet = types.ModuleType("warnings")
    quiet.filters = [("ignore", None, Warning, None, 0)]
    quiet.defaultaction = quiet._defaultaction = "ignore"
    quiet.onceregistry = quiet._onceregistry = {}
    quiet._filters_mutated = lambda: None
    return quiet


def _name(func, torch_classes, torch_callables) -> tuple[str, str]:
    """The name a call is recorded by, read without running code of the file's own; and why it could not be, or
    "". A function's name is a plain copy (a subclass of str of the file's own would answer for itself)."""
    kind = type(func)
    if kind is types.MethodType:
        func = METHOD_FUNCTION(func)
        kind = type(func)
    if kind is types.FunctionType:
        raw = FUNCTION_NAME(func)
    elif (kind is C_CALLABLES[0] or kind is C_CALLABLES[1] or kind is C_CALLABLES[2] or kind is C_CALLABLES[3]
          or id(kind) in C_CALLABLE_IDS):  # the commonest first: no id(), an audited call
        raw = func.__name__
    elif id(kind) in torch_callables or kind is functools.partial:
        raw = func.__name__ if kind is not functools.partial else "partial"
    elif issubclass(kind, type) and id(func) in torch_classes:  # a class of torch's, called
        raw = TYPE_NAME(func)
    else:
        return "?", f"a callable of the file's own type ({TYPE_NAME(kind)}), run as a torch function"
    return (str.__str__(raw) if issubclass(type(raw), str) else "?"), ""


KNOWN_CLASSES: list = []  # the classes there are before any candidate's code runs, found once in the zygote


def remember_classes() -> None:
    KNOWN_CLASSES[:] = _every_class()


def _every_class() -> list:
    found, frontier = [object], [object]
    seen = {id(object)}
    while frontier:
        for sub in type.__subclasses__(frontier.pop()):
            if id(sub) not in seen:
                seen.add(id(sub))
                found.append(sub)
                frontier.append(sub)
    return found


def _subclasses(cls) -> frozenset:
    found, frontier = {cls}, [cls]
    while frontier:
        for sub in frontier.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                frontier.append(sub)
    return frozenset(found)


def _hiding(func, name: str, kinds, own_types, torch_globals) -> str:
    """Why this call lets code of the candidate's run where the record cannot see it, or "".

    While the mode handles a call, the mode is stashed: whatever the call runs goes unrecorded.
    That is torch's own code, unless the call hands control back to the candidate's: a tensor
    subclass of its own (its __torch_function__ runs), a function of its own passed off as a
    torch function (torch.overrides.handle_torch_function), or a Python callback (Tensor.apply_).
    Read through C getters only: nothing of the file's own runs here.
    """
    for t in kinds if type(kinds) is tuple else ():
        if t is not TENSOR[0] and id(t) not in own_types:  # the commonest first: no id(), an audited call
            return "a tensor subclass of the file's own, which runs its own code inside torch calls"
    if name in CALLBACKS:
        return f"Tensor.{name}, which runs a Python callable inside the call"
    if type(func) is functools.partial:
        return f"{name}, a partial function of the file's own, run as a torch function"
    layer = METHOD_FUNCTION(func) if type(func) is types.MethodType else func
    for _ in range(8):  # a torch wrapper (torch.overrides.wrap_torch_function) around a function of the file's
        if type(layer) is not types.FunctionType:
            return ""
        if id(FUNCTION_GLOBALS(layer)) not in torch_globals:
            return f"{name}, a function of the file's own, run as a torch function"
        layer = dict.get(FUNCTION_DICT(layer), "__wrapped__")
        if layer is None:
            return ""
    return f"{name}, wrapped too deep to follow, run as a torch function"


def _bound(parameters, args, kwargs) -> dict | None:
    """The arguments by name, defaults filled in; None for a call these parameters cannot take."""
    names = [name for name, _ in parameters]
    if len(args) > len(names) or any(k not in names for k in kwargs) or any(n in kwargs for n in names[:len(args)]):
        return None
    return {**dict(parameters), **dict(zip(names[: len(args)], args, strict=True)), **kwargs}


class _Hooks:
    """The process-wide hooks through which Python of the file's own could run inside a torch call, where the record
    is stashed: warnings' display, unraisable exceptions, the garbage collector's callbacks, autograd's saved-tensor
    hooks. As the worker found them when armed; `set()` says which one the file has set since, or ""."""

    def __init__(self, torch):
        import gc
        import sys
        import warnings

        self.sys, self.warnings = sys, warnings
        self.callbacks = gc.callbacks  # the list the collector itself holds
        self.top_hooks = torch._C._autograd._top_saved_tensors_default_hooks  # bound now: no file can replace it
        self.kept = self._now()

    def _now(self):
        return (self.warnings.showwarning, self.warnings._showwarnmsg, self.warnings.formatwarning,
                self.sys.unraisablehook, self.sys.excepthook)

    def set(self) -> str:
        if self.callbacks:
            return "a garbage-collector callback of the file's own, which may run inside a torch call"
        kept, warnings, sys = self.kept, self.warnings, self.sys
        if (warnings.showwarning is not kept[0] or warnings._showwarnmsg is not kept[1]
                or warnings.formatwarning is not kept[2] or sys.unraisablehook is not kept[3]
                or sys.excepthook is not kept[4]):
            return "a warnings or exception hook of the file's own, which torch may call inside a call"
        if self.top_hooks(True) is not None:
            return "saved-tensor hooks of the file's own, which autograd runs inside a torch call"
        return ""


def _foreign_argument(numpy, name: str, arguments, passable, torch_globals) -> str:
    """Why an argument of this call could run the file's own code inside it, or "": an object of a type of the
    file's own (torch reads a sequence's items, calls a hook), or a function of the file's own. `passable`: the ids
    of torch's tensor types and the plain ones. Types are compared by identity and functions read through C getters:
    nothing of the file's own runs here."""
    stack = list(arguments)
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is TENSOR[0] or kind is int or kind is float or kind is bool or value is None:
            continue  # the commonest first, and the containers: no id(), an audited call
        if kind is tuple or kind is list:
            stack.extend(value)
        elif kind is dict:
            stack.extend(dict.values(value))
        elif kind is slice:
            stack.extend((value.start, value.stop, value.step))
        elif id(kind) in passable:
            continue
        elif kind is numpy.ndarray:
            if value.dtype.hasobject:
                return f"an array of Python objects passed to {name}"
        elif kind is types.FunctionType and id(FUNCTION_GLOBALS(value)) in torch_globals:
            continue
        else:
            return f"an object of the file's own passed to {name}, which may run its code"
    return ""


def _foreign_finder(torch):
    """foreign(*groups): whether a tensor among the values of `groups`, or in a list or tuple among them (a foreach
    op's, an `out=`), holds memory torch did not allocate (FOREIGN_MEMORY). Read through torch's C types: nothing of
    the file's own runs here, and most calls cost one pass over their arguments' types."""
    tensor, storage_of, resizable = torch.Tensor, torch._C.TensorBase.untyped_storage, torch._C.StorageBase.resizable

    def lent(t) -> bool:
        try:
            return not resizable(storage_of(t))
        except BaseException:  # a sparse or nested tensor: no storage of its own
            return False

    def foreign(*groups) -> bool:
        for values in groups:
            for value in values:
                kind = type(value)
                if kind is tuple or kind is list:
                    for t in value:
                        if issubclass(type(t), tensor) and lent(t):
                            return True
                elif issubclass(kind, tensor) and lent(value):
                    return True
        return False

    return foreign


def _number_reader(torch):
    """reads(name, args, kwargs): whether torch reads a tensor's value as a number in this call (READ_AS_NUMBER): a
    tensor of one integer or bool inside a list, tuple or slice argument, or given to a function that takes numbers
    (TAKES_NUMBERS) besides its first operand; a selection by a mask, and what is as long as a count of its data
    (DATA_SHAPED). Read through torch's C type: nothing of the file's own runs here.
    Most calls have no container and take no number: those cost one pass over their arguments' types."""
    numel, is_float, is_complex = (torch._C.TensorBase.numel, torch._C.TensorBase.is_floating_point,
                                   torch._C.TensorBase.is_complex)
    tensor = torch.Tensor

    def number(value) -> bool:
        return issubclass(type(value), tensor) and numel(value) == 1 and not is_float(value) and not is_complex(value)

    def scalar(value) -> bool:  # any tensor of one number, a float too: a factory's bound (arange's end)
        return issubclass(type(value), tensor) and numel(value) == 1

    def numbers(value) -> bool:  # an integer tensor of any size: a list of numbers (tensor_split's cut points)
        return issubclass(type(value), tensor) and numel(value) >= 1 and not is_float(value) and not is_complex(value)

    def inside(value, name: str, depth: int) -> bool:
        if type(value) is slice:
            return number(value.start) or number(value.stop) or number(value.step)
        for item in value:
            kind = type(item)
            if kind is tuple or kind is list or kind is slice:
                if depth < 4 and inside(item, name, depth + 1):
                    return True
            elif name not in TENSOR_LISTS and number(item):
                return True
        return False

    dtype_of, masks, dims = torch._C.TensorBase.dtype.__get__, (torch.bool, torch.uint8), torch._C.TensorBase.dim

    def mask(value) -> bool:
        return issubclass(type(value), tensor) and any(dtype_of(value) is m for m in masks)

    by_name = {}  # a name's (always read, sized by a number it is given), found once: names are torch's, and few

    def reads(name: str, args, kwargs) -> bool:
        if type(args) is not tuple:
            return False
        name = str.split(name, ".")[0]  # an overload reached through torch.ops ("narrow.default") is its op
        known = by_name.get(name)
        if known is None:
            known = by_name[name] = (
                name in DATA_SHAPED or name in SPARSE_PARTS or any(part in name for part in STRUCTURED),
                any(part in name for part in SIZED))
        if known[0]:
            return True
        if name in ("__getitem__", "index") and len(args) > 1:  # a mask's selection: as long as its True entries;
            index = args[1]  # an integer of no dims, a view at that offset
            items = index if type(index) is tuple or type(index) is list else (index,)
            if any(mask(i) or (number(i) and dims(i) == 0) for i in items):
                return True
        given = dict.values(kwargs) if type(kwargs) is dict and kwargs else ()
        if known[1] and any(numbers(v) for v in (*args, *given)):
            return True
        if name == "where" and len(args) == 1 and not given:  # torch.where(condition): nonzero's indices
            return True
        if name == "repeat_interleave" and len(args) == 1 and not given:  # (repeats): as long as their sum
            return True
        if name in TAKES_NUMBERS:
            read = number if name in INDEXES else scalar if name in FACTORIES else numbers
            for value in (*(args if name in FACTORIES else args[1:]), *given):
                if read(value):
                    return True
        for value in (*args, *given):
            kind = type(value)
            if (kind is tuple or kind is list or kind is slice) and inside(value, name, 0):
                return True
        return False

    return reads


class Shapes:
    """The shapes of the tensors a call's torch functions create or are given, for checks of what a step materialises
    (tiles, say, where the whole matrix must never exist). A view counts as itself (a transpose or reshape
    holds as many elements as the memory it views, einsum's answer among them; a slice fewer), but a view
    larger than that memory (an expand of a small tensor) counts as the tensor it views: no more is held.
    The shapes of what makes scores or their probabilities returned (SCORES: products, exponentials) are kept
    apart as well. Plain data, bounded: each distinct shape once, in the order first seen, at most MAX_SHAPES
    of them; `more` counts the distinct shapes left out:
    {"created": [[2, 2, 16, 24], [2, 2, 16], ...], "more": 0, "scores": [[2, 2, 16, 24]], "blocks": [[64, 16], ...]},
    "blocks" the shapes of the blocks a kernel run by Triton's interpreter made (its tiles: kernels.py), "loaded"
    the most elements one of its loads read from one tensor (distinct addresses: what a block of any shape took in),
    and "blocks_alive" the most bytes its blocks held at once (each handle watched through a weak reference from when it
    is made until it is freed: tiles of the same shape kept in a list, the fifty-fourth review's F2, add up).

    The storages those tensors live in are counted once each, by address: "held", the bytes of them all. Each is
    watched through a weak reference as well (torch's own, to the storage itself, which every tensor, view and
    storage object of it keeps alive), so "alive" is the most bytes they held at once, after any call (the call's
    own arguments aside), and
    "largest" the MAX_SIZES largest sizes among those then alive, with how many of each ([[bytes, count], ...]):
    what a call keeps alive together, however it comes in pieces.

    It also keeps the calls themselves, in order, as one digest of each one's name and what it answered (a tensor's
    layout, a number, a bool, a size): "sequence", of "calls" calls. Called again on inputs of the same shapes and
    other values, code that reads no value into Python makes the same calls; code that does shows a size, a number
    or a bool, or takes a branch, that it did not before (grader/engine/runner.py compares them).
    """

    def __init__(self):
        self.seen = {}
        self.scores = {}
        self.blocks = {}  # the shapes of the blocks an interpreted Triton kernel made (what its tiles hold)
        self.loaded = 0  # the most elements of one tensor one of its loads read
        self.held_blocks = {}  # the weak reference to each interpreted block alive, by its id: its bytes
        self.blocks_live = 0  # the bytes of those alive now
        self.blocks_alive = 0  # the most of them alive at once
        self.more = 0
        self.storages = {}  # the address of each storage a tensor seen lives in: its bytes
        self.unsorted = 0  # the bytes of those seen past MAX_STORAGES
        self.alive = {}  # the address of each storage seen and not yet freed: (its weak reference, its bytes)
        self.inputs = set()  # the addresses of the storages of the call's arguments: alive throughout, not made
        self.peak = 0  # the most bytes those held at once
        self.largest = []  # then, the largest sizes among them: [[bytes, count], ...]
        self.overflow = 0  # the bytes of the storages seen past MAX_STORAGES, counted alive from then on
        self.grew = False  # a storage watched, or counted larger, since the last sweep: the bytes alive may have grown
        self.sequence = BLAKE2B(digest_size=16)
        self.calls = 0

    def trace(self, torch, name: str, value) -> None:
        """Add the call `name` that answered `value` to the sequence. An address (or a hash, or a version count) is
        where memory happens to be, the same in no two calls: kept as no value."""
        if str.split(name, ".")[0] in UNSTEADY:
            value = None
        self.sequence.update(MARSHAL((name, _answered(torch, value, 0)), 2))
        self.calls += 1

    def add(self, torch, value, name: str = "", given: tuple = ()) -> None:
        """Record the tensors of a call `name`'s result `value` and of what it was `given` (a buffer made where
        nothing records it, a legacy constructor's, is seen when it is written in place). Its results count as
        scores too where the call makes them: by its name, or by making twice what the memory of every tensor it was
        given holds or more (an outer product by broadcasting, or an expanded view made whole: `contiguous`)."""
        readers = _tensor_readers(torch)
        tensor, numel = readers[0], readers[2]
        inputs = [_memory(readers, t) for t in given if issubclass(type(t), tensor)]
        widest = max(map(numel, inputs)) if inputs else None
        makes_scores = str.split(name, ".")[0] in SCORES
        for t in _items(value):
            if not issubclass(type(t), tensor):
                continue
            base = _memory(readers, t)
            outgrew = widest is not None and base is t and numel(t) >= 2 * widest  # a pad to whole blocks grows less
            self._keep(_shape(readers, base), makes_scores or outgrew)
            found = _storage(readers, t)  # a view's is its base's: read once for both
            if found is not None:
                held = _held(readers, base, found[2])
                if held is not None:
                    self._keep(held, makes_scores or outgrew)
                self._count(readers, *found)
        for t in inputs:  # watched too: a buffer made where nothing records it, used
            self._keep(_shape(readers, t), False)
            found = _storage(readers, t)
            if found is not None:
                held = _held(readers, t, found[2])
                if held is not None:
                    self._keep(held, False)
                self._watch(readers, *found)
        if self.grew:  # else only frees happened since the last sweep: fewer bytes alive than then, no new peak
            self._sweep(readers)

    def _count(self, readers, storage, address: int, size: int) -> None:
        """The bytes of a storage a result lives in, once per address: what a call's tensors hold together, however
        many pieces or shapes they come in (a score matrix in B·H·2 buffers of one shape, the thirtieth review's
        f04). A storage freed and its address reused counts once: pieces that are never alive together are not."""
        if address in self.storages:
            self.storages[address] = max(self.storages[address], size)
        elif len(self.storages) < MAX_STORAGES:
            self.storages[address] = size
        else:  # past the bound, each counted whole: more than they hold, never less
            self.unsorted += size
        self._watch(readers, storage, address, size)

    def _watch(self, readers, storage, address: int, size: int) -> None:
        """Watch a storage through a weak reference, once, while it lives; past MAX_STORAGES each new one counts
        as alive for the rest of the call (more than it holds, never less: the thirty-seventh review's f01 filled
        the table first)."""
        if address in self.inputs:
            return
        watched = self.alive.get(address)
        if watched is not None:
            if not readers[10](watched[0]):  # the same storage, seen again
                if size > watched[1]:
                    self.alive[address] = (watched[0], size)
                    self.grew = True
                return
            readers[11](watched[0])  # freed, and its address given to another
            del self.alive[address]
        if len(self.alive) < MAX_STORAGES:
            self.alive[address] = (readers[9](storage), size)
        else:
            self.overflow += size
        self.grew = True

    def given(self, torch, values) -> None:
        """The arguments of the call the record is for: their storages are the caller's, not what it holds."""
        readers = _tensor_readers(torch)
        for value in values:
            for t in value if type(value) is tuple or type(value) is list else (value,):
                if issubclass(type(t), readers[0]):
                    try:
                        self.inputs.add(readers[8](readers[6](t)))
                    except BaseException:  # a sparse, nested or meta tensor: no address of its own
                        pass

    def _sweep(self, readers) -> None:
        """Forget the storages freed since the last call; keep the most bytes the rest hold together, and their
        largest sizes then."""
        self.grew = False
        expired, free = readers[10], readers[11]
        for address, (weak, _) in list(self.alive.items()):
            if expired(weak):
                free(weak)
                del self.alive[address]
        live = sum(size for _, size in self.alive.values()) + self.overflow
        if live > self.peak:
            counts = {}
            for _, size in self.alive.values():
                if size:
                    counts[size] = counts.get(size, 0) + 1
            self.peak = live
            self.largest = [[size, counts[size]] for size in sorted(counts, reverse=True)[:MAX_SIZES]]

    def block(self, shape) -> None:
        """A block Triton's interpreter made while the call ran (kernels.py): "blocks", each distinct shape once."""
        key = tuple(int(n) for n in shape)
        if key not in self.blocks:
            if len(self.blocks) >= MAX_SHAPES:
                self.more += 1
            else:
                self.blocks[key] = True

    def hold(self, block, size: int) -> None:
        """A block an interpreted kernel made (its handle, of `size` bytes: kernels.py), counted alive until the
        handle is freed. The handle, not its array: the interpreter gives a handle a new array in place (a reversed
        scan's flip, the fifty-sixth review's F1), and the one it replaced is freed while the block lives on."""
        try:
            weak = WEAK_REFERENCE(block, self._freed)
        except BaseException:  # nothing to watch: not counted
            return
        self.held_blocks[id(weak)] = (weak, size)
        self.blocks_live += size
        if self.blocks_live > self.blocks_alive:
            self.blocks_alive = self.blocks_live

    def _freed(self, weak) -> None:
        found = self.held_blocks.pop(id(weak), None)
        if found is not None:
            self.blocks_live -= found[1]

    def load(self, elements: int) -> None:
        """A load of an interpreted Triton kernel read `elements` distinct elements of one tensor (kernels.py)."""
        self.loaded = max(self.loaded, int(elements))

    def _keep(self, key: tuple, scores: bool) -> None:
        for kept in (self.seen, self.scores) if scores else (self.seen,):
            if key in kept:
                continue
            if len(kept) >= MAX_SHAPES:
                self.more += 1
                continue
            kept[key] = True

    def data(self) -> dict:
        return {"created": [list(s) for s in self.seen], "more": self.more,
                "scores": [list(s) for s in self.scores], "blocks": [list(s) for s in self.blocks],
                "loaded": self.loaded, "blocks_alive": self.blocks_alive, "sequence": self.sequence.hexdigest(),
                "calls": self.calls,
                "held": sum(self.storages.values()) + self.unsorted, "alive": self.peak, "largest": self.largest}

    def release(self, torch) -> None:
        """Give back the weak references of the storages still alive: the request is answered."""
        free = _tensor_readers(torch)[11]
        for weak, _ in self.alive.values():
            free(weak)
        self.alive = {}
        self.held_blocks = {}  # a weak reference dropped calls back no more


_READERS: list = []  # torch's C getters Shapes reads a tensor through, bound once


def _items(value) -> tuple:
    """A call's results: a tuple's items (torch.return_types' named tuples too, read by tuple's own C methods, never
    a subclass's), a list's, or the value itself."""
    kind = type(value)
    if kind is list:
        return tuple(value)
    if issubclass(kind, tuple):
        return tuple(TUPLE_GET(value, i) for i in range(TUPLE_LEN(value)))
    return (value,)


TUPLE_LEN, TUPLE_GET = tuple.__len__, tuple.__getitem__


def _tensor_readers(torch) -> tuple:
    """(Tensor, its base's getter, numel, its shape's getter), read through torch's C type, whose attributes no file
    can replace: bound at the first call, before any candidate's code runs (the zygote warms the record)."""
    if not _READERS:
        base, storage = torch._C.TensorBase, torch._C.StorageBase
        _READERS.append((torch.Tensor, base._base.__get__, base.numel, base.shape.__get__, base.element_size,
                         base.is_complex, base.untyped_storage, storage.nbytes, storage.data_ptr, storage._weak_ref,
                         storage._expired, storage._free_weak_ref))
    return _READERS[0]


def _memory(readers, t):
    """What a tensor holds: an expanded view, its base's. Compared in bytes: a view as large as its base in bytes
    holds as much (view_as_real's floats are twice a complex base's elements, each half as wide)."""
    view_of = readers[1](t)
    numel, width = readers[2], readers[4]
    return view_of if view_of is not None and numel(view_of) * width(view_of) < numel(t) * width(t) else t


def _storage(readers, t) -> tuple | None:
    """(storage, its address, its bytes) of the memory a tensor lives in; None for a sparse or nested tensor, which
    has no storage of its own."""
    try:
        storage = readers[6](t)
        return storage, readers[8](storage), readers[7](storage)
    except BaseException:
        return None


def _held(readers, t, nbytes: int) -> tuple | None:
    """The shape of a tensor's whole storage, one axis of its elements, where that storage holds more than the
    tensor it belongs to (the tensor's base, or itself) has elements: a (2,) tensor made with a stride of n − 1 holds
    n, and a view of any shape on it counts as that tensor (the twenty-eighth review's f01–f04). None where the
    storage holds no more (a slice of an input is its input's, which is counted as itself)."""
    root = readers[1](t)
    root = t if root is None else root
    held = nbytes // readers[4](root)  # `nbytes`: its storage's, which a view shares with its base
    if held <= readers[2](root):
        return None
    # its batch and head axes kept, where the storage divides among them: a slice of an output padded to whole blocks
    # (o[..., :Tq, :] of (B, H, 48, Dv)) holds its padding per batch and head, not all of it in each
    shape = tuple(map(int, readers[3](root)))
    lead = math.prod(shape[:-2]) if len(shape) > 2 else 1
    size = (*shape[:-2], held // lead) if lead > 1 and held % lead == 0 else (held,)
    return (*size, 2) if readers[5](root) else size


def _shape(readers, t) -> tuple:
    """A tensor's shape as the numbers it holds: a complex tensor's with a last axis of 2, as view_as_real has it
    (a strip of scores in complex memory holds twice its elements)."""
    shape = tuple(map(int, readers[3](t)))
    return (*shape, 2) if readers[5](t) else shape


BLAKE2B = hashlib.blake2b
WEAK_REFERENCE = weakref.ref  # bound in the zygote, before any candidate's code
# plain data as bytes, in C: version 2 writes no back-references, so equal values give equal bytes whichever objects
# hold them; it refuses anything but exact builtin types, which is all `_answered` gives
MARSHAL = marshal.dumps
UNSTEADY = frozenset({"data_ptr", "__hash__", "_cdata", "_version"})
NUMBERS = (type(None), bool, int, float, complex, str)
DTYPE_NAMES: dict = {}  # torch's dtypes (C singletons) by name, read once in the zygote (make_recorder)


def _answered(torch, value, depth: int):
    """What a call answered, as plain data, read without running code of the file's own: a tensor's layout (through
    torch's C type, as Shapes.add reads it), a number, a bool or a string as itself, a tuple or a list (a size) item
    by item, anything else by its type's name."""
    kind = type(value)
    if issubclass(kind, torch.Tensor):
        base = torch._C.TensorBase
        dtype = DTYPE_NAMES.get(base.dtype.__get__(value)) or str(base.dtype.__get__(value))
        try:
            return ("tensor", tuple(base.shape.__get__(value)), tuple(base.stride(value)), base.storage_offset(value),
                    dtype)
        except BaseException:  # a nested or sparse tensor has no strides: its parts answer for it
            return ("tensor", dtype)
    if any(kind is k for k in NUMBERS):
        return value
    if (kind is tuple or kind is list or kind is torch.Size) and depth < 3:
        return (len(value), *(_answered(torch, v, depth + 1) for v in tuple(value)[:256]))
    return str.__str__(TYPE_NAME(kind))  # an exact str: a metaclass can make __name__ a str subclass of the file's


def _scalars_to_meta(torch, args, kwargs):
    values = [*args, *kwargs.values()]
    if not any(type(v) is torch.Tensor and v.is_meta for v in values):
        return args, kwargs

    def moved(v):
        return v.to("meta") if type(v) is torch.Tensor and v.dim() == 0 and v.device.type == "cpu" else v

    return tuple(moved(a) for a in args), {k: moved(v) for k, v in kwargs.items()}
