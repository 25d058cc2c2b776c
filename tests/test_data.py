"""Tests for stalegrad.data: real file formats written small in tmp_path."""
from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import struct
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalegrad import data
from stalegrad.data import DataError
from stalegrad.errors import ConfigError, UsageError

REAL_SYSTEM_DIRS = list(data.SYSTEM_DATA_DIRS)
IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def isolated_lookup(tmp_path, monkeypatch):
    """No test may see the user's data, cache or the machine's system dir."""
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setattr(data.locate, "SYSTEM_DATA_DIRS", [tmp_path / "system"])


# ---- writers for the real formats --------------------------------------------
def idx_bytes(array: np.ndarray, *, magic: int | None = None) -> bytes:
    array = np.asarray(array, dtype=np.uint8)
    if magic is None:
        magic = 0x0800 | array.ndim
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array, *, gz: bool = False, magic: int | None = None) -> Path:
    payload = idx_bytes(array, magic=magic)
    if gz:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


def write_mnist(folder: Path, *, n_train=5, n_test=3, hw=(28, 28), gz=False,
                seed=0, label_offset=0) -> dict:
    """Writes the four IDX files; returns the arrays written, by split."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n, (img, lbl) in (("train", n_train, IDX_STEMS[:2]),
                                 ("test", n_test, IDX_STEMS[2:])):
        images = rng.integers(0, 256, size=(n, *hw), dtype=np.uint8)
        labels = ((np.arange(n) + label_offset) % 10).astype(np.uint8)
        write_idx(folder / img, images, gz=gz)
        write_idx(folder / lbl, labels, gz=gz)
        out[split] = (images, labels)
    return out


def cifar_batch_bytes(images, labels, *, protocol=2, str_keys=False) -> bytes:
    key = (lambda k: k) if str_keys else (lambda k: k.encode())
    batch = {key("batch_label"): b"testing batch", key("labels"): list(labels),
             key("data"): images, key("filenames"): [b"x.png"] * len(labels)}
    return pickle.dumps(batch, protocol=protocol)


def write_cifar(folder: Path, *, per_batch=4, seed=0, protocol=2) -> dict:
    """Writes data_batch_1..5 and test_batch into folder; returns the arrays."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {"train": [], "test": []}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        (folder / name).write_bytes(cifar_batch_bytes(images, labels, protocol=protocol))
        out["test" if name == "test_batch" else "train"].append((images, labels))
    return {k: (np.concatenate([b[0] for b in v]), np.concatenate([b[1] for b in v]))
            for k, v in out.items()}


