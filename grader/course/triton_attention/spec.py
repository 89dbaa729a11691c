"""The checks of `triton_attention`: a fused row softmax, FlashAttention's forward kernel and a decode kernel.

Every check is a property check that calls the candidate's launcher on the device Triton runs on:
CUDA where the grade's device checks run on CUDA (the kernel compiled), else the CPU, where the
worker turns Triton's interpreter on (TRITON_INTERPRET=1, grader/sandbox/worker.py). The engine's
own kinds would call on the CPU, which a compiled kernel cannot read.

Sizes never divide the blocks (rows of 37 in 64 lanes, a head width of 20 in 32, 21 queries in
blocks of 16), so a load or store without its mask shows; inputs are also handed over
non-contiguous (strides: transposed last axes, and `layouts`, some in the layout heads split from a
projection have, (B, T, H, D) transposed, others not, so one tensor's strides taken for another's,
or the batch and head strides folded into one, show), in float16 and bfloat16 (the low-precision rule),
causal with Tq < Tk
and Tq > Tk (rows with no key: out 0, lse -inf), and decode caches hold NaN past each sequence's
length. The work must be a Triton kernel's: the launcher's torch calls may create no tensor the size
of the score matrix (`no_score_matrix`), may call no softmax, matmul or attention (exercise.toml's
forbidden lists), and must launch a `triton.jit` function (`kernel`, through stand_ins.py). On CUDA
only, `speed` times the forward kernel against F.scaled_dot_product_attention.

The references are plain torch (wrong.py), which the model answer equals
(tests/exercises/triton_attention/test_oracle.py); the named mistakes' wrong answers are there too.
"""

import math
from dataclasses import replace

import torch

from grader.engine import (
    ALWAYS,
    Call,
    CandidateError,
    CheckFailed,
    Mistake,
    Probe,
    Raises,
    Script,
    Spec,
    StepSpec,
    TileSizes,
    check_rules,
    prop,
    source_of,
)

from .wrong import (
    all_nan,
    batch_offset_one_stride,
    block_narrower_than_row,
    cache_read_as_contiguous,
    cache_with_other_strides,
    cache_with_query_strides,
    decode_ids_swapped,
    decode_keys_lanes_unmasked,
    decode_keys_unmasked,
    decode_reference,
    decode_variant,
    empty_sequence_nan,
    first_length,
    flash_lanes_unmasked,
    flash_reference,
    flash_variant,
    grid_from_keys,
    grid_rounded_down,
    has_nan,
    head_dims_cut,
    keys_past_end,
    masked_row_not_nan,
    program_ids_swapped,
    softmax_column_stride_ignored,
    softmax_logged,
    softmax_no_max,
    softmax_output_strides,
    softmax_padded,
    softmax_padding_in_max,
    softmax_reference,
    softmax_transposed_memory,
    strides_swapped,
    top_left,
    unmasked_rows,
)

ROWS, COLS = 5, 37  # the softmax's rows: 37 lanes of a 64-lane block
B, H, TQ, TK, D = 1, 3, 21, 37, 20  # 3 batch·heads, 2 query blocks of 16 (not 3: swapped program ids show), D in 32
# The decode cache: three sequences of two heads (B ≠ H: a program id split the other way shows), NaN past each one's
# length; the last fills it, so a kernel that reads past a length still gets that one right (a NaN there is another
# mistake's)
T_MAX, LENGTHS, DECODE_HEADS = 40, (29, 6, 40), 2
# The speed check's size (float16, causal) and tiles (CUDA only): the launcher's defaults of 16 suit the interpreter,
# a GPU wants larger ones. Within SPEED_FACTOR of SDPA's time earns its points (not yet calibrated on a GPU).
SPEED = {"batch": 4, "heads": 16, "t": 2048, "d": 64, "block_m": 64, "block_n": 64}
SPEED_FACTOR = 4.0


def triton_device(run) -> str:
    """Where Triton runs in this grade: CUDA (compiled) when the device checks run there, else the CPU (the
    interpreter)."""
    return "cuda" if run.ctx.device == "cuda" else "cpu"


# Triton's interpreter (3.9) multiplies bfloat16 blocks in tl.dot as their bits, integers: a right kernel's answer is
# garbage there, so bfloat16 through tl.dot is checked compiled only.
INTERPRETER_BFLOAT16 = ("Triton ran in its interpreter (no CUDA), whose tl.dot of bfloat16 blocks is wrong: bfloat16 "
                        "is checked compiled, on a GPU only")


def checked(name: str, points: int, dtype=torch.float32, strided: tuple[int, ...] = (), compiled_only: str = "",
            situation: Mistake | None = None, **params):
    """A values check on Triton's device: the answer to the step's inputs with `params` against the reference.
    `compiled_only`: why the interpreter cannot check it (then it is skipped without CUDA)."""
    def check(run):
        device = triton_device(run)
        call = run.inputs(dtype=dtype, **params)
        answer = run.answer(call, device=device, strided=strided)  # runs, or says why not, even where not compared
        if compiled_only and device != "cuda":
            raise CheckFailed(compiled_only, outcome="skipped")
        run.expect_right(run.output(answer), call, device)

    check.__doc__ = f"{name}: the answer on Triton's device matches the reference ({params or 'the plain inputs'})."
    return prop(name, points, check, situation=situation)


def kept_rules(points: int, **params):
    """The launcher's call used none of the step's forbidden torch functions, and was right."""
    def check(run):
        device = triton_device(run)
        call = run.inputs(**params)
        answer = run.answer(call, device=device)
        check_rules(answer.called, run.ctx.forbidden.get(run.step.id, ()), run.ctx.source,
                    source_of(run.ctx.source, run.step.id), run.ctx.allowed.get(run.step.id))
        try:
            run.expect_right(run.output(answer), call, device)
        except CheckFailed as failure:
            raise CheckFailed(f"the rules were kept, but the answer is wrong: {failure.message}", failure.mistake,
                              failure.details) from None

    return prop("rules", points, check)


