"""Per-step metrics, goodput and MFU; sinks to the console, JSONL, Ray and Cloud Monitoring.

Every sink is a ``RunListener`` (``orchestrator.controller.listener``); the driver builds them
with ``build_sinks`` and hands the run one ``MetricsPipeline``, itself a listener, that feeds
each on its own thread. Everything else (goodput, MFU, the report) is pure arithmetic over the
records.
"""

from orchestrator.controller.records import StepRecord
from orchestrator.metrics.config import CloudMonitoringConfig, MetricsConfig
from orchestrator.metrics.goodput import GoodputReport, compute_goodput
from orchestrator.metrics.identity import ResourceIdentity
from orchestrator.metrics.pipeline import MetricsPipeline, build_sinks, identity_for
from orchestrator.metrics.rundir import load_run

__all__ = ["CloudMonitoringConfig", "GoodputReport", "MetricsConfig",
           "MetricsPipeline", "ResourceIdentity", "StepRecord", "build_sinks", "compute_goodput",
           "identity_for", "load_run"]
