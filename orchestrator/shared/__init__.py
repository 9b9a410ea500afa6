"""What the driver and the hosts both need: ``errors``, ``hostspec`` (the spec a host receives),
``plan`` (the mesh plan), ``hosts`` (a host's identity), ``sections`` (the config sections a host
receives), ``task`` (the task reference and settings), ``configtools`` (building and dumping
config dataclasses), ``layout`` (the run directory's checkpoint layout), ``host_env`` (the
environment of a host process, the executable store's place and key, ``free_port``) and ``files``
(atomic writes, JSON-lines reads and appends), ``procfs`` (a process's ``/proc/<pid>/stat``).

Neutral ground: these modules import nothing else of ``orchestrator`` or ``workers``, and no Ray
or JAX (``tests/test_import_direction.py``), so a host actor never loads the driver's config
tree and the driver never needs a host's libraries to build what it sends."""