def write_cifar_archive(archive: Path, batch_dir: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(batch_dir, arcname="cifar-10-batches-py")
    return archive


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def expected_x(images: np.ndarray) -> torch.Tensor:
    return torch.tensor(images, dtype=torch.float32) / 255


# ---- Dataset ----------------------------------------------------------------
def test_dataset_container():
    ds = data.Dataset("t", torch.zeros(6, 2, 3), torch.arange(6), 10)
    assert len(ds) == 6 and ds.input_shape == (2, 3)
    moved = ds.to("cpu")
    assert moved is not ds and torch.equal(moved.x, ds.x) and moved.num_classes == 10
    with pytest.raises(ValueError):
        data.Dataset("t", torch.zeros(6, 2, dtype=torch.float64), torch.arange(6), 10)
    with pytest.raises(ValueError):
        data.Dataset("t", torch.zeros(5, 2), torch.arange(6), 10)


def test_unknown_names():
    with pytest.raises(ConfigError, match="^dataset must be one of mnist, .*, got 'imagenet'$") as info:
        data.load_dataset("imagenet", "train")
    assert info.value.param == "dataset"
    with pytest.raises(ConfigError, match="^split must be one of train, test, got 'validation'$") as info:
        data.load_dataset("digits", "validation")
    assert info.value.param == "split"
    with pytest.raises(ConfigError, match="got 'imagenet'"):
        data.fetch("imagenet")
    with pytest.raises(ConfigError, match="got 'imagenet'"):
        data.cache_dir("imagenet")
    with pytest.raises(ConfigError, match="bundled with scikit-learn"):
        data.find_dataset_dir("digits")


def test_errors_are_usage_errors():
    # Catchable as before (DataError, ValueError) and as every deliberate stalegrad error.
    assert issubclass(DataError, UsageError) and issubclass(DataError, ValueError)
    assert DataError.exit_code == 2
    assert str(DataError("two\nlines")) == "two lines"
    assert issubclass(ConfigError, ValueError)


# ---- MNIST-style IDX ---------------------------------------------------------
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_idx_loads_exact_values(tmp_path, name, gz):
    written = write_mnist(tmp_path / name, gz=gz)
    train, test = data.load_pair(name, tmp_path / name)
    for ds, (images, labels) in ((train, written["train"]), (test, written["test"])):
        assert ds.name == name and ds.num_classes == 10
        assert ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
        assert ds.x.shape == (len(labels), 1, 28, 28) and ds.x.is_contiguous()
        assert torch.equal(ds.x[:, 0], expected_x(images))
        assert ds.y.tolist() == labels.tolist()


def test_idx_shape_comes_from_header(tmp_path):
    written = write_mnist(tmp_path, n_train=7, n_test=2, hw=(5, 4), gz=True)
    train = data.load_dataset("mnist", "train", tmp_path)
    assert train.input_shape == (1, 5, 4) and len(train) == 7
    assert torch.equal(train.x[:, 0], expected_x(written["train"][0]))


def test_idx_mixed_raw_and_gz_and_raw_preferred(tmp_path):
    write_mnist(tmp_path, gz=True, seed=1)
    raw = write_mnist(tmp_path, gz=False, seed=2)   # same names without .gz
    (tmp_path / "t10k-images-idx3-ubyte").unlink()  # this one only as .gz now
    train = data.load_dataset("mnist", "train", tmp_path)
    assert torch.equal(train.x[:, 0], expected_x(raw["train"][0]))
    test = data.load_dataset("mnist", "test", tmp_path)
    assert len(test) == 3


def test_read_idx_labels_and_images(tmp_path):
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    path = write_idx(tmp_path / "l", labels, gz=True)
    assert data.read_idx(path, 1).tolist() == labels.tolist()
    # Gzip is recognised by content too, whatever the name says.
    renamed = tmp_path / "no-suffix"
    renamed.write_bytes(path.read_bytes())
    assert data.read_idx(renamed, 1).tolist() == labels.tolist()


# ---- CIFAR-10 ----------------------------------------------------------------
def check_cifar(ds, images, labels):
    assert ds.name == "cifar10" and ds.num_classes == 10
    assert ds.x.shape == (len(labels), 3, 32, 32) and ds.x.dtype == torch.float32
    assert ds.y.tolist() == list(labels)
    # Rows are 1024 red, then green, then blue values, each row-major 32x32.
    assert torch.equal(ds.x, expected_x(images).view(-1, 3, 32, 32))
    assert ds.x[1, 2, 3, 4] == images[1, 2 * 1024 + 3 * 32 + 4] / np.float32(255)


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar_from_batches_dir(tmp_path, protocol):
    written = write_cifar(tmp_path / "cifar10" / "cifar-10-batches-py", protocol=protocol)
    train, test = data.load_pair("cifar10", tmp_path)   # parent of cifar10/
    assert len(train) == 20 and len(test) == 4
    check_cifar(train, *written["train"])
    check_cifar(test, *written["test"])


def test_cifar_batches_folder_given_directly(tmp_path):
    written = write_cifar(tmp_path / "cifar-10-batches-py")
    test = data.load_dataset("cifar10", "test", tmp_path / "cifar-10-batches-py")
    check_cifar(test, *written["test"])
    # ... and its parent, torchvision's root layout, works too.
    train = data.load_dataset("cifar10", "train", tmp_path)
    check_cifar(train, *written["train"])


def test_cifar_from_archive_only(tmp_path):
    written = write_cifar(tmp_path / "build" / "cifar-10-batches-py")
    folder = tmp_path / "cifar10"
    folder.mkdir()
    write_cifar_archive(folder / "cifar-10-python.tar.gz",
                        tmp_path / "build" / "cifar-10-batches-py")
    train, test = data.load_pair("cifar10", folder)
    check_cifar(train, *written["train"])
    check_cifar(test, *written["test"])


def test_cifar_batch_with_str_keys():
    images = np.arange(2 * 3072).reshape(2, 3072).astype(np.uint8)
    got_x, got_y = data.parse_cifar_batch(
        cifar_batch_bytes(images, [7, 0], protocol=4, str_keys=True), "b")
    assert np.array_equal(got_x, images) and got_y.tolist() == [7, 0]


def test_cifar_batch_pickled_by_numpy_1():
    # The official files (and numpy 1) name numpy.core, which numpy 2 renamed.
    images = np.full((1, 3072), 200, np.uint8)
    blob = cifar_batch_bytes(images, [4], protocol=2)
    assert b"numpy._core.multiarray" in blob
    old = blob.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    got_x, got_y = data.parse_cifar_batch(old, "b")
    assert np.array_equal(got_x, images) and got_y.tolist() == [4]


# ---- look-up order -----------------------------------------------------------
def put_marked(folder: Path, mark: int):
    """mnist files whose first train label is `mark`, to tell folders apart."""
    write_mnist(folder, n_train=2, n_test=1, hw=(2, 2), gz=True, label_offset=mark)


def first_label(**kwargs) -> int:
    return int(data.load_dataset("mnist", "train", **kwargs).y[0])


def test_lookup_order(tmp_path, monkeypatch):
    arg, env = tmp_path / "arg", tmp_path / "env"
    cache, system = tmp_path / "xdg-cache" / "stalegrad" / "mnist", tmp_path / "system" / "mnist"
    put_marked(arg, 1)
    put_marked(env / "mnist", 2)        # $STALEGRAD_DATA as a parent of mnist/
    put_marked(cache, 3)
    put_marked(system, 4)
    monkeypatch.setenv(data.ENV_VAR, str(env))

    assert first_label(data_dir=arg) == 1
    assert data.find_dataset_dir("mnist", arg) == arg
    assert first_label() == 2
    assert data.find_dataset_dir("mnist") == env / "mnist"
    # A data_dir without the files does not stop the search.
    assert first_label(data_dir=tmp_path / "empty") == 2
    monkeypatch.delenv(data.ENV_VAR)
    assert first_label() == 3
    assert data.find_dataset_dir("mnist") == cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert first_label() == 4
    assert data.find_dataset_dir("mnist") == system


def test_lookup_parent_dir_and_torchvision_layout(tmp_path):
    put_marked(tmp_path / "root" / "mnist", 5)
    assert data.find_dataset_dir("mnist", tmp_path / "root") == tmp_path / "root" / "mnist"
    put_marked(tmp_path / "tv" / "FashionMNIST" / "raw", 6)
    assert int(data.load_dataset("fashion-mnist", "train", tmp_path / "tv").y[0]) == 6


def test_cache_dir_default_without_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.cache_dir("mnist") == tmp_path / "home" / ".cache" / "stalegrad" / "mnist"


def test_not_found_lists_every_place(tmp_path, monkeypatch):
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "env"))
    with pytest.raises(DataError) as info:
        data.load_pair("fashion-mnist", tmp_path / "arg")
    msg = str(info.value)
    assert msg.startswith("fashion-mnist: no data found in ")
    for place in (tmp_path / "arg", tmp_path / "arg" / "fashion-mnist",
                  tmp_path / "env", tmp_path / "env" / "fashion-mnist",
                  tmp_path / "xdg-cache" / "stalegrad" / "fashion-mnist",
                  tmp_path / "system" / "fashion-mnist"):
        assert str(place) in msg
    assert "stalegrad data fetch fashion-mnist" in msg and "--data-dir" in msg
    assert "\n" not in msg


