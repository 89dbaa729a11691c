"""paged_attention's function steps: paged_decode and varlen_attention, their inputs and their named mistakes.

Each mistake's wrong answer is computed here from the check's inputs, with attention written
out over an explicit list of the keys each query reads (paged_decode) or an explicit
(total_q, total_k) mask (varlen_attention): a row with no key to read is NaN, as a softmax over
nothing but -inf gives. spec.py beside this file declares the exercise.
"""

import math

import torch

from grader.engine import Call, Mistake, Probe, Raises, StepSpec, device, shape, values
from solutions import paged_attention as ref

from .cache import BLOCK, DH, FLOATS, H

# -- paged_decode -------------------------------------------------------------------------

LENGTHS = (5, 8, 1, 11)  # past a boundary, exactly at one, a single token, into a third block
DECODE_NAMES = ("q", "k_cache", "v_cache", "block_tables", "context_lens")


def decode_inputs(gen, dtype, lengths=LENGTHS, extra=0, nan=False, q_scale=1.0, zero=False, below=0.0):
    """A pool holding len(lengths) sequences in shuffled blocks, three blocks to spare (block 0 among them, unless
    `zero`: then it is the first sequence's first block, as valid a block as any); the block tables padded with −1
    (`extra` more columns of it); with `nan`, NaN in every slot no sequence holds; `q_scale` multiplies the queries
    (100: scores in the hundreds, whose e^s overflows float32 unless the max is subtracted); `below`: every score
    moved about that far below 0 (a shared direction added to q, taken from the keys), within a few units of each
    other: e^s underflows past -104 in float32 unless a running max starts at -inf."""
    needed = [-(-n // BLOCK) for n in lengths]
    num_blocks = sum(needed) + 3
    order = (torch.randperm(num_blocks - 1, generator=gen.rng) + 1).tolist()  # block 0 left free, as vLLM's null
    # block: a −1 clamped to 0 reads a slot no sequence holds
    if zero:
        order.append(0)  # popped first
    tables = torch.full((len(lengths), max(needed) + extra), -1, dtype=torch.int32)
    held = torch.zeros(num_blocks, BLOCK, dtype=torch.bool)
    for b, n in enumerate(lengths):
        for i in range(needed[b]):
            tables[b, i] = order.pop()
            held[tables[b, i], :min(BLOCK, n - i * BLOCK)] = True
    k_cache = torch.as_tensor(gen.randn(num_blocks, BLOCK, H, DH, dtype=dtype))
    v_cache = torch.as_tensor(gen.randn(num_blocks, BLOCK, H, DH, dtype=dtype))
    if nan:
        k_cache[~held], v_cache[~held] = float("nan"), float("nan")
    q = torch.as_tensor(gen.randn(len(lengths), H, DH, dtype=dtype, scale=q_scale))
    if below:
        shift = math.sqrt(below * math.sqrt(DH) / DH)  # per coordinate: q·k / √Dh falls by `below`
        q, k_cache = q / 4 + shift, k_cache / 4 - shift
    return Call((q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32)), names=DECODE_NAMES)


def _slot(table, t):
    """Token t's (block, slot), read through a table row as a list: −1 and all, as Python indexes it."""
    return table[t // BLOCK], t % BLOCK


def decoded(q, k_cache, v_cache, block_tables, context_lens, *, reads=None, width=None, heads_reshaped=False,
            empty=math.nan):
    """paged_decode from its definition: `reads(table, n)` lists the (block, slot) each sequence reads; `width`, the
    scale's √width (None: Dh). A sequence with nothing to read gives `empty` (NaN; an einsum over no key gives 0)."""
    reads = reads or (lambda table, n: [_slot(table, t) for t in range(n)])
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        slots = reads(block_tables[b].tolist(), int(context_lens[b]))
        k = torch.stack([k_cache[blk, s] for blk, s in slots]) if slots else k_cache[:0, 0]  # (n, H, Dh)
        v = torch.stack([v_cache[blk, s] for blk, s in slots]) if slots else v_cache[:0, 0]
        k, v = (x.reshape(H, -1, DH) if heads_reshaped else x.transpose(0, 1) for x in (k, v))  # (H, n, Dh)
        scores = (k @ q[b][:, :, None])[..., 0] / math.sqrt(width or DH)  # (H, n)
        out[b] = (torch.softmax(scores, -1)[:, None] @ v)[:, 0] if slots else empty
    return out


def _online(q, k_cache, v_cache, block_tables, context_lens, fault: str):
    """paged_decode block by block with an online softmax and one fault: "inverted", the rescale e^(m_new - m_old),
    so what was summed under an older, smaller max is multiplied up instead of down; "last_block_sum", the output
    divided by the last block's own sum, not the running one (each sequence's first block is right either way)."""
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        n = int(context_lens[b])
        slots = [_slot(block_tables[b].tolist(), t) for t in range(n)]
        k = torch.stack([k_cache[blk, s] for blk, s in slots]).transpose(0, 1).double()  # (H, n, Dh)
        v = torch.stack([v_cache[blk, s] for blk, s in slots]).transpose(0, 1).double()
        m = torch.full((q.shape[1],), -math.inf, dtype=torch.float64)
        total, acc = torch.zeros_like(m), torch.zeros(q.shape[1], q.shape[2], dtype=torch.float64)
        last = total
        for start in range(0, n, k_cache.shape[1]):
            s = (k[:, start:start + k_cache.shape[1]] @ q[b].double()[:, :, None])[..., 0] / math.sqrt(q.shape[2])
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            alpha = torch.where(torch.isinf(m), 0.0, torch.exp(m_new - m if fault == "inverted" else m - m_new))
            total, last = total * alpha + p.sum(-1), p.sum(-1)
            acc = acc * alpha[:, None] + (p[:, None] @ v[:, start:start + k_cache.shape[1]])[:, 0]
            m = m_new
        out[b] = (acc / (last if fault == "last_block_sum" else total)[:, None]).to(q.dtype)
    return out


def _decode_mistake(name, message, why="", **knobs):
    return Mistake(f"paged_decode.{name}", message, lambda *a: decoded(*a, **knobs), why=why)


def _weighted(q, k_cache, v_cache, block_tables, context_lens, weights):
    """paged_decode with each sequence's (H, n) scores turned into weights by `weights`, not a softmax over each
    head's keys: the mistakes made across the heads."""
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        slots = [_slot(block_tables[b].tolist(), t) for t in range(int(context_lens[b]))]
        k = torch.stack([k_cache[blk, s] for blk, s in slots]).transpose(0, 1).double()  # (H, n, Dh)
        v = torch.stack([v_cache[blk, s] for blk, s in slots]).transpose(0, 1).double()
        scores = (k @ q[b].double()[:, :, None])[..., 0] / math.sqrt(q.shape[2])  # (H, n)
        out[b] = (weights(scores)[:, None] @ v)[:, 0].to(q.dtype)
    return out


def _softmax_over_heads(*args):
    """Each key's weights sum to 1 over the heads (softmax along dim=0), not each head's over its keys."""
    return _weighted(*args, lambda scores: torch.softmax(scores, 0))


def _summed_over_heads(*args):
    """Every head's weights from the scores summed over the heads (an einsum that drops h: 'bhd,bnhd->bn')."""
    return _weighted(*args, lambda scores: torch.softmax(scores.sum(0, keepdim=True), -1).expand_as(scores))


def _max_over_heads(*args):
    """Each key's scores shifted by their max over the heads, not each head's max over its keys: e^(s − m) / Σ e^(s −
    m) with m different for every key is no softmax."""
    def weights(scores):
        e = torch.exp(scores - scores.amax(0, keepdim=True))
        return e / e.sum(-1, keepdim=True)
    return _weighted(*args, weights)


MAX_OVER_HEADS = Mistake(
    "paged_decode.max_over_heads", "the softmax's max was taken over the heads, one per key, not over each head's "
    "keys: subtract scores.amax(dim=-1, keepdim=True), the keys' axis", _max_over_heads,
    why="Softmax is unchanged by one shift of a whole row; a shift that differs from key to key reweights them.")
SUMMED_OVER_HEADS = Mistake(
    "paged_decode.scores_summed_over_heads", "the scores were summed over the heads, so every head weights its keys "
    "alike: each head scores with its own query, einsum('hd,nhd->hn', q[b], k)", _summed_over_heads,
    why="An einsum whose output drops h ('bhd,bnhd->bn') sums over it.")
SOFTMAX_OVER_HEADS = Mistake(
    "paged_decode.softmax_over_heads", "the softmax ran over the heads (dim=0 of the (H, n) scores): each head's "
    "weights over its keys sum to 1, softmax(scores, dim=-1)", _softmax_over_heads)
RESCALE_INVERTED = Mistake(
    "paged_decode.rescale_inverted", "the online softmax rescaled by e^(m_new - m_old) when the max rose: what was "
    "summed under the old max is multiplied by alpha = e^(m_old - m_new), at most 1",
    lambda *a: _online(*a, fault="inverted"),
    why="Right while a sequence fits in one block, or its first block holds its largest score: alpha is then 1.")
LAST_BLOCK_SUM = Mistake(
    "paged_decode.last_block_sum", "the output was divided by the last block's sum, not the running sum: keep "
    "l = alpha · l + Σ p across the blocks, and divide acc by it",
    lambda *a: _online(*a, fault="last_block_sum"),
    why="Right while a sequence fits in one block: its last block is then its only one.")
WHOLE_BLOCKS = _decode_mistake(
    "whole_blocks_read", "read every slot of the sequence's blocks: its last block is filled only up to "
    "context_lens[b]; read its first context_lens[b] tokens", reads=lambda table, n: [
        _slot(table, t) for t in range(-(-n // BLOCK) * BLOCK)],
    why="The slots after a sequence's last token hold what an earlier, freed sequence left there, or nothing yet.")
PADDING_READ = _decode_mistake(
    "padding_read", "read the whole table row, −1 entries included (block −1 is the pool's last block): read the "
    "first ceil(n / block_size) entries, or mask every position past context_lens[b]",
    reads=lambda table, n: [_slot(table, t) for t in range(len(table) * BLOCK)])
LOGICAL_AS_PHYSICAL = _decode_mistake(
    "logical_block_as_physical", "read logical block i at physical block i: the sequence's blocks are anywhere in the "
    "pool; block t // block_size of the sequence is block_tables[b, t // block_size]",
    reads=lambda table, n: [(t // BLOCK, t % BLOCK) for t in range(n)],
    why="The block table is the page table: logical and physical block numbers differ.")
FLAT_SLOT = _decode_mistake(
    "block_not_times_block_size", "in the flattened pool, token t is at table[t // block_size] · block_size + t % "
    "block_size: the block number was added as an offset, not multiplied by block_size",
    reads=lambda table, n: [divmod(table[t // BLOCK] + t % BLOCK, BLOCK) for t in range(n)])
def _block_stride_wrong(*args):
    """Token t read at flat slot table[t // block_size] · w + t % block_size of the flattened pool, w another size
    than block_size: the table's width (max_blocks), or the number of heads; nothing where a slot is past the pool."""
    k_cache, tables, lengths = args[1], args[3].tolist(), args[4].tolist()
    forms = []
    for width in {len(tables[0]), H} - {BLOCK}:
        def reads(table, n, width=width):
            return [divmod(table[t // BLOCK] * width + t % BLOCK, BLOCK) for t in range(n)]

        slots = [flat for table, n in zip(tables, lengths, strict=True) for flat in reads(table, int(n))]
        if all(0 <= block < k_cache.shape[0] for block, _ in slots):
            forms.append(decoded(*args, reads=reads))
    return forms


def _position_as_slot(*args):
    """Token t read at flat slot table[t // block_size] · block_size + t of the flattened pool: its position in the
    sequence taken for its offset in the block; nothing where a slot is past the pool (the file raises there)."""
    k_cache, tables, lengths = args[1], args[3].tolist(), args[4].tolist()

    def reads(table, n):
        return [divmod(table[t // BLOCK] * BLOCK + t, BLOCK) for t in range(n)]

    slots = [flat for table, n in zip(tables, lengths, strict=True) for flat in reads(table, int(n))]
    return [decoded(*args, reads=reads)] if all(0 <= block < k_cache.shape[0] for block, _ in slots) else []


POSITION_AS_SLOT = Mistake(
    "paged_decode.position_as_slot", "token t is slot t % block_size of its block: its position t itself was added "
    "to the block's start, table[t // block_size] · block_size + t", _position_as_slot,
    why="Past the first block, t overshoots into later blocks, or past the pool.")
BLOCK_STRIDE = Mistake(
    "paged_decode.block_stride_not_block_size", "in the flattened pool, token t is at table[t // block_size] · "
    "block_size + t % block_size: the block was multiplied by another size (the table's width?)", _block_stride_wrong,
    why="A flattened (num_blocks · block_size) pool steps block_size slots per block, whatever the tables' width.")


def _block_and_slot_swapped(*args):
    """Token t read at slot t // block_size of block table[t % block_size]; nothing where that runs past a table."""
    tables, lengths = args[3], args[4]
    if any(min(int(n), BLOCK) > len(row) for row, n in zip(tables.tolist(), lengths.tolist(), strict=True)):
        return []
    return [decoded(*args, reads=lambda table, n: [(table[t % BLOCK], t // BLOCK) for t in range(n)])]


BLOCK_SLOT_SWAPPED = Mistake(
    "paged_decode.block_and_slot_swapped", "swapped the block and the slot: token t is at slot t % block_size of "
    "block block_tables[b, t // block_size]", _block_and_slot_swapped,
    why="divmod(t, block_size) gives (logical block, offset), in that order.")


def _one_past(clamped: bool):
    """Token n read too: through a −1 table entry that is the pool's last block as Python indexes it, or block 0 once
    the table is clamped (a vectorised gather)."""
    row = (lambda table: [max(b, 0) for b in table]) if clamped else (lambda table: table)
    return lambda table, n: [_slot(row(table), t) for t in range(min(n + 1, len(table) * BLOCK))]


ONE_PAST = Mistake(
    "paged_decode.one_key_past_context", "read context_lens[b] + 1 keys (<= where < belongs): token "
    "context_lens[b] − 1 is the sequence's last",
    lambda *a: [decoded(*a, reads=_one_past(clamped)) for clamped in (False, True)],
    why="A valid-slot mask written pos <= context_lens[b] keeps one slot past the end: padding, or a −1 block.")
CONTIGUOUS_RUN = _decode_mistake(
    "blocks_assumed_contiguous", "read the sequence as one run of the pool from its first block: its blocks are "
    "anywhere, token t is in block block_tables[b, t // block_size]",
    reads=lambda table, n: [divmod(table[0] * BLOCK + t, BLOCK) for t in range(n)],
    why="Paging exists so that a sequence's blocks need not be next to each other.")
ONE_SHORT = _decode_mistake(
    "one_key_short", "read context_lens[b] − 1 keys: context_lens counts every key, the new token's included",
    reads=lambda table, n: [_slot(table, t) for t in range(n - 1)])
PARTIAL_BLOCK_DROPPED = Mistake(
    "paged_decode.partial_block_dropped", "read only the n // block_size full blocks, dropping the last, partly "
    "filled block's keys: read the first ceil(n / block_size) blocks, -(-n // block_size), cut to n tokens",
    lambda *a: [*(decoded(*a, reads=lambda table, n: [_slot(table, t) for t in range(n // BLOCK * BLOCK)],
                          empty=empty) for empty in (math.nan, 0.0)),
                decoded(*a, reads=lambda table, n: [_slot(table, t)  # and at least one block
                                                    for t in range(min(n, max(n // BLOCK, 1) * BLOCK))])],
    why="A sequence's last block holds its newest tokens, the new token's own key among them; floor division "
        "drops them whenever n is not a multiple of block_size.")
def _last_fill_by_remainder(table, n):
    """Every block but the last read whole, the last `n % block_size` slots: none when n fills it."""
    whole = (-(-n // BLOCK) - 1) * BLOCK
    return [_slot(table, t) for t in range(whole + n % BLOCK)]


LAST_BLOCK_BY_REMAINDER = Mistake(
    "paged_decode.full_last_block_read_empty", "the last block's fill was n % block_size, 0 when n fills it: read "
    "n − (blocks − 1)·block_size slots of it, or min(block_size, n − start)",
    lambda *a: [decoded(*a, reads=_last_fill_by_remainder, empty=empty) for empty in (math.nan, 0.0)],
    # the fill as a remainder, assigned to a count or the else of a conditional: not a docstring's slot t % block_size
    # (the seventy-ninth review's F4), nor `n % block_size or block_size`, right (the eightieth's F5)
    raises=Raises(message=r"non-zero size|zero-size|(?<!non-)empty",
                  source=r"(\b(last|fill|used|rem|tail|valid|count|num|size|len|n_)\w*\s*=[^\n]*|\belse\s+\(?\s*)"
                         r"\w+\s*%\s*(self\.)?(block_size|bs|block|page_size)\b(?!\s*or\b)"
                         # and no fix-up of a 0 remainder after it (review 81's F3)
                         r"(?![\s\S]*(==\s*0\b|\bif\s+not\s|\b(or|else)\s+(self\.)?(block_size|bs|page_size)\b))"),
    why="n % block_size is the last block's fill only while n is not a multiple of block_size; a full last block "
        "is then read as empty.")
BLOCK_PAST_FULL_ROW = Mistake(
    "paged_decode.block_past_a_full_row", "read n // block_size + 1 table entries, one past a row whose blocks are "
    "all full: read ceil(n / block_size) of them, -(-n // block_size)",
    raises=Raises(message=r"is invalid for input of size|must match the size|out of (bounds|range)|expanded size",
                  # a name's floor plus one, not the ceiling (n - 1) // bs + 1 (review 81's F4)
                  source=r"\b\w+\s*//\s*(self\.)?(block_size|bs|block|page_size)\s*\+\s*1\b"),
    why="With padding after it (-1) the extra entry is sliced away; a row exactly as wide as the blocks has no "
        "entry there (blind set 63's b09).")
PADDING_SEARCHED = Mistake(
    "paged_decode.padding_searched", "a table row was cut at its first -1 (row.index(-1)), which a sequence that "
    "fills every column has none of: take its first ceil(context_lens[b] / block_size) entries",
    raises=Raises(message=r"-1 is not in (list|tuple)"),
    why="Tables are as wide as the longest sequence needs: its row holds no padding at all.")
LENGTHS_NOT_BROADCAST = Mistake(
    "paged_decode.lengths_not_broadcast", "compared the positions (max_len,) with context_lens (B,) as they are, "
    "which runs only for B = 1: give the lengths an axis, positions[None, :] < context_lens[:, None]",
    raises=Raises(message=r"must match the size|broadcast",
                  line=r"arange\(.*[<>]=?\s*context_lens(\.(long|int)\(\)|\.to\([^)]*\))?\s*(#.*)?\)?$"),
    why="Every sequence has its own length, so the mask is (B, max_len): one row of positions, one column of lengths.")
DECODE_UNSCALED = _decode_mistake("unscaled", "scores not scaled: divide q · k by √Dh", width=1)
DECODE_SCALE_PRECEDENCE = _decode_mistake(
    "scale_precedence", "scaled by Dh ** -1/2, which Python reads as (Dh ** -1) / 2, 1/(2·Dh): write Dh ** -0.5, or "
    "divide by math.sqrt(Dh)", width=4 * DH * DH)
def _padded_heads_reshaped(q, k_cache, v_cache, block_tables, context_lens):
    """Every table row gathered whole, (B, max_blocks · block_size, H, Dh) viewed as (B, H, L, Dh), and the
    positions past context_lens of that view masked."""
    b, h, dh = q.shape
    rows = block_tables.long().clamp(min=0)
    length = rows.shape[1] * k_cache.shape[1]
    keep = torch.arange(length)[None, :] < context_lens.long()[:, None]  # (B, L), read along the view's axis 2
    k, v = (x[rows].reshape(b, h, length, dh).where(keep[:, None, :, None], 0.0) for x in (k_cache, v_cache))
    scores = (k @ q[..., None])[..., 0].masked_fill(~keep[:, None], -math.inf) / math.sqrt(dh)  # (B, H, L)
    return (torch.softmax(scores, -1)[..., None, :] @ v)[..., 0, :]


HEADS_RESHAPED = Mistake(
    "paged_decode.heads_reshaped", "the gathered keys (n, H, Dh) were reshaped to (H, n, Dh), which mixes tokens and "
    "heads: transpose(0, 1) to put the heads first",
    lambda *a: [decoded(*a, heads_reshaped=True), _padded_heads_reshaped(*a)])


def masked_multiplied(q, k_cache, v_cache, block_tables, context_lens):
    """Every table row gathered whole (−1 clamped to block 0), or the sequence's own blocks only, and masked past
    context_lens: right, but NaN for a sequence whose gathered slots hold NaN, since its weight 0 times NaN is NaN."""
    right = ref.paged_decode(q, k_cache, v_cache, block_tables, context_lens)
    forms = []
    for own_blocks in (False, True):
        out = right.clone()
        for b, row in enumerate(block_tables.clamp(min=0).long()):
            row = row[:-(-int(context_lens[b]) // BLOCK)] if own_blocks else row
            if torch.isnan(k_cache[row]).any() or torch.isnan(v_cache[row]).any():
                out[b] = float("nan")
        forms.append(out)
    return forms


TIMES_NAN = Mistake(
    "paged_decode.masked_slots_multiplied", "masked the slots past a sequence's length, but still multiplied their "
    "values by 0: 0 · NaN is NaN; zero those values (torch.where) or read only the sequence's slots",
    why="The grader fills every slot no sequence holds with NaN: a slot must not be read at all.",
    variant=masked_multiplied)

# What a check's failure says when the plain case passed and no listed mistake explains it.
NAN_SLOTS = Mistake("paged_decode.unused_slots_read", "right while unused slots hold numbers, wrong when they hold "
                    "NaN: read no slot past a sequence's length and no block of -1, not even to multiply it by 0")
BOUNDARIES = Mistake("paged_decode.boundaries_mishandled", "wrong when a length is a multiple of block_size: a "
                     "sequence holds ceil(len / block_size) blocks, and its last block's slots end at len")
FULL_ROWS = Mistake("paged_decode.full_rows_mishandled", "wrong when a sequence fills its last block and its table "
                    "row holds no padding (-1) after it: read -(-n // block_size) entries of the row")
BLOCK_ZERO = Mistake("paged_decode.block_zero_skipped", "wrong when a sequence holds block 0: only −1 pads a table "
                     "row, and block 0 is a block like any other (keep entries >= 0, not > 0)")
LONG_CONTEXT = Mistake("paged_decode.long_context_mishandled", "right for contexts of a few blocks, wrong for 41 "
                       "tokens: every block counts, and splits of the keys are rescaled to one max before adding",
                       why="A split-k decode (vLLM's paged_attention_v2) takes a softmax per split of the context; "
                           "the splits' sums are relative to their own maxima until rescaled to the whole row's.")
WIDE_TABLES = Mistake("paged_decode.wide_tables_mishandled", "right for tables as wide as the longest sequence "
                      "needs, wrong with more padding: a split holding none of a sequence's blocks must add nothing "
                      "(weight 0, not NaN)",
                      why="vLLM pads every row to the batch's widest table; a split-k decode's empty split has max "
                          "−inf, and e^(−inf − −inf) is NaN.")
HALF = Mistake("paged_decode.half_mishandled", "right in float32, wrong in float16: compute in float32 if you like, "
               "return q's dtype, and fill masked scores with -inf rather than a large number")

LARGE_SCORES = Mistake("paged_decode.large_scores_mishandled", "right for small scores, wrong for large ones "
                      "(in the hundreds): subtract each row's max before exp, as torch.softmax does",
                      why="e^s overflows float32 past s = 88; e^(s − max) is at most 1.")
BELOW_ZERO = Mistake("paged_decode.far_below_zero_mishandled", "right for ordinary scores, wrong when every score "
                     "is far below 0 (−200): start the running max at -inf, not 0 (e^(s − 0) underflows to 0, 0 / 0)",
                     why="A max started at 0 is right whenever some score is above 0; here none is.")
DECODE_LENGTHS = Mistake("paged_decode.lengths_mixed", "right when every sequence has one length, wrong when they "
                         "differ: sequence b reads its own table row and context_lens[b], and its output stays row b")

DECODE = StepSpec(
    "paged_decode", decode_inputs, ref.paged_decode,
    # no length a multiple of BLOCK first: a last block counted ctx % block_size (0 when full) is right there, and
    # wrong for any equal lengths that happen to fill it (the twenty-ninth blind set's b06)
    probes=(Probe({"lengths": (5, 7, 1, 11)}, BOUNDARIES), Probe({"lengths": (7, 7, 7)}, DECODE_LENGTHS)),
    checks=(
        shape(3), values("mixed_lengths", 3, FLOATS), values("block_zero", 1, situation=BLOCK_ZERO, zero=True),
        values("unused_nan", 4, situation=NAN_SLOTS, nan=True),
        values("long_context", 1, situation=LONG_CONTEXT, lengths=(5, 41, 1, 11)),
        values("wide_tables", 1, situation=WIDE_TABLES, extra=5),
        values("large_scores", 1, situation=LARGE_SCORES, q_scale=100.0),
        values("far_below_zero", 1, situation=BELOW_ZERO, below=200.0),
        values("at_boundaries", 2, situation=BOUNDARIES, lengths=(4, 8, 12), extra=1, nan=True),
        # the longest sequences fill their last block, their rows no wider than their blocks (blind set 63's b09)
        values("full_rows", 1, situation=FULL_ROWS, lengths=(8, 5, 1, 8), nan=True),
        values("half", 2, (torch.float16,), situation=HALF),
        device(2),
    ),
    # first: an answer all NaN in a NaN check looks like several of the others', and only this one is right elsewhere
    mistakes=(TIMES_NAN, RESCALE_INVERTED, LAST_BLOCK_SUM, SOFTMAX_OVER_HEADS, MAX_OVER_HEADS, SUMMED_OVER_HEADS,
              DECODE_SCALE_PRECEDENCE, WHOLE_BLOCKS,
              PADDING_READ, LOGICAL_AS_PHYSICAL, FLAT_SLOT, BLOCK_STRIDE, POSITION_AS_SLOT, CONTIGUOUS_RUN,
              BLOCK_SLOT_SWAPPED, ONE_PAST, ONE_SHORT, PARTIAL_BLOCK_DROPPED, LAST_BLOCK_BY_REMAINDER,
              BLOCK_PAST_FULL_ROW, DECODE_UNSCALED, HEADS_RESHAPED,
              LENGTHS_NOT_BROADCAST, PADDING_SEARCHED),
)

# -- varlen_attention ---------------------------------------------------------------------

PACKED = (3, 5, 1, 4)  # a packed batch's lengths, queries and keys alike
# New tokens after a cache, a prefill, one token after two. The prefill is longer than the other offsets' sum, so that
# one offset for the whole batch (total_k − total_q = 4) still hides some of its keys: not the same as no mask.
# a chunk after a cache: fewer queries than keys, and one sequence with more keys than any has queries (keys padded to
# the longest query fit in the fortieth blind set)
CHUNK_Q, CHUNK_K = (2, 9, 1), (4, 12, 3)
# as many queries in every sequence, and keys of three lengths (a whole number of rows per sequence all the same): a
# fast path for equal lengths that looks at the queries only (the forty-first blind set's b06)
EVEN_Q, EVEN_K = (3, 3, 3), (5, 3, 7)
VARLEN_NAMES = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)


def varlen_inputs(gen, dtype, q_lens=PACKED, k_lens=None, causal=False, first_scale=1.0):
    """A packed batch; `first_scale` multiplies the first sequence's queries (100: its scores in the hundreds, the
    others' a few units, so that one max for the whole batch underflows every other sequence's e^s to 0)."""
    k_lens = k_lens or q_lens
    q = torch.as_tensor(gen.randn(sum(q_lens), H, DH, dtype=dtype))
    q[:q_lens[0]] *= first_scale
    k, v = (torch.as_tensor(gen.randn(sum(k_lens), H, DH, dtype=dtype)) for _ in range(2))
    return Call((q, k, v, _cu(q_lens), _cu(k_lens)), {"causal": causal}, names=VARLEN_NAMES)


def _segments(cu: torch.Tensor, total: int, as_lengths: bool = False, first_to_previous: bool = False):
    """Each row's (sequence, position in it, sequence length), as tensors; as_lengths reads cu[1:] as lengths;
    first_to_previous gives each sequence's first row to the sequence before, as searchsorted(cu[1:], rows) does
    (right=False: a row equal to a boundary goes left of it), one past that sequence's end."""
    bounds = cu.tolist()
    if as_lengths:
        bounds = [0, *torch.tensor(bounds[1:]).cumsum(0).clamp(max=total).tolist()]
    seq, pos, length = (torch.full((total,), fill, dtype=torch.long) for fill in (-1, 0, 0))
    for b, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        seq[start:end], pos[start:end], length[start:end] = b, torch.arange(end - start), end - start
        if first_to_previous and b and start < end:
            seq[start], pos[start], length[start] = b - 1, start - bounds[b - 1], start - bounds[b - 1]
    return seq, pos, length


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, *, bug=None):
    """varlen_attention from its definition, with one (total_q, total_k) mask; `bug`, a mistake's id, makes its
    wrong answer instead (a list of its forms where it has several)."""
    nq, nk = q.shape[0], k.shape[0]
    as_lengths, left = bug == CU_AS_LENGTHS.id, bug == BOUNDARY_ROWS.id
    sq, pq, lq = _segments(cu_seqlens_q, nq, as_lengths, left)
    sk, pk, lk = _segments(cu_seqlens_q if bug == KEYS_CUT_BY_Q.id else cu_seqlens_k, nk, as_lengths, left)
    same = (sq[:, None] == sk[None, :]) & (sq[:, None] >= 0)
    rows, cols = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    bottom_right = pk[None, :] <= pq[:, None] + lk[None, :] - lq[:, None]
    if bug == CROSSES.id:
        forms = [torch.ones(nq, nk, dtype=torch.bool)] if not causal else [cols <= rows, cols <= rows + nk - nq]
        return [_attend(q, k, v, mask) for mask in forms]
    if causal and bug == GLOBAL_POSITIONS.id:  # packed rows, with no offset, one for the whole batch, or each its own;
        shifts = (0, nk - nq, lk[None, :] - lq[:, None])  # or positions in each sequence, the whole batch's offset
        return [*(_attend(q, k, v, same & (cols <= rows + shift)) for shift in shifts),
                _attend(q, k, v, same & (pk[None, :] <= pq[:, None] + nk - nq))]
    if causal and bug == TOP_LEFT.id:
        return _attend(q, k, v, same & (pk[None, :] <= pq[:, None]))
    if bug == VARLEN_HEADS_RESHAPED.id:
        return _heads_reshaped(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
    if bug == CAUSAL_IGNORED.id:
        causal = False
    if bug == LAST_DROPPED.id:  # each sequence's last query and key left out: those rows 0, the others without it
        kept_q, kept_k = pq < lq - 1, pk < lk - 1
        out = _attend(q, k, v, (same & bottom_right if causal else same) & kept_q[:, None] & kept_k[None, :])
        return out.masked_fill(~kept_q[:, None, None], 0.0).nan_to_num(0.0)
    mask = same & bottom_right if causal else same
    if bug == MAX_OVER_BATCH.id:  # one max per head or for the whole tensor, of the scores masked or not
        return [_attend(q, k, v, mask, shift=(dims, masked)) for dims in ((-2, -1), (0, -2, -1))
                for masked in (True, False)]
    return _attend(q, k, v, mask, unscaled=bug == VARLEN_UNSCALED.id, heads_axis=bug == HEADS_AXIS.id)


def _attend(q, k, v, mask, unscaled=False, heads_axis=False, shift=None):
    """Attention over (total, H, Dh) tensors with a (total_q, total_k) mask; with heads_axis, over the heads of each
    token instead (q[s:e] @ k[s:e].mT on (T, H, Dh), for a sequence with as many queries as keys); `shift`, the
    axes one max is taken over before e^s and whether it is the masked scores' (each row's own, when None)."""
    if heads_axis:
        scores = q @ k.transpose(-2, -1) / math.sqrt(DH)  # (T, H, H): needs total_q = total_k
        return torch.softmax(scores, -1) @ v
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))  # (H, total, Dh)
    scores = (qh @ kh.transpose(-2, -1)) / (1 if unscaled else math.sqrt(DH))  # (H, total_q, total_k)
    masked = scores.masked_fill(~mask, float("-inf"))
    if shift is not None:
        dims, of_masked = shift
        e = (masked - (masked if of_masked else scores).amax(dim=dims, keepdim=True)).exp()
        weights = e / e.sum(-1, keepdim=True)  # 0 / 0 where every e^s underflowed
    else:
        weights = torch.softmax(masked, -1)
    return (weights @ vh).transpose(0, 1)  # (total_q, H, Dh)


def _heads_reshaped(q, k, v, cu_seqlens_q, cu_seqlens_k, causal):
    """Each sequence's (T, H, Dh) rows reshaped to (H, T, Dh), not transposed, and the output reshaped back: every
    head's numbers scrambled across tokens and heads."""
    outs, heads = [], q.shape[1]
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        qs, ks, vs = q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        t_q, t_k = qs.shape[0], ks.shape[0]
        scores = qs.reshape(heads, t_q, -1) @ ks.reshape(heads, t_k, -1).transpose(-2, -1) / math.sqrt(DH)
        if causal:
            seen = torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)
            scores = scores.masked_fill(~seen, float("-inf"))
        out = torch.softmax(scores, -1).nan_to_num(0.0) @ vs.reshape(heads, t_k, -1)
        outs.append(out.reshape(t_q, heads, -1))
    return torch.cat(outs)


def _varlen_mistake(name, message, why=""):
    mistake_id = f"varlen_attention.{name}"
    return Mistake(mistake_id, message, lambda *a, **kw: varlen(*a, **kw, bug=mistake_id), why=why)


CU_AS_LENGTHS = _varlen_mistake(
    "cu_seqlens_as_lengths", "read cu_seqlens as lengths: it holds cumulative starts, sequence b is rows "
    "cu_seqlens[b] up to cu_seqlens[b + 1]", why="flash-attn's cu_seqlens has B + 1 entries, from 0 to the total.")
KEYS_CUT_BY_Q = _varlen_mistake(
    "keys_cut_by_q", "cut the keys by cu_seqlens_q: the keys and values of sequence b are rows cu_seqlens_k[b] up to "
    "cu_seqlens_k[b + 1]", why="The queries may be fewer than the keys: the new tokens of a chunk after a cache.")
BOUNDARY_ROWS = _varlen_mistake(
    "first_row_in_previous_sequence", "each sequence's first row was counted in the sequence before "
    "(searchsorted's right=False): searchsorted(cu_seqlens[1:], rows, right=True)",
    why="A row equal to a boundary cu_seqlens[b] starts sequence b; searchsorted puts it left of that boundary unless "
        "right=True.")
CROSSES = _varlen_mistake(
    "crosses_boundaries", "attended across sequence boundaries (one mask over the whole packed batch, not reset per "
    "sequence): each query sees only its own sequence's keys; cut by cu_seqlens",
    why="Packing puts unrelated sequences side by side: nothing may cross a boundary.")
GLOBAL_POSITIONS = _varlen_mistake(
    "causal_global_positions", "the causal mask used packed rows or the whole batch's offset: compare positions "
    "within each sequence, offset by its own Tk − Tq",
    why="With as many queries as keys both agree; with fewer queries (a chunk after a cache) the rows are offset, and "
        "one offset for the whole batch, total_k − total_q, is right for no sequence but the last.")
TOP_LEFT = _varlen_mistake(
    "causal_top_left", "each sequence's causal mask is aligned to the top-left (query i sees keys 0 … i): align it to "
    "the bottom-right, tril(diagonal=Tk − Tq)",
    why="The queries are the sequence's last Tq tokens, as kv_cache's decode_mask: with Tq queries and Tk keys, "
        "query i sees keys 0 … Tk − Tq + i, as flash-attn aligns it.")
LAST_DROPPED = _varlen_mistake(
    "last_token_dropped", "each sequence's last query and key were left out (rows cu_seqlens[b] to "
    "cu_seqlens[b + 1] - 1 taken as a slice's end): slice q[cu[b]:cu[b + 1]], the end excluded already",
    why="A docstring's inclusive range 'rows cu[b] … cu[b + 1] − 1' is the slice cu[b]:cu[b + 1] in Python.")
CAUSAL_IGNORED = _varlen_mistake("causal_ignored", "causal=True was ignored: mask each sequence's future keys")
VARLEN_UNSCALED = _varlen_mistake("unscaled", "scores not scaled: divide q · kᵀ by √Dh")
VARLEN_HEADS_RESHAPED = _varlen_mistake(
    "heads_reshaped", "each sequence's (T, H, Dh) rows were reshaped to (H, T, Dh), not transposed: "
    "x.transpose(0, 1), and back with transpose(0, 1)",
    why="A reshape keeps the memory's order: it deals one token's heads out as if they were tokens of one head.")
MAX_OVER_BATCH = _varlen_mistake(
    "max_over_batch", "one max for the whole packed batch was subtracted before e^s, so sequences far below it "
    "underflow to 0 / 0: subtract each row's own, amax(-1, keepdim=True)",
    why="Any shift of a row leaves its softmax unchanged in exact arithmetic; in float32 e^-104 is 0, and packed "
        "sequences are unrelated, their scores as far apart as their contents.")
HEADS_AXIS = _varlen_mistake(
    "heads_axis", "attended across the heads of each token (q @ k.mT on (T, H, Dh) is (T, H, H)): move the heads "
    "first, (H, T, Dh)", why="Then q @ k.mT is (H, Tq, Tk): every query against every key, head by head.")

VARLEN_CAUSAL = Mistake("varlen_attention.causal_mishandled", "right without causal, wrong with it: mask within each "
                        "sequence, key j hidden from query i when j > i + Tk - Tq, its own lengths' offset")
VARLEN_LENGTHS = Mistake("varlen_attention.lengths_mishandled", "wrong when a sequence has fewer queries than keys: "
                         "cut q by cu_seqlens_q and k, v by cu_seqlens_k, each sequence by its own offsets")
VARLEN_EVEN = Mistake("varlen_attention.equal_queries_mishandled", "wrong when every sequence has as many queries "
                      "but not as many keys: a path for sequences of one length must check cu_seqlens_k's lengths too")
VARLEN_HALF = Mistake("varlen_attention.half_mishandled", "right in float32, wrong in float16: return q's dtype, and "
                      "fill masked scores with -inf rather than a large number")

VARLEN_APART = Mistake("varlen_attention.sequences_far_apart_mishandled", "right while every sequence's scores are "
                       "alike, wrong when one's are in the hundreds: take each row's own max before e^s, or "
                       "torch.softmax over the keys")
VARLEN_ONE = Mistake("varlen_attention.sequences_mixed", "right for one packed sequence, wrong for several: sequence "
                     "b's queries, keys and values start at its own cu_seqlens offsets, and attend only each other")

def varlen_within_contract(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    """ref.varlen_attention, once cu_seqlens are what the contract says (from 0 to the packed rows, never falling).
    The grader answers a composite's questions with it, in its own process: offsets past the rows given would have
    it build masks of their size (the twenty-sixth and twenty-seventh reviews' [0, 40000], 3.4 GB)."""
    for cu, rows in ((cu_seqlens_q, q.shape[0]), (cu_seqlens_k, k.shape[0])):
        bounds = cu.tolist() if cu.dim() == 1 and cu.numel() <= rows + 1 else []
        falling = any(b < a for a, b in zip(bounds, bounds[1:], strict=False))
        if not bounds or bounds[0] != 0 or bounds[-1] != rows or falling:
            raise ValueError(f"cu_seqlens must run from 0 to the {rows} packed rows, never falling")
    return ref.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)


VARLEN = StepSpec(
    "varlen_attention", varlen_inputs, varlen_within_contract, probes=(Probe({"q_lens": (6,)}, VARLEN_ONE),),
    checks=(
        shape(3), values("packed", 3, FLOATS),
        values("causal_chunks", 3, FLOATS, situation=VARLEN_CAUSAL, q_lens=CHUNK_Q, k_lens=CHUNK_K, causal=True),
        values("causal_prefill", 1, situation=VARLEN_CAUSAL, causal=True),
        values("sequences_far_apart", 1, situation=VARLEN_APART, first_scale=100.0),
        values("fewer_queries", 2, situation=VARLEN_LENGTHS, q_lens=CHUNK_Q, k_lens=CHUNK_K),
        values("equal_queries", 2, situation=VARLEN_EVEN, q_lens=EVEN_Q, k_lens=EVEN_K),
        values("half", 2, (torch.float16,), situation=VARLEN_HALF, q_lens=CHUNK_Q, k_lens=CHUNK_K, causal=True),
        device(2, causal=True),
    ),
    mistakes=(CU_AS_LENGTHS, KEYS_CUT_BY_Q, BOUNDARY_ROWS, CROSSES, GLOBAL_POSITIONS, TOP_LEFT, LAST_DROPPED,
              CAUSAL_IGNORED, VARLEN_UNSCALED, HEADS_AXIS, VARLEN_HEADS_RESHAPED, MAX_OVER_BATCH),
)