def launched_kernel(points: int, mistake: Mistake, **params):
    """The launcher launched a Triton kernel (a triton.jit function, compiled or interpreted, or an autotuner over
    one), and the kernel did the work: the stand-in `Launches` (stand_ins.py) runs it in the worker and lists what
    `kernel[grid]` launched, then runs it again where no Python of the candidate's can read a tensor's memory (a
    storage or data pointer is one of NaN but to Triton's own copies of a launch's arguments); a launcher right the
    first time must be right the second, and not raise (else it computed the answer itself, from its inputs'
    bytes)."""
    def check(run):
        call = run.inputs(**params)
        device = triton_device(run)
        script = Script()
        probe = script.build("Launches", stand_in=True)
        names = ("launcher", *call.names)
        index = script.call(probe, "run", run.step.id, *call.args, kwargs=call.kwargs, names=names)
        unread = script.call(probe, "unread", run.step.id, *call.args, kwargs=call.kwargs, names=names,
                             may_raise=True)
        results = run.script(script, device=device, rules=False).value  # its answer keeps them
        launched = results[index]
        if not isinstance(launched, list) or not launched:
            raise CheckFailed(f"{run.step.id} launched no Triton kernel: its work must be a @triton.jit function's, "
                              "launched over a grid", mistake, {"launched": []})
        try:
            run.expect_right(run.output(run.answer(call, device=device)), call, device)
        except CheckFailed:
            return  # a wrong answer is its checks' to charge, not this one's
        try:
            if isinstance(results[unread], CandidateError):  # it raised only where its Python read NaN
                raise CheckFailed(results[unread].message)
            run.expect_right(results[unread], call, device)
        except CheckFailed:
            raise CheckFailed(f"{run.step.id} was right, and wrong when its own Python could read no tensor's memory "
                              "(a storage or data pointer asked anywhere but in Triton's own copy of a launch's "
                              "arguments: before the launch, in a grid function or hook, or in Python the kernel "
                              "calls): the launcher computed the answer, not the kernel", mistake,
                              {"launched": launched}, breach=True) from None

    return prop("kernel", points, check, gated=ALWAYS)


# -- softmax ----------------------------------------------------------------------------


def softmax_inputs(gen, dtype, rows=ROWS, cols=COLS, scale=1.0, offset=0.0, masked_row=False):
    """x; `offset` moves every entry (far below 0: e^(x - max) is still 1 at the max, e^x is 0), `masked_row` makes
    row 1 all -inf (its softmax is NaN, as torch.softmax gives)."""
    x = (gen.randn(rows, cols, dtype=torch.float64, scale=scale) + offset).to(dtype)
    if masked_row:
        x[1] = -math.inf
    return Call((x,), {}, ("x",))


NOT_POWER_OF_TWO = Raises(message=r"power of 2")
SOFTMAX_NO_KERNEL = Mistake("softmax.no_kernel", "the launcher computed the softmax without launching a Triton "
                            "kernel: do the work in softmax_kernel, launched over a grid of n_rows programs")
# What a check's failure says when the plain case passed and no listed mistake explains it.
STRIDES = "right for contiguous inputs, wrong for transposed views: pass each tensor's own strides and address "
HALF = ("right in float32, wrong in float16 or bfloat16: load, compute in float32 (x.to(tl.float32)) and store in "
        "the output's dtype")
SOFTMAX_STRIDES = Mistake("softmax.strides_mishandled", STRIDES + "(row, col) as row * stride_r + col * stride_c")
SOFTMAX_HALF = Mistake("softmax.half_mishandled", HALF)
SOFTMAX_EDGES = Mistake("softmax.extreme_rows_mishandled", "wrong for rows of -inf only or far below 0: load padding "
                        "as -inf, subtract the real lanes' max, and let 0 / 0 give NaN as torch does")
SOFTMAX_WIDE = Mistake("softmax.wide_rows_mishandled", "wrong for rows of 257 columns: BLOCK is "
                       "triton.next_power_of_2(n_cols), from the columns, and every lane past n_cols is masked")
SOFTMAX_LARGE = Mistake("softmax.large_scores_mishandled", "wrong for scores of a hundred: subtract the row's max "
                        "before tl.exp, over the real lanes only")
SOFTMAX_ROWS = Mistake("softmax.rows_mixed", "right for one row, wrong for several: program i handles row "
                       "tl.program_id(0), at x_ptr + row * stride_xr, and stores at y's row")
