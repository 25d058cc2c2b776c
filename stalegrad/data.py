"""Datasets, loaded whole into memory as torch tensors.

Training here is asynchronous and many workers index the same samples at
random, so every dataset is decoded once, up front, into one float32 tensor
``x`` of shape ``(N, *input_shape)`` and one int64 tensor ``y``. The training
loop then only slices tensors; nothing here runs per step.

Datasets
    mnist, fashion-mnist  IDX files (raw or gzipped), x (N, 1, 28, 28) in [0, 1]
    cifar10               the python pickle batches (or their .tar.gz),
                          x (N, 3, 32, 32) in [0, 1]
    digits                scikit-learn's bundled 8x8 digits, x (N, 1, 8, 8)
    synthetic             generated from ``seed``, x (N, 32)

Where files are looked for, first match wins (``find_dataset_dir``):
    1. the ``data_dir`` argument (the dataset folder itself, or a parent of
       ``<name>/``), 2. ``$STALEGRAD_DATA`` (the same), 3. the user cache
    ``$XDG_CACHE_HOME/stalegrad/<name>`` (``~/.cache/...``), which is where
    ``fetch`` puts downloads, 4. ``SYSTEM_DATA_DIRS`` (``/usr/share/datasets``,
    where Debian's ``dataset-fashion-mnist`` package installs its files).

Every problem with a file surfaces as one ``DataError`` whose one-line message
names the file, says what is wrong and how to fix it: users see these on the
command line, where a gzip or pickle traceback would tell them nothing.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import math
import os
import pickle
import struct
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import torch

DATASETS = ("mnist", "fashion-mnist", "cifar10", "digits", "synthetic")
# The datasets that live in files; the others are bundled or generated.
FILE_DATASETS = ("mnist", "fashion-mnist", "cifar10")
SPLITS = ("train", "test")

ENV_VAR = "STALEGRAD_DATA"
# A list so that tests (and distributions with another layout) can change it.
SYSTEM_DATA_DIRS = [Path("/usr/share/datasets")]

# ---- where the files come from ----------------------------------------------
# md5 sums as torchvision publishes them (for Fashion-MNIST they are also the
# ones in the upstream README). They identify the compressed downloads: a
# re-compressed copy of the same data, like Debian's, has other sums.
_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_ARCHIVE = "cifar-10-python.tar.gz"
_CIFAR_BATCHES = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}

SOURCES: dict[str, dict] = {
    "mnist": {
        "base_url": "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "md5": {
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
    },
    "fashion-mnist": {
        "base_url": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "md5": {
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
    },
    "cifar10": {
        "base_url": "https://www.cs.toronto.edu/~kriz/",
        "md5": {_CIFAR_ARCHIVE: "c58f30108f718f92721af3b95e74349a"},
    },
}

# torchvision keeps MNIST under <root>/MNIST/raw; looking there too lets an
# existing torchvision download be used with --data-dir <root> as it is.
_TORCHVISION_SUBDIRS = {"mnist": "MNIST/raw", "fashion-mnist": "FashionMNIST/raw"}

# A tar member bigger than this is not a CIFAR batch (those are ~30 MiB); the
# cap keeps a hostile archive from making us read gigabytes into memory.
_MAX_TAR_MEMBER = 256 * 2**20


class DataError(Exception):
    """A dataset cannot be found or read: one line naming the file (or the
    dataset), what is wrong with it and how to fix it."""

    def __init__(self, message: str):
        # Messages quote other exceptions' text; keep them on one line anyway.
        super().__init__(" ".join(str(message).splitlines()))


@dataclass
class Dataset:
    name: str
    x: torch.Tensor          # float32, (N, *input_shape), contiguous
    y: torch.Tensor          # int64, (N,)
    num_classes: int

    def __post_init__(self):
        if self.x.dtype != torch.float32 or self.y.dtype != torch.int64:
            raise ValueError(f"{self.name}: x must be float32 and y int64, "
                             f"got {self.x.dtype} and {self.y.dtype}")
        if self.y.dim() != 1 or self.x.dim() < 2 or len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: x {tuple(self.x.shape)} and "
                             f"y {tuple(self.y.shape)} do not pair up")
        self.x = self.x.contiguous()
        self.y = self.y.contiguous()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device) -> "Dataset":
        return dataclasses.replace(self, x=self.x.to(device), y=self.y.to(device))


# ---- public entry points -----------------------------------------------------
def load_dataset(name: str, split: str, data_dir: str | os.PathLike | None = None,
                 *, seed: int = 0) -> Dataset:
    """Load one split ("train" or "test") of a dataset into memory.

    ``seed`` only matters for ``synthetic``; ``data_dir`` only for the
    datasets that live in files.
    """
    name = _check_name(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if name == "digits":
        return _load_digits(split)
    if name == "synthetic":
        return _load_synthetic(split, seed)
    folder = find_dataset_dir(name, data_dir)
    try:
        if name == "cifar10":
            return _load_cifar(folder, split)
        return _load_idx_pair(name, folder, split)
    except DataError as err:
        raise DataError(f"{err}; replace the file, e.g. with "
                        f"'stalegrad data fetch {name}'") from None


def load_pair(name: str, data_dir: str | os.PathLike | None = None,
              *, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, test) of one dataset."""
    return (load_dataset(name, "train", data_dir, seed=seed),
            load_dataset(name, "test", data_dir, seed=seed))


