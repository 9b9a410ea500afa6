"""``python -m orchestrator.main --print-config`` (issue 53, item 11): the resolved config as YAML
with each setting's default and one-line doc, printed without starting anything."""

from __future__ import annotations

import pytest
import yaml

from orchestrator import main as driver_main
from orchestrator.config import load_config
from orchestrator.driver.show_config import field_docs

OVERRIDES = ["run.total_steps=50", "train.global_batch=32", "checkpoint.ram.enabled=false"]


def test_print_config_prints_the_resolved_tree_with_defaults_and_docs(capsys, monkeypatch,
                                                                       tmp_path):
    """Exit 0 with no driver built; the YAML is the resolved config (it loads back to the same
    run), a changed setting names its default, documented settings carry their doc."""

    def no_driver(*args, **kwargs):
        raise AssertionError("--print-config must start nothing")

    monkeypatch.setattr(driver_main, "Driver", no_driver)
    assert driver_main.main(["--print-config", *OVERRIDES]) == 0
    out = capsys.readouterr().out
    cfg = load_config(None, OVERRIDES)
    assert yaml.safe_load(out) == cfg.as_dict()
    printed = tmp_path / "printed.yaml"
    printed.write_text(out)
    assert load_config(str(printed)).digest() == cfg.digest()
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if ":" in line}
    assert "# default: 200" in lines["total_steps"]
    assert any(line.strip().startswith("enabled: false  ") and "# default: auto;" in line
               for line in out.splitlines())  # checkpoint.ram.enabled, with its doc after
    assert "Steps each host runs per driver call" in lines["steps_per_call"]
    assert "0: decay over run.total_steps." in lines["decay_steps"]  # a shared section's doc
    assert "# default" not in lines["seed"]


def test_bad_overrides_still_exit_2_and_help_names_the_flag(capsys):
    """A bad setting is refused as for a run; --help names --print-config."""
    assert driver_main.main(["--print-config", "run.nope=1"]) == 2
    assert "run.nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        driver_main.parse_args(["--help"])
    assert "--print-config" in capsys.readouterr().out


def test_field_docs_reads_attribute_docstrings():
    """The doc of a field is the string under it, first sentence, one line."""
    from orchestrator.config import ClusterConfig, RunSection

    assert field_docs(RunSection)["steps_per_call"].startswith("Steps each host runs")
    assert "total_steps" not in field_docs(RunSection)  # no docstring: no doc
    assert "\n" not in field_docs(ClusterConfig)["device_memory_gib"]