def test_partial_folder_names_missing_file(tmp_path):
    write_mnist(tmp_path, gz=True)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"lacks t10k-labels-idx1-ubyte\[\.gz\]") as info:
        data.load_dataset("mnist", "train", tmp_path)
    assert str(tmp_path) in str(info.value)


# ---- bad files ---------------------------------------------------------------
def load_error(tmp_path, split="train") -> str:
    with pytest.raises(DataError) as info:
        data.load_dataset("mnist", split, tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and "stalegrad data fetch mnist" in msg
    return msg


def test_missing_file_read_directly(tmp_path):
    with pytest.raises(DataError, match="cannot read") as info:
        data.read_idx(tmp_path / "nope-idx1-ubyte", 1)
    assert str(tmp_path / "nope-idx1-ubyte") in str(info.value)


def test_truncated_payload(tmp_path):
    write_mnist(tmp_path, gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    full = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(full[:16 + 1234]))
    msg = load_error(tmp_path)
    assert f"{path}: truncated: header says 5x28x28 images, file has 1234 bytes of data" in msg


def test_trailing_bytes(tmp_path):
    write_mnist(tmp_path)
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes() + b"\0\0\0")
    assert f"{path}: 3 bytes of unexpected data" in load_error(tmp_path)


def test_wrong_magic(tmp_path):
    write_mnist(tmp_path)
    # A labels file where the images should be: a classic mix-up.
    path = write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros(3, np.uint8))
    msg = load_error(tmp_path, "test")
    assert f"{path}: bad magic number 0x00000801, expected 0x00000803" in msg


