"""What the tests share, imported as ``tests.support.<module>`` (no ``sys.path`` edits).

- :mod:`tests.support.launching`: start multi-rank jobs (``run_mpi``,
  ``run_torch``) in their own process groups, with deadlines, always cleaned
  up; the environment of a job of its own (``base_env``); processes found
  again by a marker.
- :mod:`tests.support.jobs`: ``gflowdist run`` of a config (the toy job by
  default) as a :class:`~tests.support.jobs.Job`, and the ``job_factory``
  fixture that kills every job it started.
- :mod:`tests.support.netns`: hosts made of Linux network namespaces.

Launcher facts (free ports, ``mpiexec``, variable names, process groups)
come from gflowdist itself: :mod:`gflowdist.jobenv` and
:mod:`gflowdist.process_tree`.
"""
