"""The search: a failed check's wrong answer compared with generic wrong answers built from the step's own
reference and contract, so a mistake no exercise listed is still named, in the step's own words.

A step's own mistakes (its spec) are tried first; when none explains the answer, `search` builds the
wrong answers any step can give from its reference, its arguments and their names (the reference's
signature), and names the first that matches:

  outputs_reordered     the parts of a tuple answer in another order ((keys, values, queries))
  arguments_swapped     two arguments of one shape and dtype swapped (k for v, w_k's weights for w_v's)
  argument_duplicated   one argument used in another's place too (a copy-paste: b_key for b_value)
  argument_ignored      an argument that had no effect (its default: RoPE's base, the mask, the window)
  none_read_as_zero     an optional whole number given as None read as 0 (window=None)
  flag_inverted         a flag that acted as its opposite
  off_by_one            a whole-number argument that acted one more or one less
  input_transposed      an input read with its last two axes swapped
  scaled_by_wrong_size  scores scaled by the square root of another size of the inputs than their width (√Tk for √D)
  mask_edge_off_by_one  a bool answer whose edge moved by one along an axis (tril's diagonal, < for <=)
  computed_in_float32   float64 inputs computed in float32 (a .float(), a float32 softmax) and cast back

When none matches, a metamorphic probe (a few times a step) asks the candidate again with one argument at its default:
an answer that does not change at all ignored that argument, whatever else is wrong with it.

A module step's weights (its `state`) are arguments too: layers swapped or duplicated by their names.
The search runs only for a check that failed, tries at most MAX_VARIANTS wrong answers, and stops after
BUDGET_S seconds (and after GRADE_BUDGET_S in one grade), so a failed file grades within its time bound.
"""

from __future__ import annotations

import inspect
import itertools
import math
import time

import numpy as np
import torch

from grader.arrays import as_tensor
from grader.engine.failure import CheckFailed
from grader.engine.spec import Mistake
from grader.engine.tolerance import HALF_TYPES, Tolerance, expect_close

MAX_VARIANTS = 160
BUDGET_S = 1.5  # one search
GRADE_BUDGET_S = 8.0  # every search of one grade together
MAX_MISSES = 3  # searches of one step that found nothing, after which its failures are not searched
MAX_PROBES = 2  # candidate calls one probe may make
MAX_PROBE_ROUNDS = 4  # probes of one step in one grade
SPENT = "_search_seconds"  # where a grade's shared dict keeps what its searches took

