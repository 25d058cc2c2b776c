"""Where the files of a dataset are: the look-up order and the user cache.

First match wins (``find_dataset_dir``): 1. the ``data_dir`` argument (the
dataset folder itself, or a parent of ``<name>/``), 2. ``$STALEGRAD_DATA``
(the same), 3. the user cache ``$XDG_CACHE_HOME/stalegrad/<name>``
(``~/.cache/...``), which is where ``fetch`` puts downloads, 4.
``SYSTEM_DATA_DIRS`` (``/usr/share/datasets``, where Debian's
``dataset-fashion-mnist`` package installs its files).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from .cifar import CIFAR_ARCHIVE, CIFAR_BATCHES, CIFAR_DIR
from .dataset import FILE_DATASETS, DataError, check_name
from .idx import IDX_FILES, idx_path

ENV_VAR = "STALEGRAD_DATA"
# A list so that distributions with another layout can change it (in place:
# ``stalegrad.data.SYSTEM_DATA_DIRS`` is this same list). Tests replace it
# here, as ``stalegrad.data.locate.SYSTEM_DATA_DIRS``.
SYSTEM_DATA_DIRS = [Path("/usr/share/datasets")]

# torchvision keeps MNIST under <root>/MNIST/raw; looking there too lets an
# existing torchvision download be used with --data-dir <root> as it is.
_TORCHVISION_SUBDIRS = {"mnist": "MNIST/raw", "fashion-mnist": "FashionMNIST/raw"}


def cache_dir(name: str | None = None) -> Path:
    """The user cache folder (of one dataset, if named); ``fetch`` writes here."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says to ignore a relative value.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    root = base / "stalegrad"
    return root / check_name(name) if name is not None else root


def find_dataset_dir(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The first folder, in look-up order, that holds every file of ``name``.

    Raises DataError listing every folder searched when none does, and saying
    which files are missing where a folder holds only some of them (most
    likely an interrupted copy).
    """
    name = check_name(name)
    if name not in FILE_DATASETS:
        raise ConfigError("dataset", f"{name!r} has no files: "
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
        if (folder / CIFAR_ARCHIVE).is_file():
            return [CIFAR_ARCHIVE], []
        wanted = CIFAR_BATCHES["train"] + CIFAR_BATCHES["test"]
        inner = folder / CIFAR_DIR
        where = inner if inner.is_dir() else folder
        present = [b for b in wanted if (where / b).is_file()]
        missing = [b for b in wanted if b not in present]
        return present, (missing if len(missing) < len(wanted) else
                         [f"{CIFAR_DIR}/ or {CIFAR_ARCHIVE}"])
    wanted = IDX_FILES["train"] + IDX_FILES["test"]
    present = [f for f in wanted if idx_path(folder, f) is not None]
    return present, [f"{f}[.gz]" for f in wanted if f not in present]
