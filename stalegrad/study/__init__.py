"""Many runs: grids of runs (``grid``, ``grid_names``, ``grid_ray`` on a Ray cluster) and the protocol's two
stages (``stages``), the statistics over seeds (``selection``, ``stats``, ``intervals``), the report and its
sections (``report``, ``report_*``) and the plots (``plot``).

It may import ``run``, ``core``, ``runtimes``, ``algorithms``, ``models``, ``data`` and the top-level modules;
never ``cli`` (``tests/test_architecture.py``). A grid runs each cell as ``stalegrad train`` in a child process,
and checks its options first against those of ``run.options``, from which the command line builds its flags.
"""
