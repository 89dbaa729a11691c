"""The mistakes any exercise can make, and how each is recognised from what came back.

A step's own mistakes (its spec) are tried first; these come after, from every signal a
failed check has: the exception the candidate's code raised (its type, its message and the
candidate's own line), the answer's dtype, its shape, and its device. Each entry is a
Mistake of the catalogue (`attn-grade mistakes` lists them with every exercise's own).
"""

from __future__ import annotations

import numpy as np
import torch

from grader.engine import locate
from grader.engine.search import GENERIC
from grader.engine.spec import Mistake, Raises
from grader.errors import meta_error
from grader.wire import device_of

ON_A_GPU_TOO = ("The grader ran this step on a stand-in for a GPU (torch's meta device); on a GPU the same code fails "
                "the same way.")

# Exceptions, recognised by type, message and the candidate's own line.
TRANSPOSE_ALL_AXES = Mistake(
    "transpose_all_axes",
    "`.T` reverses every axis of a batched tensor or array, not just the last two: swap only the last two "
    "(torch: k.transpose(-2, -1) or k.mT; NumPy: np.swapaxes(k, -1, -2))",
    # not a view's sizes that do not multiply out: `.T` of a weight (2-D, right) often shares that line
    raises=Raises(message=r"^(?!.*is invalid for input of size).*(size|shape|mismatch|dimension|aligned|mat1|mat2)",
                  line=r"\.T\b"),
)
WEIGHT_AS_STORED = Mistake(
    "weight_as_stored",
    "a weight kept as nn.Linear keeps it, (out, in), was multiplied as it is stored: x @ w needs w as (in, out); "
    "use x @ w.T",
    # mat1's columns are mat2's too: mat2 taken transposed would fit (CPU and CUDA's wording, then the meta device's)
    raises=Raises(message=r"mat1 and mat2 shapes cannot be multiplied \(\d+x(\d+) and \d+x\1\)|"
                          r"must have same reduction dim, but got \[\d+, (\d+)\] X \[\d+, \2\]"),
    why="Written where the weight is square (a model width in and out), the product runs and is wrong; where the "
        "widths differ, it raises.",
)
RESHAPE_SIZES = Mistake(
    "reshape_sizes_wrong",
    "a view or reshape asked for sizes that do not multiply to the tensor's: a width or head count came from "
    "another tensor: take each from the one reshaped",
    raises=Raises(message=r"is invalid for input of size", line=r"\.(view|reshape|unflatten)\("),
    why="The keys' head width used for the values' (or the model width for the heads') fits only while they are "
        "equal; every width here differs, so it raises.",
)
VIEW_NON_CONTIGUOUS = Mistake(
    "view_non_contiguous",
    "view() on a non-contiguous tensor (after a transpose or permute, or an input that is not contiguous): "
    "use reshape(), or .contiguous().view()",
    raises=Raises(message=r"view size is not compatible|view\(\) on a non-contiguous|Use \.reshape"),
)
FILL_OVERFLOWS_HALF = Mistake(
    "fill_overflows_half",
    "a fill value such as -1e9 does not fit in float16 (its range ends at ±65504): fill with float('-inf') "
    "or torch.finfo(scores.dtype).min",
    raises=Raises(message=r"cannot be converted to type .*(Half|BFloat16).* without overflow"),
)
NONE_UNHANDLED = Mistake(
    "none_unhandled",
    "an optional argument given as None (mask=None, bias=None) is not handled: use it only when it is given "
    "(if mask is not None: ...)",
    raises=Raises(types=("TypeError", "AttributeError"), message=r"NoneType"),
)
FLOAT_SHAPE = Mistake(
    "float_shape",
    "a size computed with / is a float (12 / 3 is 4.0): shapes and head widths need whole numbers, use // "
    "(D // num_heads)",
    raises=Raises(message=r"'float' object cannot be interpreted as an integer|"
                          r"must be tuple of ints, ?but (found element of type float|got float)|"
                          r"received an invalid combination of arguments - got \(.*float"),
)
TENSOR_TRUTHINESS = Mistake(
    "tensor_truthiness",
    "a tensor was asked for one truth value (`key or query`, `if mask:`): compare with None instead "
    "(key if key is not None else query)",
    raises=Raises(message=r"Boolean value of Tensor with more than one|truth value of an array with more than one"),
)
DTYPE_MISMATCH = Mistake(
    "dtype_mismatch",
    "tensors of two dtypes met in one operation: a tensor was cast (.float()) or made without dtype=; keep the "
    "input's dtype (dtype=x.dtype, or cast back with .to(x.dtype))",
    raises=Raises(message=r"same dtype|expected (scalar type|m1 and m2)|dtype .* but got|found dtype"),
)
# The axis is found by a lookahead: two runs of [^)]* around it backtracked over every split of a long line with no
# ")", in cubic time (review 73's F1: 6 s a diagnosis over 7,800 characters of ".sum(1111").
KEEPDIM_LOST = Mistake(
    "keepdim_lost",
    "a reduction lost its axis (sum/max/amax without keepdim=True), so it broadcast against the wrong axis: "
    "pass keepdim=True",
    raises=Raises(message=r"must match the size|could not be broadcast|operands could not|Attempting to broadcast",
                  uses=r"\.(sum|max|amax|logsumexp|mean)\((?![^)]*keepdim)(?=[^)]*(dim|axis|\d))[^)]*\)"),
)
FIXED_RANK = Mistake(
    "fixed_rank",
    "the step works for one number of axes only (B, T, D = x.shape, torch.bmm, .t(), an einsum without ...): use "
    "x.shape[-1], @, '...' in einsum, transpose(-2, -1)",
    # torch.mm and addmm ("mat1 must be a matrix"; the meta device: "a must be 2D"), .t() and mv on a batch too
    raises=Raises(message=r"values to unpack|must be a 3D tensor|batch\d must be a 3D|subscripts|einstein sum|"
                          r"does not match the number of dimensions|Dimension out of range|axis \d+ is out of bounds|"
                          r"must be a matrix|\ba must be 2D|expects a tensor with <= 2 dimensions|"
                          r"matrix @ vector expected|too many indices for (tensor|array)"),
    why="The contract allows any number of leading dims: torch.mm, addmm, bmm and .t() take a fixed number of axes, "
        "@ (torch.matmul) batches over any.",
)
TENSOR_ON_CPU = Mistake(
    "tensor_on_cpu",
    "a tensor was created on the CPU inside the step (torch.tensor, torch.ones, torch.arange without device=): create "
    "it on the input's device (device=x.device), or use a Python float (math.sqrt(d))",
    # CUDA's own wordings, as torch 2.11 on an H100 gave them: "Expected all tensors to be on the same
    # device", "masked_fill_: Expected inputs to be on same device", "Expected a 'cpu' device type for
    # generator" (torch.rand(..., generator=) on the CPU); and the meta device's.
    raises=Raises(message=r"is not on the expected device|to be on (the )?same device|"
                          r"must (all )?be on the same device|found at least two devices|"
                          r"device type (cpu|cuda) .* does not match|Expected a '\w+' device type for generator"),
    why=f"torch.FloatTensor([...]) makes a CPU tensor too. {ON_A_GPU_TOO}",
)
EXPAND_NON_SINGLETON = Mistake(
    "expand_non_singleton",
    "expand() can only repeat an axis of size 1, so it fails for more than one head: use repeat_interleave, or "
    "x[:, :, None].expand(...) then reshape",
    raises=Raises(message=r"expanded size of the tensor .* must match the existing size", line=r"expand\("),
    why="Written against one KV head (multi-query attention), expand on the head axis works; with two it raises.",
)
OPEN_SLICE_WRITE = Mistake(
    "open_slice_write",
    "new tokens were written into buffer[..., start:] with no end, a slice to the buffer's end: write "
    "buffer[..., start:start + n]",
    raises=Raises(message=r"expanded size of the tensor .* must match the existing size|must match the size",
                  # an axis sliced from a start to no end, [..., start:] or [:, start:, :], not a whole one ([..., :])
                  line=r"\[[^\n=]*[^\s,\[:]\s*:\s*(\]|,[^\n=]*\])\s*=(?!=)"),
    why="Written against one-token appends to a nearly full buffer, or a buffer sized to the sequence, it runs; a "
        "chunk with room to spare after it raises.",
)
EXPAND_AS_ANOTHER_SHAPE = Mistake(
    "expand_as_another_shape",
    "expand_as() copies the other tensor's whole shape, its last axis too, so it fails where the widths differ: "
    "expand only the axes of size 1, x.expand(-1, H, -1, -1)",
    raises=Raises(message=r"expanded size of the tensor .* must match the existing size", line=r"expand_as\("),
    why="Written against a test where both widths happen to be equal, expand_as runs; with two widths it raises.",
)
EMPTY_SLICE = Mistake(
    "empty_slice",
    "a slice came out empty: a start below 0 counts from the end, and one past the end selects nothing; keep its "
    "bounds within the axis (max(0, start))",
    raises=Raises(message=r"size of tensor [ab] \(\d+\) must match the size of tensor [ab] \(0\)|"
                          r"size of tensor [ab] \(0\) must match the size of tensor [ab] \(\d+\)"),
    why="It then meets a tensor of the size it should have had. Written against sizes where the start never goes "
        "below 0 (as many queries as keys), the slice is whole; with fewer queries than keys, the first blocks' starts "
        "are negative.",
)
CAT_WRONG_AXIS = Mistake(
    "cat_wrong_axis",
    "torch.cat joined pieces along one axis while they differ in another: join them along the axis they were cut "
    "from (the tokens' axis, for sequences packed one after another)",
    raises=Raises(message=r"Sizes of tensors must match except in dimension", line=r"\bcat\("),
    why="Written against pieces of one size (sequences of one length), any axis joins them; pieces of two sizes "
        "raise.",
)
MASK_KEPT = Mistake(
    "mask_kept_between_calls",
    "a mask kept on the module from an earlier call met other lengths: build it from this call's own (T new tokens "
    "after past_len cached) at every call",
    raises=Raises(message=r"must match the size of tensor", uses=r"\bself\.\w*mask"),
    why="Rebuilt only when T changes, a decode's mask is the previous token's: one key short (blind set 58's b14).",
)
SLICE_LENGTH_WRONG = Mistake(
    "slice_length_wrong",
    "the slice written into holds another number of positions than what is written there: make end - start the new "
    "tokens' count, x.shape[1] (len(x) counts the batch)",
    raises=Raises(message=r"expanded size of the tensor \(\d+\) must match the existing size", sliced=True),
    why="The buffer is right and so is what is written; the window between them moved by another count (blind set "
        "58's b13 advanced its length by len(c_kv_new), the batch, which runs wherever the batch and T are equal).",
)
BUFFER_OTHER_SHAPE = Mistake(
    "buffer_other_shape",
    "a preallocated buffer has another shape than what is written into it: allocate each buffer with the shape of "
    "what it stores (its own width, not a neighbouring buffer's)",
    raises=Raises(message=r"expanded size of the tensor .* must match the existing size",
                  # no colon before the slice's own: two open runs around one would backtrack in cubic time
                  line=r"\[[^\]\n:]*:\s*[^\]\s][^\]\n]*\]\s*=(?!=)"),
    why="Written where two widths happen to be equal, the copy runs; with two widths it raises.",
)
RAGGED_TO_TENSOR = Mistake(
    "ragged_to_tensor",
    "torch.tensor() was given lists of different lengths, which makes no tensor: pad each to the longest first "
    "(with -1, or 0 and a length beside it)",
    raises=Raises(message=r"expected sequence of length \d+ at dim \d+ \(got \d+\)"),
    why="Written against rows of one length (sequences that all hold as many blocks), it runs; rows of two raise.",
)
LAYER_NAMES = Mistake(
    "layer_names",
    "the module's layers are not named or shaped as the contract says, so the grader's weights cannot be loaded "
    "into them: use exactly the nn.Linear attributes the docstring names",
    raises=Raises(message=r"Unexpected key|Missing key|size mismatch for|state_dict"),
)
ASSERT_NOT_VALUEERROR = Mistake(  # named by the width check itself: an assert elsewhere may be about anything
    "assert_not_valueerror",
    "an invalid argument raised AssertionError: `assert` is stripped by python -O; raise ValueError with a message",
)
DOT_ON_BATCHED = Mistake(
    "dot_on_batched",
    "np.dot (or np.tensordot) on batched arrays pairs every batch of one with every batch of the other (or fails "
    "to align them): use np.matmul (the @ operator), which batches",
    raises=Raises(message=r"not aligned|shapes .* not aligned", line=r"\bdot\("),
)

