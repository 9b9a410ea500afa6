import sys

from orchestrator.sim.cli import main

sys.exit(main())
