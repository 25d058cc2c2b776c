"""Many runs: grids of runs (``grid``, ``grid_names``, ``grid_ray`` on a Ray cluster) and the protocol's two
stages (``stages``), the statistics over seeds (``selection``, ``stats``, ``intervals``), the report and its
sections (``report``, ``report_*``) and the plots (``plot``).

It may import ``run``, ``core``, ``runtimes``, ``algorithms``, ``models``, ``data`` and the top-level modules.
A grid runs each cell as ``stalegrad train`` and validates its options against that command's, so ``grid``
and ``grid_names`` also import ``cli.options`` and ``cli.run`` (the one arrow into the command line; the
test names it).
"""
