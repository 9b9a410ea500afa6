"""Every figure in bench/results says whether it is a result (issue 52): a `validity` record with
the load before each measurement, or, for files written before that was recorded, one that says
so (`valid: null`) rather than nothing."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_every_result_file_carries_its_validity_record():
    missing = []
    # a result is a file in bench/results or in a result's folder (deeper: its parts, run dirs)
    for path in sorted([*RESULTS.glob("*.json"), *RESULTS.glob("*/*.json")]):
        data = json.loads(path.read_text())
        v = data.get("validity") if isinstance(data, dict) else None
        if not isinstance(v, dict) or v.get("valid") not in (True, False, None) or (
                v.get("valid") is None and not v.get("note")):
            missing.append(str(path.relative_to(RESULTS)))
    assert not missing, f"no validity record (bench/machine.py: validity): {missing}"
