"""One run: its options (``config``, ``validation``, ``model_check``), the loop that ties a runtime to the
server and the workers (``training``: ``train``, ``TrainingRun``), its files (``rundir``, ``results``,
``files``, ``checkpoint`` + ``checkpoint_schema``, ``metrics``, ``tblog``) and its progress line (``progress``).

It may import ``core``, ``runtimes``, ``algorithms``, ``models``, ``data`` and the top-level modules; never
``study`` or ``cli`` (``tests/test_architecture.py``).
"""
