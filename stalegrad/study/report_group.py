"""One group of the report: runs that differ only by their seed, and what the report computes of them.

``report.group_runs`` makes a ``Group`` from its settings and runs; ``report.analyse`` fills in the figures over
the seeds (each ``stat``'s mean, sample standard deviation and count), ``report_time.summarise`` the modelled
costs. The readers of a group (report_plots.py, report_target.py, report_protocol.py, report_probes.py,
report_curves.py, report_time.py) read it as they read a dict, ``g["best_test_acc"]``, so that they also take the
plain dicts of a grid's stages (``{"key": ..., "algo": ...}``); a name that is not a field is a ``KeyError``, and
a field not computed (None) is not ``in`` the group, as a key never set was not in the dict.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(eq=False)   # (compared and hashed as the object it is, as a dict in a list was found by identity)
class Group:
    key: dict                      # the settings the runs share, seed aside (report.IGNORED left out too)
    algo: str
    algo_keys: set                 # which of ``key`` are the algorithm's parameters
    runs: list = field(default_factory=list)   # the runs (report.usable_run's dicts), by seed
    label: str = ""                # the algorithm and the settings that vary between groups
    # over the seeds, each {"mean", "std", "n"} (report.stat) of summary.json's figure of that name
    final_test_acc: dict | None = None
    best_test_acc: dict | None = None
    tau_mean: dict | None = None
    tau_max: dict | None = None
    nonfinite_skipped: dict | None = None
    diverged: list | None = None   # the directories of the runs that diverged
    time_to_target: dict | None = None        # per kind of time (report_curves.TIMES), and reached, n
    temporal_efficiency: dict | None = None   # against the baseline group: its label, differs_in, unpaired_seeds
    temporal_efficiency_central: dict | None = None   # beside the workers-modelled variant
    modelled: dict | None = None   # the time model's costs for the group (report_time.summarise)

    def __getitem__(self, name: str):
        if name not in _FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def __setitem__(self, name: str, value) -> None:
        if name not in _FIELDS:
            raise KeyError(name)
        setattr(self, name, value)

    def __contains__(self, name: str) -> bool:
        return name in _FIELDS and getattr(self, name) is not None

    def get(self, name: str, default=None):
        return self[name] if name in self else default


_FIELDS = frozenset(f.name for f in dataclasses.fields(Group))
