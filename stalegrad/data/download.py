"""``fetch``: download a dataset's files into the cache, each checked against
its md5 before it takes its final name."""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .cifar import CIFAR_ARCHIVE
from .dataset import FILE_DATASETS, DataError, check_name
from .locate import cache_dir

# md5 sums as torchvision publishes them (for Fashion-MNIST they are also the
# ones in the upstream README). They identify the compressed downloads: a
# re-compressed copy of the same data, like Debian's, has other sums.
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
        "md5": {CIFAR_ARCHIVE: "c58f30108f718f92721af3b95e74349a"},
    },
}


def fetch(name: str, dest: Path | None = None, *, base_url: str | None = None,
          checksums: dict | None = None, progress: bool = True) -> Path:
    """Download the files of ``name`` into ``dest`` (the user cache by default).

    Every file is checked against its md5 before it takes its final name, so
    an interrupted or corrupt download never looks like data. Files already
    present with the right checksum are not downloaded again. ``base_url`` and
    ``checksums`` (file name -> md5) replace the canonical source, e.g. with a
    ``file://`` mirror. Returns the folder the files are in.
    """
    name = check_name(name)
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
