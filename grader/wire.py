"""The wire format between the grader and its worker: JSON headers plus raw bytes, never a pickle.

A frame is a 4-byte big-endian header length, a UTF-8 JSON header, then the raw
bytes of every tensor or array it mentions (their lengths are in the header's "blobs").
A value in a header is plain JSON, or a tagged object:

    {"kind": "tensor",  "dtype": "float32", "shape": [2, 3], "device": "cpu", "blob": 0}
    {"kind": "ndarray", "dtype": "float64", "shape": [4], "blob": 1}
    {"kind": "float", "value": "inf"}          # JSON has no inf or nan
    {"kind": "tuple" | "list", "items": [...]}
    {"kind": "dict", "items": {"name": ...}}
    {"kind": "dtype", "name": "float16"}       # a torch.dtype of TORCH_DTYPES (a KV cache's dtype argument)
    {"kind": "object", "type": "builtins.set"}  # anything else: its type name only

The worker loads this file by path (it may not import the grader package), and both
sides speak through the same functions. torch and numpy are imported inside the codec
because the grader starts the worker before it pays for importing torch.
"""

from __future__ import annotations

import _hashlib
import _json
import hmac
import json
import math
import os
import re
import select
import struct
import time

MAX_HEADER_BYTES = 1 << 20
MAX_BLOB_BYTES = 1 << 28  # 256 MiB a frame: answers are kilobytes, and the grader makes copies of a wrong one
MAX_TYPE_NAME = 120
MAX_DEPTH = 64  # items nested in items: answers are a few deep; a deeper one would overflow the checks' recursion
DEVICE = re.compile(r"(cpu|meta|cuda|mps|xpu|hip)(:[0-9]{1,3})?")  # a tensor's device, as torch names it

# dtypes that may cross, by the names torch and numpy print.
TORCH_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
NUMPY_DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


class WireError(Exception):
    """The other side sent something that is not a well-formed frame."""


class Closed(WireError):
    """The other side closed its end (the worker exited)."""


class TooLarge(WireError):
    """A frame holds more bytes of data than its reader takes; none of them was read."""

    def __init__(self, size: int, limit: int, header: dict):
        super().__init__(f"{size} bytes of data, over the limit of {limit}")
        self.size, self.limit, self.header = size, limit, header


class Timeout(Exception):
    """The deadline passed before a whole frame arrived or left."""


# -- framing ---------------------------------------------------------------------------


def write_frame(fd: int, header: dict, blobs: list[bytes], deadline: float | None = None,
                key: bytes | None = None) -> None:
    """One frame; with `key`, signed (its header's "mac": see `signature`)."""
    header = dict(header, blobs=[len(b) for b in blobs])
    if key is not None:
        header["mac"] = signature(key, header, blobs)
    head = _dumps(header).encode()
    data = b"".join([struct.pack(">I", len(head)), head, *blobs])
    view = memoryview(data)
    while view:
        if deadline is not None:
            _wait(fd, deadline, write=True)
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            continue
        except BrokenPipeError as exc:
            raise Closed("the other side closed the pipe") from exc
        view = view[written:]


def read_frame(fd: int, deadline: float | None = None, max_blob_bytes: int = MAX_BLOB_BYTES,
               key: bytes | None = None) -> tuple[dict, list[bytes]]:
    """One frame. With `max_blob_bytes` (the reader knows how much it can use), a frame holding more bytes of data
    than that raises TooLarge before any of them is read: it costs no copy, and the pipe is left mid-frame (the
    reader drops the writer, or reads past them with `skip`)."""
    (length,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if length > MAX_HEADER_BYTES:
        raise WireError(f"header of {length} bytes is over the limit")
    try:
        header = json.loads(_read_exact(fd, length, deadline))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"header is not JSON: {exc}") from exc
    sizes = header.get("blobs") if isinstance(header, dict) else None
    if not isinstance(sizes, list) or not all(type(n) is int and n >= 0 for n in sizes):
        raise WireError("header has no valid blob sizes")
    if sum(sizes) > min(max_blob_bytes, MAX_BLOB_BYTES):
        raise TooLarge(sum(sizes), min(max_blob_bytes, MAX_BLOB_BYTES), header)
    blobs = [_read_exact(fd, n, deadline) for n in sizes]
    if key is not None:
        mac = header.pop("mac", None)
        if not isinstance(mac, str) or not hmac.compare_digest(mac, signature(key, header, blobs)):
            raise WireError("a frame the worker did not sign (written by the candidate's code to the worker's pipe)")
    return header, blobs


