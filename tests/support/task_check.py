"""The driver's task check answered in the test's own process.

``orchestrator.driver.task_check.ask`` runs ``python -m workers.task.check`` in a subprocess,
~0.8 CPU-s of interpreter start and imports per call; ``check_here`` replaces that seam with the
same ``workers.task.check.answer`` in this process, for tests of what the check answers
(``tests/conftest.py`` offers it to every test). The subprocess itself is tested where it
matters: tests/tasks/test_task_check.py's passing checks, and every ``orchestrator.main`` the
suite runs.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def check_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.driver import task_check
    from workers.task.check import answer

    monkeypatch.setattr(task_check, "ask", lambda request, **_: answer(request))
