"""The worker: the only process that runs candidate code.

The grader starts it as `python -I worker.py READ_FD WRITE_FD WIRE_PY CANDIDATE` in a
new session, an empty working directory and a scrubbed environment (ATTN_GRADE_WARM=device
asks it to warm up the device the checks will use before the candidate is imported). It imports torch,
then the candidate file, says hello, and answers requests one at a time:

    {"op": "call", "name": "softmax", "args": [...], "kwargs": {...}, "device": "meta"}
    {"op": "module", "name": "MultiHeadAttention", "init": [...], "init_kwargs": {...},
     "state": {...}, "args": [...], "kwargs": {...}, "device": "cpu",
     "grad_output": <tensor or None>, "grad_args": [0, 1]}

Each answer is {"ok": true, "value": ..., "called": [...]} or {"ok": false, "error": {...}}.
"called" names every torch function the candidate's code called (seen through a
TorchFunctionMode, so aliases and getattr do not hide a call); the grader decides
which of them were forbidden. Nothing here decides a score: the worker only runs code
and reports what came back, because everything in this process is untrusted.
"""

import importlib.util
import os
import sys
import traceback

BLOCKED_PACKAGES = ("grader", "solutions")
MAX_MESSAGE = 500


def main() -> None:
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    wire = _load_by_path("_attn_grade_wire", sys.argv[3])
    candidate_path = sys.argv[4]

    import torch

    torch.set_num_threads(1)  # the grader needs the other core; the inputs are small
    if os.environ.get("ATTN_GRADE_WARM") == "device":
        _warm_device(torch)
    sys.meta_path.insert(0, _BlockGrader())
    spy = _make_spy(torch)

    hello = {"ok": True, "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    module, error = _import_candidate(candidate_path)
    if error:
        hello = dict(hello, ok=False, error=error)
    wire.write_frame(write_fd, hello, [])
    if error:
        os._exit(0)

    while True:
        try:
            request, blobs = wire.read_frame(read_fd)
        except wire.Closed:
            os._exit(0)
        blobs_out: list[bytes] = []
        try:
            value, called = _handle(torch, wire, spy, module, request, blobs, blobs_out)
            answer = {"ok": True, "value": value, "called": sorted(called)}
        except BaseException as exc:  # the candidate's exception, even SystemExit, is an answer
            blobs_out = []
            answer = {"ok": False, "error": _describe(exc, candidate_path), "called": sorted(spy.seen)}
        wire.write_frame(write_fd, answer, blobs_out)


def _handle(torch, wire, spy, module, request, blobs, blobs_out):
    device = request.get("device", "cpu")
    args = [_to_device(torch, wire.decode(a, blobs), device, a) for a in request.get("args", [])]
    kwargs = {k: _to_device(torch, wire.decode(v, blobs), device, v) for k, v in request.get("kwargs", {}).items()}
    target = getattr(module, request["name"])
    spy.seen = set()

    if request["op"] == "call":
        with spy:
            value = target(*args, **kwargs)
        return wire.encode(value, blobs_out), spy.seen

    # op == "module": build it on the CPU, load the grader's weights, move it, run forward (and backward)
    init_args = wire.decode(request.get("init"), blobs) or []
    init_kwargs = wire.decode(request.get("init_kwargs"), blobs) or {}
    state = wire.decode(request.get("state"), blobs) or {}
    grad_args = request.get("grad_args", [])
    for i in grad_args:
        args[i] = args[i].detach().requires_grad_(True)
    with spy:
        instance = target(*init_args, **init_kwargs)
        children = {name: wire.type_name(child) for name, child in instance.named_children()}
        if state:
            instance.load_state_dict(state, strict=True, assign=True)  # assign keeps the state's dtype
        instance.to(device)
        output = instance(*args, **kwargs)
    result = {"output": output, "children": children}
    grad_output = request.get("grad_output")
    if grad_output is not None:
        # sum(output * grad) has the same gradients as backward(grad), without the lazy
        # import (sympy, 0.7 s) that backward with an explicit gradient pays.
        (output * wire.decode(grad_output, blobs).to(device)).sum().backward()
        result["arg_grads"] = [args[i].grad for i in grad_args]
        result["param_grads"] = {name: p.grad for name, p in instance.named_parameters()}
    return wire.encode(result, blobs_out), spy.seen


def _to_device(torch, value, device, description):
    """Move a decoded input tensor to the device under test; 'strided' asks for a non-contiguous copy."""
    if type(value) is not torch.Tensor:
        return value
    value = value.to(device)
    if isinstance(description, dict) and description.get("strided") and value.dim() >= 2:
        value = value.transpose(-1, -2).contiguous().transpose(-1, -2)
    return value


def _warm_device(torch):
    """Pay for the device's first use now, while the grader is still importing, not in the first check."""
    if torch.cuda.is_available():
        device = "cuda"
    else:
        device = "meta"
        _skip_lazy_dynamo_import(torch)
    x = torch.ones(2, 2, device=device)
    (x @ x.T).exp().amax(-1, keepdim=True).masked_fill(x[:, :1] > 0, 0.0)


def _skip_lazy_dynamo_import(torch):
    """Spare the meta device's first elementwise op an import of torch._dynamo (over a second).

    torch wraps its Python meta kernels in torch._disable_dynamo, which imports
    torch._dynamo on a function's first call only to wrap it so torch.compile will not
    trace it. Nothing is compiled here, so each wrapper gets its function as is.
    """
    import gc

    inner = torch._compile._disable_dynamo(_warm_device).__code__
    slot = inner.co_freevars.index("fn")
    for obj in gc.get_objects():
        if type(obj) is type(_warm_device) and obj.__code__ is inner:
            fn = obj.__closure__[slot].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                fn.__dynamo_disable = fn


def _make_spy(torch):
    from torch.overrides import TorchFunctionMode

    class Spy(TorchFunctionMode):
        """Records the name of every torch function called while it is active."""

        seen: set = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(getattr(func, "__name__", "?")))
            return func(*args, **(kwargs or {}))

    return Spy()


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
    return {"type": name, "message": f"{name}: {text}"[:MAX_MESSAGE] + where, "line": line}


class _BlockGrader:
    """An import hook that refuses the grader and the reference solutions."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED_PACKAGES:
            raise ImportError(f"the candidate may not import '{name}' while being graded")
        return None


def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
