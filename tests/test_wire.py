"""The wire format: what crosses round-trips exactly, and what is malformed is refused, never unpickled."""

import json
import os
import struct

import numpy as np
import pytest
import torch

from grader import wire


def roundtrip(value):
    blobs = []
    header = wire.encode(value, blobs)
    return wire.decode(json.loads(json.dumps(header)), blobs)


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_round_trip_bit_exactly(dtype):
    x = (torch.randn(3, 4, 5) * 100).to(dtype).transpose(0, 2)  # non-contiguous on the way in
    y = roundtrip(x)
    assert type(y) is torch.Tensor and y.dtype == dtype and y.shape == x.shape and torch.equal(y, x)


def test_plain_data_round_trips():
    value = {"a": [1, 2.5, None, True, "s"], "b": (float("inf"), float("-inf")), "c": np.arange(6.0).reshape(2, 3)}
    out = roundtrip(value)
    assert out["a"] == [1, 2.5, None, True, "s"] and out["b"] == (float("inf"), float("-inf"))
    assert isinstance(out["c"], np.ndarray) and np.array_equal(out["c"], value["c"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_dtypes_cross_by_name(dtype):
    assert roundtrip(dtype) is dtype
    assert roundtrip({"dtype": dtype})["dtype"] is dtype


def test_meta_tensors_cross_without_bytes():
    blobs = []
    header = wire.encode(torch.empty(2, 3, device="meta"), blobs)
    assert blobs == [] and wire.device_of(wire.decode(header, blobs)) == "meta"


class Liar(torch.Tensor):
    pass


@pytest.mark.parametrize("value, type_name", [
    (Liar(), "Liar"),
    (torch.nn.Parameter(torch.ones(2)), "Parameter"),
    ({1, 2}, "builtins.set"),
    (object(), "builtins.object"),
    (torch.ones(2, dtype=torch.complex64), "torch.Tensor"),
])
def test_anything_else_crosses_as_its_type_name_only(value, type_name):
    out = roundtrip(value)
    assert isinstance(out, wire.Opaque) and type_name in out.type_name


@pytest.mark.parametrize("header, blobs", [
    ({"kind": "tensor", "dtype": "object", "shape": [1], "blob": 0}, [b"x" * 8]),
    ({"kind": "tensor", "dtype": "float32", "shape": [2], "blob": 0}, [b"x" * 4]),
    ({"kind": "tensor", "dtype": "float32", "shape": [-1], "blob": 0}, [b""]),
    ({"kind": "tensor", "dtype": "float32", "shape": [1], "blob": 3}, [b"xxxx"]),
    ({"kind": "pickle", "data": "gASVAAAAAAAAAAA="}, []),
    ({"kind": "dtype", "name": "complex64"}, []),
    ({"kind": "dtype", "name": "__class__"}, []),
    ([1, 2], []),
])
def test_malformed_descriptions_are_refused(header, blobs):
    with pytest.raises(wire.WireError):
        wire.decode(header, blobs)


def test_frames_round_trip_and_bad_frames_are_refused():
    r, w = os.pipe()
    wire.write_frame(w, {"op": "call"}, [b"abc", b""])
    assert wire.read_frame(r) == ({"op": "call", "blobs": [3, 0]}, [b"abc", b""])
    os.write(w, struct.pack(">I", 5) + b"nope!")
    with pytest.raises(wire.WireError):
        wire.read_frame(r)
    os.write(w, struct.pack(">I", wire.MAX_HEADER_BYTES + 1))
    with pytest.raises(wire.WireError):
        wire.read_frame(r)
    os.close(w)
    with pytest.raises(wire.Closed):
        wire.read_frame(r)
    os.close(r)


def test_a_silent_peer_times_out():
    import time
    r, w = os.pipe()
    with pytest.raises(wire.Timeout):
        wire.read_frame(r, deadline=time.monotonic() + 0.2)
    os.close(r), os.close(w)


def test_a_frame_is_signed_and_one_without_the_signature_is_refused():
    key = os.urandom(32)
    read, write = os.pipe()
    try:
        wire.write_frame(write, {"ok": True, "value": 1}, [b"abc"], key=key)
        assert wire.read_frame(read, key=key) == ({"ok": True, "value": 1, "blobs": [3]}, [b"abc"])
        wire.write_frame(write, {"ok": True, "value": 1}, [b"abc"])  # the candidate's code, which has no key
        with pytest.raises(wire.WireError, match="did not sign"):
            wire.read_frame(read, key=key)
        wire.write_frame(write, {"ok": True, "value": 1}, [b"abc"], key=os.urandom(32))  # a key of its own
        with pytest.raises(wire.WireError, match="did not sign"):
            wire.read_frame(read, key=key)
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("item, blobs, why", [
    ({"kind": "tuple", "items": [{"kind": "tensor", "dtype": "float32", "shape": [1], "device": "cpu", "blob": 0}] * 2},
     [bytes(4)], "named by two tensors"),  # one blob, copied once per name: a grader's memory multiplied
    ({"kind": "tensor", "dtype": "float32", "shape": [1], "device": "cpu\n  ✓ softmax FORGED", "blob": 0},
     [bytes(4)], "no device's name"),
    ({"kind": "tensor", "dtype": "float32", "shape": [1], "device": "\ud800", "blob": 0}, [bytes(4)], "no device"),
], ids=["blob reused", "device with a newline", "device with a surrogate"])
def test_a_description_that_would_cost_memory_or_forge_a_report_is_refused(item, blobs, why):
    with pytest.raises(wire.WireError, match=why):
        wire.decode(item, blobs)


def test_items_nested_past_the_bound_are_refused_not_a_recursion_error():
    item = {"kind": "list", "items": []}
    for _ in range(wire.MAX_DEPTH + 5):
        item = {"kind": "list", "items": [item]}
    with pytest.raises(wire.WireError, match="nested"):
        wire.decode(item, [])


def test_plain_takes_exact_types_only_and_runs_nothing_of_the_values_own():
    """What the worker encodes where nothing records (a question to the grader) is first made plain by `plain`,
    which tests exact types: a property, a metaclass or an __iter__ of the value's own never runs (review 29)."""
    ran = []

    class Meta(type):
        @property
        def __module__(cls):
            ran.append("metaclass")
            return "x"

    class Named(metaclass=Meta):
        pass

    class Posing:
        @property
        def __class__(self):
            ran.append("__class__")
            return torch.Tensor

    class Listed(list):
        def __iter__(self):
            ran.append("__iter__")
            return iter(())

    for value in (Named(), [Posing()], Listed([1]), {1: 2}):
        with pytest.raises(TypeError):
            wire.plain(value)
    assert ran == []
    assert wire.type_name(Named()).startswith("tests.test_wire.") and ran == []
    weight = torch.nn.Parameter(torch.ones(2))
    made = wire.plain({"a": (weight, torch.Size([2, 3]), torch.device("cpu"), np.float32(0.5), None)})
    assert type(made["a"][0]) is torch.Tensor and made["a"][1:] == ((2, 3), "cpu", 0.5, None)