def _check_name(name: str) -> str:
    key = str(name).strip().lower().replace("_", "-")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return key


# ---- where the files are -----------------------------------------------------
def cache_dir(name: str | None = None) -> Path:
    """The user cache folder (of one dataset, if named); ``fetch`` writes here."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says to ignore a relative value.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    root = base / "stalegrad"
    return root / _check_name(name) if name is not None else root


def find_dataset_dir(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The first folder, in look-up order, that holds every file of ``name``.

    Raises DataError listing every folder searched when none does, and saying
    which files are missing where a folder holds only some of them (most
    likely an interrupted copy).
    """
    name = _check_name(name)
    if name not in FILE_DATASETS:
        raise ValueError(f"dataset {name!r} has no files: "
                         + ("it is bundled with scikit-learn" if name == "digits"
                            else "it is generated"))
    searched: list[str] = []
    partial: list[str] = []
    for folder in _candidate_dirs(name, data_dir):
        searched.append(str(folder))
        present, missing = _files_in(name, folder)
        if not missing:
            return folder
        if present:
            partial.append(f"{folder} lacks {', '.join(missing)}")
    where = ", ".join(dict.fromkeys(searched))
    note = f" ({'; '.join(partial)})" if partial else ""
    raise DataError(f"{name}: no data found in {where}{note}; run "
                    f"'stalegrad data fetch {name}' or pass --data-dir DIR")


def _candidate_dirs(name: str, data_dir) -> list[Path]:
    out: list[Path] = []
    for base in (data_dir, os.environ.get(ENV_VAR) or None):
        if base is None:
            continue
        base = Path(base).expanduser()
        out += [base, base / name]
        if name in _TORCHVISION_SUBDIRS:
            out.append(base / _TORCHVISION_SUBDIRS[name])
    out.append(cache_dir(name))
    out += [Path(d) / name for d in SYSTEM_DATA_DIRS]
    return out


def _files_in(name: str, folder: Path) -> tuple[list[str], list[str]]:
    """(files present, files missing) of dataset ``name`` in ``folder``."""
    if not folder.is_dir():
        return [], ["everything"]
    if name == "cifar10":
        if (folder / _CIFAR_ARCHIVE).is_file():
            return [_CIFAR_ARCHIVE], []
        wanted = _CIFAR_BATCHES["train"] + _CIFAR_BATCHES["test"]
        inner = folder / _CIFAR_DIR
        where = inner if inner.is_dir() else folder
        present = [b for b in wanted if (where / b).is_file()]
        missing = [b for b in wanted if b not in present]
        return present, (missing if len(missing) < len(wanted) else
                         [f"{_CIFAR_DIR}/ or {_CIFAR_ARCHIVE}"])
    wanted = _IDX_FILES["train"] + _IDX_FILES["test"]
    present = [f for f in wanted if _idx_path(folder, f) is not None]
    return present, [f"{f}[.gz]" for f in wanted if f not in present]


def _idx_path(folder: Path, stem: str) -> Path | None:
    # Prefer the raw file: it needs no decompression.
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


