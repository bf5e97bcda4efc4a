"""The CVM params binary (the TVM/NNVM NDArray list format), read and written byte-compatibly with the runtime.

Layout, little-endian, no padding::

    u64 0xF7E58D4F05049CB7 (list magic), u64 reserved, u64 N, N x (u64 len, name bytes), u64 N,
    N x (u64 0xDD5E40F096B4A13F (array magic), u64 reserved, i32 device_type, i32 device_id, i32 ndim,
         u8 code, u8 bits, u16 lanes, i64 shape[ndim], i64 byte_size, data[byte_size])

The reader trusts no length field: every count, length and size is checked against the rules (ndim in 1..6,
dims in (0, 2^24], size <= 2^30, int8 or int32 on the CPU) and against the bytes left before anything is
allocated, so memory stays bounded by the file size.
"""
from __future__ import annotations

import os
import struct
from typing import BinaryIO, Iterator

import numpy as np

from ..errors import FormatError, Problem
from ..graph import MAX_NDIM, shape_problem

LIST_MAGIC = 0xF7E58D4F05049CB7
ARRAY_MAGIC = 0xDD5E40F096B4A13F
KDL_CPU = 1
KDL_INT = 0
DTYPES = {8: np.dtype(np.int8), 32: np.dtype(np.int32)}
_ARRAY_HEADER = struct.Struct("<QQiiiBBH")  # magic, reserved, device, ndim, dtype


class _Cursor:
    """Reads fixed-size fields from ``data`` (bytes, or a binary file read from its position on: one field's bytes
    held at a time), checking the bytes left first."""

    def __init__(self, data: bytes | BinaryIO, where: str):
        self.file = None if isinstance(data, (bytes, bytearray, memoryview)) else data
        self.data = memoryview(data).cast("B") if self.file is None else None
        self.size = len(self.data) if self.file is None else os.fstat(self.file.fileno()).st_size - data.tell()
        self.where = where
        self.off = 0
        self.array = ""

    def fail(self, rule: str, at: int | None = None) -> FormatError:
        place = f"{self.where}, byte {self.off if at is None else at}"
        if self.array:
            place += f", array {self.array!r}"
        return FormatError(Problem(place, rule))

    @property
    def left(self) -> int:
        return self.size - self.off

    def need(self, n: int, what: str) -> None:
        if n > self.left:
            raise self.fail(f"{what} needs {n} bytes, only {self.left} left (truncated file?)")

    def unpack(self, fmt: struct.Struct | str, what: str) -> tuple:
        s = fmt if isinstance(fmt, struct.Struct) else struct.Struct(fmt)
        return s.unpack(self.take(s.size, what))

    def take(self, n: int, what: str) -> memoryview | bytes:
        self.need(n, what)
        view = self.data[self.off:self.off + n] if self.file is None else self.file.read(n)
        if len(view) < n:  # the file shrank while read
            raise self.fail(f"{what} needs {n} bytes, only {len(view)} left (truncated file?)")
        self.off += n
        return view


def read_params(data: bytes | BinaryIO, where: str = "params") -> dict[str, np.ndarray]:
    """Arrays by name, in file order, with their on-disk dtype (int8 or int32), C order, native byte order, from the
    file's bytes or the open file (then no more than one array's bytes held beside the arrays).

    Raises ``FormatError`` naming the byte offset, the array and the broken rule.
    """
    cur = _Cursor(data, where)
    magic, _reserved = cur.unpack("<QQ", "header")
    if magic != LIST_MAGIC:
        raise cur.fail(f"not a CVM params file: magic {magic:#018x}, expected {LIST_MAGIC:#018x}", 0)
    (count,) = cur.unpack("<Q", "name count")
    if count * 8 > cur.left:
        raise cur.fail(f"name count {count} cannot fit in the {cur.left} bytes left", cur.off - 8)
    names: list[str] = []
    seen: set[str] = set()
    for i in range(count):
        start = cur.off
        (length,) = cur.unpack("<Q", f"length of name {i}")
        raw = cur.take(length, f"name {i} ({length} bytes)")
        try:
            name = str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise cur.fail(f"name {i} is not UTF-8 ({e.reason})", start + 8) from None
        if name in seen:
            raise cur.fail(f"duplicate name {name!r}", start)
        seen.add(name)
        names.append(name)
    (arrays,) = cur.unpack("<Q", "array count")
    if arrays != count:
        raise cur.fail(f"{arrays} arrays for {count} names", cur.off - 8)
    out: dict[str, np.ndarray] = {}
    for name in names:
        cur.array = name
        out[name] = _read_array(cur)
    cur.array = ""
    if cur.left:
        raise cur.fail(f"{cur.left} trailing bytes after the last array")
    return out