def test_wrong_dtype_code(tmp_path):
    write_mnist(tmp_path)
    path = write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5, np.uint8), magic=0x0D01)
    assert f"{path}: bad magic number 0x00000d01" in load_error(tmp_path)


def test_label_count_mismatch(tmp_path):
    write_mnist(tmp_path)
    path = write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
    msg = load_error(tmp_path)
    assert f"{path}: has 4 labels but " in msg and "has 5 images" in msg


def test_bad_gzip(tmp_path):
    write_mnist(tmp_path, gz=True)
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(b"this is not gzip at all")
    assert f"{path}: not a valid gzip file" in load_error(tmp_path)


def test_truncated_gzip(tmp_path):
    write_mnist(tmp_path, gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:100])
    assert f"{path}: truncated gzip file" in load_error(tmp_path)


def test_label_out_of_range(tmp_path):
    write_mnist(tmp_path)
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 10, 12], np.uint8))
    msg = load_error(tmp_path, "test")
    assert f"{path}: label 10 at index 1 is out of range 0..9 (2 such labels)" in msg


def cifar_error(tmp_path, payload: bytes, name="test_batch") -> str:
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    (folder / name).write_bytes(payload)
    with pytest.raises(DataError) as info:
        data.load_dataset("cifar10", "test" if name == "test_batch" else "train", tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"{folder / name}: ") and "\n" not in msg
    return msg


def test_cifar_wrong_shape(tmp_path):
    bad = cifar_batch_bytes(np.zeros((4, 1024), np.uint8), [0, 1, 2, 3])
    assert "b'data' should be an N x 3072 array, is (4, 1024)" in cifar_error(tmp_path, bad)


def test_cifar_label_problems(tmp_path):
    images = np.zeros((2, 3072), np.uint8)
    assert "has 3 labels for 2 images" in cifar_error(
        tmp_path, cifar_batch_bytes(images, [0, 1, 2]))
    assert "label 11 at index 1" in cifar_error(tmp_path, cifar_batch_bytes(images, [0, 11]))
    assert "not a list of integers" in cifar_error(
        tmp_path, cifar_batch_bytes(images, [b"a", b"b"]))


def test_cifar_not_a_batch(tmp_path):
    assert "holds a list, not a dict" in cifar_error(tmp_path, pickle.dumps([1, 2]))
    assert "needs keys b'data' and b'labels'" in cifar_error(
        tmp_path, pickle.dumps({b"x": 1}), name="data_batch_3")
    assert "not a valid pickle file" in cifar_error(tmp_path, b"\x80\x02garbage")
    assert "should hold bytes (uint8)" in cifar_error(
        tmp_path, cifar_batch_bytes(np.zeros((1, 3072), np.float32), [0]))


class Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_cifar_pickle_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({b"data": Evil(marker), b"labels": [0]}, protocol=2)
    assert b"system" in payload   # the payload really does ask for os.system
    msg = cifar_error(tmp_path, payload)
    assert "refusing to unpickle" in msg and "system" in msg
    assert not marker.exists()
    # eval by its builtins name: refused the same way.
    sneaky = b"cbuiltins\neval\n(S'1+1'\ntR."
    with pytest.raises(DataError, match="refusing to unpickle: it asks for builtins.eval"):
        data.parse_cifar_batch(sneaky, "sneaky")


def test_cifar_bad_archive(tmp_path):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b\x08\x00junk")
    with pytest.raises(DataError) as info:
        data.load_dataset("cifar10", "train", tmp_path)
    assert str(tmp_path / "cifar-10-python.tar.gz") in str(info.value)
    # A valid archive without the test batch.
    write_cifar(tmp_path / "b" / "cifar-10-batches-py")
    (tmp_path / "b" / "cifar-10-batches-py" / "test_batch").unlink()
    write_cifar_archive(tmp_path / "cifar-10-python.tar.gz", tmp_path / "b" / "cifar-10-batches-py")
    with pytest.raises(DataError, match="has no test_batch"):
        data.load_dataset("cifar10", "test", tmp_path)


# ---- fuzzing: nothing but DataError escapes the parsers ----------------------
VALID_IDX = {
    1: idx_bytes(np.arange(9, dtype=np.uint8)),
    3: idx_bytes(np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)),
}
VALID_BATCH = cifar_batch_bytes(np.arange(2 * 3072).reshape(2, 3072).astype(np.uint8), [3, 9])
VALID_BATCH_P5 = cifar_batch_bytes(np.ones((1, 3072), np.uint8), [0], protocol=5)
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def mutate(blob: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(blob[: cut % (len(blob) + 1)])
    for pos, value in flips:
        if out:
            out[pos % len(out)] = value
    return bytes(out)


def only_data_error(fn, *args):
    try:
        fn(*args)
    except DataError as err:
        assert "\n" not in str(err)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from([1, 3]))
def test_fuzz_idx_random_bytes(blob, ndim):
    only_data_error(data.parse_idx, blob, "f", ndim)


@FUZZ
@given(st.sampled_from([1, 3]), st.integers(0, 200),
       st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
       st.booleans())
def test_fuzz_idx_mutated(ndim, cut, flips, gz):
    blob = mutate(VALID_IDX[ndim], cut, flips)
    if gz:   # truncate / corrupt the compressed form instead
        blob = mutate(gzip.compress(VALID_IDX[ndim]), cut, flips)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / ("f.gz" if gz else "f")
        path.write_bytes(blob)
        only_data_error(data.read_idx, path, ndim)


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_cifar_random_bytes(blob):
    only_data_error(data.parse_cifar_batch, blob, "f")
    only_data_error(data.parse_cifar_batch, b"\x80\x02" + blob, "f")


@FUZZ
@given(st.sampled_from([VALID_BATCH, VALID_BATCH_P5]), st.integers(0, 7000),
       st.lists(st.tuples(st.integers(0, 7000), st.integers(0, 255)), max_size=3))
def test_fuzz_cifar_mutated(blob, cut, flips):
    only_data_error(data.parse_cifar_batch, mutate(blob, cut, flips), "f")


def test_fuzz_inputs_are_valid_unmutated():
    # The fuzzers start from files that parse, so mutations probe real paths.
    assert data.parse_idx(VALID_IDX[3], "f", 3).shape == (2, 3, 4)
    assert data.parse_cifar_batch(VALID_BATCH, "f")[1].tolist() == [3, 9]
    assert data.parse_cifar_batch(VALID_BATCH_P5, "f")[0].shape == (1, 3072)