OUTPUTS_REORDERED = Mistake(
    "outputs_reordered",
    "the parts of the answer came back in another order than the contract's: return them in the order its "
    "docstring gives",
)
ARGUMENTS_SWAPPED = Mistake(
    "arguments_swapped",
    "two arguments of the same shape were used in each other's places (keys passed as values, w_k for w_v): use each "
    "where the contract puts it",
    why="Copy-paste swaps run without an error whenever the two have the same shape, and give a wrong answer.",
)
ARGUMENT_DUPLICATED = Mistake(
    "argument_duplicated",
    "one argument was used in another's place as well (a copy-paste: k twice, b_key for b_value): use each "
    "argument in its own place",
)
ARGUMENT_IGNORED = Mistake(
    "argument_ignored",
    "an argument had no effect: the answer is the one for its default value (RoPE's base, a mask, a window); use "
    "the value the caller gives",
    why="A hard-coded constant (10000, a window of its own) or an argument not passed on to a helper looks right "
        "as long as the caller passes the default.",
)
NONE_READ_AS_ZERO = Mistake(
    "none_read_as_zero",
    "an optional number given as None was read as 0 (`window or 0`): None means the contract's no-limit case; "
    "test `is None`",
)
ZERO_READ_AS_DEFAULT = Mistake(
    "zero_read_as_default",
    "an argument given as 0 acted as its default (`dim or -1`, `if not offset`): 0 is falsy; use the value as given, "
    "testing `is None` where None is allowed",
    why="Written against the defaults and positive values, `x or default` looks right; 0 is a value too (the first "
        "axis, no offset), and Python's `or` passes it over.",
)
FLAG_INVERTED = Mistake(
    "flag_inverted",
    "a flag acted as its opposite (causal=False read as True, or the reverse): branch on the flag as given",
)
OFF_BY_ONE = Mistake(
    "off_by_one",
    "a whole-number argument acted as one more or one less than given: check < against <=, where ranges start, "
    "and diagonal offsets",
)
INPUT_TRANSPOSED = Mistake(
    "input_transposed",
    "an input was read with its last two axes swapped: follow the axis order the contract gives for it",
)
MASK_EDGE_OFF_BY_ONE = Mistake(
    "mask_edge_off_by_one",
    "the mask's edge is one position off along an axis (a diagonal offset one off, < where <= belongs): compare "
    "positions exactly as the contract says",
)
SCALED_BY_WRONG_SIZE = Mistake(
    "scaled_by_wrong_size",
    "the scores were divided by the square root of another size than the width of q and k (the key length, "
    "say): divide by √D, D = q.shape[-1]",
    why="A size read from the wrong axis (k.shape[-2] for k.shape[-1]) runs without an error, and the softmax comes "
        "out sharper or flatter.",
)
EXPONENT_BASE_WRONG = Mistake(
    "exponent_base_wrong",
    "the softmax's exponent had the wrong base: exp2 of scores not multiplied by log2(e) (or exp of scores that "
    "were): e^s = 2^(s · log2(e))",
    why="FlashAttention's kernels take exp2, the faster instruction, and fold log2(e) into the scale; leaving it out "
        "gives softmax(s · ln 2), a flatter softmax that shapes cannot show.",
)
SCALED_BY_SIZE_NOT_ROOT = Mistake(
    "scaled_by_size_not_root",
    "the scores were divided by D, multiplied by √D or not scaled, where the contract divides by √D: divide "
    "q kᵀ by √D, D = q.shape[-1]",
    why="1/D (a scale applied twice, or head_dim ** -1 for ** -0.5), √D (a scale of D ** -0.5 divided by) and no "
        "scale at all all run without an error; the softmax comes out flatter or sharper.",
)
DEFAULT_MISREAD = Mistake(
    "default_misread",
    "a parameter's default is not the contract's (dim=1 where the stub says dim=-1): keep the defaults of the stub's "
    "signature",
    why="A caller that leaves the argument out gets the contract's default; a default of another value is right only "
        "when the argument is given.",
)
COMPUTED_IN_FLOAT32 = Mistake(
    "computed_in_float32",
    "float64 inputs were computed in float32 inside the step (.float(), dtype=torch.float32, a float32 softmax): "
    "compute in the input's dtype",
    why="Hugging Face's and Meta's attention take the softmax in float32 for half inputs; for float64 inputs that "
        "loses the precision the caller asked for.",
)
GENERIC = (OUTPUTS_REORDERED, ARGUMENTS_SWAPPED, ARGUMENT_DUPLICATED, ARGUMENT_IGNORED, NONE_READ_AS_ZERO,
           ZERO_READ_AS_DEFAULT, FLAG_INVERTED, OFF_BY_ONE, INPUT_TRANSPOSED, MASK_EDGE_OFF_BY_ONE,
           SCALED_BY_WRONG_SIZE, EXPONENT_BASE_WRONG, SCALED_BY_SIZE_NOT_ROOT, DEFAULT_MISREAD, COMPUTED_IN_FLOAT32)

# Pairs whose swap has a name of its own (the gloss after the names).
GLOSSES = {frozenset(p): g for p, g in (
    (("k", "v"), "keys passed as values"), (("key", "value"), "keys passed as values"),
    (("keys", "values"), "keys passed as values"), (("w_k", "w_v"), "keys projected with w_v, values with w_k"),
    (("q", "k"), "queries passed as keys"), (("query", "key"), "queries passed as keys"),
    (("cos", "sin"), "cos passed as sin"),
)}


def said(generic: Mistake, message: str) -> Mistake:
    """The generic mistake, said in the step's own words (the same id, so reports and tests count it as one)."""
    return Mistake(generic.id, message, why=generic.why)