# Answers of the wrong dtype, shape or device.
DTYPE_PROMOTED = Mistake(
    "dtype_promoted",
    "the result was promoted to a wider dtype (float32 to float64, or a half type to float32): use Python floats, "
    "or dtype=x.dtype",
    why="A float64 constant, tensor or NumPy scalar (np.sqrt(d), np.zeros(shape), torch.tensor(d)) entered the "
        "computation and promoted it.",
)
NOT_CAST_BACK = Mistake(  # dtype_promoted, said where it is known: right values, in float32 for half inputs
    "dtype_promoted",
    "computed in float32 for half inputs and never cast back: return the result in the input's dtype "
    "(.to(x.dtype) at the end)",
    why="Computing in float32 is right for half inputs; the caller still gets its own dtype back.",
)
DTYPE_NARROWED = Mistake(
    "dtype_narrowed",
    "the result came back in a narrower dtype (float64 computed as float32): a tensor made without dtype= "
    "(torch.zeros(...), torch.full(...), torch.tensor(...)) defaults to float32; use dtype=x.dtype or zeros_like",
)
AXES_SWAPPED = Mistake(
    "axes_swapped",
    "the result's axes are in another order than the contract's: same sizes, wrong places; check every "
    "transpose and permute against the shapes in the docstring",
)
AXIS_MISSING = Mistake(
    "axis_missing",
    "the result has one axis too few: a sum, squeeze or indexing dropped an axis the contract keeps",
)
AXIS_EXTRA = Mistake(
    "axis_extra",
    "the result has one axis too many: an unsqueeze or a broadcast added an axis the contract does not have",
)
WRONG_AXIS_SIZE = Mistake(
    "wrong_axis_size",
    "an axis of the result has another size than the contract's (for example Tk where Tq belongs): the "
    "reduction or product ran over the wrong axis",
)
MASK_NOT_BOOL = Mistake(
    "mask_not_bool",
    "returned a float (or integer) mask where a bool mask belongs: build it from comparisons (positions < lengths, "
    "&, tril of a bool tensor) or end with .bool()",
    why="masked_fill and ~ need a bool mask.",
)
RESULT_ON_CPU = Mistake(
    "result_on_cpu",
    "the result came back on the CPU, not on the device asked for or the inputs': create every tensor with device= "
    "(torch.ones(t_q, t_k, device=device)), or use a Python float",
    why=f"A tensor created without device= ended up in the result. {ON_A_GPU_TOO}",
)

