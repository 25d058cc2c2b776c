"""Files read without trusting them, and files written all together or not at all.

``read_text`` reads a regular file of bounded size: a FIFO, a device (a symlink to /dev/zero), a
directory or a file past its limit is refused with a reason, never waited on or read into memory.
``loads_toml`` and ``loads_json`` parse such text, a document nested too deeply for the parser, or an integer of
more digits than Python converts, included (a ``TOMLDecodeError`` or ``JSONDecodeError`` like any other malformed
one, never a ``RecursionError`` or a bare ``ValueError``). ``read_parsed`` does both for a script's inputs: the
parsed file, or one ``UnreadableFile`` whose reason says what is wrong (missing too).
``StagedFiles`` writes several files into a directory so that a failure part-way (a full disk) leaves
the directory as it was.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import tomllib
from pathlib import Path

# The most a file of a run may hold to be read: a reader holds what it reads in memory, and a file that is no
# run's (a symlink to a disk image, /dev/zero) must cost a line, not the machine. summary.json, config.json and
# staleness.json hold a few KiB (a staleness histogram of 100000 distinct tau values is 2 MiB); a JSON Lines file
# holds one line per evaluation, message (about 135 bytes: 256 MiB is 2 million messages, about what parsed
# records fit in a few GiB of memory) or probe.
JSON_LIMIT = 16 * 2**20
JSONL_LIMIT = 256 * 2**20
_KINDS = ((stat.S_ISDIR, "a directory, not a file"), (stat.S_ISFIFO, "a FIFO (named pipe), not a regular file"),
          (stat.S_ISCHR, "a character device, not a regular file"),
          (stat.S_ISBLK, "a block device, not a regular file"), (stat.S_ISSOCK, "a socket, not a regular file"))


class UnreadableFile(Exception):
    """Why a file cannot be read (``reason``, a phrase that follows the file's name: "is a FIFO, ...")."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# An options file (--config) or a run's config.json: a few KiB; a MiB is thousands of options.
CONFIG_LIMIT = 2**20


def read_text(path: str | os.PathLike, limit: int) -> str:
    """The UTF-8 text of the regular file ``path`` of at most ``limit`` bytes, read without blocking on a FIFO
    and without reading past the limit; ``FileNotFoundError`` when it is missing, else ``UnreadableFile``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO opens at once, to be refused
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UnreadableFile(f"cannot be read ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile("is " + next((what for test, what in _KINDS if test(info.st_mode)),
                                              "not a regular file"))
        if info.st_size > limit:
            raise UnreadableFile(f"is {info.st_size:,} bytes, more than the {limit >> 20} MiB such a file may hold")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 2**20))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise UnreadableFile(f"grew past the {limit >> 20} MiB such a file may hold while it was read")
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableFile(f"is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UnreadableFile(f"cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)


_TOO_DEEP = "nested too deeply"


class _Refused(tomllib.TOMLDecodeError):
    def __init__(self, message: str):
        ValueError.__init__(self, message)


def _long_integer(text: str) -> tuple[str, int] | None:
    """(what is wrong, where) for the first integer of ``text`` with more digits than ``int()`` converts (Python's
    ``sys.get_int_max_str_digits()``, 4,300 by default: a parser raises a bare ``ValueError`` on it), or None."""
    limit = sys.get_int_max_str_digits()
    found = re.search(r"\d{%d,}" % (limit + 1), text) if limit else None
    if found is None:
        return None
    return f"a number of {len(found.group()):,} digits, more than the {limit:,} an integer may have", found.start()


def loads_toml(text: str) -> dict:
    """``tomllib.loads(text)``; a document nested too deeply, or an integer too long to convert, is a
    ``TOMLDecodeError`` that says so."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise _Refused(_TOO_DEEP) from None
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:
        if (long := _long_integer(text)) is None:
            raise
        what, at = long
        raise _Refused(f"{what} (at line {text.count(chr(10), 0, at) + 1})") from None


def loads_json(text: str, **kwargs):
    """``json.loads(text, **kwargs)``; a document nested too deeply, or an integer too long to convert, is a
    ``JSONDecodeError`` that says so."""
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        raise json.JSONDecodeError(_TOO_DEEP, text, 0) from None
    except json.JSONDecodeError:
        raise
    except ValueError:
        if (long := _long_integer(text)) is None:
            raise
        raise json.JSONDecodeError(long[0], text, long[1]) from None


def read_parsed(path: str | os.PathLike, limit: int, kind: str):
    """The parsed content of ``path`` (``kind``: "json", "toml", or "jsonl": a list of the lines' values, blank
    lines skipped), read by ``read_text`` under ``limit`` bytes; ``UnreadableFile`` whose reason, following the
    file's name, says why not: missing, not a regular file, too large, not UTF-8, not valid JSON or TOML."""
    try:
        text = read_text(path, limit)
    except FileNotFoundError:
        raise UnreadableFile("does not exist") from None
    try:
        if kind == "toml":
            return loads_toml(text)
        if kind == "json":
            return loads_json(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise UnreadableFile(f"is not valid {kind.upper()} ({e})") from None
    values = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                values.append(loads_json(line))
            except json.JSONDecodeError as e:
                raise UnreadableFile(f"line {number} is not valid JSON ({e.msg})") from None
    return values


class StagedFiles:
    """Files written into ``out`` all together or not at all (a report: its plots, report.json, report.md).
    Within ``with StagedFiles(out) as files:`` each file is written into ``files.dir``, a hidden directory
    inside ``out``; when the block ends they are flushed to disk and renamed into ``out``, and the names
    given to ``files.remove`` are removed from it. If anything fails (a full disk), the staged files go, and
    ``out`` is as it was: not even created, if it was not there."""

    def __init__(self, out: str | os.PathLike):
        self.out, self.created, self.gone = Path(out), [], []

    def remove(self, name: str) -> None:
        self.gone.append(name)

    def __enter__(self) -> "StagedFiles":
        missing = self.out
        while not missing.exists() and missing != missing.parent:
            self.created.insert(0, missing)
            missing = missing.parent
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(dir=self.out, prefix=".staged-"))
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(self, kind, error, tb) -> None:
        try:
            if kind is None:
                names = sorted(os.listdir(self.dir))
                if taken := [n for n in names if (self.out / n).is_dir()]:   # refused before any file is replaced
                    raise IsADirectoryError(errno.EISDIR, f"{taken[0]} there is a directory")
                for name in names:
                    fd = os.open(self.dir / name, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                for name in names:
                    os.replace(self.dir / name, self.out / name)
                for name in self.gone:
                    (self.out / name).unlink(missing_ok=True)
        except BaseException:
            self._undo()
            raise
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        if kind is not None:
            self._undo()

    def _undo(self) -> None:
        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)
        for d in reversed(self.created):   # the directories this made, if nothing else is in them
            try:
                d.rmdir()
            except OSError:
                break


def disk_full(error: OSError) -> bool:
    """Whether ``error`` says that the disk (or the user's quota) is full."""
    return error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
