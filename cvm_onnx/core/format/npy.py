"""One array from a .npy file, or one ``FormatError`` saying what the file is instead (numpy alone would read a
file without the .npy magic as a pickle and say so, or fail on an empty file with ``EOFError``)."""
from __future__ import annotations

import os

import numpy as np

from ..errors import FormatError

MAGIC = b"\x93NUMPY"
ZIP = b"PK\x03\x04"
#: The most values an .npz archive's members may declare in all (each is decompressed into memory whole).
MAX_NPZ_VALUES = 1 << 30


def _header(f) -> np.dtype | None:
    """The dtype the header of a version 1 or 2 .npy file declares (None for another version: numpy says)."""
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    return read(f)[2] if read else None


def read_npy(path: str | os.PathLike, what: str = "the input array", mmap: bool = True) -> np.ndarray:
    """The array in the .npy file ``path``; ``mmap``: memory-mapped, so a header claiming more data than the file
    holds is refused instead of allocated. An .npz archive, an empty file, a file that is no .npy (a pickle, text)
    and an array of Python objects are refused naming ``what``."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
            if head != MAGIC:
                why = ("an empty file" if not head else "an .npz archive, not one .npy array" if head.startswith(ZIP)
                       else "not a .npy file (it does not start with numpy's magic string)")
                raise FormatError(f"cannot read {what}: {why}", where=where)
            f.seek(0)
            dtype = _header(f)
        if dtype is not None and dtype.hasobject:
            raise FormatError(f"cannot read {what}: it holds Python objects (dtype {dtype}), not numbers",
                              where=where)
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise FormatError(f"cannot read {what}: {getattr(e, 'strerror', None) or e}", where=where) from None


def read_npz(path: str | os.PathLike, what: str = "the input arrays") -> dict[str, np.ndarray]:
    """The arrays of the .npz archive ``path`` by name (a member ``x.npy`` is ``x``), each read after its header is
    checked against the member's size, so that a header claiming more data than the archive holds is refused
    instead of allocated, and the members' values in all against MAX_NPZ_VALUES (a compressed member of zeros
    declares gigabytes in a few megabytes). An archive that is no zip of .npy arrays, or holds Python objects, is
    refused naming ``what``."""
    import zipfile

    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(ZIP))
        if head != ZIP:
            why = "an empty file" if not head else "one .npy array, not an .npz archive" if head == MAGIC[:4] \
                else "not an .npz archive"
            raise FormatError(f"cannot read {what}: {why}", where=where)
        out, values = {}, 0
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                name = info.filename.removesuffix(".npy")
                with z.open(info) as f:
                    if f.read(len(MAGIC)) != MAGIC:
                        raise FormatError(f"cannot read {what}: member {info.filename!r} is no .npy array",
                                          where=where)
                    f.seek(0)
                    version = np.lib.format.read_magic(f)
                    read = {(1, 0): np.lib.format.read_array_header_1_0,
                            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if read is None:
                        raise FormatError(f"cannot read {what}: member {info.filename!r} is a .npy of version "
                                          f"{version}", where=where)
                    shape, _, dtype = read(f)
                    if dtype.hasobject:
                        raise FormatError(f"cannot read {what}: member {info.filename!r} holds Python objects "
                                          f"(dtype {dtype}), not numbers", where=where)
                    if int(np.prod(shape, dtype=object)) * dtype.itemsize > info.file_size:
                        raise FormatError(f"cannot read {what}: member {info.filename!r} declares {shape} {dtype}, "
                                          f"more than its {info.file_size} bytes", where=where)
                    values += int(np.prod(shape, dtype=object))
                    if values > MAX_NPZ_VALUES:
                        raise FormatError(f"cannot read {what}: member {info.filename!r} declares {shape} {dtype}, "
                                          "past 2^30 values in all the archive's members may hold", where=where)
                    f.seek(0)
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
        return out
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise FormatError(f"cannot read {what}: {getattr(e, 'strerror', None) or e}", where=where) from None
