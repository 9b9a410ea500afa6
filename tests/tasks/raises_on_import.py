"""A task module whose import fails (tests/tasks/test_task_check.py)."""

raise RuntimeError("this module is broken on purpose")
