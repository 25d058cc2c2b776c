"""The rules' state: the parameter server (``server``, its boundary checks ``server_checks``, the checks of a
state it loads ``state_checks``, the sharded ``sharding``), the worker (``worker``: ``Worker``, ``FlatModel``, ``BatchStream`` and the data layouts),
the delay models (``delays``), the learning-rate schedules (``schedules``), the probes (``probes``: the
math; ``prober``: taking them during a run) and the memory a run's state needs (``resources``).

It may import ``algorithms``, ``models``, ``data`` and the top-level ``errors``, ``numerics`` and ``_lazy``;
never ``runtimes``, ``run``, ``study`` or ``cli`` (``tests/test_architecture.py``).
"""