# What a module's own checks see.
PARAMETERS_NOT_LOADED = Mistake(
    "parameters_not_loaded",
    "the module has parameters the contract does not name, which kept their random start (a bias although "
    "bias=False, or a layer of its own): honour the constructor's arguments, nn.Linear(..., bias=bias)",
)
CONSTRUCTOR_DEFAULTS = Mistake(
    "constructor_defaults",
    "built with only its required arguments, the module is not the contract's (a default such as bias differs): "
    "give every argument the default the docstring states",
    why="The grader passes every argument in its other checks, so a wrong default shows only here; callers who "
        "rely on the default get another model.",
)
STATE_BETWEEN_CALLS = Mistake(
    "state_between_calls",
    "a second call with the same input on the same module gave another answer: it kept state (a cache on self); "
    "calls without a cache must be independent",
    why="Keys and values kept on the module from call to call belong in a cache the caller passes and owns.",
)
KEPT_FROM_EARLIER_CALL = Mistake(
    "kept_from_earlier_call",
    "kept something from an earlier call (wrong after other calls, right as a fresh process's first): compute from "
    "the arguments each time; no cache keyed by data_ptr, id or shape",
    why="A freed tensor's address is handed to the next one: a result cached by data_ptr is another weight's "
        "(blind set 56's b12).",
)
STATE_SHARED = Mistake(
    "state_shared_between_objects",
    "kept state between objects (wrong after earlier ones, right in a fresh process): make each instance's state in "
    "__init__, not in a class attribute, a global or a default argument",
    why="A dict or list made in the class body, or as a default argument, is made once and shared by every instance: "
        "the first object works, the next sees its tables (blind set 58's b17).",
)
GRADIENT_CUT = Mistake(
    "gradient_cut",
    "no gradient reached a weight or an input: .data, .detach(), torch.no_grad() or a new tensor built from "
    "values (torch.tensor(x)) cut it off the graph; compute with the tensors themselves",
)
FORBIDDEN_CALL = Mistake(
    "forbidden_call",
    "the step called a function its contract forbids (torch.softmax in softmax, F.linear in project, "
    "F.scaled_dot_product_attention in a module): the step earns nothing; write it with basic tensor ops",
)