def signature(key: bytes, header: dict, blobs: list[bytes]) -> str:
    """HMAC-SHA256 of a frame's header (without its "mac") and data, under the key the grader gave one worker child.

    The candidate's code shares the child's process and can write to its pipe; it cannot read the key (frames,
    the object graph, ctypes and the process's memory are refused it: grader/sandbox/guard.py), so a frame it
    forges fails here.
    """
    digests = b"".join(_SHA256(blob).digest() for blob in blobs)
    return _HMAC(key, _dumps(header).encode() + digests, "sha256").hex()


# What a worker child signs and writes with, bound when this module loads (before any candidate code): C functions
# of Python's own, which a file that replaces json.dumps, json.JSONEncoder's methods or hmac.new cannot change.
_ENCODE = _json.make_encoder({}, None, _json.encode_basestring_ascii, None, ": ", ", ", False, False, False)
_HMAC, _SHA256 = _hashlib.hmac_digest, _hashlib.openssl_sha256


def _dumps(header: dict) -> str:
    """json.dumps(header, allow_nan=False), byte for byte (checked in tests/test_wire.py)."""
    return "".join(_ENCODE(header, 0))


def _wait(fd: int, deadline: float, write: bool = False) -> None:
    """Until fd can be read (or written), or the deadline. poll, not select: fds may be over 1024."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise Timeout()
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    if not poller.poll(remaining * 1000):
        raise Timeout()


def skip(fd: int, n: int, deadline: float | None = None) -> None:
    """Read `n` bytes and keep none of them (a frame's data its reader refused: see TooLarge)."""
    while n:
        n -= len(_read_exact(fd, min(n, 1 << 20), deadline))


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, missing = [], n
    while missing:
        if deadline is not None:
            _wait(fd, deadline)
        try:
            chunk = os.read(fd, min(missing, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise Closed("the other side closed the pipe")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


# -- values ----------------------------------------------------------------------------


def type_name(value) -> str:
    return type_name_of(type(value))


def type_name_of(cls) -> str:
    """A class's module and name, read by type's own getters: a metaclass of the file's cannot answer them (its
    `__module__` property would run the file's code wherever the worker names a type, the record paused or gone)."""
    module, name = TYPE_MODULE(cls), TYPE_QUALNAME(cls)
    module = module if type(module) is str else "?"
    name = name if type(name) is str else "?"
    return (module + "." + name)[:MAX_TYPE_NAME]


TYPE_MODULE, TYPE_QUALNAME = type.__dict__["__module__"].__get__, type.__dict__["__qualname__"].__get__


def plain(value, depth: int = 0):
    """`value` rebuilt of exact types only, what may cross where nothing records the file's code: None, bool, int,
    float, str, torch.Tensor, torch.dtype, numpy.ndarray, and tuples, lists and str-keyed dicts of them; an
    nn.Parameter becomes a plain tensor, a torch.Size a tuple, a torch.device its name, a NumPy scalar a number.
    Every test is of the exact type, so nothing of the value's own runs here (no property such as `__class__`, no
    `__iter__`, no metaclass); anything else raises TypeError. The worker calls it while the record still runs."""
    b = bound()
    kind = type(value)
    if value is None or kind in (bool, int, float, str) or kind is b.tensor or kind is b.dtype or kind is b.ndarray:
        return value
    if depth >= MAX_DEPTH:
        raise TypeError(f"items nested more than {MAX_DEPTH} deep")
    if kind is tuple or kind is list or kind is b.size:
        items = [plain(v, depth + 1) for v in value]
        return items if kind is list else tuple(items)
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise TypeError("a dict whose keys are not all strings")
        return {k: plain(v, depth + 1) for k, v in dict.items(value)}
    if kind is b.parameter:
        return b.make_plain(b.tensor, b.detach(value))
    if kind is b.device:
        return str(value)
    if kind in b.numpy_scalars:
        return b.item(value)
    raise TypeError(f"a {type_name(value)}: only tensors, arrays, numbers, strings, dtypes, devices, and tuples, "
                    "lists and dicts of them, cross to the grader")


class Bound:
    """What encode reads of torch and NumPy, bound once, before any candidate's code runs (the worker binds it in
    the zygote): the worker encodes an answer after the call, where no record is kept, so nothing it calls may be
    what a file put in place of torch's own (a Tensor method replaced, sys.modules' torch swapped). The methods are
    torch._C.TensorBase's, a C type whose attributes no file can set."""

    __slots__ = ("tensor", "dtype", "uint8", "detach", "to", "contiguous", "reshape", "view",
                 "clone", "to_numpy", "storage", "data_ptr", "dtype_of", "shape_of", "device_of", "grad_of",
                 "equal", "ndarray", "contiguous_array", "isfinite", "size", "parameter", "make_plain", "device",
                 "numpy_scalars", "item")

    def __init__(self):
        import numpy
        import torch

        base = torch._C.TensorBase
        self.tensor, self.dtype, self.uint8 = torch.Tensor, torch.dtype, torch.uint8
        self.detach, self.to, self.contiguous, self.reshape, self.view, self.clone = (
            base.detach, base.to, base.contiguous, base.reshape, base.view, base.clone)
        self.to_numpy, self.storage, self.data_ptr = base.numpy, base.untyped_storage, torch._C.StorageBase.data_ptr
        self.dtype_of, self.shape_of, self.device_of, self.grad_of = (
            base.dtype.__get__, base.shape.__get__, base.device.__get__, base.grad.__get__)
        self.equal, self.ndarray, self.contiguous_array = torch.equal, numpy.ndarray, numpy.ascontiguousarray
        self.isfinite = math.isfinite
        self.size, self.parameter, self.make_plain, self.device = (
            torch.Size, torch.nn.Parameter, torch.Tensor._make_subclass, torch.device)
        numbers = (numpy.bool_, numpy.integer, numpy.floating)
        self.numpy_scalars = frozenset(t for t in numpy.sctypeDict.values() if issubclass(t, numbers))
        self.item = numpy.generic.item


_BOUND: list[Bound] = []


def bound() -> Bound:
    """The codec's torch and NumPy, bound at the first call (`Bound`)."""
    if not _BOUND:
        _BOUND.append(Bound())
    return _BOUND[0]


def encode(value, blobs: list[bytes]):
    """A JSON-able description of `value`; tensor and array bytes are appended to `blobs`."""
    b = bound()
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return value if b.isfinite(value) else {"kind": "float", "value": repr(value)}
    if type(value) in (tuple, list):
        return {"kind": type(value).__name__, "items": [encode(v, blobs) for v in value]}
    if type(value) is dict and all(type(k) is str for k in value):
        return {"kind": "dict", "items": {k: encode(v, blobs) for k, v in value.items()}}
    if type(value) is b.tensor and str(b.dtype_of(value)).removeprefix("torch.") in TORCH_DTYPES:
        tensor = b.detach(value)
        device = b.device_of(tensor)
        out = {
            "kind": "tensor",
            "dtype": str(b.dtype_of(tensor)).removeprefix("torch."),
            "shape": list(b.shape_of(tensor)),
            "device": str(device),
        }
        if device.type != "meta":
            flat = b.reshape(b.contiguous(b.to(tensor, "cpu")), -1)
            if b.data_ptr(b.storage(flat)) == b.data_ptr(b.storage(tensor)):
                flat = b.clone(flat)  # numpy() lends a storage's memory for good (never resizable again): a copy's
            out["blob"] = len(blobs)
            blobs.append(b.to_numpy(b.view(flat, b.uint8)).tobytes())
        return out
    if type(value) is b.dtype and str(value).removeprefix("torch.") in TORCH_DTYPES:
        return {"kind": "dtype", "name": str(value).removeprefix("torch.")}
    if type(value) is b.ndarray and value.dtype.name in NUMPY_DTYPES:
        out = {"kind": "ndarray", "dtype": value.dtype.name, "shape": list(value.shape), "blob": len(blobs)}
        blobs.append(b.contiguous_array(value).tobytes())
        return out
    if type(value) is b.tensor:  # of a dtype no check compares (complex, float8): said, or it reads as a tensor
        return {"kind": "object", "type": f"{type_name(value)} of {str(b.dtype_of(value)).removeprefix('torch.')}"}
    return {"kind": "object", "type": type_name(value)}


def decode(item, blobs: list[bytes], meta: bool = True):
    """The value an `encode` description stands for, checking every field.

    A tensor from a meta device has no bytes and comes back as a meta tensor, where `meta` allows one (an answer to
    a call made on the meta device): elsewhere it is an answer without values, which no check can read.
    Anything the description does not allow raises WireError: among it, items nested deeper than MAX_DEPTH,
    a blob named by two tensors (each would be a copy of its own), and a device that is no device's name.
    """
    return _decode(item, blobs, 0, set(), meta)


def _decode(item, blobs: list[bytes], depth: int, used: set, meta: bool = True):
    import numpy as np
    import torch

    if depth > MAX_DEPTH:
        raise WireError(f"items nested more than {MAX_DEPTH} deep")

    if item is None or type(item) in (bool, int, str):
        return item
    if type(item) is float:
        return item
    if type(item) is list:  # a bare JSON list only appears inside tagged items
        raise WireError("untagged list")
    if type(item) is not dict:
        raise WireError(f"unexpected {type(item).__name__}")
    kind = item.get("kind")
    if kind == "float" and item.get("value") in ("inf", "-inf", "nan"):
        return float(item["value"])
    if kind in ("tuple", "list") and type(item.get("items")) is list:
        items = [_decode(v, blobs, depth + 1, used, meta) for v in item["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict" and type(item.get("items")) is dict:
        return {str(k): _decode(v, blobs, depth + 1, used, meta) for k, v in item["items"].items()}
    if kind == "dtype" and item.get("name") in TORCH_DTYPES:
        return getattr(torch, item["name"])
    if kind == "object":
        return Opaque(_printable_name(str(item.get("type", "?"))[:MAX_TYPE_NAME]))
    if kind in ("tensor", "ndarray"):
        dtypes = TORCH_DTYPES if kind == "tensor" else NUMPY_DTYPES
        dtype, shape = item.get("dtype"), item.get("shape")
        if dtype not in dtypes:
            raise WireError(f"dtype {dtype!r} is not allowed")
        if type(shape) is not list or not all(type(n) is int and 0 <= n < 2**40 for n in shape) or len(shape) > 16:
            raise WireError(f"shape {str(shape)[:80]} is not a list of sizes")
        if math.prod(shape) > MAX_BLOB_BYTES:
            raise WireError(f"shape {shape} is too large")
        device = item.get("device", "cpu")
        if type(device) is not str or not DEVICE.fullmatch(device):
            raise WireError(f"device {_printable_name(str(device))[:40]!r} is no device's name")
        if kind == "tensor" and device.split(":")[0] == "meta":
            if not meta:
                raise WireError("a tensor on the meta device, which holds no values, answered a call made elsewhere")
            return torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
        blob = item.get("blob")
        if type(blob) is not int or not 0 <= blob < len(blobs):
            raise WireError("tensor without its bytes")
        if blob in used:
            raise WireError(f"blob {blob} named by two tensors")
        used.add(blob)
        data = blobs[blob]
        if kind == "ndarray":
            np_dtype = np.dtype(dtype)
            if len(data) != math.prod(shape) * np_dtype.itemsize:
                raise WireError(f"{len(data)} bytes do not fill shape {shape} of {dtype}")
            return np.frombuffer(data, dtype=np_dtype).reshape(shape).copy()
        torch_dtype = getattr(torch, dtype)
        if len(data) != math.prod(shape) * torch_dtype.itemsize:
            raise WireError(f"{len(data)} bytes do not fill shape {shape} of {dtype}")
        if not data:
            tensor = torch.empty(shape, dtype=torch_dtype)
            tensor.worker_device = device[:40]
            return tensor
        # Copied into a storage torch allocates: a worker's record marks a tensor on lent memory (a bytearray's)
        storage = torch.UntypedStorage.from_buffer(data, dtype=torch.uint8)
        tensor = torch.empty(0, dtype=torch.uint8).set_(storage).view(torch_dtype).reshape(shape)
        tensor.worker_device = device[:40]  # where the worker had it; see device_of
        return tensor
    raise WireError(f"unknown kind {kind!r}")


def _printable_name(name: str) -> str:
    """A type name the candidate chose, safe in every report: a newline that would forge a report line, an
    escape sequence, a lone surrogate that no UTF-8 encoder takes, each shown escaped instead."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


class Opaque:
    """A result that was not a tensor or plain data: only its type name crossed."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def device_of(value) -> str:
    """The device a decoded tensor was on in the worker ('cpu', 'cuda:0', 'meta')."""
    if getattr(value, "is_meta", False):
        return "meta"
    return getattr(value, "worker_device", "cpu")
