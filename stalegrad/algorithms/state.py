"""A rule's server state, declared: which fields hold a tensor shaped like the weights, which one such tensor per
worker, which a scalar.

As an optax transformation declares its state (``ScaleByAdamState``, a NamedTuple), a rule declares its server
state as a subclass of ``RuleState``, a dataclass whose fields are made with ``per_element()``, ``per_worker()`` or
``scalar(default)``; ``server_init`` returns one, and the rule reads ``state.mean_square[worker]``. It is mutable,
unlike optax's: the server updates its tensors in place and a rule replaces its scalars. Whatever handles a rule's
state reads the declaration, never a list of names: the server runs an ``@elementwise`` rule on a chunk of every
per-element field (``chunk``), a server split into shards gives each shard its slice of them
(``core/sharding.py``), a checkpoint saves ``to_dict()``, and ``Algorithm.server_writes`` names declared fields
only (``check_declaration``: a misspelt one is an error where the class is written, not a tensor silently
left out).

A field left None is state this configuration does not keep (the momentum buffer without momentum): ``to_dict``
leaves it out, so that the dict is the one stalegrad 0.4 saved, and ``from_dict`` reads such a dict back.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

PER_ELEMENT, PER_WORKER, SCALAR = "per element", "per worker", "scalar"


def per_element():
    """A field holding a tensor shaped like the weights (None: not kept in this configuration)."""
    return field(default=None, metadata={"state": PER_ELEMENT})


def per_worker():
    """A field holding a list of tensors shaped like the weights, one per worker (None: not kept)."""
    return field(default=None, metadata={"state": PER_WORKER})


def scalar(default=None):
    """A field holding a number, replaced (not written in place) by the rule."""
    return field(default=default, metadata={"state": SCALAR})


@functools.cache
def kinds(cls: type) -> dict[str, str]:
    """Each field of the state class ``cls``, in order, and its kind; a field not made with ``per_element``,
    ``per_worker`` or ``scalar`` is a TypeError (its kind would be a guess)."""
    out = {}
    for f in dataclasses.fields(cls):
        kind = f.metadata.get("state")
        if kind is None:
            raise TypeError(f"{cls.__qualname__}.{f.name} is not declared with per_element(), per_worker() or "
                            "scalar(): the server could not tell whether to chunk it")
        out[f.name] = kind
    return out


@dataclass
class RuleState:
    """The server state of a rule that keeps none; a rule's own state subclasses it (``@dataclass``)."""

    def __setattr__(self, name: str, value) -> None:
        # a misspelt field written by a rule would otherwise be a new attribute that nothing chunks or saves
        if name not in kinds(type(self)):
            raise AttributeError(f"{type(self).__qualname__} declares no field {name!r}")
        object.__setattr__(self, name, value)

    @classmethod
    def per_element_fields(cls) -> tuple[str, ...]:
        """The fields shaped like the weights: per-element tensors and per-worker lists of them."""
        return tuple(name for name, kind in kinds(cls).items() if kind != SCALAR)

    def chunk(self, a: int, b: int) -> "RuleState":
        """A copy holding elements [a, b) of every per-element field (a per-worker list: sliced when indexed)
        and every scalar as it is: what an ``@elementwise`` rule gets for one chunk of the weights."""
        parts = {}
        for name, kind in kinds(type(self)).items():
            value = getattr(self, name)
            if value is not None and kind != SCALAR:
                parts[name] = value[a:b] if kind == PER_ELEMENT else Slices(value, a, b)
        return dataclasses.replace(self, **parts)

    def to_dict(self) -> dict:
        """The fields this configuration keeps (not None), by name, in declaration order: a state_dict's "state"."""
        return {name: value for name in kinds(type(self)) if (value := getattr(self, name)) is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "RuleState":
        """The state of ``to_dict`` (the tensors as they are: not copied)."""
        return cls(**d)


def check_declaration(rule: type) -> None:
    """The state declaration of the rule class ``rule`` holds together, else a TypeError where the class is written:
    its ``State``'s fields are all declared, ``server_writes`` names fields of it, and ``per_element_state`` is the
    State's own (a class does not list names of its own)."""
    if "per_element_state" in vars(rule):
        raise TypeError(f"{rule.__qualname__} sets per_element_state: declare those fields in its State with "
                        "per_element() or per_worker() instead")
    declared = kinds(rule.State)
    for name in rule.server_writes or ():
        if name not in declared:
            raise TypeError(f"{rule.__qualname__}.server_writes names {name!r}, which {rule.State.__qualname__} does "
                            f"not declare (its fields: {', '.join(declared) or 'none'})")


class Slices:
    """Elements [a, b) of each tensor of a per-worker list, sliced when indexed (a rule touches one or two of
    the M workers' tensors)."""

    __slots__ = ("seq", "a", "b")

    def __init__(self, seq, a: int, b: int):
        self.seq, self.a, self.b = seq, a, b

    def __getitem__(self, i):
        return self.seq[i][self.a:self.b]

    def __len__(self) -> int:
        return len(self.seq)
