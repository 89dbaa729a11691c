"""paged_attention's PagedKVCache step: the pool scripts, their record and checks, and the pool's named mistakes.

A pool script builds the candidate's PagedKVCache in one worker, appends to several sequences in
turn, and after each append reads the pool's storage, every sequence's block table and length, and
the free blocks; its record (PoolScript) is the answer the mistakes' tests read, named through
Run.explain. "A stored token never moves" is checked on the storage itself: each token is looked for
at the slot its block table gave it when it was written, after every later append, and a script's
`storage` action says whether k_cache and v_cache still live in the storage they were made in. spec.py beside
this file declares the exercise; the sizes below are shared with it.
"""

from typing import NamedTuple

import torch

from grader.engine import (
    ALWAYS,
    ON_META,
    Call,
    CandidateError,
    CheckFailed,
    Mistake,
    Raises,
    Run,
    Script,
    StepSpec,
    device_of,
    diagnose,
    exactly,
    expect_each,
    expect_result,
    prop,
    type_name,
)

FLOATS = (torch.float32, torch.float64)
H, DH, BLOCK = 2, 3, 4  # heads, head width, tokens a block: three sizes no axis can pass for another
NUM_BLOCKS = 10  # the main script's pool: 7 blocks used, 3 free
SCHEDULE = ((5, 3), (2, 4), (5, 2), (9, 6), (5, 1), (2, 5))  # (seq_id, new tokens): lengths at, before and past a
# block boundary, an append of exactly one block, appends across one and two boundaries (one from inside a block: a
# token's block is table[(length + i) // block_size], not table[length // block_size + i // block_size]),
# interleaved sequences
KV = ("seq_id", "k", "v")
POOL = ("k_cache", "v_cache")


