"""Orbax, imported without its optional Cloud Logging backend.

Where ``google-cloud-logging`` is installed (the ``goodput`` extra brings it), ``import
orbax.checkpoint`` also imports it for Orbax's ``CloudLogger``: a costly import in every host
and holder process, for a logger no process of ours uses (checkpoint events reach Cloud Monitoring
through the driver's metrics). Orbax guards that import with ``except ImportError``; this module
takes that path by marking the package absent for the duration of Orbax's first import only,
so a later ``import google.cloud.logging`` in the same process (the goodput recorder's) works.
Import Orbax from here, never directly, in ``workers/``.
"""

from __future__ import annotations

import sys

_SKIPPED = "google.cloud.logging"


def _import_orbax():
    first = "orbax.checkpoint" not in sys.modules and _SKIPPED not in sys.modules
    if first:
        sys.modules[_SKIPPED] = None  # type: ignore[assignment]  (import raises ImportError)
    try:
        import orbax.checkpoint
    finally:
        if first and sys.modules.get(_SKIPPED, 0) is None:
            del sys.modules[_SKIPPED]
    return orbax.checkpoint


ocp = _import_orbax()