# A module that gives two answers to the same input in eval mode.
DROPOUT_AT_EVAL = Mistake(
    "dropout_at_eval",
    "the module gave different outputs for the same input in eval mode: dropout still acts at eval; use "
    "nn.Dropout (off after model.eval()) or F.dropout(x, p, training=self.training)",
)
INPUT_CHANGED = Mistake(
    "input_changed_in_place",
    "the step changed an argument in place (masked_fill_, x /= s, x[mask] = v): compute into a new tensor "
    "(masked_fill, x / s, np.where) or work on a copy",
    why="The caller's tensors and arrays are theirs, and may be read again; np.exp(x, out=x) writes into x too.",
)

ERRORS = (EMPTY_SLICE, OPEN_SLICE_WRITE, VIEW_NON_CONTIGUOUS, FILL_OVERFLOWS_HALF, TENSOR_ON_CPU, NONE_UNHANDLED,
          TENSOR_TRUTHINESS, DTYPE_MISMATCH, FLOAT_SHAPE, TRANSPOSE_ALL_AXES, WEIGHT_AS_STORED, RESHAPE_SIZES,
          DOT_ON_BATCHED, KEEPDIM_LOST, FIXED_RANK, EXPAND_NON_SINGLETON, EXPAND_AS_ANOTHER_SHAPE, CAT_WRONG_AXIS,
          MASK_KEPT, SLICE_LENGTH_WRONG, BUFFER_OTHER_SHAPE, RAGGED_TO_TENSOR, LAYER_NAMES)
