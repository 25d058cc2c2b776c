"""MNIST and Fashion-MNIST: IDX files, raw or gzipped.

x is (N, 1, 28, 28) float32 in [0, 1], y the int64 labels 0..9.
"""
from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from .._lazy import torch
from .dataset import DataError, Dataset, check_labels

# The four files of a dataset (each may also be there gzipped, as <stem>.gz).
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_IDX_UBYTE = 0x08


def idx_path(folder: Path, stem: str) -> Path | None:
    """``folder/stem`` or ``folder/stem.gz``, whichever exists (None if neither)."""
    # Prefer the raw file: it needs no decompression.
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def read_file_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped if it is gzip (by name or by content)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise DataError(f"{path}: cannot read: {err.strerror or err}") from None
    # IDX data starts with two zero bytes, so the gzip magic cannot be IDX.
    if str(path).endswith(".gz") or raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except EOFError:
            raise DataError(f"{path}: truncated gzip file (the compressed "
                            f"stream ends early)") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as err:
            raise DataError(f"{path}: not a valid gzip file ({err})") from None
    return raw


def parse_idx(data: bytes, source: str, ndim: int) -> np.ndarray:
    """Decode an unsigned-byte IDX file with ``ndim`` dimensions.

    The header (magic 0x0000, type code, number of dims, then one big-endian
    uint32 per dim) is checked against the payload before anything is built
    from it, so a corrupt header cannot make us allocate memory.
    """
    what = "images" if ndim == 3 else "labels" if ndim == 1 else "values"
    if len(data) < 4:
        raise DataError(f"{source}: not an IDX file: only {len(data)} bytes")
    zero, code, dims = struct.unpack(">HBB", data[:4])
    expected_magic = (_IDX_UBYTE << 8) | ndim
    if zero != 0 or code != _IDX_UBYTE or dims != ndim:
        magic = struct.unpack(">I", data[:4])[0]
        raise DataError(f"{source}: bad magic number 0x{magic:08x}, expected "
                        f"0x{expected_magic:08x} (unsigned-byte {what}, {ndim}-dim "
                        f"IDX); is this the right file?")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{source}: truncated: {len(data)} bytes, the IDX header "
                        f"alone is {header}")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    count = math.prod(shape)  # exact: numpy's product could overflow
    payload = len(data) - header
    dims_text = "x".join(map(str, shape))
    if payload < count:
        raise DataError(f"{source}: truncated: header says {dims_text} {what}, "
                        f"file has {payload} bytes of data, needs {count}")
    if payload > count:
        raise DataError(f"{source}: {payload - count} bytes of unexpected data after "
                        f"the {dims_text} {what} the header announces")
    return np.frombuffer(data, dtype=np.uint8, count=count, offset=header).reshape(shape)


def read_idx(path: str | os.PathLike, ndim: int) -> np.ndarray:
    """Read and decode one IDX file (raw or gzipped)."""
    return parse_idx(read_file_bytes(Path(path)), str(path), ndim)


def load_idx_pair(name: str, folder: Path, split: str) -> Dataset:
    """One split of ``name`` (mnist or fashion-mnist) from the IDX files in ``folder``."""
    stems = IDX_FILES[split]
    paths = []
    for stem in stems:
        path = idx_path(folder, stem)
        if path is None:
            raise DataError(f"{folder / stem}: missing (neither {stem} nor {stem}.gz "
                            f"is in {folder})")
        paths.append(path)
    img_path, lbl_path = paths
    images = read_idx(img_path, 3)
    labels = read_idx(lbl_path, 1)
    if len(images) != len(labels):
        raise DataError(f"{lbl_path}: has {len(labels)} labels but {img_path} has "
                        f"{len(images)} images; the two files do not belong together")
    if images.size == 0:
        raise DataError(f"{img_path}: holds no images (header says "
                        f"{'x'.join(map(str, images.shape))})")
    check_labels(labels, 10, str(lbl_path))
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return Dataset(name, x, y, 10)