# ---- digits and synthetic ----------------------------------------------------
def test_digits():
    from sklearn.datasets import load_digits
    train, test = data.load_pair("digits")
    assert (len(train), len(test)) == (1437, 360)
    assert train.input_shape == (1, 8, 8) and train.num_classes == 10
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    assert float(train.x.min()) == 0.0 and float(train.x.max()) == 1.0
    # Together the two splits are exactly the bundled data set.
    all_y = load_digits().target
    assert torch.equal(torch.cat([train.y, test.y]).bincount(), torch.from_numpy(all_y).bincount())
    # Fixed split: the same every time and whatever the seed.
    again = data.load_dataset("digits", "test", seed=123)
    assert torch.equal(again.x, test.x) and torch.equal(again.y, test.y)
    assert not torch.equal(test.y, torch.from_numpy(all_y[-360:]))  # it is shuffled


def test_digits_are_read_as_scikit_learn_reads_them_without_importing_it(monkeypatch, tmp_path):
    """Issue 33: the bundled file is read directly (scikit-learn's import cost 1.5 s of every run's start),
    into the same arrays as sklearn.datasets.load_digits; another layout falls back to that loader."""
    import importlib.util
    from types import SimpleNamespace

    import numpy as np
    from sklearn.datasets import load_digits

    from stalegrad.data import builtin
    want = load_digits(return_X_y=True)
    with monkeypatch.context() as mp:
        mp.setitem(sys.modules, "sklearn.datasets", None)       # an import of it would fail
        got = builtin._bundled_digits()
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(
        submodule_search_locations=[str(tmp_path)]))            # no digits file where it is looked for
    got = builtin._bundled_digits()
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("absent", ["sklearn", "sklearn.datasets"])
def test_digits_without_sklearn(monkeypatch, tmp_path, absent):
    import importlib.util
    from types import SimpleNamespace
    monkeypatch.setitem(sys.modules, absent, None)   # import fails
    if absent == "sklearn.datasets":    # and the bundled file is not where it is read without the import
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(
            submodule_search_locations=[str(tmp_path)]))
    expected = "^dataset 'digits' needs scikit-learn: pip install scikit-learn$"
    with pytest.raises(DataError, match=expected):
        data.load_dataset("digits", "train")


def test_synthetic():
    train, test = data.load_pair("synthetic", seed=7)
    assert train.x.shape == (4096, 32) and test.x.shape == (1024, 32)
    assert train.num_classes == 10 and set(train.y.tolist()) == set(range(10))
    again = data.load_dataset("synthetic", "train", seed=7)
    assert torch.equal(again.x, train.x) and torch.equal(again.y, train.y)
    other = data.load_dataset("synthetic", "train", seed=8)
    assert not torch.equal(other.x, train.x)
    assert not torch.equal(train.x[:1024], test.x)


def test_synthetic_is_learnable_but_not_trivial():
    train, test = data.load_pair("synthetic")
    means = torch.stack([train.x[train.y == c].mean(0) for c in range(10)])
    accuracy = (torch.cdist(test.x, means).argmin(1) == test.y).float().mean().item()
    # Far above chance (0.1), yet a linear rule leaves a lot to learn.
    assert 0.5 < accuracy < 0.95


# ---- fetch -------------------------------------------------------------------
@pytest.fixture
def mirror(tmp_path):
    """A file:// mirror holding gzipped mnist files, with their md5s."""
    folder = tmp_path / "mirror"
    written = write_mnist(folder, gz=True)
    sums = {p.name: md5(p) for p in folder.iterdir()}
    return folder, sums, written