FORMS = (MASK_NOT_BOOL, DTYPE_PROMOTED, DTYPE_NARROWED, AXES_SWAPPED, AXIS_MISSING, AXIS_EXTRA, WRONG_AXIS_SIZE,
         RESULT_ON_CPU)
CATALOGUE = (*ERRORS, *FORMS, *GENERIC, *locate.GENERIC, PARAMETERS_NOT_LOADED, CONSTRUCTOR_DEFAULTS,
             STATE_BETWEEN_CALLS, KEPT_FROM_EARLIER_CALL, STATE_SHARED, GRADIENT_CUT, DROPOUT_AT_EVAL,
             FORBIDDEN_CALL, ASSERT_NOT_VALUEERROR, INPUT_CHANGED)


def unloaded(names) -> Mistake:
    """parameters_not_loaded, said with the parameters left unloaded: only biases means a layer built without the
    constructor's bias argument (nn.Linear's default, bias=True)."""
    names = [str(n) for n in names]
    listed = ", ".join(f"`{n}`" for n in names[:4]) + (" and more" if len(names) > 4 else "")
    if names and all(n.endswith(".bias") for n in names):
        layers = ", ".join(n.removesuffix(".bias") for n in names[:4])
        message = (f"{listed} exists although the module was built without a bias: the bias argument was not passed "
                   f"on to {layers}; build it with nn.Linear(..., bias=bias)")
    else:
        message = (f"the module has parameters the contract does not name ({listed}), which kept their random start: "
                   "honour the constructor's arguments and the contract's layers")
    return Mistake(PARAMETERS_NOT_LOADED.id, message, why=PARAMETERS_NOT_LOADED.why)


