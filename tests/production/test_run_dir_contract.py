"""docs/CONTRACTS.md "Run directory" says what the code writes there (no Ray, no JAX).

run.json as the driver writes it, topology.json as the controller writes it (read back by
`explain`), and every file name the code keeps in a run directory each have their row.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

from orchestrator.autoresume.runs import HOLD_FILE
from orchestrator.config import load_config
from orchestrator.controller.forming import write_topology
from orchestrator.driver.logs import LOG_FILE
from orchestrator.driver.worker_output import WORKERS_LOG
from orchestrator.events.explain import TOPOLOGY_FILE, load_topology
from orchestrator.events.inbox import INBOX_DIR
from orchestrator.events.intake import (
    DEAD_LETTERS_FILE,
    DEDUPE_FILE,
    EVENTS_FILE,
    PUBSUB_INFO_FILE,
)
from orchestrator.lifecycle import TIMELINE_FILE
from orchestrator.main import Driver
from orchestrator.shared.hosts import HostRef

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "CONTRACTS.md"


def run_dir_rows() -> dict[str, str]:
    """First cell (the path, without backticks and a trailing /) -> the whole row."""
    text = CONTRACTS.read_text(encoding="utf-8")
    section = text.split("## Run directory", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([^`]+)`", line)
        if m:
            rows[m.group(1).rstrip("/")] = line
    return rows


def documented_keys(row: str) -> set[str]:
    return set(re.findall(r'"([a-z_]+)"', row))


def test_every_run_directory_file_has_a_row():
    """The names the code reads and writes in RUN_DIR are all in the table."""
    names = {"config.yaml", "run.json", "checkpoints", "metrics.jsonl", "summary.json",
             TIMELINE_FILE, EVENTS_FILE, DEAD_LETTERS_FILE, DEDUPE_FILE, INBOX_DIR,
             PUBSUB_INFO_FILE, TOPOLOGY_FILE, HOLD_FILE, LOG_FILE, WORKERS_LOG}
    assert names - set(run_dir_rows()) == set()


def test_run_json_row_lists_the_keys_the_driver_writes(tmp_path):
    """Every key of run.json, as Driver._prepare_run_dir writes it, is named in its row."""
    cfg = load_config(None, ["run.name=llm-1", f"run.run_dir={tmp_path / 'run'}"])
    Driver(cfg, argv=["run.name=llm-1"])._prepare_run_dir()
    written = json.loads((tmp_path / "run" / "run.json").read_text())
    row = run_dir_rows()["run.json"]
    assert set(written) <= documented_keys(row), set(written) - documented_keys(row)
    assert "<redacted>" in row and "run.name" in row


def test_topology_json_row_matches_write_topology_and_explain_reads_it(tmp_path):
    """write_topology's keys and HostRef's fields are the row's; explain loads the file back."""
    hosts = [HostRef(index=i, slice_name="slice-0", worker_id=i, node_id=f"n{i}",
                     node_ip=f"10.0.0.{i}", instance=f"vm-{i}", devices=4) for i in range(2)]
    run = SimpleNamespace(plan=SimpleNamespace(hosts=hosts), run_dir=tmp_path,
                          cfg=SimpleNamespace(run=SimpleNamespace(name="llm-1"),
                                              events=SimpleNamespace(cluster="c1")),
                          ledger=SimpleNamespace(incarnation=3))
    write_topology(run, SimpleNamespace(instance_ids={"123": "vm-1"}))
    written = json.loads((tmp_path / TOPOLOGY_FILE).read_text())
    row = run_dir_rows()["topology.json"]
    host_fields = {f.name for f in dataclasses.fields(HostRef)}
    assert set(written) | host_fields == documented_keys(row)
    assert set(written["hosts"][0]) == host_fields
    topo = load_topology(tmp_path)
    assert (list(topo.hosts), topo.id_to_name, topo.job, topo.cluster, topo.incarnation) == (
        hosts, {"123": "vm-1"}, "llm-1", "c1", 3)
