"""A worker child, once in its sandbox: import the candidate's file, then answer the grader's requests.

The child says hello on its pipe ({"ok": true, "torch": version, "cuda": bool}, or "ok": false with
why the file could not be imported), then answers requests one at a time:

    {"op": "call", "name": "step_function", "args": [...], "kwargs": {...}, "device": "meta"}
    {"op": "module", "name": "SomeModule", "init": [...], "init_kwargs": {...},
     "state": {...}, "args": [...], "kwargs": {...}, "device": "cpu",
     "grad_output": <tensor or None>, "grad_args": [0, 1]}
    {"op": "script", "name": "SomeClass", "device": "cpu", "answered": [...], "actions": [...]}

"script" runs a list of plain-data actions in order, for a stateful class, under torch.no_grad as
inference runs: see scripts.py. "answered" (any op) names the candidate's step functions whose calls
the grader answers while the request runs: see answered.py.

with {"ok": true, "value": ..., "called": [...]} or {"ok": false, "error": {...}}.
"called" names every torch function the candidate's code called (seen through a
TorchFunctionMode, so aliases and getattr do not hide a call: see recorder.py); the grader
decides which were forbidden. A "call" answer also says, as "changed_in_place", which
arguments (by position or keyword) the call changed; a request with "shapes": true gets the
shapes of the tensors its torch calls created, as "shapes". Nothing here decides a score:
everything in a child is untrusted.

Loaded by path by worker.py (never as part of the grader package), as are the siblings it uses.
"""

import gc
import importlib.util
import os
import sys
import types

import _attn_grade_sandbox_answered as answered  # this folder's modules, loaded by path by worker.py
import _attn_grade_sandbox_recorder as recorder
import _attn_grade_sandbox_scripts as scripts

BLOCKED_PACKAGES = ("grader", "solutions")
MAX_MESSAGE = 500
MAX_FRAMES = 1000  # a traceback's entries read for the candidate's line
TRACEBACK_OF = BaseException.__dict__["__traceback__"].__get__  # not the exception's own (a property of the file's)
RECORDER_FILE = recorder.__file__  # the record's code: where a torch call it made raised, innermost
# warm.py's stand-ins for what torch's meta kernels import (symbolic sizes): theirs is torch's refusal (review 72's F2)
WARM_FILE = os.path.join(os.path.dirname(RECORDER_FILE), "warm.py")
# torch's own code, its folder, and torch.autocast's, which raises for the meta device outside any torch call the
# record sees: set as a child starts, before the candidate's file is imported
TORCH_FOLDER, AUTOCAST_FILE = ["\0"], ["\0"]


def serve(wire, torch, candidate_path, read_fd, write_fd, cuda: bool, stand_ins, guarded, key) -> None:
    """Import the candidate's file, say hello, and answer requests until the grader closes the pipe.

    `stand_ins` is the module of the grader's stand-in classes for this exercise (or None): a script builds one
    in place of a candidate's class that lost points. `guarded` holds the guard's `arm` and `lifted` (guard.py):
    armed before the candidate's file is imported, lifted only for the worker's own reading of a traceback; and
    the record of torch calls the zygote made (recorder.py). `key` signs every frame this child writes, so the
    grader can tell them from one the candidate's code writes to the pipe. All stay in this frame's locals, out
    of the candidate's reach.
    """
    sys.meta_path.insert(0, _BlockGrader())
    TORCH_FOLDER[0] = os.path.dirname(torch.__file__) + os.sep
    AUTOCAST_FILE[0] = os.path.join(TORCH_FOLDER[0], "amp", "autocast_mode.py")
    arm, lifted, record = guarded
    record = record.forked(fresh=cuda)
    # No automatic collection while the candidate's code runs: one could start inside a torch call, where the record
    # is stashed, and run the __del__ of its objects there. The worker collects between requests instead, and the
    # guard refuses gc.enable.
    collect = gc.collect
    gc.disable()
    arm(record)
    hello = {"ok": True, "torch": torch.__version__, "cuda": cuda}
    module, error = _import_candidate(candidate_path, lifted)
    if error:
        hello = dict(hello, ok=False, error=error)
    wire.write_frame(write_fd, hello, [], key=key)
    if error:
        return
    while True:
        try:
            request, blobs = wire.read_frame(read_fd)
        except wire.Closed:
            return
        blobs_out: list[bytes] = []
        record.shapes = recorder.Shapes() if request.get("shapes") is True else None
        record.replaced = []
        record.changed = []
        record.hidden = ""
        record.raised = None
        try:
            value, called = _handle(torch, wire, record, module, stand_ins, request, blobs, blobs_out,
                                    (read_fd, write_fd, key), lifted)
            answer = {"ok": True, "value": value, "called": sorted(called)}
            if record.shapes is not None:
                answer["shapes"] = record.shapes.data()
            if record.changed:
                answer["changed_in_place"] = record.changed
        except BaseException as exc:  # the candidate's exception, even SystemExit, is an answer
            blobs_out = []
            answer = {"ok": False, "error": describe(exc, candidate_path, lifted, record),
                      "called": sorted(record.seen)}
        if record.shapes is not None:
            record.shapes.release(torch)
        if record.hidden:
            answer["hidden"] = record.hidden[:MAX_MESSAGE]
        wire.write_frame(write_fd, answer, blobs_out, key=key)
        try:
            record.replaced = []  # what the request's setters replaced, freed now it is answered
            collect()
        except BaseException:  # a finalizer of the candidate's that raised: nothing of a request's
            pass


