"""Fleet simulator: the real controller, lifecycle and policies against a simulated worker
group, cluster and event stream on a virtual clock (docs/sim.md).

    from orchestrator.sim import load_sim_config, simulate
    result = simulate(load_sim_config("orchestrator/sim/examples/week-256.yaml"))
"""

from orchestrator.sim.config import SimConfig, load_sim_config
from orchestrator.sim.runner import SimResult, simulate

__all__ = ["SimConfig", "SimResult", "load_sim_config", "simulate"]