def _read_array(cur: _Cursor) -> np.ndarray:
    start = cur.off
    magic, _reserved, device, _device_id, ndim, code, bits, lanes = cur.unpack(_ARRAY_HEADER, "array header")
    if magic != ARRAY_MAGIC:
        raise cur.fail(f"bad array magic {magic:#018x}, expected {ARRAY_MAGIC:#018x}", start)
    if device != KDL_CPU:
        raise cur.fail(f"device_type {device}: params must be CPU arrays (1)", start + 16)
    if not 1 <= ndim <= MAX_NDIM:
        raise cur.fail(f"ndim {ndim} is not in 1..{MAX_NDIM}", start + 24)
    if code != KDL_INT or bits not in DTYPES or lanes != 1:
        raise cur.fail(f"dtype (code {code}, bits {bits}, lanes {lanes}) is not int8 or int32 "
                       "(code 0, bits 8 or 32, lanes 1)", start + 28)
    shape = cur.unpack(f"<{ndim}q", "shape")
    if (rule := shape_problem(shape)) is not None:
        raise cur.fail(rule, cur.off - 8 * ndim)
    (nbytes,) = cur.unpack("<q", "byte size")
    expected = int(np.prod(shape, dtype=object)) * bits // 8
    if nbytes != expected:
        raise cur.fail(f"byte size {nbytes} != {expected} (shape {shape} x {bits // 8} bytes)", cur.off - 8)
    raw = cur.take(nbytes, "array data")
    return np.frombuffer(raw, DTYPES[bits].newbyteorder("<")).astype(DTYPES[bits]).reshape(shape)


def write_params(params: dict[str, np.ndarray], precisions: dict[str, int] | None = None) -> bytes:
    """The runtime's params bytes for ``params``, names in the dict's order.

    A param with a precision in ``precisions`` is stored as int8 if that precision is <= 8, else int32 (MRT's
    rule); one without keeps its dtype, which must then be int8 or int32. Raises ``FormatError`` for a value
    that its storage type cannot hold or a shape the runtime refuses.
    """
    return b"".join(params_pieces(params, precisions))


def params_pieces(params: dict[str, np.ndarray], precisions: dict[str, int] | None = None) -> Iterator[bytes]:
    """``write_params``'s bytes in pieces, each array's made when it is reached (its ``FormatError`` then), so that
    a writer holds one array's bytes at a time, not the file's."""
    precisions = precisions or {}
    names = []
    for name in params:
        try:
            names.append(name.encode("utf-8"))
        except (AttributeError, UnicodeEncodeError):
            raise FormatError(f"name {name!r} cannot be written as UTF-8", "params") from None
    yield b"".join([struct.pack("<QQQ", LIST_MAGIC, 0, len(params)),
                    *(struct.pack("<Q", len(raw)) + raw for raw in names), struct.pack("<Q", len(params))])
    for name, value in params.items():
        yield _array_bytes(name, np.asarray(value), precisions.get(name))


def _array_bytes(name: str, array: np.ndarray, precision: int | None) -> bytes:
    where = f"params, array {name!r}"
    if array.dtype.kind not in "iu":
        raise FormatError(f"dtype {array.dtype} is not an integer type", where)
    if (rule := shape_problem(array.shape)) is not None:
        raise FormatError(rule, where)
    if precision is not None:
        dtype = DTYPES[8] if precision <= 8 else DTYPES[32]
    elif array.dtype in (DTYPES[8], DTYPES[32]):
        dtype = array.dtype
    else:
        raise FormatError(f"dtype {array.dtype} is neither int8 nor int32 and no precision says which", where)
    info = np.iinfo(dtype)
    if array.min() < info.min or array.max() > info.max:
        raise FormatError(f"values outside [{info.min}, {info.max}] cannot be stored as {dtype}", where)
    data = np.ascontiguousarray(array, dtype=dtype.newbyteorder("<")).tobytes()
    header = _ARRAY_HEADER.pack(ARRAY_MAGIC, 0, KDL_CPU, 0, array.ndim, KDL_INT, dtype.itemsize * 8, 1)
    return header + struct.pack(f"<{array.ndim}q", *array.shape) + struct.pack("<q", len(data)) + data