def meta_unsupported(error) -> bool:
    """The meta device cannot run this code (no kernel, or it needs data): not the candidate's fault. torch's own
    error only, in a call the record saw (the worker's `in_torch`), as torch words it (errors.META_ERRORS): the same
    words raised by the file's own code, or echoed by torch from its arguments, are the file's."""
    return error.kind in ("raised", "not_implemented") and meta_error(error.message, error.in_torch)


def error(error, line: str, source: str):
    """The generic mistake an exception shows, if any."""
    return next((m for m in ERRORS if m.raises.matches(error, line, source)), None)


def form(value, native, backend: str = "torch", device: str = "cpu"):
    """The generic mistake a wrong dtype, shape or device shows, if any (of a tuple: its first part that is off)."""
    value, native = _first_off(value, native)
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor) or not isinstance(native, torch.Tensor):
        return None
    if tuple(value.shape) != tuple(native.shape):
        if backend == "numpy" and value.dim() >= native.dim() + 2:  # np.dot pairs every batch with every other
            return DOT_ON_BATCHED
        return _shape_mistake(tuple(value.shape), tuple(native.shape))
    if native.dtype == torch.bool and value.dtype != torch.bool:
        return MASK_NOT_BOOL
    if value.dtype != native.dtype and value.is_floating_point() and native.is_floating_point():
        return DTYPE_PROMOTED if value.dtype.itemsize > native.dtype.itemsize else DTYPE_NARROWED
    if device not in ("cpu", "none") and device_of(value).split(":")[0] != device.split(":")[0]:
        return RESULT_ON_CPU
    return None


def _shape_mistake(got: tuple, expected: tuple):
    if len(got) == len(expected) - 1:
        return AXIS_MISSING
    if len(got) == len(expected) + 1:
        return AXIS_EXTRA
    if len(got) == len(expected):
        return AXES_SWAPPED if sorted(got) == sorted(expected) else WRONG_AXIS_SIZE
    return None


def _first_off(value, native):
    """The first part of a tuple answer whose shape or dtype is not the reference's (else the first parts)."""
    if isinstance(value, (tuple, list)) and isinstance(native, tuple) and len(value) == len(native):
        for got, want in zip(value, native, strict=True):
            if not (isinstance(got, (torch.Tensor, np.ndarray)) and isinstance(want, torch.Tensor)):
                continue
            dtypes = (str(t.dtype).removeprefix("torch.") for t in (got, want))  # an ndarray's float32 is a tensor's
            if tuple(got.shape) != tuple(want.shape) or len(set(dtypes)) > 1:
                return got, want
    return _first(value), _first(native)


def _first(value):
    while isinstance(value, (tuple, list)) and value:
        value = value[0]
    return value
