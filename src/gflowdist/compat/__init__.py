"""The helper APIs of other codebases, under their original names, over gflowdist's core.

- :mod:`gflowdist.compat.spinup`   — Spinning Up ``spinup.utils.mpi_tools`` + ``mpi_pytorch``
- :mod:`gflowdist.compat.omnisafe` — OmniSafe ``omnisafe.utils.distributed`` (0.3 and 0.5)
- :mod:`gflowdist.compat.virtex`   — VirTex ``virtex.utils.distributed``
- :mod:`gflowdist.compat.evorl`    — a torch analogue of EvoRL ``evorl.distributed``
- :mod:`gflowdist.compat.torchgfn` — torchgfn ``gfn.utils.distributed`` (docs/migration-torchgfn.md)

Each module is thin: a line or two per function over :mod:`gflowdist.ops`
and :mod:`gflowdist.launch`. Moving code over means changing an import;
docs/migration.md lists the imports side by side and the behaviour fixed
along the way. Import the submodule you need (this package imports none of
them, so ``import gflowdist.compat`` costs nothing).
"""
