"""Per-step metrics, goodput and MFU; sinks to the console, JSONL, Ray and Cloud Monitoring.

The driver builds sinks with ``build_sinks`` and feeds a ``MetricsPipeline``; everything else
(goodput, MFU, the report) is pure arithmetic over the records.
"""

from orchestrator.metrics.config import CloudMonitoringConfig, MetricsConfig
from orchestrator.metrics.goodput import GoodputReport, compute_goodput
from orchestrator.metrics.identity import ResourceIdentity
from orchestrator.metrics.pipeline import MetricsPipeline, build_sinks, identity_for
from orchestrator.metrics.records import StepRecord
from orchestrator.metrics.rundir import load_run
from orchestrator.metrics.sink import MetricSink

__all__ = ["CloudMonitoringConfig", "GoodputReport", "MetricSink", "MetricsConfig",
           "MetricsPipeline", "ResourceIdentity", "StepRecord", "build_sinks", "compute_goodput",
           "identity_for", "load_run"]
