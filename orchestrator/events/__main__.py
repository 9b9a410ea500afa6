"""``python -m orchestrator.events``: the operator CLI (see orchestrator/events/cli.py)."""

import sys

from orchestrator.events.cli import main

sys.exit(main())
