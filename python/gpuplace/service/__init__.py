"""``gpuplace serve``: one long-running service that holds the live cluster state and answers
place, release, repair, explain and status; the one writer of that state, journaled so that a
crash loses nothing it acknowledged. See ``docs/schedulers.md``.

:mod:`~gpuplace.service.journal` (SQLite WAL, group commit), :mod:`~gpuplace.service.engine`
(the state, holds, health, Slurm reconciliation), :mod:`~gpuplace.service.follow` (Slurm and
kernel-log followers), :mod:`~gpuplace.service.app` (the HTTP API, limits, metrics),
:mod:`~gpuplace.service.server` (sockets and the server), :mod:`~gpuplace.service.client`.
"""