def _handle(torch, wire, record, module, stand_ins, request, blobs, blobs_out, fds, lifted):
    device = request.get("device", "cpu")
    args = [to_device(torch, _decode(wire, a, blobs), device, a) for a in request.get("args", [])]
    kwargs = {k: to_device(torch, _decode(wire, v, blobs), device, v) for k, v in request.get("kwargs", {}).items()}
    target = getattr(module, request["name"])
    record.seen = set()
    record.device = device
    oracle = answered.Answered(torch, wire, record, module, request.get("answered", []), fds)

    if request["op"] == "script":
        return (scripts.run(torch, wire, record, module, stand_ins, request, blobs, blobs_out, oracle, lifted),
                record.seen)

    if request["op"] == "call":
        before = _snapshot(wire.bound(), [*enumerate(args), *kwargs.items()])
        if record.shapes is not None:
            record.shapes.given(torch, [*args, *kwargs.values()])
        with record, oracle:
            value = target(*args, **kwargs)
        record.changed = _changed_in_place(wire.bound(), before)
        return wire.encode(value, blobs_out), record.seen

    # op == "module": build it on the CPU, load the grader's weights, move it, run forward (and backward)
    # in eval mode, as inference code runs: dropout is off.
    init_args = wire.decode(request.get("init"), blobs) or []
    init_kwargs = wire.decode(request.get("init_kwargs"), blobs) or {}
    state = wire.decode(request.get("state"), blobs) or {}
    grad_args = request.get("grad_args", [])
    for i in grad_args:
        args[i] = args[i].detach().requires_grad_(True)
    with record:
        instance = target(*init_args, **init_kwargs)
        # every class a layer is, so the grader can ask isinstance (nn.LazyLinear is an nn.Linear)
        children = {name: [wire.type_name_of(t) for t in type(child).__mro__]
                    for name, child in instance.named_children()}
        if not request.get("forward", True):
            return wire.encode({"output": None, "children": children}, blobs_out), record.seen
        unloaded = load_weights(instance, state) if state else []
        instance.to(device)
        instance.eval()
        with oracle:
            output = instance(*args, **kwargs)
            again = instance(*args, **kwargs) if request.get("repeat") else None  # the same input once more
    result = {"output": output, "children": children, "unloaded": unloaded}
    if request.get("repeat"):
        result["again"] = again
    grad_output = request.get("grad_output")
    if grad_output is not None:
        # sum(output * grad) has the same gradients as backward(grad), without the lazy
        # import (sympy, 0.7 s) that backward with an explicit gradient pays.
        with record, oracle:
            (output * wire.decode(grad_output, blobs).to(device)).sum().backward()
            parameters = [(name, p) for name, p in instance.named_parameters()]  # the module's code: recorded
        grad_of = wire.bound().grad_of  # and the gradients read as encode reads (wire.Bound)
        result["arg_grads"] = [grad_of(args[i]) for i in grad_args]
        result["param_grads"] = {name: grad_of(p) for name, p in parameters if type(name) is str}
    return wire.encode(result, blobs_out), record.seen


def _snapshot(bound, named: list) -> list:
    """The bytes of each tensor or array argument (by position or keyword) before the call, to tell which it changed.
    Read, as after the call, through what the wire bound before the file ran (wire.Bound): no method the file put
    in place of torch's runs here, where nothing is recorded."""
    kept = []
    for key, value in named:
        if issubclass(type(value), bound.tensor) and bound.device_of(value).type != "meta":  # no bytes on meta
            kept.append((str(key), value, tuple(bound.shape_of(value)), _bytes_of(bound, value)))
        elif type(value) is bound.ndarray:
            kept.append((str(key), value, value.shape, value.tobytes()))
    return kept


