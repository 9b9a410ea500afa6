"""The metrics we export to Cloud Monitoring, defined once.

Type names live under ``custom.googleapis.com/tpu_orchestrator/`` by default: that domain is the
documented home of user-defined metrics written through the API. ``workload.googleapis.com`` is
meant for metrics collected by the Ops Agent / OpenTelemetry collector; ``external`` for
third-party libraries. The prefix is configurable (``metrics.cloud_monitoring.metric_prefix``).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.api import label_pb2, metric_pb2

GAUGE = metric_pb2.MetricDescriptor.MetricKind.GAUGE
CUMULATIVE = metric_pb2.MetricDescriptor.MetricKind.CUMULATIVE
DOUBLE = metric_pb2.MetricDescriptor.ValueType.DOUBLE
INT64 = metric_pb2.MetricDescriptor.ValueType.INT64
_STRING = label_pb2.LabelDescriptor.ValueType.STRING


@dataclass(frozen=True, kw_only=True)
class MetricDef:
    """One exported metric: short name, kind, value type, unit, its own labels."""

    name: str
    kind: int
    value_type: int
    unit: str
    description: str
    labels: tuple[str, ...] = ()


METRICS: tuple[MetricDef, ...] = (
    MetricDef(name="mfu", kind=GAUGE, value_type=DOUBLE, unit="1", labels=("peak_source",),
              description="Model FLOPs utilisation, mean over the window (fraction of peak)."),
    MetricDef(name="loss", kind=GAUGE, value_type=DOUBLE, unit="1",
              description="Training loss, mean over the window."),
    MetricDef(name="step_time", kind=GAUGE, value_type=DOUBLE, unit="s",
              description="Step time, median over the window."),
    MetricDef(name="tokens_per_second", kind=GAUGE, value_type=DOUBLE, unit="1/s",
              description="Tokens over the window divided by the step time over the window."),
    MetricDef(name="grad_norm", kind=GAUGE, value_type=DOUBLE, unit="1",
              description="Global gradient norm, mean over the window."),
    MetricDef(name="heartbeat", kind=GAUGE, value_type=INT64, unit="1",
              description="Last completed step; written only when steps completed in the window, "
                          "so an absence alert fires when training stalls."),
    MetricDef(name="goodput", kind=GAUGE, value_type=DOUBLE, unit="1",
              labels=("slice", "window"),
              description="Productive time / wall time; slice 'all' is the run, window is "
                          "'cumulative' or 'rolling'."),
    MetricDef(name="badput", kind=GAUGE, value_type=DOUBLE, unit="s", labels=("cause",),
              description="Seconds of the run lost so far, by cause."),
    MetricDef(name="ml_badput", kind=GAUGE, value_type=DOUBLE, unit="s", labels=("bucket",),
              description="The badput seconds in the buckets of Google's ml-goodput-measurement "
                          "(its BadputType names in lower case)."),
    MetricDef(name="restarts", kind=CUMULATIVE, value_type=INT64, unit="1", labels=("cause",),
              description="Re-forms of the JAX group since the driver started, by cause."),
    MetricDef(name="restores", kind=CUMULATIVE, value_type=INT64, unit="1", labels=("tier",),
              description="Restores since the driver started, by the tier they read: ram "
                          "(peer host memory), copy (saved from RAM), durable (Orbax)."),
    MetricDef(name="restore_time", kind=GAUGE, value_type=DOUBLE, unit="s", labels=("tier",),
              description="Seconds the latest restore from each tier took."),
)

BY_NAME = {m.name: m for m in METRICS}


def metric_type(prefix: str, name: str) -> str:
    return f"{prefix.rstrip('/')}/{name}"


def descriptor(prefix: str, m: MetricDef,
               extra_labels: tuple[str, ...]) -> metric_pb2.MetricDescriptor:
    """The MetricDescriptor proto to create for ``m`` (its labels plus the configured extras)."""
    return metric_pb2.MetricDescriptor(
        type=metric_type(prefix, m.name),
        metric_kind=m.kind,
        value_type=m.value_type,
        unit=m.unit,
        description=m.description,
        display_name=f"tpu_orchestrator {m.name}",
        labels=[label_pb2.LabelDescriptor(key=k, value_type=_STRING)
                for k in (*m.labels, *extra_labels)],
    )