def test_fetch_from_file_url(tmp_path, mirror):
    folder, sums, written = mirror
    dest = tmp_path / "dest"
    got = data.fetch("mnist", dest, base_url=folder.as_uri(), checksums=sums, progress=False)
    assert got == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(sums)   # no temp files left
    for name in sums:
        assert (dest / name).read_bytes() == (folder / name).read_bytes()
    train = data.load_dataset("mnist", "train", dest)
    assert torch.equal(train.x[:, 0], expected_x(written["train"][0]))
    # Files already there with the right md5 are not downloaded again.
    (folder / "train-images-idx3-ubyte.gz").unlink()
    data.fetch("mnist", dest, base_url=folder.as_uri(), checksums=sums, progress=False)
    assert md5(dest / "train-images-idx3-ubyte.gz") == sums["train-images-idx3-ubyte.gz"]


def test_fetch_default_dest_is_cache(tmp_path, mirror):
    folder, sums, _ = mirror
    got = data.fetch("mnist", base_url=folder.as_uri(), checksums=sums, progress=False)
    assert got == tmp_path / "xdg-cache" / "stalegrad" / "mnist"
    assert data.find_dataset_dir("mnist") == got


def test_fetch_checksum_mismatch(tmp_path, mirror):
    folder, sums, _ = mirror
    dest = tmp_path / "dest"
    dest.mkdir()
    stale = dest / "t10k-labels-idx1-ubyte.gz"
    stale.write_bytes(b"old")
    bad = {**sums, "t10k-labels-idx1-ubyte.gz": "0" * 32}
    with pytest.raises(DataError) as info:
        data.fetch("mnist", dest, base_url=folder.as_uri(), checksums=bad, progress=False)
    msg = str(info.value)
    assert str(stale) in msg and "0" * 32 in msg and sums["t10k-labels-idx1-ubyte.gz"] in msg
    # The bad download is gone and the file it was meant to replace untouched.
    assert stale.read_bytes() == b"old"
    assert not [p for p in dest.iterdir() if p.name.endswith(".part")]


def test_fetch_missing_source(tmp_path):
    with pytest.raises(DataError, match="download failed"):
        data.fetch("fashion-mnist", tmp_path / "d", base_url=(tmp_path / "none").as_uri(),
                   progress=False)
    assert list((tmp_path / "d").iterdir()) == []


def test_fetch_cifar_archive(tmp_path):
    written = write_cifar(tmp_path / "build" / "cifar-10-batches-py")
    mirror_dir = tmp_path / "mirror"
    mirror_dir.mkdir()
    archive = write_cifar_archive(mirror_dir / "cifar-10-python.tar.gz",
                                  tmp_path / "build" / "cifar-10-batches-py")
    dest = data.fetch("cifar10", tmp_path / "dest", base_url=mirror_dir.as_uri(),
                      checksums={archive.name: md5(archive)}, progress=False)
    check_cifar(data.load_dataset("cifar10", "test", dest), *written["test"])


def test_fetch_needs_nothing_for_bundled(tmp_path, capsys):
    for name in ("digits", "synthetic"):
        data.fetch(name, tmp_path / name)
        assert not (tmp_path / name).exists()
    assert "nothing to fetch" in capsys.readouterr().err


def test_canonical_checksums():
    cifar = data.SOURCES["cifar10"]["md5"]
    assert cifar == {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"}
    for name in ("mnist", "fashion-mnist"):
        assert sorted(data.SOURCES[name]["md5"]) == sorted(f"{s}.gz" for s in IDX_STEMS)


# ---- the Debian package's Fashion-MNIST --------------------------------------
SYSTEM_FASHION = REAL_SYSTEM_DIRS[0] / "fashion-mnist"


@pytest.mark.skipif(not SYSTEM_FASHION.is_dir(),
                    reason=f"{SYSTEM_FASHION} absent: apt-get install dataset-fashion-mnist")
def test_system_fashion_mnist(monkeypatch):
    monkeypatch.setattr(data.locate, "SYSTEM_DATA_DIRS", REAL_SYSTEM_DIRS)
    assert data.find_dataset_dir("fashion-mnist") == SYSTEM_FASHION
    train, test = data.load_pair("fashion-mnist")
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.y.bincount().tolist() == [6000] * 10
    assert test.y.bincount().tolist() == [1000] * 10
    assert 0.0 <= float(train.x.min()) and float(train.x.max()) == 1.0