def _changed_in_place(bound, kept: list) -> list[str]:
    """The arguments whose shape or bytes the call changed (masked_fill_, x /= s, a[mask] = v on the caller's data)."""
    changed = []
    for key, value, shape, data in kept:
        if issubclass(type(value), bound.tensor):
            same = tuple(bound.shape_of(value)) == shape and bound.equal(_bytes_of(bound, value), data)
        else:
            same = value.shape == shape and value.tobytes() == data
        if not same:
            changed.append(key)
    return changed


def _bytes_of(bound, tensor):
    # bytes, not values: NaN equals itself here, and -0.0 differs from 0.0
    return bound.clone(bound.view(bound.reshape(bound.contiguous(bound.detach(tensor)), -1), bound.uint8))


def load_weights(instance, state) -> list:
    """Load the grader's weights by the contract's names; the module may hold more (a mask buffer).

    Returns the names of its parameters the grader's weights did not fill.
    """
    missing, unexpected = instance.load_state_dict(state, strict=False, assign=True)  # assign keeps the state's dtype
    parameters = [name for name, _ in instance.named_parameters()]
    if unexpected:
        raise LookupError(f"Unexpected key(s) in the grader's weights: {', '.join(unexpected)}; "
                          f"the module's parameters are: {', '.join(parameters) or 'none'}")
    return [name for name in missing if name in parameters]


def _decode(wire, item, blobs):
    """An input as the grader described it; a generator is built in to_device."""
    return None if isinstance(item, dict) and item.get("kind") == "generator" else wire.decode(item, blobs)


def to_device(torch, value, device, description):
    """Move a decoded input tensor to the device under test; 'strided' asks for a non-contiguous copy."""
    if isinstance(description, dict) and description.get("kind") == "generator":
        return torch.Generator(device=device if device != "meta" else "cpu").manual_seed(description["seed"])
    if type(value) is not torch.Tensor:
        return value
    value = value.to(device)
    axes = description.get("strided") if isinstance(description, dict) else None
    if type(axes) is list and len(axes) == 2 and all(type(a) is int and -value.dim() <= a < value.dim() for a in axes):
        value = value.transpose(*axes).contiguous().transpose(*axes)
    return value


def _import_candidate(path, lifted):
    """The candidate module, or a description of why it could not be imported."""
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        message = f"SyntaxError at line {exc.lineno}: {exc.msg}"
        return None, {"type": "SyntaxError", "message": message, "line": exc.lineno}
    except SystemExit:
        return None, {"type": "SystemExit", "message": "candidate exited while importing", "line": None}
    except BaseException as exc:
        return None, describe(exc, path, lifted)
    return module, None


def describe(exc, candidate_path, lifted, record=None):
    """Type, message and the candidate's line for an exception the candidate's code raised; and whether torch raised
    it (`in_torch`): the very exception a torch call of the record's raised, from torch's own code (the innermost
    frame the record's call, torch's, or the stand-ins warm.py puts in torch's place), or torch.autocast's own, with
    the record whole. A meta device's "needs data" is torch's only then, not a message the file wrote."""
    line = None
    tb = TRACEBACK_OF(exc) if issubclass(type(exc), BaseException) else None  # BaseException's own getter
    places = []
    with lifted():  # frames, which the candidate may not read: walked by hand, through C getters only
        # (traceback and linecache are modules the candidate shares, and could have replaced)
        while type(tb) is types.TracebackType and len(places) < MAX_FRAMES:
            places.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
    for filename, lineno in places:
        if type(filename) is str and filename == candidate_path and type(lineno) is int:
            line = lineno
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
    innermost = places[-1][0] if places and len(places) < MAX_FRAMES else None
    whole = record is not None and not record.hidden and type(innermost) is str
    in_torch = whole and (innermost == AUTOCAST_FILE[0] or record.raised is exc and (
        innermost in (RECORDER_FILE, WARM_FILE) or str.startswith(innermost, TORCH_FOLDER[0])))
    return {"type": name, "message": (f"{name}: {text}" if text else name)[:MAX_MESSAGE] + where, "line": line,
            "in_torch": in_torch}


class _BlockGrader:
    """An import hook that refuses the grader and the reference solutions."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED_PACKAGES:
            raise ImportError(f"the candidate may not import '{name}' while being graded")
        return None