def ceil_blocks(n: int) -> int:
    return -(-n // BLOCK)


def pool_inputs(gen, dtype, schedule=SCHEDULE):
    """The new keys and values of each append of `schedule`, (T, H, Dh) each."""
    ks = [torch.as_tensor(gen.randn(t, H, DH, dtype=dtype)) for _, t in schedule]
    vs = [torch.as_tensor(gen.randn(t, H, DH, dtype=dtype)) for _, t in schedule]
    return Call((ks, vs), names=("keys", "values"))


class Seen(NamedTuple):
    """What the pool showed after one append, and what it should have."""

    index: int
    k_cache: object
    v_cache: object
    storages: object  # where k_cache and v_cache were stored, by the grader's probe
    tables: dict  # seq_id -> what block_table returned
    lengths: dict  # seq_id -> what seq_len returned
    free: object  # what num_free_blocks returned
    keys: dict  # seq_id -> every key appended to it so far, (n, H, Dh)
    values: dict


def _table(value) -> list[int] | None:
    """A block table as a list of ints (a list, a tuple or a 1-D integer tensor), else None."""
    if isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_floating_point() and not value.is_meta:
        value = value.tolist()
    if isinstance(value, (list, tuple)) and all(type(b) is int for b in value):
        return list(value)
    return None


def _gathered(cache, table, n: int):
    """The n tokens a table points at, (n, H, Dh), or None when it cannot point at them."""
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or table is None or len(table) < ceil_blocks(n):
        return None
    if any(not 0 <= b < cache.shape[0] for b in table) or cache.shape[1] < min(n, BLOCK):  # a pool of another layout
        return None
    slots = [(table[t // BLOCK], t % BLOCK) for t in range(n)]
    return cache[[b for b, _ in slots], [s for _, s in slots]] if n else cache[:0, 0]


class PoolScript:
    """A pool built, then the appends of `schedule`, each followed by reads of the storage, the tables, the lengths
    and the free blocks. The answer of a pool check: `seen()` sorts the results out."""

    def __init__(self, run: Run, dtype=torch.float32, schedule=SCHEDULE, num_blocks=NUM_BLOCKS):
        self.dtype, self.schedule, self.num_blocks = dtype, schedule, num_blocks
        self.call = run.inputs(dtype=dtype, schedule=schedule)
        self.ks, self.vs = self.call.args
        script = Script()
        pool = script.build("PagedKVCache", num_blocks, BLOCK, H, DH, dtype=dtype)
        self.built_in = script.storage(pool, POOL)  # where k_cache and v_cache are stored
        self.reads, started = [], []
        for (seq_id, _), k, v in zip(schedule, self.ks, self.vs, strict=True):
            script.call(pool, "append", seq_id, k, v, names=KV)
            started += [seq_id] if seq_id not in started else []
            read = {"k_cache": script.get(pool, "k_cache"), "v_cache": script.get(pool, "v_cache"),
                    "free": script.call(pool, "num_free_blocks"),
                    "storages": script.storage(pool, POOL)}
            read["tables"] = {s: script.call(pool, "block_table", s, names=("seq_id",)) for s in started}
            read["lengths"] = {s: script.call(pool, "seq_len", s, names=("seq_id",)) for s in started}
            self.reads.append(read)
        self.results = run.script(script).value

    def seen(self):
        """One Seen for each append, in order."""
        keys, values = {}, {}
        for i, ((seq_id, _), k, v, read) in enumerate(zip(self.schedule, self.ks, self.vs, self.reads, strict=True)):
            keys[seq_id] = torch.cat([keys[seq_id], k]) if seq_id in keys else k
            values[seq_id] = torch.cat([values[seq_id], v]) if seq_id in values else v
            got = lambda index: self.results[index]  # noqa: E731
            yield Seen(i, got(read["k_cache"]), got(read["v_cache"]), got(read["storages"]),
                       {s: got(j) for s, j in read["tables"].items()}, {s: got(j) for s, j in read["lengths"].items()},
                       got(read["free"]), dict(keys), dict(values))

    def after(self, seen: Seen) -> str:
        return f"after append {seen.index + 1} ({', '.join(f'{s}: +{t}' for s, t in self.schedule[:seen.index + 1])})"


def _grown(record: PoolScript, *_) -> bool:
    shape = (record.num_blocks, BLOCK, H, DH)
    return any(isinstance(s.k_cache, torch.Tensor) and tuple(s.k_cache.shape) != shape for s in record.seen())


def _extra_block(record: PoolScript, *_) -> bool:
    """A sequence whose length fills its last block holds one block more."""
    for s in record.seen():
        for seq_id, keys in s.keys.items():
            table, n = _table(s.tables[seq_id]), len(keys)
            if n % BLOCK == 0 and table is not None and len(table) == n // BLOCK + 1:
                return True
    return False


def _moved(record: PoolScript, *_) -> bool:
    previous: dict = {}
    for s in record.seen():
        for seq_id, table in s.tables.items():
            table = _table(table)
            old = previous.get(seq_id)
            if table is not None and old is not None and table[:len(old)] != old:
                return True
            previous[seq_id] = table
    return False


def _logical(record: PoolScript, *_) -> bool:
    """The sequence just appended to sits at blocks 0, 1, … (its logical blocks), though its table says otherwise."""
    for s in record.seen():
        seq_id = record.schedule[s.index][0]
        keys, table = s.keys[seq_id], _table(s.tables[seq_id])
        logical = list(range(ceil_blocks(len(keys))))
        got = _gathered(s.k_cache, logical, len(keys))
        if table is not None and table[:len(logical)] != logical and got is not None \
                and torch.equal(got.nan_to_num(), keys.to(got.dtype).nan_to_num()):
            return True
    return False


def _values_are_keys(record: PoolScript, *_) -> bool:
    """Every sequence's values, read through its table, are the keys appended to it (v_cache written from k)."""
    found = False
    for s in record.seen():
        for seq_id, keys in s.keys.items():
            got = _gathered(s.v_cache, _table(s.tables.get(seq_id)), len(keys))
            if got is None or got.shape != keys.shape or not torch.allclose(got.double(), keys.double()):
                return False
            found = found or not torch.allclose(keys.double(), s.values[seq_id].double())
    return found


def _wrapped(record: PoolScript, *_) -> bool:
    """An append that crossed a block boundary wrote all its tokens into one block, at slot t % block_size: its first
    token's (the later ones wrapped round onto that block's start) or the table's newest (the earlier ones
    landed past their block's end, in the new one)."""
    for s in record.seen():
        seq_id, t = record.schedule[s.index]
        keys, table = s.keys[seq_id], _table(s.tables[seq_id])
        n = len(keys)
        start = n - t
        if t < 2 or start // BLOCK == (n - 1) // BLOCK or table is None or len(table) <= start // BLOCK:
            continue
        last = {p % BLOCK: p for p in range(start, n)}  # the token each touched slot holds last
        got = _gathered(s.k_cache, [table[start // BLOCK]] * len(last), 0)  # the layout checks alone
        if got is None:
            return False
        blocks = (s.k_cache[table[start // BLOCK]], s.k_cache[table[-1]])
        return any(all(torch.equal(block[slot].nan_to_num(), keys[p].to(block.dtype).nan_to_num())
                       for slot, p in last.items()) for block in blocks)
    return False


def _handed_out_twice(record: PoolScript, *_) -> bool:
    """A block in two live sequences' tables at once, or twice in one's."""
    for s in record.seen():
        held = [block for table in s.tables.values() for block in (_table(table) or [])]
        if len(held) != len(set(held)):
            return True
    return False


def _slots_from_append(record: PoolScript, *_) -> bool:
    """An append that started inside a block wrote its i-th token at slot i % block_size, its index in the append
    rather than its position in the sequence: over the tokens before it."""
    for s in record.seen():
        seq_id, t = record.schedule[s.index]
        keys, table = s.keys[seq_id], _table(s.tables[seq_id])
        n = len(keys)
        start = n - t
        if (start % BLOCK == 0 or table is None or len(table) < ceil_blocks(n)
                or not isinstance(s.k_cache, torch.Tensor)):
            continue
        last = {(table[(start + i) // BLOCK], i % BLOCK): start + i for i in range(t)}  # what each slot holds last
        if any(block >= len(s.k_cache) for block, _ in last):
            return False
        return all(torch.equal(s.k_cache[block, slot].nan_to_num(), keys[p].to(s.k_cache.dtype).nan_to_num())
                   for (block, slot), p in last.items())
    return False


def _slots_counted(record: PoolScript, *_) -> bool:
    return any(s.lengths[i] == ceil_blocks(len(k)) * BLOCK != len(k) for s in record.seen() for i, k in s.keys.items())


def _cache_check(*looks):
    def check(run: Run) -> None:
        record = PoolScript(run)
        expect_each(run, record, record.call, *looks)

    return check


def pool_storage(record: PoolScript) -> None:
    shape = (record.num_blocks, BLOCK, H, DH)
    for s in record.seen():
        for name, pool in (("k_cache", s.k_cache), ("v_cache", s.v_cache)):
            got = tuple(pool.shape) if isinstance(pool, torch.Tensor) else type_name(pool)
            if got != shape:
                raise CheckFailed(f"{record.after(s)}, the pool's {name} is {got}; expected {shape}, "
                                  "(num_blocks, block_size, H, Dh), made once and written in place")
            if pool.dtype != record.dtype:
                raise CheckFailed(f"the pool's {name} is {str(pool.dtype).removeprefix('torch.')}: make it in the "
                                  "dtype asked for", DTYPE_IGNORED)


def pool_dtype(run: Run) -> None:
    """Built in float16, the pool is float16."""
    script = Script()
    pool = script.build("PagedKVCache", 3, BLOCK, H, DH, dtype=torch.float16)
    script.get(pool, "k_cache")
    k_cache = run.script(script).value[1]
    if not isinstance(k_cache, torch.Tensor) or k_cache.dtype != torch.float16:
        got = str(k_cache.dtype).removeprefix("torch.") if isinstance(k_cache, torch.Tensor) else type_name(k_cache)
        raise CheckFailed(f"PagedKVCache(3, {BLOCK}, {H}, {DH}, dtype=torch.float16).k_cache is {got}: make the pool "
                          "in the dtype asked for", DTYPE_IGNORED)


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def pool_contents(record: PoolScript) -> None:
    for s in record.seen():
        for seq_id, keys in s.keys.items():
            table = _table(s.tables[seq_id])
            if table is None:
                raise CheckFailed(f"{record.after(s)}, block_table({seq_id}) returned {type_name(s.tables[seq_id])}; "
                                  "expected a list of ints")
            read = _gathered(s.k_cache, table, len(keys))
            if read is not None and _same(read, s.values[seq_id]) and not _same(keys, s.values[seq_id]):
                raise CheckFailed(f"{record.after(s)}, sequence {seq_id}'s keys read through its block table {table} "
                                  "are its values: k_cache and v_cache are one tensor, so each value overwrote its key",
                                  KV_SHARED)
            for name, pool, want in (("k", s.k_cache, keys), ("v", s.v_cache, s.values[seq_id])):
                got = _gathered(pool, table, len(want))
                if got is None:
                    raise CheckFailed(f"{record.after(s)}, sequence {seq_id} holds {len(want)} tokens, and its block "
                                      f"table {table} cannot point at them in a pool of {record.num_blocks} blocks")
                expect_result(f"{record.after(s)}, sequence {seq_id}'s {name} read through its block table {table} "
                              f"(token t at [table[t // {BLOCK}], t % {BLOCK}])", got, want)


def block_tables(record: PoolScript) -> None:
    for s in record.seen():
        held: dict[int, int] = {}
        for seq_id, keys in s.keys.items():
            table, n = _table(s.tables[seq_id]), len(keys)
            if table is None or len(table) != ceil_blocks(n):
                shown = table if table is not None else type_name(s.tables[seq_id])
                raise CheckFailed(f"{record.after(s)}, sequence {seq_id} holds {n} tokens and its block table is "
                                  f"{shown}; expected ceil({n} / {BLOCK}) = {ceil_blocks(n)} blocks")
            for block in table:
                if not 0 <= block < record.num_blocks or block in held:
                    why = "outside the pool" if block not in held else f"sequence {held[block]}'s too"
                    raise CheckFailed(f"{record.after(s)}, block {block} of sequence {seq_id} is {why}: a block "
                                      "belongs to one sequence at a time")
                held[block] = seq_id


def seq_lens(record: PoolScript) -> None:
    for s in record.seen():
        for seq_id, keys in s.keys.items():
            if type(s.lengths[seq_id]) is not int or s.lengths[seq_id] != len(keys):
                raise CheckFailed(f"{record.after(s)}, seq_len({seq_id}) is {s.lengths[seq_id]!r}; expected "
                                  f"{len(keys)}, the tokens appended to it")


def free_counts(record: PoolScript) -> None:
    for s in record.seen():
        used = sum(ceil_blocks(len(k)) for k in s.keys.values())
        if type(s.free) is not int or s.free != record.num_blocks - used:
            raise CheckFailed(f"{record.after(s)}, num_free_blocks() is {s.free!r}; expected {record.num_blocks} − "
                              f"{used} held = {record.num_blocks - used}")


def tokens_stay(record: PoolScript) -> None:
    """Every token stays at the slot its block table gave it when it was written, in the same storage."""
    where: dict = {}  # seq_id -> the table it had when its tokens were written
    for s in record.seen():
        for seq_id in s.keys:
            table = _table(s.tables[seq_id])
            old = where.get(seq_id)
            if old is not None and (table is None or table[:len(old)] != old):
                raise CheckFailed(f"{record.after(s)}, sequence {seq_id}'s block table went from {old} to {table}: "
                                  "its stored tokens moved; a table only grows at its end", TOKENS_MOVED)
            where[seq_id] = table
        for seq_id, table in where.items():  # what was written at each token's first slot is still there
            keys = s.keys[seq_id]
            got = _gathered(s.k_cache, table, len(keys))
            if got is None or not torch.equal(got.nan_to_num(), keys.to(got.dtype).nan_to_num()):
                raise CheckFailed(f"{record.after(s)}, sequence {seq_id}'s keys are no longer at the slots its block "
                                  f"table {table} gave them: a stored token never moves",
                                  _named(record, ((_logical, LOGICAL_WRITTEN), (_wrapped, WRAPPED),
                                                  (_slots_from_append, SLOTS_FROM_APPEND)), TOKENS_MOVED))


def _named(record: PoolScript, tests, otherwise: Mistake) -> Mistake:
    """The mistake of the first test that holds of the record, else `otherwise`. A test that cannot read the pool (a
    layout of its own: heads before slots, the fortieth review's f02) holds nothing: the failure stands as it is."""
    for test, mistake in tests:
        try:
            if test(record):
                return mistake
        except Exception:  # the candidate's pool, read as the contract's layout
            continue
    return otherwise


def in_place(record: PoolScript) -> None:
    """k_cache and v_cache stay where they were made: every append writes into the same storage."""
    first = record.results[record.built_in]
    if not isinstance(first, list) or None in first:  # a property's, made anew at each read (the fortieth review's f04)
        raise CheckFailed("the pool's k_cache or v_cache is no torch.Tensor it keeps itself (an attribute, a slot or a "
                          "buffer): keep both as tensors, made once and written in place", STORAGE_REPLACED)
    for s in record.seen():
        if s.storages != first:
            grown = isinstance(s.k_cache, torch.Tensor) and tuple(s.k_cache.shape) != (record.num_blocks, BLOCK, H, DH)
            raise CheckFailed(f"{record.after(s)}, the pool's k_cache or v_cache is stored elsewhere than where it was "
                              "made: write into them in place (indexing assignment, index_put_, copy_)",
                              GROWN_BY_CAT if grown else STORAGE_REPLACED)


def pool_on_device(run: Run) -> None:
    where = run.ctx.device
    script = Script()
    pool = script.build("PagedKVCache", 3, BLOCK, H, DH, **({"device": where} if where != "cpu" else {}))
    script.get(pool, "k_cache")
    script.get(pool, "v_cache")
    for name, buffer in zip(("k_cache", "v_cache"), run.script(script, device=where).value[1:], strict=True):
        got = device_of(buffer) if isinstance(buffer, torch.Tensor) else type_name(buffer)
        if got.split(":")[0] != where.split(":")[0]:
            raise CheckFailed(f"PagedKVCache(..., device={where!r}).{name} is on {got}: make the pool on the device "
                              "asked for", diagnose.RESULT_ON_CPU)


def _refusal_script(run: Run) -> dict:
    """A pool of 4 blocks: sequence 7 takes 6 tokens (2 blocks), sequence 2 takes 4 (exactly 1 block); then 7 asks for
    7 more (13 tokens: 4 blocks, 2 more than it holds, 1 free). What it showed before and after, once 2 takes 4
    more (8 in all: exactly the 1 block left), and once 7 takes 2 more with no block free (the room left in its
    last block)."""
    (k1, k2, k3, k4, k5), (v1, v2, v3, v4, v5) = run.inputs(schedule=((7, 6), (2, 4), (7, 7), (2, 4), (7, 2))).args
    script = Script()
    pool = script.build("PagedKVCache", 4, BLOCK, H, DH)
    script.call(pool, "append", 7, k1, v1, names=KV)
    script.call(pool, "append", 2, k2, v2, names=KV)

    def reads():
        return {"k_cache": script.get(pool, "k_cache"), "v_cache": script.get(pool, "v_cache"),
                "table7": script.call(pool, "block_table", 7), "table2": script.call(pool, "block_table", 2),
                "len7": script.call(pool, "seq_len", 7), "free": script.call(pool, "num_free_blocks")}

    before = reads()
    error = script.call(pool, "append", 7, k3, v3, names=KV, may_raise=True)
    after = reads()
    fits = script.call(pool, "append", 2, k4, v4, names=KV, may_raise=True)
    last = reads()
    room = script.call(pool, "append", 7, k5, v5, names=KV, may_raise=True)
    roomed = reads()
    results = run.script(script).value
    pick = lambda read: {name: results[i] for name, i in read.items()}  # noqa: E731
    return {"before": pick(before), "error": results[error], "after": pick(after), "fits": results[fits],
            "last": pick(last), "room": results[room], "roomed": pick(roomed), "k": (k1, k2, k4, k5),
            "v": (v1, v2, v4, v5)}


def out_of_blocks(run: Run) -> None:
    error = _refusal_script(run)["error"]
    if not isinstance(error, CandidateError):
        raise CheckFailed("a pool of 4 blocks holding 3 (2 of sequence 7's) took 7 more tokens for sequence 7, which "
                          "need 2 more blocks, without complaint: raise RuntimeError", OUT_OF_BLOCKS_NOT_REFUSED)
    if error.type != "RuntimeError":
        raise CheckFailed(f"an append the pool had no blocks for raised {error.message}; the contract says "
                          "RuntimeError, raised before anything changes", OUT_OF_BLOCKS_NOT_REFUSED)


def unchanged_after_refusal(run: Run) -> None:
    seen = _refusal_script(run)
    before, after = seen["before"], seen["after"]
    for name in ("table7", "table2", "len7", "free"):
        plain = _table if name.startswith("table") else (lambda x: x if type(x) is int else type_name(x))
        if plain(after[name]) != plain(before[name]):
            raise CheckFailed(f"the refused append changed the pool: {name.replace('7', '(7)').replace('2', '(2)')} "
                              f"went from {before[name]!r} to {after[name]!r}; check first, then take blocks and "
                              "write", CHANGED_BEFORE_RAISING)
    for name in ("k_cache", "v_cache"):
        old, new = before[name], after[name]
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.shape == new.shape
                and torch.equal(old.nan_to_num(), new.nan_to_num())):
            raise CheckFailed(f"the refused append wrote into the pool's {name}: check first, then write",
                              CHANGED_BEFORE_RAISING)
    if isinstance(seen["fits"], CandidateError):  # the pool is as it was, so the exact fit itself was refused
        extra = len(_table(before["table2"]) or ()) > 1  # 4 tokens in 2 blocks: the count is one too many
        raise CheckFailed(f"after the refused append (which changed nothing), sequence 2 could not take 4 more tokens "
                          f"(8 in all: exactly 1 more block, and 1 is free): {seen['fits'].message}"
                          + (f"; its 4 tokens held blocks {before['table2']!r}" if extra else ""),
                          EXTRA_BLOCK if extra else EXACT_FIT_REFUSED)
    _expect_held(seen["last"], {7: (seen["k"][0], 6, "table7"), 2: (torch.cat(seen["k"][1:3]), 8, "table2")},
                 "after the refused append and one that fits")
    if isinstance(seen["room"], CandidateError):
        raise CheckFailed(f"with no block free, sequence 7 (6 tokens in 2 blocks of {BLOCK}) could not take 2 more, "
                          f"which fit in its last block: {seen['room'].message}", ROOM_IGNORED)
    _expect_held(seen["roomed"], {7: (torch.cat([seen["k"][0], seen["k"][3]]), 8, "table7")},
                 "after sequence 7 took 2 more tokens into the room left in its last block")


def _expect_held(read: dict, sequences: dict, when: str, appended=None) -> None:
    """Each sequence's keys read through its table are the ones appended to it; `appended`, every key the script
    appended, (m, H, Dh): a sequence whose wrong rows are its keys plus some key appended earlier (a block handed
    out again still holds its last owner's) added its tokens to what the slots held."""
    for seq_id, (keys, n, table_name) in sequences.items():
        table = _table(read[table_name])
        got = _gathered(read["k_cache"], table, n)
        if got is None:
            raise CheckFailed(f"{when}, sequence {seq_id}'s block table {read[table_name]!r} cannot point at its {n} "
                              "tokens")
        if isinstance(got, torch.Tensor) and got.dtype != keys.dtype:  # each pool here is built with no dtype
            raise CheckFailed(f"{when}, the pool is {str(got.dtype).removeprefix('torch.')}: built with no dtype, "
                              "it is the contract's default, float32", DEFAULT_DTYPE)
        try:
            expect_result(f"{when}, sequence {seq_id}'s keys read through its block table", got, keys)
        except CheckFailed as failure:
            if appended is not None and _added(got, keys, appended):
                raise CheckFailed(failure.message, ADDED_NOT_WRITTEN, failure.details) from None
            raise


def _added(got, keys, appended) -> bool:
    """Every wrong row of `got` is its key plus one of the keys `appended` (to within float32's rounding)."""
    if not isinstance(got, torch.Tensor) or got.shape != keys.shape or not got.is_floating_point():
        return False
    got, keys, appended = got.double().flatten(1), keys.double().flatten(1), appended.double().flatten(1)
    wrong = ~torch.isclose(got, keys, rtol=1e-4, atol=1e-5).all(-1)
    if not bool(wrong.any()):
        return False
    extra = (got - keys)[wrong]  # (w, H·Dh)
    return bool(torch.isclose(extra[:, None], appended[None], rtol=1e-4, atol=1e-5).all(-1).any(-1).all())


def free_returns_blocks(run: Run) -> None:
    """A pool of 9 blocks: sequences 1 (9 tokens, 3 blocks) and 2 (8, 2 blocks); 1 is freed; 3 takes 13 (4 blocks);
    then the freed id 1 comes back with 5 tokens: a new sequence, 2 fresh blocks of its own."""
    (k1, k2, k3, k4), (v1, v2, v3, v4) = run.inputs(schedule=((1, 9), (2, 8), (3, 13), (1, 5))).args
    script = Script()
    pool = script.build("PagedKVCache", 9, BLOCK, H, DH)
    script.call(pool, "append", 1, k1, v1, names=KV)
    script.call(pool, "append", 2, k2, v2, names=KV)
    held = script.call(pool, "block_table", 2, may_raise=True)
    script.call(pool, "free", 1, names=("seq_id",))
    kept = script.call(pool, "block_table", 2, may_raise=True)
    free = script.call(pool, "num_free_blocks")
    taken = script.call(pool, "append", 3, k3, v3, names=KV, may_raise=True)
    reused = script.call(pool, "append", 1, k4, v4, names=KV, may_raise=True)
    read = {"k_cache": script.get(pool, "k_cache"), "table3": script.call(pool, "block_table", 3, may_raise=True),
            "table2": script.call(pool, "block_table", 2, may_raise=True),
            "table1": script.call(pool, "block_table", 1, may_raise=True),
            "len1": script.call(pool, "seq_len", 1, may_raise=True)}  # said below, after what explains them
    results = run.script(script).value
    read = {name: results[i] for name, i in read.items()}
    table2 = _table(read["table2"])
    if not exactly(results[free], 7):
        extra = table2 is not None and len(table2) > 2  # 8 tokens in more than 2 blocks: the count, not free
        raise CheckFailed(f"a pool of 9 blocks held 3 for sequence 1 (9 tokens) and 2 for sequence 2 (8 tokens); "
                          f"after free(1), num_free_blocks() is {results[free]!r}; expected 7"
                          + (f" (sequence 2's table is {table2})" if extra else ": free returns the sequence's blocks"),
                          EXTRA_BLOCK if extra else FREE_KEEPS_BLOCKS)
    before, after = _table(results[held]), _table(results[kept])
    if before is not None and after != before:
        raise CheckFailed(f"free(1) changed sequence 2's block table from {before} to {results[kept]!r}: its tokens "
                          "were moved, where a stored token never moves", FREE_MOVES_TOKENS)
    if isinstance(results[taken], CandidateError):
        raise CheckFailed(f"after free(1), 7 blocks are free, but 13 tokens (4 blocks) for a new sequence were "
                          f"refused: {results[taken].message}", FREE_KEEPS_BLOCKS)
    table1, table3 = _table(read["table1"]), _table(read["table3"]) or []
    reuse = "after free(1), sequence 3's 13 tokens, and 5 tokens for the freed id 1"
    if (isinstance(results[reused], CandidateError) or table1 is None or len(table1) != 2
            or not exactly(read["len1"], 5) or set(table1) & set(table3 + (table2 or []))):
        got = results[reused].message if isinstance(results[reused], CandidateError) else \
            f"its table is {read['table1']!r} and seq_len {read['len1']!r}; expected 2 blocks of its own and 5"
        raise CheckFailed(f"{reuse}: {got}", FREE_KEEPS_SEQUENCE)
    _expect_held(read, {1: (k4, 5, "table1"), 2: (k2, 8, "table2"), 3: (k3, 13, "table3")}, reuse,
                 appended=torch.cat([k1, k2, k3]))


def tables_in_order(run: Run) -> None:
    """A full pool of 4 blocks, one for each of sequences 1 to 4 (4 tokens each); 1 and 4 are freed, then 2 and 3
    take 2 more tokens each: each takes one of the freed blocks, which for one of them (whatever order blocks are
    handed out in) lies below its first. Its block table lists its blocks in the order of its tokens."""
    (k1, k2, k3, k4, k2b, k3b), (v1, v2, v3, v4, v2b, v3b) = run.inputs(
        schedule=((1, 4), (2, 4), (3, 4), (4, 4), (2, 2), (3, 2))).args
    script = Script()
    pool = script.build("PagedKVCache", 4, BLOCK, H, DH)
    for seq_id, k, v in ((1, k1, v1), (2, k2, v2), (3, k3, v3), (4, k4, v4)):
        script.call(pool, "append", seq_id, k, v, names=KV)
    script.call(pool, "free", 1, names=("seq_id",))
    script.call(pool, "free", 4, names=("seq_id",))
    script.call(pool, "append", 2, k2b, v2b, names=KV)
    script.call(pool, "append", 3, k3b, v3b, names=KV)
    read = {"k_cache": script.get(pool, "k_cache"), "table2": script.call(pool, "block_table", 2),
            "table3": script.call(pool, "block_table", 3)}
    results = run.script(script).value
    read = {name: results[i] for name, i in read.items()}
    when = "after sequences 1 and 4 of a full pool were freed and 2 and 3 grew into their blocks"
    try:
        _expect_held(read, {2: (torch.cat([k2, k2b]), 6, "table2"), 3: (torch.cat([k3, k3b]), 6, "table3")}, when,
                     appended=torch.cat([k1, k4]))
    except CheckFailed as failure:
        # the right blocks, listed in another order than the tokens': by their physical index
        reordered = any(_held(read["k_cache"], (_table(read[name]) or [])[::-1], keys)
                        for name, keys in (("table2", torch.cat([k2, k2b])), ("table3", torch.cat([k3, k3b]))))
        raise CheckFailed(failure.message, TABLE_SORTED if reordered else failure.mistake, failure.details) from None


def _held(cache, table, keys) -> bool:
    got = _gathered(cache, table, keys.shape[0])
    return isinstance(got, torch.Tensor) and got.shape == keys.shape and bool(torch.allclose(got, keys))


ADDED_NOT_WRITTEN = Mistake(
    "PagedKVCache.added_not_written", "the new tokens were added to what their slots held (+=, or index_put_ with "
    "accumulate=True): write them, k_cache[blocks, slots] = k",
    why="A fresh pool of zeros hides it: a block freed and handed out again still holds its last owner's tokens "
        "(blind set 60's b13).")
DEFAULT_DTYPE = Mistake(
    "PagedKVCache.default_dtype", "a pool built with no dtype was not float32: keep the stub's default, "
    "dtype=torch.float32")
GROWN_BY_CAT = Mistake(
    "PagedKVCache.grown_by_cat", "the pool grows (torch.cat onto it, or a new tensor per append): make k_cache and "
    "v_cache once, (num_blocks, block_size, H, Dh), and write into their blocks",
    why="A pool of fixed size is the point: its memory is reserved once, blocks are handed out and taken back, and a "
        "copy of the whole pool per token would cost more than the attention.", test=_grown)
EXTRA_BLOCK = Mistake(
    "PagedKVCache.extra_block_at_boundary", "took a block one token early: n // block_size + 1 blocks is one too many "
    "when n fills its last block; hold ceil(n / block_size), -(-n // block_size)",
    why="At a block boundary the last block is full but still the sequence's last: the next token takes a new one.",
    test=_extra_block)
EVERY_BLOCK_TAKEN = Mistake(
    "PagedKVCache.every_block_taken_for_none", "took free[-n:] blocks, and with n = 0 that slice is every free block: "
    "take none when n is 0 (if n: ..., or free[len(free) - n:])",
    why="-0 is 0, so free[-0:] is free[0:]: an append that fills no new block empties the pool.",
    raises=Raises(message=r"block|free", source=r"\[\s*-\s*\w+\s*:\s*\]"))
LAST_BLOCK_MISSING = Mistake(
    "PagedKVCache.last_block_not_allocated", "took a block one token late (n // block_size blocks: the last, partly "
    "filled block is never taken): hold ceil(n / block_size) blocks",
    raises=Raises(types=("IndexError",), message=r"out of range|out of bounds"))
CROSSES_BLOCK = Mistake(
    "PagedKVCache.append_written_as_one_slice", "wrote an append's T tokens as one slice of one block: past its end "
    "they belong in the next block; write token by token, or by (block, slot) index tensors",
    raises=Raises(message=r"shape mismatch|must match the size|expanded size|broadcast"))
VALUES_ARE_KEYS = Mistake(
    "PagedKVCache.values_written_from_keys", "the values' pool holds the keys: append writes v into v_cache, "
    "v_cache[blocks, slots] = v (a copied line kept its k)", test=_values_are_keys)
HANDED_OUT_TWICE = Mistake(
    "PagedKVCache.block_handed_out_twice", "one block was handed to two sequences (or twice to one): remove from the "
    "free list the very blocks an append takes (free[:n] taken, free[:n] removed)",
    why="The count of free blocks stays right when as many are removed as taken; removing others leaves the taken "
        "ones free, and the next append writes over their tokens (blind set 56's b18).", test=_handed_out_twice)
WRAPPED = Mistake(
    "PagedKVCache.append_wrapped_in_one_block", "an append crossing a block boundary wrote every token into one "
    "block (its first token's, or the newest): look each token's block up, table[t // block_size]",
    why="At slot t % block_size of that one block, the tokens past the boundary overwrite the block's start.",
    test=_wrapped)
SLOTS_FROM_APPEND = Mistake(
    "PagedKVCache.slot_from_append_index", "a token's slot came from its index in this append, not its position in "
    "the sequence: token seq_len + i goes to slot (seq_len + i) % block_size", test=_slots_from_append,
    why="An append that starts inside a block then writes over the tokens already there.")
KV_SHARED = Mistake(
    "PagedKVCache.keys_and_values_shared", "k_cache and v_cache are one tensor (a = b = torch.zeros(...)): each value "
    "overwrote its key; make each pool its own tensor")
TOKENS_MOVED = Mistake(
    "PagedKVCache.tokens_moved", "stored tokens moved on append (new blocks for the whole sequence, copied): keep "
    "each token where it was written; take blocks only for the new tokens, at the table's end",
    why="Other readers hold block tables (a batch in flight, a shared prompt): a token must stay at its slot.",
    test=_moved)
LOGICAL_WRITTEN = Mistake(
    "PagedKVCache.logical_block_written", "wrote token t into block t // block_size, its logical block: write it into "
    "the physical block its table gives, table[t // block_size]",
    why="Every sequence's logical block 0 is the pool's block 0: sequences then overwrite each other.", test=_logical)
SLOTS_COUNTED = Mistake(
    "PagedKVCache.seq_len_counts_slots", "seq_len counted the slots of the sequence's blocks: count its tokens, which "
    "fill its last block only partly", test=_slots_counted)
STORAGE_REPLACED = Mistake(
    "PagedKVCache.storage_replaced", "an append made a new k_cache or v_cache (clone, index_put or scatter without "
    "the underscore, torch.where): write into the pool in place, k_cache[blocks, slots] = k",
    why="The pool is the server's memory: a copy of all of it per token costs more than the attention, and every "
        "reader of the old tensor is left behind.")
OUT_OF_BLOCKS_NOT_REFUSED = Mistake(
    "PagedKVCache.out_of_blocks_not_refused", "an append with too few free blocks was not refused with RuntimeError: "
    "count the blocks it needs first, and raise RuntimeError if fewer are free",
    why="Without the check, popping an empty free list raises IndexError, after part of the append is done.")
CHANGED_BEFORE_RAISING = Mistake(
    "PagedKVCache.changed_before_raising", "the refused append changed the pool (blocks taken, tokens written, "
    "length advanced) before raising: count the blocks needed, raise, and only then take blocks and write",
    why="A server that runs out of blocks preempts a sequence and goes on: the pool must be as it was.")
EXACT_FIT_REFUSED = Mistake(
    "PagedKVCache.exact_fit_refused", "an append needing exactly the free blocks was refused: raise only when the "
    "blocks needed exceed the free ones (needed > free, not >=)",
    why="An off-by-one in the capacity check wastes the pool's last block, and a server then preempts for nothing.")
ROOM_IGNORED = Mistake(
    "PagedKVCache.room_in_last_block_ignored", "an append that fits in the room left in its last block was refused: "
    "it needs ceil((seq_len + T) / block_size) − len(table) new blocks",
    why="Counting ceil(T / block_size) ignores the room left: a decoding sequence adds one token at a time, and most "
        "of its appends need no new block at all.")
FREE_KEEPS_BLOCKS = Mistake(
    "PagedKVCache.free_keeps_blocks", "free did not return the sequence's blocks: put every block "
    "of its table back on the free list",
    why="A finished sequence's blocks must serve the next ones at once; otherwise the pool leaks until it is empty.")
FREE_MOVES_TOKENS = Mistake(
    "PagedKVCache.free_moves_tokens", "free moved other sequences' tokens (the pool compacted into the freed blocks): "
    "leave their blocks and tables as they are; a freed block only goes back on the free list",
    why="A block table is the one map from a token to its slot, and readers hold it (a batch in flight): paging "
        "needs no compaction, any free block serves the next append (blind set 57's b24).")
FREE_KEEPS_SEQUENCE = Mistake(
    "PagedKVCache.free_keeps_sequence", "free returned the blocks but kept the sequence's table or length: forget "
    "the sequence too, so a reused id starts empty with fresh blocks",
    why="Ids are reused by servers. A kept table points at blocks now on the free list, so the reused sequence "
        "writes over whoever took them next.")
TABLE_SORTED = Mistake(
    "PagedKVCache.table_not_in_token_order", "block_table listed the blocks by physical index, not in the tokens' "
    "order: entry i is the block holding tokens i·block_size onwards",
    why="After a free, a growing sequence may take a block below its first: its table maps logical blocks, in order.")
DTYPE_IGNORED = Mistake(
    "PagedKVCache.dtype_ignored", "the pool ignores the dtype argument (torch.zeros(shape) is "
    "float32): pass dtype= and device= when you make k_cache and v_cache")

# What a check's failure says when the pool's contents are right and no listed mistake explains it (the other checks
# name each of their failures).
TABLES_WRONG = Mistake("PagedKVCache.tables_mishandled", "right contents, wrong block tables: row b lists sequence "
                       "b's physical blocks in token order, then -1; a new block is taken only when the last fills")
COUNTS_WRONG = Mistake("PagedKVCache.counts_mishandled", "right contents, wrong counts: seq_len is the tokens "
                       "appended to that sequence, num_free_blocks the blocks no sequence holds")

CACHE = StepSpec(
    "PagedKVCache", pool_inputs, lambda ks, vs: None, prefix="pool", plain="contents",
    checks=(
        prop("storage", 2, _cache_check(pool_storage)), prop("dtype", 1, pool_dtype),
        prop("contents", 4, _cache_check(pool_contents)),
        prop("block_tables", 2, _cache_check(block_tables), situation=TABLES_WRONG),
        prop("tables_in_order", 2, tables_in_order, situation=TABLES_WRONG),
        prop("seq_len", 2, _cache_check(seq_lens), situation=COUNTS_WRONG),
        prop("free_blocks", 2, _cache_check(free_counts), situation=COUNTS_WRONG),
        prop("tokens_stay", 3, _cache_check(tokens_stay)),
        prop("in_place", 2, _cache_check(in_place), gated=ALWAYS),  # kept by one writing nothing
        prop("out_of_blocks", 3, out_of_blocks, gated=ALWAYS),
        prop("unchanged_after_refusal", 3, unchanged_after_refusal), prop("free", 2, free_returns_blocks),
        prop("device", 2, pool_on_device, gated=ON_META),
    ),
    mistakes=(VALUES_ARE_KEYS, GROWN_BY_CAT, STORAGE_REPLACED, HANDED_OUT_TWICE, EXTRA_BLOCK, LAST_BLOCK_MISSING,
              CROSSES_BLOCK, LOGICAL_WRITTEN, WRAPPED, SLOTS_FROM_APPEND, TOKENS_MOVED, KV_SHARED, SLOTS_COUNTED,
              OUT_OF_BLOCKS_NOT_REFUSED, CHANGED_BEFORE_RAISING, EXACT_FIT_REFUSED, ROOM_IGNORED, FREE_KEEPS_BLOCKS,
              FREE_MOVES_TOKENS, FREE_KEEPS_SEQUENCE, DTYPE_IGNORED, TABLE_SORTED, EVERY_BLOCK_TAKEN, DEFAULT_DTYPE,
              ADDED_NOT_WRITTEN),
)
