"""The suite's order comes from what a full run measured (``tests/support/units.py``), not from
constants kept by hand (issue 52): a junit file becomes seconds per work unit."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.units import DURATIONS, durations_from_junit, main, read_durations, unit_of

ROOT = Path(__file__).resolve().parents[1]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
 <testcase classname="tests.faults.test_group_faults" name="test_a" time="40.5"/>
 <testcase classname="tests.faults.test_group_faults" name="test_b" time="9.5"/>
 <testcase classname="tests.autoresume.test_e2e" name="test_c" time="20"/>
 <testcase classname="tests.autoresume.test_latency" name="test_d" time="5"/>
 <testcase classname="tests.test_suite_units" name="test_e" time="0.25"/>
 <testcase classname="no.such.module" name="test_f" time="99"/>
</testsuite></testsuites>
"""


def test_a_junit_file_becomes_seconds_per_unit(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    assert durations_from_junit(junit, ROOT) == {
        "tests/autoresume (job server, emulator)": 25.0,  # two files, one shared-fixture unit
        "tests/faults/test_group_faults.py": 50.0,
        "tests/test_suite_units.py": 0.2,
    }


def test_main_rewrites_the_file_the_order_reads(tmp_path, monkeypatch):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    out = tmp_path / "durations.json"
    monkeypatch.setattr("tests.support.units.DURATIONS", out)
    assert main([str(junit)]) == 0
    assert read_durations(out)["tests/faults/test_group_faults.py"] == 50.0
    assert json.loads(out.read_text())["units"]["tests/test_suite_units.py"] == 0.2


def test_a_missing_or_broken_file_leaves_the_collection_order(tmp_path):
    assert read_durations(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert read_durations(tmp_path / "bad.json") == {}


def test_the_committed_durations_name_units_of_this_tree():
    units = read_durations(DURATIONS)
    assert units, "tests/durations.json is missing or empty"
    for unit in units:
        assert unit == unit_of(unit) and (
            (ROOT / unit).is_file() or unit.startswith("tests/autoresume (")), unit
