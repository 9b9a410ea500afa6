"""Example user code: packages that live outside ``orchestrator/`` and ``workers/`` and reach
the orchestrator only through its task API (docs/tasks.md)."""