# ---- MNIST and Fashion-MNIST: IDX files --------------------------------------
_IDX_UBYTE = 0x08


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


def _load_idx_pair(name: str, folder: Path, split: str) -> Dataset:
    stems = _IDX_FILES[split]
    paths = []
    for stem in stems:
        path = _idx_path(folder, stem)
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
    _check_labels(labels, 10, str(lbl_path))
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return Dataset(name, x, y, 10)


def _check_labels(labels: np.ndarray, num_classes: int, source: str) -> None:
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise DataError(f"{source}: label {int(labels[i])} at index {i} is out of "
                        f"range 0..{num_classes - 1} ({bad.size} such labels)")


# ---- CIFAR-10: pickled batches -----------------------------------------------
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
        ("_codecs", "encode"): __import__("codecs").encode,
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
    _check_labels(labels, 10, source)
    return images.astype(np.uint8, copy=False), labels.astype(np.int64)


def _get(batch: dict, key: str):
    # Python 2 pickles (the official files) have bytes keys; a batch written
    # by Python 3 has str keys.
    return batch.get(key.encode(), batch.get(key))


def _load_cifar(folder: Path, split: str) -> Dataset:
    names = _CIFAR_BATCHES[split]
    inner = folder / _CIFAR_DIR
    batch_dir = inner if inner.is_dir() else folder
    if all((batch_dir / n).is_file() for n in names):
        blobs = {}
        for n in names:
            try:
                blobs[str(batch_dir / n)] = (batch_dir / n).read_bytes()
            except OSError as err:
                raise DataError(f"{batch_dir / n}: cannot read: "
                                f"{err.strerror or err}") from None
    elif (folder / _CIFAR_ARCHIVE).is_file():
        archive = folder / _CIFAR_ARCHIVE
        members = read_cifar_archive(archive, names)
        blobs = {f"{archive}:{n}": members[n] for n in names}
    else:
        missing = [n for n in names if not (batch_dir / n).is_file()]
        raise DataError(f"{batch_dir / missing[0]}: missing (and no {_CIFAR_ARCHIVE} "
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
    except DataError:
        raise
    except EOFError:
        raise DataError(f"{archive}: truncated archive") from None
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, OSError, ValueError) as err:
        raise DataError(f"{archive}: not a valid .tar.gz archive ({err})") from None
    missing = sorted(wanted - found.keys())
    if missing:
        raise DataError(f"{archive}: has no {', '.join(missing)} "
                        f"(expected under {_CIFAR_DIR}/)")
    return found


# ---- digits: bundled with scikit-learn ---------------------------------------
_DIGITS_TEST = 360


def _load_digits(split: str) -> Dataset:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("dataset 'digits' needs scikit-learn: "
                        "pip install scikit-learn") from None
    images, labels = load_digits(return_X_y=True)
    # A fixed permutation, independent of the run's seed, so that every run
    # (and every paper table) evaluates on the same 360 test digits.
    order = np.random.default_rng(0).permutation(len(labels))
    idx = order[-_DIGITS_TEST:] if split == "test" else order[:-_DIGITS_TEST]
    x = torch.from_numpy((images[idx] / 16.0).astype(np.float32)).view(-1, 1, 8, 8)
    y = torch.from_numpy(labels[idx].astype(np.int64))
    return Dataset("digits", x, y, 10)


# ---- synthetic: generated ----------------------------------------------------
SYNTHETIC_FEATURES = 32
SYNTHETIC_CLASSES = 10
SYNTHETIC_SIZES = {"train": 4096, "test": 1024}
# Each class is a mixture of two unit-variance Gaussian clusters whose centres
# sit on a sphere of this radius. At 4.0 the best possible accuracy is ~96%,
# a linear model gets ~80% and a small MLP ~90%+: it rewards training a
# non-linear model without being solved in a few steps.
_SYNTHETIC_RADIUS = 4.0
_SYNTHETIC_CLUSTERS = 2


