"""The task API (docs/tasks.md): what a user brings so that their training gets every
guarantee of a run. ``Task``, ``TaskContext`` and ``DataSource`` are the contract
(``workers/task/contract.py``); ``workers.task.nnx.NnxModel`` and
``workers.task.optim.adamw_cosine`` are helpers; ``lm`` is the built-in task."""

from workers.task.contract import DEFAULT_RULES, DataSource, Task, TaskContext

__all__ = ["DEFAULT_RULES", "DataSource", "Task", "TaskContext"]
