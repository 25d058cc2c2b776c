"""Progress of one run: a bar on a terminal, one line per evaluation in a log.

tqdm redraws its bar with carriage returns; written to a file (CI, ``nohup``,
``make demo > log``) that is thousands of updates on one line. When stderr is
not a terminal, ``LineProgress`` prints one plain line per evaluation instead.
"""
from __future__ import annotations

import sys
from typing import Protocol, TextIO


class Progress(Protocol):
    def advance(self, samples: int) -> None: ...
    def evaluated(self, record: dict) -> None: ...
    def close(self) -> None: ...


def count(n, noun: str, spec: str = "g") -> str:
    """``1 epoch``, ``0.5 epochs``, ``3 updates``: ``n`` formatted with ``spec``, and the noun in the
    plural unless the number reads 1."""
    text = format(n, spec)
    return f"{text} {noun}" if text == "1" else f"{text} {noun}s"


def _describe(record: dict) -> str:
    return (f"epoch {record['epoch']:.2f}, {count(record['updates'], 'update')}: test acc {record['test_acc']:.4f}, "
            f"loss {record['test_loss']:.4f}")


class BarProgress:
    """A tqdm bar of samples, with the latest evaluation beside it."""

    def __init__(self, total: int, desc: str, stream: TextIO):
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, unit="sample", unit_scale=True, desc=desc, leave=False,
                        dynamic_ncols=True, file=stream)

    def advance(self, samples: int) -> None:
        self.bar.update(samples)

    def evaluated(self, record: dict) -> None:
        self.bar.set_postfix(epoch=f"{record['epoch']:.2f}", updates=record["updates"],
                             loss=f"{record['test_loss']:.4f}", acc=f"{record['test_acc']:.4f}", refresh=False)

    def close(self) -> None:
        self.bar.close()


class LineProgress:
    """One line per evaluation, for logs."""

    def __init__(self, desc: str, stream: TextIO):
        self.desc, self.stream = desc, stream

    def advance(self, samples: int) -> None:
        pass

    def evaluated(self, record: dict) -> None:
        print(f"{self.desc}: {_describe(record)}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


def make_progress(total: int, desc: str, stream: TextIO | None = None) -> Progress:
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return BarProgress(total, desc, stream)
    return LineProgress(desc, stream)


def eta(seconds: float) -> str:
    """A time left, as a person reads it: ``about 40 s left``, ``about 12 min left``, ``about 2.5 h left``."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s left"
    return f"about {round(seconds / 60)} min left" if seconds < 5400 else f"about {seconds / 3600:.1f} h left"