def _load_synthetic(split: str, seed: int) -> Dataset:
    # Sub-seeds: one stream defines the problem (cluster centres), one each
    # draws the train and the test samples from it.
    root = int(seed) % 2**64
    problem = np.random.default_rng([root, 0])
    k = SYNTHETIC_CLASSES * _SYNTHETIC_CLUSTERS
    centres = problem.standard_normal((k, SYNTHETIC_FEATURES))
    centres *= _SYNTHETIC_RADIUS / np.linalg.norm(centres, axis=1, keepdims=True)

    rng = np.random.default_rng([root, 1 if split == "train" else 2])
    n = SYNTHETIC_SIZES[split]
    labels = rng.permutation(np.arange(n) % SYNTHETIC_CLASSES)  # balanced classes
    cluster = labels * _SYNTHETIC_CLUSTERS + rng.integers(0, _SYNTHETIC_CLUSTERS, n)
    points = centres[cluster] + rng.standard_normal((n, SYNTHETIC_FEATURES))
    return Dataset("synthetic", torch.from_numpy(points.astype(np.float32)),
                   torch.from_numpy(labels.astype(np.int64)), SYNTHETIC_CLASSES)


# ---- fetch: download into the cache ------------------------------------------
def fetch(name: str, dest: Path | None = None, *, base_url: str | None = None,
          checksums: dict | None = None, progress: bool = True) -> Path:
    """Download the files of ``name`` into ``dest`` (the user cache by default).

    Every file is checked against its md5 before it takes its final name, so
    an interrupted or corrupt download never looks like data. Files already
    present with the right checksum are not downloaded again. ``base_url`` and
    ``checksums`` (file name -> md5) replace the canonical source, e.g. with a
    ``file://`` mirror. Returns the folder the files are in.
    """
    name = _check_name(name)
    folder = Path(dest).expanduser() if dest is not None else cache_dir(name)
    if name not in FILE_DATASETS:
        if progress:
            how = "is bundled with scikit-learn" if name == "digits" else "is generated"
            print(f"{name}: nothing to fetch, it {how}", file=sys.stderr)
        return folder
    source = SOURCES[name]
    url_base = (base_url or source["base_url"]).rstrip("/") + "/"
    sums = {**source["md5"], **(checksums or {})}
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"{folder}: cannot create: {err.strerror or err}") from None
    for filename in source["md5"]:
        target = folder / filename
        expected = sums[filename].lower()
        if target.is_file() and _md5_file(target) == expected:
            if progress:
                print(f"{target}: present, md5 ok", file=sys.stderr)
            continue
        _download(url_base + filename, target, expected, progress)
    return folder


def _md5_file(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(url: str, target: Path, expected_md5: str, progress: bool) -> None:
    # The temporary file sits next to the target so that os.replace is an
    # atomic rename, never a copy across file systems.
    try:
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                        suffix=".part")
    except OSError as err:
        raise DataError(f"{target.parent}: cannot write there "
                        f"({err.strerror or err})") from None
    tmp = Path(tmp_name)
    try:
        digest = hashlib.md5()
        done = 0
        with os.fdopen(fd, "wb") as out:
            try:
                response = urllib.request.urlopen(url, timeout=60)
            except (urllib.error.URLError, OSError, ValueError) as err:
                reason = getattr(err, "reason", err)
                raise DataError(f"{url}: download failed ({reason}); check the "
                                f"network, or copy the file to {target}") from None
            with response:
                total = int(response.headers.get("Content-Length") or 0)
                if progress:
                    print(f"fetching {url}", file=sys.stderr)
                while True:
                    try:
                        block = response.read(1 << 20)
                    except OSError as err:
                        raise DataError(f"{url}: download interrupted after "
                                        f"{done} bytes ({err})") from None
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress and total and sys.stderr.isatty():
                        print(f"\r  {done * 100 // total:3d}% of {total / 1e6:.1f} MB",
                              end="", file=sys.stderr)
        if progress and total and sys.stderr.isatty():
            print(file=sys.stderr)
        actual = digest.hexdigest()
        if actual != expected_md5:
            raise DataError(f"{target}: checksum mismatch for {url}: expected md5 "
                            f"{expected_md5}, got {actual}; the download was "
                            f"discarded, try again or check the mirror")
        os.replace(tmp, target)
        if progress:
            print(f"{target}: {done} bytes, md5 ok", file=sys.stderr)
    except OSError as err:  # a local write failed: disk full, permissions
        tmp.unlink(missing_ok=True)
        raise DataError(f"{target}: cannot save the download "
                        f"({err.strerror or err})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
