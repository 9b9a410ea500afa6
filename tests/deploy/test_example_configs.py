"""The example TPU configs in deploy/configs/ (issue 53, item 11): each loads with the config
loader, names its topology, and its mesh and batch fit that topology (and, multislice, the one
slice an elastic shrink leaves); every config the docs name ships."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "deploy" / "configs"
TOPOLOGY = re.compile(r"^# topology: slices=(\d+) hosts_per_slice=(\d+) devices_per_host=(\d+)$",
                      re.MULTILINE)
DOCS = ("README.md", "deploy/README.md", "deploy/kuberay/rayjob-example.yaml", "docs/data.md")
NAMED = re.compile(r"[\w./-]*configs/[\w.-]+\.yaml")


def shipped() -> list[Path]:
    return sorted(CONFIGS.glob("*.yaml"))


def test_every_generation_ships_one_slice_and_multislice():
    """v5e, v5p and v6e, each as one slice and as two."""
    names = {p.stem for p in shipped()}
    for gen in ("v5e", "v5p", "v6e"):
        mine = {n for n in names if n.startswith(gen)}
        assert any("x2" not in n for n in mine) and any(n.endswith("x2") for n in mine), gen


@pytest.mark.parametrize("path", shipped(), ids=lambda p: p.name)
def test_example_config_loads_and_fits_its_topology(path):
    """Loaded by the config loader; TPU mode on the accelerator its name says; every ICI axis
    spelled out (no -1) and the mesh and global batch valid on the topology it declares."""
    found = TOPOLOGY.search(path.read_text())
    assert found, f"{path.name}: no '# topology: ...' line"
    slices, hosts, devices = (int(x) for x in found.groups())
    cfg = load_config(str(path))
    assert cfg.cluster.mode == "tpu" and cfg.cluster.slices == slices
    assert cfg.cluster.accelerator == path.stem.split("-")[0]
    ici = cfg.mesh.ici
    assert -1 not in (ici.data, ici.fsdp, ici.tensor)
    assert ici.data * ici.fsdp * ici.tensor == hosts * devices
    shape = cfg.validate_for(slices=slices, hosts_per_slice=hosts, devices_per_host=devices)
    assert shape.dcn_data * shape.dcn_fsdp == slices
    if slices > 1:  # an elastic shrink to one slice must still resolve
        cfg.validate_for(slices=1, hosts_per_slice=hosts, devices_per_host=devices)


def test_the_docs_name_only_shipped_configs():
    """README and deploy docs name configs that exist (as deploy/configs/X, or X copied into
    the image's /app/configs/), not an invented configs/my-run.yaml."""
    for doc in DOCS:
        for named in NAMED.findall((ROOT / doc).read_text()):
            assert named.startswith(("deploy/configs/", "/app/configs/")), (doc, named)
            assert (CONFIGS / Path(named).name).is_file(), (doc, named)