SOFTMAX = StepSpec(
    "softmax", softmax_inputs, softmax_reference, probes=(Probe({"rows": 1}, SOFTMAX_ROWS),),
    checks=(
        checked("values", 5), checked("strided", 3, strided=(0,), situation=SOFTMAX_STRIDES),
        checked("float16", 2, torch.float16, situation=SOFTMAX_HALF),
        checked("masked_row", 1, masked_row=True, situation=SOFTMAX_EDGES),
        checked("very_negative", 1, offset=-200.0, situation=SOFTMAX_EDGES),
        checked("bfloat16", 2, torch.bfloat16, situation=SOFTMAX_HALF),
        checked("wide", 3, cols=257, rows=3, situation=SOFTMAX_WIDE),
        checked("large", 4, scale=100.0, situation=SOFTMAX_LARGE),
        launched_kernel(2, SOFTMAX_NO_KERNEL), kept_rules(2),
    ),
    mistakes=(
        Mistake("softmax.unmasked_load", "the row was loaded without a mask, reading past its end into the next "
                "row: load with mask=cols < n_cols and other=-inf", test=unmasked_rows,
                why="BLOCK is the next power of two above n_cols; the lanes past the row's end read the next row, "
                    "or past the tensor's end, whatever lies there."),
        Mistake("softmax.other_zero", "the masked lanes were loaded as 0 (other=0): load them as -inf, so that "
                "e^(x - max) adds nothing for them", lambda x: softmax_padded(x, 0.0),
                why="Each lane past the row's end then adds e^(0 - max) to the sum, and 0 may become the max."),
        Mistake("softmax.masked_row_not_nan", "a row of -inf only did not give NaN: leave the max and the sum "
                "unguarded, as torch.softmax does", test=masked_row_not_nan,
                why="Attention's kernels guard such rows (a row of no key gives 0 there); a softmax does not."),
        Mistake("softmax.padding_in_max", "the padded lanes entered the max (loaded as 0): load them as -inf, or "
                "keep them out of the max too", softmax_padding_in_max,
                why="The max is then at least 0: a row far below 0 has e^(x - 0) = 0 everywhere, and 0 / 0."),
        Mistake("softmax.no_max", "e^x without subtracting the row's max overflows for scores of a hundred: "
                "subtract tl.max(x, axis=0) first", softmax_no_max,
                why="float32's e^x is inf past x = 88, and inf / inf is NaN; softmax(x - max) is the same "
                    "softmax with every exponent <= 0."),
        Mistake("softmax.log_space", "the kernel stored the log-softmax, x - max - log Σe^(x - max): store the "
                "probabilities, e / Σe", softmax_logged),
        Mistake("softmax.strides_ignored", "the kernel assumed a contiguous x: address element (row, col) as "
                "x_ptr + row * stride_xr + col * stride_xc with both strides passed", softmax_transposed_memory,
                why="A transposed or sliced view keeps its data where it was; only its strides say where."),
        Mistake("softmax.column_stride_ignored", "the kernel stepped through a row by 1: address column c as "
                "x_ptr + row * stride_xr + c * stride_xc, with the column stride too", softmax_column_stride_ignored,
                why="A transposed view's columns are stride_xc elements apart; only a contiguous row's are 1."),
        Mistake("softmax.output_strides", "the output was written with x's strides: pass y.stride(0) and "
                "y.stride(1) for the store, as the load takes x's", softmax_output_strides,
                why="y is a new contiguous tensor; x may be a transposed view, whose strides put each row's "
                    "results where another layout's elements go."),
        Mistake("softmax.block_narrower_than_row", "BLOCK was narrower than the row (sized from the rows, or fixed): "
                "one program covers a whole row, so BLOCK = triton.next_power_of_2(n_cols)",
                test=block_narrower_than_row,
                why="The columns past BLOCK are then never loaded or stored: the output holds whatever torch.empty "
                    "left there."),
        Mistake("softmax.block_not_power_of_two", "tl.arange's length must be a power of two: make BLOCK "
                "triton.next_power_of_2(n_cols) and mask the lanes past n_cols", raises=NOT_POWER_OF_TWO),
        SOFTMAX_NO_KERNEL,
    ),
)

# -- flash_attention --------------------------------------------------------------------


def flash_inputs(gen, dtype, t_q=TQ, t_k=TK, d=D, causal=False, block_m=None, block_n=None, heads=H, q_scale=1.0,
                 v_offset=0.0, batch=B):
    """q, k, v; q_scale near 0 makes the scores nearly equal (l grows to Tk), v_offset moves every value (acc grows
    to l · v_offset: past float16's 65504 for 512 keys of 250)."""
    q = gen.randn(batch, heads, t_q, d, dtype=dtype, scale=q_scale)
    k = gen.randn(batch, heads, t_k, d, dtype=dtype)
    v = (gen.randn(batch, heads, t_k, d, dtype=torch.float64) + v_offset).to(dtype)
    kwargs = {"causal": causal}
    kwargs.update({name: n for name, n in (("block_m", block_m), ("block_n", block_n)) if n is not None})
    return Call((q, k, v), kwargs, ("q", "k", "v"))


def block_sizes(run):
    """Causal, Tq < Tk, for tiles of 32 × 16 and 16 × 32: always the reference's answer."""
    device = triton_device(run)
    for bm, bn in ((32, 16), (16, 32)):
        call = run.inputs(causal=True, block_m=bm, block_n=bn)
        try:
            run.expect_right(run.output(run.answer(call, device=device)), call, device)
        except CheckFailed as failure:
            raise CheckFailed(f"with block_m={bm}, block_n={bn}: {failure.message}", failure.mistake,
                              failure.details) from None


# The memory check's sizes: one batch·head's scores (128·256 = 32768) hold more than any input, output, or copy of
# one padded to blocks of 64 (B·H·256·16 = 12288); all of them, in float32 (393 KB), more than every input and output
# and a padded copy of each together (272 KB). A head width of 16: the least tl.dot takes compiled; blocks of 64, few
# programs for the interpreter.
MEM_TQ, MEM_TK, MEM_D = 128, 256, 16
MEM_BLOCK = 64  # block_m and block_n there: no block a kernel makes has more than 64 · 64 elements and a longer axis