def outputs_reordered(run, value, call):
    """The parts of a tuple answer in another order (their shapes may differ: run before the form's mistakes)."""
    if not (isinstance(value, (tuple, list)) and len(value) > 1):
        return None
    try:
        reference = run.step.reference(*_native_args(run, call), **_native_kwargs(call))
    except Exception:
        return None
    if not (isinstance(reference, tuple) and len(reference) == len(value)) or len(value) > 4:
        return None
    names = run.step.outputs if len(run.step.outputs) == len(value) else tuple(f"part {i}" for i in range(len(value)))
    for order in itertools.permutations(range(len(value))):
        if order == tuple(range(len(value))):
            continue
        wrong = tuple(reference[i] for i in order)
        if _matches(run, value, wrong, call):
            got = ", ".join(names[i] for i in order)
            return said(OUTPUTS_REORDERED, f"the answer's parts came back as ({got}): return ({', '.join(names)}), "
                                           "the contract's order")
    return None


def search(run, value, call, native):
    """The first generic wrong answer, built from the step's reference, that equals `value` (None if none does).

    What a step's searches found is tried first in its next ones (one bug fails many checks alike), and a step
    whose searches found nothing MAX_MISSES times is searched no more in this grade.
    """
    shared = run.ctx.shared
    memory = shared.setdefault(("search", run.step.id), {"found": None, "misses": 0})
    if shared.get(SPENT, 0.0) > GRADE_BUDGET_S or memory["misses"] >= MAX_MISSES:
        return None
    start = time.monotonic()
    try:
        mistake = _search(run, value, call, native, start, memory["found"])
        if mistake is None and memory["misses"] == 0 and memory.setdefault("probes", 0) < MAX_PROBE_ROUNDS:
            memory["probes"] += 1  # a probe asks the candidate again: a few times a step at most
            mistake = _probe(run, value, call)
        if mistake is None:
            memory["misses"] += 1
        else:
            memory["found"] = mistake.message
        return mistake
    finally:
        shared[SPENT] = shared.get(SPENT, 0.0) + time.monotonic() - start


def _search(run, value, call, native, start, first=None):
    try:
        signature = inspect.signature(run.step.reference)
        bound = signature.bind(*_native_args(run, call), **_native_kwargs(call))
    except (TypeError, ValueError):
        return None
    parameters = signature.parameters
    names = list(bound.arguments)
    found = _precision(run, value, call)
    if found:
        return found
    tried = 0
    variants = list(_variants(run.step.reference, bound, parameters, names, run.step.module, native))
    variants.sort(key=lambda variant: variant[0].message != first)  # what the step's last search found, first
    for mistake, change in variants:
        if tried >= MAX_VARIANTS or time.monotonic() - start > BUDGET_S:
            return None
        tried += 1
        arguments = dict(bound.arguments)
        try:
            if callable(change):
                wrong = change(arguments)
            else:
                arguments.update(change)
                wrong = _call(run.step.reference, signature, arguments)
        except Exception:  # a variant that cannot be formed for these inputs explains nothing
            continue
        forms = [f for f in (wrong if isinstance(wrong, list) else [wrong])  # a list: the forms the change takes
                 if f is not None and not _matches(run, native, f, call)]  # no different from the right answer here
        if any(_matches(run, value, f, call) for f in forms):
            return mistake
    return None


def _probe(run, value, call):
    """A metamorphic probe: the candidate's answer again with one argument at its default (at most MAX_PROBES of
    them, each one the reference's answer changes with); an answer that does not change at all ignored it."""
    if run.step.module:
        return None
    try:
        signature = inspect.signature(run.step.reference)
        bound = signature.bind(*_native_args(run, call), **_native_kwargs(call))
    except (TypeError, ValueError):
        return None
    probes = 0
    for index, name in enumerate(bound.arguments):
        default = signature.parameters[name].default
        given = bound.arguments[name]
        if default is inspect.Parameter.empty or _same_value(given, default) or probes >= MAX_PROBES:
            continue
        if name in call.kwargs:
            changed = type(call)(call.args, {**call.kwargs, name: default}, call.names)
        elif index < len(call.args):
            changed = type(call)((*call.args[:index], default, *call.args[index + 1:]), call.kwargs, call.names)
        else:
            continue
        try:
            if _matches(run, run.reference(changed, exact=False), run.reference(call, exact=False), call):
                continue  # the argument changes nothing here
            probes += 1
            again = run.output(run.answer(changed))
        except Exception:  # the candidate's code raised on the probe, or the call cannot be made: no sign
            continue
        if _identical(again, value):
            return said(ARGUMENT_IGNORED, f"the `{name}` argument had no effect: the answer stayed the same with "
                                          f"{name}={default!r}; use the value given")
    return None


