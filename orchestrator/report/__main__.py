"""``python -m orchestrator.report RUN_DIR``: render the run's report (``orchestrator.report``)."""

from __future__ import annotations

import sys

from orchestrator.report import main

if __name__ == "__main__":
    sys.exit(main())
