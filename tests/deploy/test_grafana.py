"""The Grafana dashboard and docs/metrics.md name exactly the Ray metrics the driver exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator.metrics.raymetrics import _GAUGES

ROOT = Path(__file__).resolve().parents[2]
EXPORTED = {f"ray_tpu_orchestrator_{k}" for k in (*_GAUGES, "state", "restarts")}


def test_dashboard_queries_only_exported_metrics_and_shows_each():
    """Every metric a panel queries exists; every exported metric has a panel."""
    dash = json.loads((ROOT / "deploy/grafana/tpu-orchestrator.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m.removesuffix("(_total)?") for e in exprs
            for m in re.findall(r"ray_tpu_orchestrator_\w+(?:\(_total\)\?)?", e)}
    assert used == EXPORTED
    assert all('job=~"$run"' in e for e in exprs)


def test_metrics_doc_lists_every_exported_metric():
    """docs/metrics.md has one row per Prometheus name."""
    doc = (ROOT / "docs/metrics.md").read_text()
    listed = set(re.findall(r"`(ray_tpu_orchestrator_\w+)`", doc))
    assert listed == EXPORTED