def _identical(a, b) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(map(_identical, a, b))
    a, b = (as_tensor(x) if isinstance(x, np.ndarray) else x for x in (a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same_form = a.shape == b.shape and a.dtype == b.dtype and not a.is_meta
        # an answer all NaN or inf (an overflow) says nothing by staying so when an argument changes
        return same_form and bool(a.isfinite().any()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    return False


def _variants(reference, bound, parameters, names, module: bool, native):
    """(mistake said for the step, change) in the order they are tried: a change is a dict of arguments, or a
    function of the arguments that returns the wrong answer."""
    arguments = bound.arguments
    tensors = [n for n in names if _is_tensor(arguments[n])]
    same = [(a, b) for a, b in itertools.combinations(tensors, 2) if _alike(arguments[a], arguments[b])]
    # one argument copied before two swapped: where one side has no effect (a bias on the keys) both match
    for a, b in same:
        for target, source in ((b, a), (a, b)):
            yield (said(ARGUMENT_DUPLICATED, f"`{source}` was used in place of `{target}` too (a copy-paste): use "
                                             f"`{target}` there"), {target: arguments[source]})
    for a, b in same:
        gloss = GLOSSES.get(frozenset((a, b)))
        yield (said(ARGUMENTS_SWAPPED, f"`{a}` and `{b}` were swapped" + (f" ({gloss})" if gloss else "")
                    + ": use each where the contract puts it"), {a: arguments[b], b: arguments[a]})
    for name in names:
        given = arguments[name]
        parameter = parameters[name]
        default = parameter.default
        if default is not inspect.Parameter.empty and not _same_value(given, default):
            if default is None:
                message = f"the `{name}` argument was ignored (the answer is the one without it): use it when given"
            elif type(given) is int and given == 0:
                yield (said(ZERO_READ_AS_DEFAULT, f"`{name}=0` acted as {name}={default!r}, its default: 0 is falsy, "
                                                  f"so `{name} or {default!r}` passes it over; use it as given"),
                       {name: default})
                continue
            else:
                message = (f"the `{name}` argument had no effect (the answer is the one for {name}={default!r}): use "
                           "the value given")
            yield said(ARGUMENT_IGNORED, message), {name: default}
        if given is None and default is None and "int" in str(parameter.annotation):
            yield (said(NONE_READ_AS_ZERO, f"`{name}=None` was read as {name}=0: None is the contract's no-limit "
                                           "case; test `is None`"), {name: 0})
        if isinstance(given, bool):
            yield (said(FLAG_INVERTED, f"`{name}={given}` acted as {name}={not given}: branch on the flag as given"),
                   {name: not given})
        elif isinstance(given, int) and given > 0:
            for delta in (1, -1):
                more = "more" if delta > 0 else "less"
                yield (said(OFF_BY_ONE, f"`{name}` acted one {more} than given (the answer is the one for {name}="
                                        f"{given + delta}): check < against <= and where ranges start"),
                       {name: given + delta})
    yield from _default_variants(parameters, arguments, tensors)
    for name in tensors:
        x = arguments[name]
        if x.dim() >= 2 and x.shape[-1] > 1 and x.shape[-2] > 1:  # square ones too: their transpose runs
            yield (said(INPUT_TRANSPOSED, f"`{name}` was read with its last two axes swapped: follow the axis order "
                                          f"the contract gives, {tuple(x.shape)}"), {name: x.transpose(-2, -1)})
    if not module:
        yield from _scale_variants(arguments, tensors)
    if module and names and isinstance(arguments[names[0]], dict):
        yield from _state_variants(names[0], arguments[names[0]])
    if isinstance(native, torch.Tensor) and native.dtype == torch.bool and native.dim() >= 1:
        yield from _edge_variants(reference, bound.signature, native.dim())


def _default_variants(parameters, arguments: dict, tensors: list):
    """The parameters the call left out, each at another value than the contract's default: a flag's opposite, an
    axis's other indices (as many as the first tensor has)."""
    dims = arguments[tensors[0]].dim() if tensors else 0
    for name, parameter in parameters.items():
        default = parameter.default
        if name in arguments or default is inspect.Parameter.empty or parameter.kind is parameter.VAR_KEYWORD:
            continue
        if isinstance(default, bool):
            others = [not default]
        elif isinstance(default, int) and -dims <= default < dims:
            others = [axis for axis in range(dims) if axis != default % dims]  # as a stub would write it: 1, not -3
        else:
            continue
        for value in others:
            yield (said(DEFAULT_MISREAD, f"`{name}` left out acted as {name}={value!r}: the contract's default is "
                                         f"{name}={default!r}; keep the stub's signature"), {name: value})


def _state_variants(name: str, state: dict):
    """A module's weights: whole layers swapped or duplicated by name, then single tensors."""
    layers = {}
    for key, x in state.items():
        if isinstance(x, torch.Tensor) and "." in key:
            layer, part = key.split(".", 1)
            layers.setdefault(layer, {})[part] = x
    alike = lambda a, b: a.keys() == b.keys() and all(_alike(a[p], b[p]) for p in a)  # noqa: E731
    pairs = [(a, b) for a, b in itertools.combinations(sorted(layers), 2) if alike(layers[a], layers[b])]
    for a, b in pairs:
        for target, source in ((b, a), (a, b)):
            copied = {**state, **{f"{target}.{p}": x for p, x in layers[source].items()}}
            yield (said(ARGUMENT_DUPLICATED, f"`{source}` was used in place of `{target}` too (a copy-paste): use "
                                             f"`{target}` there"), {name: copied})
    for a, b in pairs:
        gloss = GLOSSES.get(frozenset((a, b)))
        swapped = {**state, **{f"{a}.{p}": x for p, x in layers[b].items()},
                   **{f"{b}.{p}": x for p, x in layers[a].items()}}
        yield (said(ARGUMENTS_SWAPPED, f"the layers `{a}` and `{b}` were swapped" + (f" ({gloss})" if gloss else "")
                    + ": use each where the contract puts it"), {name: swapped})
    keys = [k for k, x in state.items() if isinstance(x, torch.Tensor)]
    entries = [(a, b) for a, b in itertools.combinations(keys, 2) if _alike(state[a], state[b])
               and a.split(".", 1)[-1] == b.split(".", 1)[-1]]
    for a, b in entries:
        for target, source in ((b, a), (a, b)):
            yield (said(ARGUMENT_DUPLICATED, f"`{source}` was used in place of `{target}` (a copy-paste): use "
                                             f"`{target}`"), {name: {**state, target: state[source]}})
    for a, b in entries:
        yield (said(ARGUMENTS_SWAPPED, f"`{a}` and `{b}` were swapped: use each where the contract puts it"),
               {name: {**state, a: state[b], b: state[a]}})


def _scale_variants(arguments: dict, tensors: list):
    """Scores q @ kᵀ / √size for each other size of the inputs: the reference with q scaled by √(D / size) (q is the
    first tensor argument whose width another one, k, shares); then the scores times ln 2 or log2(e), the softmax
    taken in the wrong base."""
    if len(tensors) < 2 or arguments[tensors[0]].dim() < 2:
        return
    query = tensors[0]
    width = arguments[query].shape[-1]
    if not any(arguments[n].dim() >= 2 and arguments[n].shape[-1] == width for n in tensors[1:]):
        return
    sizes = {}
    for name in tensors:
        for axis, size in enumerate(arguments[name].shape):
            sizes.setdefault(size, (name, axis - arguments[name].dim()))
    for size, (name, axis) in sizes.items():
        if size in (1, width):
            continue
        yield (said(SCALED_BY_WRONG_SIZE, f"the scores were divided by √{size}, the size of `{name}`'s axis {axis}, "
                                          f"instead of √{width}, the width of `{query}` (its last axis): divide by "
                                          f"√{query}.shape[-1]"),
               {query: arguments[query] * (width / size) ** 0.5})
    if arguments[query].is_floating_point():
        for factor, said_as in ((width**-0.5, f"divided by {width}, not √{width}"),
                                (width**0.5, f"not divided by √{width}"),
                                (width, f"multiplied by √{width}, not divided (a scale D ** -0.5 divided by)")):
            yield (said(SCALED_BY_SIZE_NOT_ROOT, f"the scores were {said_as} (the width of `{query}`): divide q kᵀ "
                                                 f"by √{query}.shape[-1]"), {query: arguments[query] * factor})
        for factor in (math.log(2), math.log2(math.e)):
            yield EXPONENT_BASE_WRONG, {query: arguments[query] * factor}


def _edge_variants(reference, signature, dims: int):
    """The right bool answer with its edge moved by one along the last two axes."""
    axes = (("key", -1), ("query", -2)) if dims >= 2 else (("last", -1),)
    for axis_name, axis in axes:
        for step in (1, -1):
            def shifted(arguments, axis=axis, step=step):
                return _shift(_call(reference, signature, arguments), axis, step)
            more = "one position more" if step > 0 else "one position less"
            yield (said(MASK_EDGE_OFF_BY_ONE, f"the mask's edge along the {axis_name} axis is off by one ({more} "
                                              "allowed or blocked): compare positions as the contract says, < or <=, "
                                              "offsets exactly"), shifted)


def _shift(mask: torch.Tensor, axis: int, step: int) -> list[torch.Tensor]:
    """mask moved by `step` along `axis`, the entry at the edge it left repeated, or False, or True there."""
    n = mask.shape[axis]
    index = torch.arange(n) - step
    moved = mask.index_select(axis % mask.dim(), index.clamp(0, n - 1))
    left = ((index < 0) | (index >= n)).view(-1, *([1] * (-axis - 1)))  # the entries the edge left, along `axis`
    return [moved, moved & ~left, moved | left]


def _precision(run, value, call):
    """A float64 answer within float32's tolerance of the reference but not within float64's: computed in float32."""
    got = _first_tensor(value)
    if not (isinstance(got, torch.Tensor) and got.dtype == torch.float64):
        return None
    inputs = [as_tensor(a) if isinstance(a, np.ndarray) else a for a in (*call.args, *call.kwargs.values())]
    if not any(_is_tensor(a) and a.dtype == torch.float64 for a in inputs):  # float64 asked for
        return None
    try:
        exact = run.reference(call)
        compare = run.step.compare or expect_close
        compare(value, exact, call, Tolerance(4e-4, 4e-5), run.step.outputs)
    except Exception:
        return None
    return said(COMPUTED_IN_FLOAT32, f"float64 inputs were computed in float32 inside `{run.step.id}` (.float(), "
                                     "dtype=torch.float32, a float32 softmax): compute in the input's dtype")


def not_cast_back(value, exact, native):
    """A float32 answer for half inputs that matches the reference: computed in float32 and never cast back."""
    got, want = _first_tensor(value), _first_tensor(native)
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)):
        return False
    if got.dtype != torch.float32 or want.dtype not in HALF_TYPES or got.shape != want.shape:
        return False
    try:
        expect_close(got, _first_tensor(exact), None, Tolerance(1e-3, 1e-4))
    except CheckFailed:
        return False
    return True


def _matches(run, value, wrong, call) -> bool:
    if not _same_dtypes(value, wrong):
        return False
    compare = run.step.compare or expect_close
    try:
        compare(value, wrong, call, Tolerance.loose(value), run.step.outputs)
        return True
    except CheckFailed:
        return False
    except Exception:
        return False


def _call(reference, signature, arguments: dict):
    bound = signature.bind_partial()
    bound.arguments.update(arguments)
    return reference(*bound.args, **bound.kwargs)


def _native_args(run, call) -> tuple:
    return run.reference_args(call)


def _native_kwargs(call) -> dict:
    return {k: as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in call.kwargs.items()}


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and not x.is_meta


def _alike(a, b) -> bool:
    return _is_tensor(a) and _is_tensor(b) and a.shape == b.shape and a.dtype == b.dtype and not torch.equal(a, b)


def _same_value(given, default) -> bool:
    if isinstance(given, torch.Tensor) or isinstance(default, torch.Tensor):
        return given is default
    try:
        return bool(given == default) and type(given) is type(default)
    except Exception:
        return False


def _same_dtypes(value, wrong) -> bool:
    if isinstance(wrong, tuple):
        return isinstance(value, (tuple, list)) and len(value) == len(wrong) and all(map(_same_dtypes, value, wrong))
    got = as_tensor(value) if isinstance(value, np.ndarray) else value
    if isinstance(got, torch.Tensor) and isinstance(wrong, torch.Tensor):
        return got.dtype == wrong.dtype
    return True


def _first_tensor(value):
    while isinstance(value, (tuple, list)) and value:
        value = value[0]
    return as_tensor(value) if isinstance(value, np.ndarray) else value