def no_score_matrix(run):
    """No block the kernel makes (in the interpreter) holds more than a block_m × block_n tile with an axis longer than
    a block or the head's width (review 50's F1 loaded every key at once), none of a shape that follows the number of
    keys (review 51's F1 folded them into (Tk / block_n, block_n)), and no load reads more than a block of one tensor
    (review 52's F1 folded them into a block of a constant shape), and its blocks hold no more at once over more keys
    (review 54's F2 kept every tile in a list); no tensor that the launcher's torch calls
    create holds as many elements as one batch·head's (Tq, Tk) scores
    (whole, or one per batch·head: the twenty-ninth review's f05; flat too: the twenty-seventh's f02), causal or not;
    and without a mask, where every score is needed, all the storages its tensors live in hold fewer bytes than the
    score matrix in float32 (a matrix in smaller pieces alive together, the thirtieth's f04; causal, the visible
    scores packed hold a fraction of it, the thirty-first's f03). The answers must be right too."""
    device = triton_device(run)
    scores, matrix = MEM_TQ * MEM_TK, 4 * B * H * MEM_TQ * MEM_TK
    made, alive = {}, {}  # keys -> the shapes of the blocks made over them, and the most bytes held, without a mask
    for causal, t_k in ((True, MEM_TK), (False, MEM_TK), (False, MEM_TK // 2)):
        call = run.inputs(torch.float32, t_q=MEM_TQ, t_k=t_k, d=MEM_D, causal=causal, block_m=MEM_BLOCK,
                          block_n=MEM_BLOCK)
        answer = run.answer(call, device=device, shapes=True)
        record = answer.shapes or {"created": [], "more": 0, "held": 0, "blocks": []}
        if record["more"]:
            raise CheckFailed(f"the call created tensors or blocks of more than {len(record['created'])} different "
                              "shapes: too many to check what it materialises", SCORE_MATRIX)
        where = f"with Tq={MEM_TQ}, Tk={t_k}, D={MEM_D}{', causal' if causal else ''}"
        for size in record["created"]:
            if math.prod(size) >= scores:
                raise CheckFailed(f"{where}: the launcher created a tensor of shape {tuple(size)}, as many elements as "
                                  f"a batch·head's scores ({scores}) or more", SCORE_MATRIX,
                                  {"shape": list(size), "allowed": scores - 1})
        blocks = record.get("blocks", ())  # the interpreter's blocks (compiled, none are seen)
        _no_block_past(blocks, where, KEYS_AT_ONCE, MEM_BLOCK * MEM_BLOCK, max(MEM_BLOCK, MEM_D),
                       f"block_m = block_n = {MEM_BLOCK}", f"a {MEM_BLOCK} × {MEM_BLOCK} tile")
        _no_load_past(record.get("loaded", 0), where, KEYS_AT_ONCE, MEM_BLOCK * MEM_D, f"block_n = {MEM_BLOCK}")
        if not causal:
            made[t_k], alive[t_k] = set(blocks), record.get("blocks_alive", 0)
        if not causal and t_k == MEM_TK and record.get("held", 0) >= matrix:
            raise CheckFailed(f"{where}: the launcher's tensors held {record['held']} bytes together, as many as the "
                              f"whole score matrix in float32 ({matrix}) or more", SCORE_MATRIX,
                              {"held": record["held"], "allowed": matrix - 1})
        run.expect_right(run.output(answer), call, device)
    _blocks_keep_their_shapes(made, f"with Tq={MEM_TQ}, D={MEM_D}, block_m = block_n = {MEM_BLOCK}", KEYS_AT_ONCE)
    _blocks_hold_alike(alive, f"with Tq={MEM_TQ}, D={MEM_D}, block_m = block_n = {MEM_BLOCK}", KEYS_AT_ONCE, MEM_BLOCK)
    untiled = run.ctx.untiled.get(run.step.id)  # every other call, judged where it was made (`launcher_tiles`)
    if untiled:
        sizes, where, size, why = untiled
        raise CheckFailed(f"with {where}: the launcher created a tensor of shape {size}, {why}: the scores belong in "
                          "the kernel's blocks, never in memory", SCORE_MATRIX, {"shape": list(size)})


def _no_block_past(blocks, where: str, mistake: Mistake, elements: int, axis: int, sizes: str, tile: str) -> None:
    """No block with more elements than a tile and an axis longer than a tile's (a broadcast of a tile against the
    head's width, (block_m, block_n, D), has more elements but no longer axis)."""
    for size in blocks:
        if math.prod(size) > elements and max(size, default=0) > axis:
            raise CheckFailed(f"{where}, {sizes}: the kernel made a block of shape {tuple(size)}, more than {tile}",
                              mistake, {"block": list(size), "allowed": elements})


def _no_load_past(loaded: int, where: str, mistake: Mistake, elements: int, sizes: str) -> None:
    """No load reads more of one tensor than a block of its rows: a kernel that folds every key into a block of a
    constant shape (the fifty-second review's F1) still reads them all in one load."""
    if loaded > elements:
        raise CheckFailed(f"{where}, {sizes}: one load of the kernel read {loaded} elements of its tensors, more than "
                          f"a block of {elements}: it took in more than block_n keys at once", mistake,
                          {"loaded": loaded, "allowed": elements})


def _blocks_keep_their_shapes(made: dict, where: str, mistake: Mistake) -> None:
    """A kernel that streams the keys makes blocks of the same shapes whatever their number (a block's shape is a
    constant of the kernel): one that it makes over twice the keys and not over half, or the reverse, follows their
    number, however the keys are folded into its axes or gathered into it a block at a time."""
    (few, fewer), (many, more) = sorted(made.items())
    if fewer != more:
        odd = sorted(fewer ^ more, key=math.prod, reverse=True)[0]
        side = f"over {many} keys and not over {few}" if odd in more else f"over {few} keys and not over {many}"
        raise CheckFailed(f"{where}: the kernel made a block of shape {odd} {side}: a block whose shape follows the "
                          "number of keys holds them all at once", mistake, {"block": list(odd)})


def _blocks_hold_alike(alive: dict, where: str, mistake: Mistake, rows: int) -> None:
    """A kernel that streams the keys holds as many blocks at once whatever their number (the interpreter's blocks,
    each alive from when it is made until it is freed); one that keeps each tile of scores (in a list of its own, for a
    plain two-pass softmax: the fifty-fourth review's F2) holds more over more keys. A byte more per score of the keys
    added, `rows` of them per key, is more than a running max and sum keep."""
    (few, fewer), (many, more) = sorted(alive.items())
    if more - fewer >= rows * (many - few):
        raise CheckFailed(f"{where}: the kernel's blocks held {more - fewer} bytes more at once over {many} keys than "
                          f"over {few}: tiles of scores kept together (in a list, say); hold one tile at a time, with "
                          "a running max and sum", mistake, {"grew": more - fewer, "allowed": rows * (many - few) - 1})


class LauncherSizes(TileSizes):
    """What a launcher's torch calls may not create at a call's sizes: a (Tq, Tk) matrix of scores (padded to blocks
    or not, either way round), or a buffer of as many elements as a batch·head's scores and more than twice what the
    inputs padded to blocks hold (a launcher may pad a head's width to a power of two; no score matrix is that small
    at every size). Every call the step's checks make is judged so (a launcher that kept to blocks at
    no_score_matrix's sizes alone, and wrote the whole matrix to memory at every other: the forty-first review's
    f03)."""

    def violation(self, record: dict, strips: bool = True) -> tuple[tuple, str] | None:
        if record["more"]:
            return (), f"more than {len(record['created'])} different shapes: too many to check what it materialises"
        queries = {self.t_q, -(-self.t_q // self.block_q) * self.block_q}
        keys = {self.t_k, -(-self.t_k // self.block_k) * self.block_k}
        for size in (*record["created"], *record["scores"]):
            rows, columns = (size[-2], size[-1]) if len(size) >= 2 and self.distinct() else (0, 0)  # no width a length
            if rows in queries and columns in keys or rows in keys and columns in queries:
                return tuple(size), f"a {rows} × {columns} matrix of scores"
            n = self.per_batch_and_head(size)
            if n >= self.t_q * self.t_k and n > 2 * self.allowed:
                return tuple(size), f"{n} elements per batch·head, as many as its scores ({self.t_q * self.t_k})"
        return None


def launcher_tiles(call) -> LauncherSizes:
    """The sizes of a call of flash_attention(q, k, v, causal=False, block_m=16, block_n=16), its launcher judged."""
    return LauncherSizes.of(*call.args[:3], call.kwargs.get("block_m", 16), call.kwargs.get("block_n", 16))


def speed(run):
    """On CUDA: the forward kernel's time against F.scaled_dot_product_attention's at a realistic size (float16,
    causal), measured in the worker by the stand-in `Timer`; within SPEED_FACTOR earns the points. Without CUDA
    Triton runs in its interpreter, which says nothing of speed: skipped."""
    if triton_device(run) != "cuda":
        run.answer(run.inputs(causal=True), device="cpu")  # a launcher that cannot run says so, not a skip
        raise CheckFailed("Triton ran in its interpreter (no CUDA): the kernel's speed is checked on a GPU only",
                          outcome="skipped")
    script = Script()
    timer = script.build("Timer", stand_in=True)
    index = script.call(timer, "flash", run.step.id, kwargs=dict(SPEED))
    times = run.script(script, device="cuda", rules=False).value[index]
    kernel, sdpa = float(times["kernel_ms"]), float(times["sdpa_ms"])
    ratio = kernel / sdpa
    size = "B={batch}, H={heads}, T={t}, D={d}, float16, causal, block_m={block_m}, block_n={block_n}".format(**SPEED)
    if not ratio <= SPEED_FACTOR:
        raise CheckFailed(f"with {size}: flash_attention took {kernel:.3f} ms, F.scaled_dot_product_attention "
                          f"{sdpa:.3f} ms, {ratio:.1f}× as long (within {SPEED_FACTOR:g}× earns the points)",
                          details={"kernel_ms": kernel, "sdpa_ms": sdpa, "ratio": ratio})


SCORE_MATRIX = Mistake("flash_attention.score_matrix", "the launcher built a tensor the size of the score matrix "
                       "with torch: compute each block_m × block_n tile in the kernel and keep it there")
KEYS_AT_ONCE = Mistake("flash_attention.keys_not_streamed", "the kernel held more than block_m × block_n scores "
                       "at once (a whole row of keys): loop over the keys in blocks of block_n, with the online "
                       "softmax",
                       why="A row of Tk scores in registers is no tile: it spills, or fails to compile, once Tk grows.")
FLASH_NO_KERNEL = Mistake("flash_attention.no_kernel", "the launcher computed attention without launching a Triton "
                          "kernel: do the work in flash_forward_kernel, launched over its grid of programs")
FLASH_CAUSAL = Mistake("flash_attention.causal_mishandled", "right without causal, wrong with it: mask key j > i + "
                       "Tk - Tq (bottom-right) with tl.where, and end each query block's key loop at its last query's "
                       "diagonal")
FLASH_NO_KEY = Mistake("flash_attention.no_key_rows_mishandled", "wrong for rows with no key to see (causal, Tq > Tk): "
                       "give them out 0 and lse -inf, guarding m = -inf and l = 0")
FLASH_STRIDES = Mistake("flash_attention.strides_mishandled", STRIDES + "each of q, k, v, out by its four "
                        "strides, batch and head apart")
FLASH_BLOCKS = Mistake("flash_attention.block_sizes_mishandled", "right with square blocks, wrong with block_m ≠ "
                       "block_n: queries step by block_m, keys by block_n, and the causal loop's end counts both")
FLASH_HALF = Mistake("flash_attention.half_mishandled", "right in float32, wrong in a half type: keep m, l and acc in "
                     "float32, give tl.dot its inputs' dtype, and cast only what you store")
FLASH_HEADS = Mistake("flash_attention.heads_mixed", "right for one batch·head, wrong for several: b = bh // H, "
                      "h = bh % H, and each tensor offset by its own batch and head strides")
FLASH_ONE_BLOCK = Mistake("flash_attention.blocks_mishandled", "right with one key block, wrong over several: the "
                          "running max is max(m, block max), and alpha = e^(m - m_new) rescales acc and l")
FLASH_LSE = Mistake("flash_attention.lse_mishandled", "out is right, lse wrong: store lse = m + log(l), the running "
                    "max and sum of the scaled scores after the last key block, in natural log")
FLASH_OUT = Mistake("flash_attention.out_mishandled", "lse is right, out wrong: out = acc / l, acc rescaled by alpha "
                    "as l is, stored with out's own strides in out's dtype")
FLASH = StepSpec(
    "flash_attention", flash_inputs, flash_reference, outputs=("out", "lse"), tiles=launcher_tiles,
    parts=((("out",), FLASH_LSE), (("lse",), FLASH_OUT)),
    probes=(Probe({"heads": 1}, FLASH_HEADS), Probe({"block_m": 32, "block_n": 64}, FLASH_ONE_BLOCK)),
    checks=(
        # causal with Tk − Tq = 17: the last query of the first block of 16 sees key 32, the first of a key block
        checked("values", 6), checked("causal", 6, t_k=TK + 1, causal=True, situation=FLASH_CAUSAL),
        checked("causal_square", 3, t_q=TK, causal=True, situation=FLASH_CAUSAL),
        checked("fully_masked", 4, t_q=TK + 13, t_k=TQ, causal=True, situation=FLASH_NO_KEY),
        checked("strided", 2, strided=(0, 1, 2), situation=FLASH_STRIDES),
        # two batches: a batch·head offset taken as bh · stride_h is right for contiguous inputs only
        checked("layouts", 2, strided=((0, 1, 2), (2, 1, 2)), batch=2, situation=FLASH_STRIDES),
        prop("block_sizes", 4, block_sizes, situation=FLASH_BLOCKS),
        checked("float16", 3, torch.float16, causal=True, situation=FLASH_HALF),
        checked("bfloat16", 3, torch.bfloat16, compiled_only=INTERPRETER_BFLOAT16, causal=True, situation=FLASH_HALF),
        checked("long_float16", 3, torch.float16, t_q=16, t_k=512, q_scale=0.1, v_offset=250.0,
                situation=FLASH_HALF),
        prop("no_score_matrix", 4, no_score_matrix), launched_kernel(3, FLASH_NO_KERNEL, causal=True),
        kept_rules(3, causal=True), prop("speed", 9, speed),
    ),
    mistakes=(
        Mistake("flash_attention.causal_loop_one_short", "the causal key loop ended at the block's last query's "
                "position, exclusive: end one past it, at Tk − Tq + (start_m + 1) · BLOCK_M",
                flash_variant(end_short=True),
                why="Only a block whose last query's key starts a new key block shows it: that block is never loaded."),
        Mistake("flash_attention.batch_offset_one_stride", "program bh was offset by bh · stride_h, batch and head "
                "as one axis: right for contiguous inputs only; offset by b · stride_b + h · stride_h",
                batch_offset_one_stride),
        Mistake("flash_attention.grid_rounded_down", "the grid had t_q // block_m query blocks, so the last partial "
                "block was never computed: use triton.cdiv(t_q, block_m) and mask its rows", test=grid_rounded_down,
                why="Floor division drops the rows past the last full block; their output is whatever torch.empty "
                    "held."),
        Mistake("flash_attention.grid_from_keys", "the grid's query blocks were counted from the keys, cdiv(t_k, "
                "block_m): with more queries than keys the last query blocks never run; count them from the queries, "
                "triton.cdiv(t_q, block_m)", test=grid_from_keys),
        Mistake("flash_attention.rescale_sign_flipped", "every output was NaN: the rescale factor is "
                "alpha = e^(m - m_new), old max minus new, not e^(m_new - m)", test=all_nan,
                why="With m = -inf before the first block, e^(m_new - m) is inf, and inf · 0 is NaN in every row."),
        Mistake("flash_attention.lanes_unmasked", "q, k and v were loaded without the head-width mask: with D below "
                "BLOCK_D the lanes past D read the next row's memory; mask every load with d < D",
                test=flash_lanes_unmasked),
        Mistake("flash_attention.nan_rows", "a row with no key to see (causal, Tq > Tk) gave NaN: subtract 0 where "
                "the running max is -inf, and divide by l only where l > 0", test=has_nan,
                why="Its max stays -inf, and e^(-inf - (-inf)) is NaN; such a row's out is 0 and its lse -inf."),
        Mistake("flash_attention.top_left", "causal masking aligned to the top-left (query i at position i): "
                "mask key j when j > Tk - Tq + i", top_left,
                why="The queries are the last Tq of the Tk positions: query i sits at Tk - Tq + i."),
        Mistake("flash_attention.diagonal_masked", "causal masking hid each query's own key: mask key j only when "
                "j > Tk - Tq + i (keep j <= it, not j < it)", flash_variant(diagonal=False),
                why="Query i sits at position Tk - Tq + i and sees itself; its own key is the one a decoder most "
                    "needs."),
        Mistake("flash_attention.keys_past_end", "keys past Tk were loaded as 0 and scored: set the scores of "
                "keys j >= Tk to -inf with tl.where before the softmax", keys_past_end,
                why="A masked load gives 0 for them (other=0), a score of 0 that still counts e^(0 - m) in the sum."),
        Mistake("flash_attention.no_rescale", "acc and l were not rescaled when the running max rose: multiply "
                "both by alpha = e^(m - m_new) before adding the block", flash_variant(rescale=False)),
        Mistake("flash_attention.acc_not_rescaled", "acc was not rescaled when the running max rose: multiply it "
                "by alpha = e^(m - m_new) before adding the block's p @ v, as l is", flash_variant(rescale_acc=False),
                why="acc holds sums of e^(s - m) under the old max; without alpha they outweigh the new block's."),
        Mistake("flash_attention.l_not_rescaled", "l was not rescaled when the running max rose: update it as "
                "l = alpha * l + sum(p), with alpha = e^(m - m_new), as acc is", flash_variant(rescale_l=False),
                why="l must be the sum of e^(s - m) under the current max; the old terms keep the old max's scale."),
        Mistake("flash_attention.scale_from_padded_width", "the scores were scaled by 1/sqrt(BLOCK_D), the padded "
                "width: scale by 1/sqrt(d), the head's real width", flash_variant(padded_scale=True),
                why="BLOCK_D is d rounded up to a power of two for tl.arange; the padded lanes hold zeros and "
                    "change no dot product, only a scale taken from them."),
        Mistake("flash_attention.lse_last_block", "lse came from the last key block alone: it is m + log(l) of the "
                "running max and sum after the last block", flash_variant(lse_last_block=True)),
        Mistake("flash_attention.lse_without_max", "lse was stored as log(l): l is summed relative to the running "
                "max, so lse = m + log(l)", flash_variant(lse_form="no_max"),
                why="out is right either way; a backward pass that recomputes e^(s - lse) is not."),
        Mistake("flash_attention.lse_unscaled_max", "lse used the max of the unscaled scores: with the scale inside "
                "the exponent, e^(scale·(s - m)), the log-sum-exp is scale·m + log(l)",
                flash_variant(lse_form="unscaled_max"),
                why="out is right either way: the max cancels in acc / l, but not in lse."),
        Mistake("flash_attention.lse_in_base_two", "lse kept an exp2 kernel's base 2 (its max m·log2(e), with "
                "log2(l) or log(l)): store (m₂ + log2(l))·ln(2)",
                lambda *a, **k: [flash_variant(lse_form=form)(*a, **k) for form in ("base_two", "max_in_bits")],
                why="exp2 of scores pre-scaled by log2(e) is the same softmax; its log-sum-exp comes out in bits."),
        Mistake("flash_attention.strides_swapped", "the token and width strides were swapped: the token's "
                "stride is x.stride(2), the width's x.stride(3)", strides_swapped),
        Mistake("flash_attention.program_ids_swapped", "the kernel reads its program ids the other way from the "
                "launcher's grid: axis 0 is the query block, axis 1 the batch·head", test=program_ids_swapped,
                why="Then some batch·heads are never computed (their output is whatever torch.empty held)."),
        Mistake("flash_attention.acc_in_half", "acc was kept in the inputs' half type: keep m, l and acc in "
                "float32 (tl.zeros(..., dtype=tl.float32)) and cast only the stored output",
                flash_variant(acc_dtype=torch.float16),
                why="acc is unnormalised: it grows to l times the values, and 512 keys of values near 250 pass "
                    "float16's largest number, 65504 (inf)."),
        Mistake("flash_attention.block_not_power_of_two", "tl.arange's length must be a power of two: pad the "
                "head width to triton.next_power_of_2(D) and mask the lanes past D", raises=NOT_POWER_OF_TWO),
        SCORE_MATRIX, KEYS_AT_ONCE, FLASH_NO_KERNEL,
    ),
)

# -- decode_attention -------------------------------------------------------------------


def decode_inputs(gen, dtype, lengths=LENGTHS, t_max=T_MAX, d=D, scale=1.0, peak=False, negative=False):
    """`peak`: each sequence's first key scores 150 for every head, far above every later one (a max that falls);
    `negative`: every key scores near −150 (e^s is 0 in float32 unless the running max starts at −inf)."""
    q = gen.randn(len(lengths), DECODE_HEADS, d, dtype=dtype, scale=scale)
    k_cache, v_cache = (gen.randn(len(lengths), DECODE_HEADS, t_max, d, dtype=dtype) for _ in range(2))
    if peak:
        k_cache[:, :, 0] = q * (150 * math.sqrt(d) / (q.double() ** 2).sum(-1, keepdim=True)).to(dtype)
    if negative:
        k_cache -= (q * (150 * math.sqrt(d) / (q.double() ** 2).sum(-1, keepdim=True)).to(dtype))[:, :, None]
    for b, n in enumerate(lengths):  # unused slots: a kernel that reads them shows it
        k_cache[b, :, n:] = math.nan
        v_cache[b, :, n:] = math.nan
    return Call((q, k_cache, v_cache, torch.tensor(lengths)), {}, ("q", "k_cache", "v_cache", "lengths"))


DECODE_BLOCK = 16  # the block_n the streaming check asks for: keys 16 at a time, out of 128


def decode_streamed(run):
    """Over 128 keys in blocks of 16, no block the kernel makes (in the interpreter) has an axis longer than a block
    or the head's width, padded, with more elements than a block of keys, over 64 keys it makes blocks of the same
    shapes and holds no more at once, and no load reads more than a block of keys: the cache is streamed, never loaded
    whole (reviews 50, 51 and 52's F1, 54's F2). The answer must be right too."""
    device = triton_device(run)
    width = 1 << (D - 1).bit_length()
    made, alive = {}, {}
    for t_max, lengths in ((128, (97, 128)), (64, (49, 64))):
        call = run.inputs(torch.float32, lengths=lengths, t_max=t_max)
        call = replace(call, kwargs={**call.kwargs, "block_n": DECODE_BLOCK})
        answer = run.answer(call, device=device, shapes=True)
        record = answer.shapes or {"more": 0, "blocks": []}
        where = f"over {t_max} keys"
        if record.get("more"):
            raise CheckFailed(f"{where}: the kernel made blocks of too many different shapes to check what they hold",
                              DECODE_AT_ONCE)
        _no_block_past(record.get("blocks", ()), where, DECODE_AT_ONCE, DECODE_BLOCK * width,
                       max(DECODE_BLOCK, width), f"block_n={DECODE_BLOCK}", f"{DECODE_BLOCK} keys at once")
        _no_load_past(record.get("loaded", 0), where, DECODE_AT_ONCE, DECODE_BLOCK * width, f"block_n={DECODE_BLOCK}")
        made[t_max], alive[t_max] = set(record.get("blocks", ())), record.get("blocks_alive", 0)
        run.expect_right(run.output(answer), call, device)
    _blocks_keep_their_shapes(made, f"with block_n={DECODE_BLOCK}", DECODE_AT_ONCE)
    _blocks_hold_alike(alive, f"with block_n={DECODE_BLOCK}", DECODE_AT_ONCE, 1)


DECODE_AT_ONCE = Mistake("decode_attention.cache_not_streamed", "the kernel loaded more than block_n keys at once "
                         "(the whole cache row, or blocks of its own size): loop over range(0, length, block_n) with "
                         "a running max and sum")
DECODE_NO_KERNEL = Mistake("decode_attention.no_kernel", "the launcher computed attention without launching a "
                           "Triton kernel: do the work in decode_kernel, launched over a grid of B·H programs")
DECODE_STRIDES = Mistake("decode_attention.strides_mishandled", STRIDES + "q, k_cache, v_cache and out each by its "
                         "own strides")
DECODE_HALF = Mistake("decode_attention.half_mishandled", HALF)
DECODE_LENGTHS = Mistake("decode_attention.lengths_mishandled", "wrong for some lengths (0, or one block or less): "
                         "loop over range(0, lengths[b], BLOCK_N), mask keys j >= lengths[b], and give a length of 0 "
                         "output 0")
DECODE_LONG = Mistake("decode_attention.long_sequences_mishandled", "wrong over many key blocks with large scores: "
                      "keep a running max, and rescale acc and l by e^(m - m_new) whenever it rises")
DECODE_ONE = Mistake("decode_attention.sequences_mixed", "right for one sequence, wrong for several: program pid reads "
                     "b = pid // H, lengths[b] and its own cache rows, and stores its output at b")
DECODE = StepSpec(
    "decode_attention", decode_inputs, decode_reference, probes=(Probe({"lengths": (29,)}, DECODE_ONE),),
    checks=(
        checked("values", 2), checked("negative_scores", 1, negative=True),
        checked("strided", 2, strided=(0, 1, 2), situation=DECODE_STRIDES),
        # k_cache and v_cache in two layouts: neither read with the other's strides
        checked("layouts", 2, strided=((1, 1, 2), 2), situation=DECODE_STRIDES),
        checked("float16", 2, torch.float16, situation=DECODE_HALF), prop("streamed", 1, decode_streamed),
        checked("one_block", 2, lengths=(3, 11, 13), t_max=13, situation=DECODE_LENGTHS),
        checked("long", 1, lengths=(97, 128), t_max=128, scale=8.0, situation=DECODE_LONG),
        checked("falling_max", 1, lengths=(97, 128), t_max=128, scale=8.0, peak=True, situation=DECODE_LONG),
        checked("empty", 2, lengths=(0, 17, 40), situation=DECODE_LENGTHS),  # 17: one key past a block of 16
        launched_kernel(2, DECODE_NO_KERNEL), kept_rules(2),
    ),
    mistakes=(
        Mistake("decode_attention.max_started_at_zero", "the running max started at 0: scores far below 0 then "
                "give e^(s − 0) = 0 and an output of 0; start m at -inf", decode_variant(m_start=0.0)),
        Mistake("decode_attention.block_max_not_running", "each block's own max was taken for the running max: "
                "alpha = e^(m - m_block) overflows when the max falls far; keep m_new = max(m, block max)",
                decode_variant(block_max=True)),
        Mistake("decode_attention.strides_of_the_other_cache", "k_cache was read with v_cache's strides (or v_cache "
                "with k_cache's): each cache by its own four strides", cache_with_other_strides,
                why="Two caches of one shape may be laid out differently: a copied offset line passes every check "
                    "where they are not."),
        Mistake("decode_attention.empty_nan", "a sequence of length 0 gave NaN: its l is 0, so divide by l only "
                "where l > 0 (tl.where(l > 0, l, 1.0)) and give it 0", test=empty_sequence_nan,
                why="With no key the loop never runs: acc and l stay 0, and 0 / 0 is NaN."),
        Mistake("decode_attention.block_d_below_width", "BLOCK_D was below the head width, so the dims past it were "
                "never loaded nor stored: BLOCK_D = triton.next_power_of_2(D), masked to d < D", test=head_dims_cut,
                why="2 ** int(log2(D)) rounds down: 16 for D = 20."),
        Mistake("decode_attention.rescale_sign_flipped", "every output was NaN: the rescale factor is "
                "alpha = e^(m - m_new), old max minus new, not e^(m_new - m)", test=all_nan,
                why="With m = -inf before the first block, e^(m_new - m) is inf, and inf · 0 is NaN; a sequence "
                    "that fills its cache has nothing past its length to read, so its NaN is not the cache's."),
        Mistake("decode_attention.keys_past_length", "the last block's slots past lengths[b] were scored as keys of "
                "score 0: set s to -inf where the key's index j >= lengths[b]", decode_keys_unmasked,
                why="A masked load gives those slots 0 (other=0), a score of 0 whose e^(0 - m) still joins the sum."),
        Mistake("decode_attention.program_ids_swapped", "the program id was split the other way: with a grid of "
                "B·H programs, b = pid // H and h = pid % H", test=decode_ids_swapped,
                why="b = pid % H, h = pid // H names every pair only when B = H; otherwise some sequences are "
                    "read with another's length, or never computed."),
        Mistake("decode_attention.block_not_power_of_two", "tl.arange's length must be a power of two: pad the "
                "head width to triton.next_power_of_2(D) and mask the lanes past D", raises=NOT_POWER_OF_TWO),
        Mistake("decode_attention.cache_with_query_strides", "the cache was addressed with q's batch and head "
                "strides: k_cache and v_cache have their own, k_cache.stride(0) and k_cache.stride(1)",
                cache_with_query_strides),
        Mistake("decode_attention.cache_assumed_contiguous", "the cache was read as a contiguous one, its strides "
                "computed from its shape: pass k_cache's and v_cache's own strides", cache_read_as_contiguous,
                why="A transposed or sliced cache has other strides than a fresh one of its shape."),
        Mistake("decode_attention.key_lanes_unmasked", "k_cache was loaded without the head-width mask: with D "
                "below BLOCK_D its lanes past D read the next slot, NaN past a length; mask the load with d < D",
                decode_keys_lanes_unmasked),
        Mistake("decode_attention.past_length", "the kernel read the cache past the sequence's length (NaN "
                "there): loop over range(0, lengths[b], BLOCK_N) and mask keys j >= lengths[b]", test=has_nan,
                why="The cache is allocated for T_max positions; only the first lengths[b] hold keys."),
        Mistake("decode_attention.no_rescale", "acc and l were not rescaled when the running max rose: alpha = "
                "e^(m - m_new) from the old max, before m = m_new, multiplies both",
                decode_variant(rescale_acc=False, rescale_l=False),
                why="alpha computed after m is updated is e^0 = 1: every earlier block keeps its old scale."),
        Mistake("decode_attention.acc_not_rescaled", "acc was not rescaled when the running max rose: multiply it "
                "by alpha = e^(m - m_new) before adding the block's weighted values, as l is",
                decode_variant(rescale_acc=False)),
        Mistake("decode_attention.l_not_rescaled", "l was not rescaled when the running max rose: update it as "
                "l = alpha * l + sum(p), with alpha = e^(m - m_new), as acc is", decode_variant(rescale_l=False),
                why="l must be the sum of e^(s - m) under the current max; the old terms keep the old max's scale."),
        Mistake("decode_attention.unscaled", "the scores were never scaled: multiply q · k by scale = 1/sqrt(d) "
                "before the softmax", decode_variant(scaled=False)),
        Mistake("decode_attention.scale_from_padded_width", "the scores were scaled by 1/sqrt(BLOCK_D), the padded "
                "width: scale by 1/sqrt(d), the head's real width", decode_variant(padded_scale=True)),
        Mistake("decode_attention.first_length", "every sequence used lengths[0]: load lengths[b] for the "
                "program's own batch b = program_id // H", first_length),
        DECODE_AT_ONCE, DECODE_NO_KERNEL,
    ),
)

SPEC = Spec((SOFTMAX, FLASH, DECODE))
