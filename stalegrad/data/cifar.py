"""CIFAR-10: the python pickle batches, loose or inside their .tar.gz.

x is (N, 3, 32, 32) float32 in [0, 1], y the int64 labels 0..9. The pickles
go through an unpickler that only builds numpy arrays and plain containers,
and the archive is read in memory, never extracted.
"""
from __future__ import annotations

import codecs
import gzip
import io
import pickle
import tarfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np

from .._lazy import torch
from .dataset import DataError, Dataset, check_labels

CIFAR_DIR = "cifar-10-batches-py"
CIFAR_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR_BATCHES = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}

# A tar member bigger than this is not a CIFAR batch (those are ~30 MiB); the
# cap keeps a hostile archive from making us read gigabytes into memory.
_MAX_TAR_MEMBER = 256 * 2**20


def _numpy_globals() -> dict[tuple[str, str], object]:
    """The only globals a pickled uint8 numpy array needs, by every name
    numpy has pickled them under (numpy 1 wrote numpy.core, numpy 2 writes
    numpy._core; protocol 5 uses _frombuffer, older ones _reconstruct)."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        # Protocol-2 pickles written by Python 3 encode bytes this way.
        ("_codecs", "encode"): codecs.encode,
    }
    for module in ("numpy.core", "numpy._core"):
        allowed[(f"{module}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{module}.numeric", "_frombuffer")] = numeric._frombuffer
    return allowed


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and plain containers, nothing else.

    A pickle can name any importable callable and call it (``os.system`` is
    the classic), so a downloaded file must never reach the stock loader.
    """

    def __init__(self, data: bytes, source: str):
        super().__init__(io.BytesIO(data), encoding="bytes")
        self.source = source
        self.allowed = _numpy_globals()

    def find_class(self, module, name):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise DataError(f"{self.source}: refusing to unpickle: it asks for "
                            f"{module}.{name}, which a CIFAR-10 batch never does "
                            f"(only numpy arrays are allowed); the file is corrupt "
                            f"or malicious") from None

    def persistent_load(self, pid):
        raise DataError(f"{self.source}: refusing to unpickle: it uses persistent "
                        f"ids, which a CIFAR-10 batch never does")


def parse_cifar_batch(data: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Decode one CIFAR-10 batch: (uint8 images (N, 3072), int64 labels (N,))."""
    try:
        batch = _BatchUnpickler(data, source).load()
    except DataError:
        raise
    except RecursionError:
        raise DataError(f"{source}: not a CIFAR-10 batch: nested too deeply") from None
    except Exception as err:  # noqa: BLE001
        # Unpickling arbitrary bytes can fail in any of a dozen ways (opcode
        # errors, EOF, bad numpy state, ...): to the user they all mean the
        # same thing, a corrupt file.
        raise DataError(f"{source}: not a valid pickle file "
                        f"({type(err).__name__}: {err})") from None
    if not isinstance(batch, dict):
        raise DataError(f"{source}: not a CIFAR-10 batch: holds a "
                        f"{type(batch).__name__}, not a dict")
    images, labels = _get(batch, "data"), _get(batch, "labels")
    if images is None or labels is None:
        keys = ", ".join(repr(k) for k in list(batch)[:8])
        raise DataError(f"{source}: not a CIFAR-10 batch: needs keys b'data' and "
                        f"b'labels', has {keys or 'none'}")
    if not isinstance(images, np.ndarray) or images.ndim != 2 or images.shape[1] != 3072:
        shape = getattr(images, "shape", type(images).__name__)
        raise DataError(f"{source}: b'data' should be an N x 3072 array, is {shape}")
    if images.dtype.kind not in "ui":
        raise DataError(f"{source}: b'data' should hold bytes (uint8), "
                        f"holds {images.dtype}")
    if images.size and (images.min() < 0 or images.max() > 255):
        raise DataError(f"{source}: b'data' has pixel values outside 0..255")
    try:
        labels = np.asarray(labels)
    except Exception as err:  # noqa: BLE001  (ragged or odd nested objects)
        raise DataError(f"{source}: b'labels' is not a list of integers ({err})") from None
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "ui"):
        raise DataError(f"{source}: b'labels' is not a list of integers")
    if len(labels) != len(images):
        raise DataError(f"{source}: has {len(labels)} labels for {len(images)} images")
    check_labels(labels, 10, source)
    return images.astype(np.uint8, copy=False), labels.astype(np.int64)


def _get(batch: dict, key: str):
    # Python 2 pickles (the official files) have bytes keys; a batch written
    # by Python 3 has str keys.
    return batch.get(key.encode(), batch.get(key))


def load_cifar(folder: Path, split: str) -> Dataset:
    """One split of CIFAR-10 from ``folder`` (its batches, loose or under
    ``cifar-10-batches-py/``, or else its ``.tar.gz``)."""
    names = CIFAR_BATCHES[split]
    inner = folder / CIFAR_DIR
    batch_dir = inner if inner.is_dir() else folder
    if all((batch_dir / n).is_file() for n in names):
        blobs = {}
        for n in names:
            try:
                blobs[str(batch_dir / n)] = (batch_dir / n).read_bytes()
            except OSError as err:
                raise DataError(f"{batch_dir / n}: cannot read: "
                                f"{err.strerror or err}") from None
    elif (folder / CIFAR_ARCHIVE).is_file():
        archive = folder / CIFAR_ARCHIVE
        members = read_cifar_archive(archive, names)
        blobs = {f"{archive}:{n}": members[n] for n in names}
    else:
        missing = [n for n in names if not (batch_dir / n).is_file()]
        raise DataError(f"{batch_dir / missing[0]}: missing (and no {CIFAR_ARCHIVE} "
                        f"in {folder})")
    parts = [parse_cifar_batch(data, source) for source, data in blobs.items()]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    if len(images) == 0:
        raise DataError(f"{batch_dir}: the {split} batches hold no images")
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).view(-1, 3, 32, 32)
    return Dataset("cifar10", x, torch.from_numpy(labels), 10)


def read_cifar_archive(archive: Path, names) -> dict[str, bytes]:
    """The batches ``names`` from ``cifar-10-python.tar.gz``, read in memory.

    Nothing is extracted to disk, so member paths (``../..``, links) cannot
    write anywhere; members are matched by their file name only.
    """
    wanted = set(names)
    found: dict[str, bytes] = {}
    try:
        # Streaming mode ("r|gz") reads the archive front to back once.
        with tarfile.open(archive, mode="r|gz") as tar:
            for member in tar:
                base = PurePosixPath(member.name).name
                if base not in wanted or base in found or not member.isfile():
                    continue
                if member.size > _MAX_TAR_MEMBER:
                    raise DataError(f"{archive}: member {member.name} is "
                                    f"{member.size} bytes, too big for a CIFAR batch")
                handle = tar.extractfile(member)
                found[base] = handle.read() if handle is not None else b""
                if len(found) == len(wanted):
                    break
    except DataError:   # first: DataError is a ValueError too
        raise
    except EOFError:
        raise DataError(f"{archive}: truncated archive") from None
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, OSError, ValueError) as err:
        raise DataError(f"{archive}: not a valid .tar.gz archive ({err})") from None
    missing = sorted(wanted - found.keys())
    if missing:
        raise DataError(f"{archive}: has no {', '.join(missing)} "
                        f"(expected under {CIFAR_DIR}/)")
    return found
