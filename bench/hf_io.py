"""``python -m bench.hf_io [--preset 1b] [--hosts 4]``: Hugging Face export and import of a
preset's real tensor shapes on this machine (issue 50's closing figure).

Synthetic weights of the preset's shapes (float32, as the family keeps them) are exported the
way ``orchestrator.export --format hf`` writes them (Hugging Face names and layout, bfloat16,
one file under 5 GB), then read back as ``task.init_from`` reads them: the whole tree (one
process), and one host's share of every leaf (``--hosts`` hosts splitting each leaf's first
axis, the reads a host of an fsdp mesh makes). Reads are timed with the file in the page cache
(just written) and, where this user may drop it, cold. A JSON result with the load before each
measurement goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from bench import machine
from orchestrator.export.hf import _shards, _write_weights
from workers.models import hf_llama
from workers.models.llama import LlamaConfig


def synthetic(cfg: LlamaConfig, seed: int = 0) -> dict:
    """The family's parameter tree with random float32 values of the real shapes."""
    rng = np.random.default_rng(seed)
    tree: dict = {}
    for path, leaf in hf_llama.leaf_tensors(cfg).items():
        shape = leaf[0].kernel if len(leaf) == 1 and leaf[0].layer is None else \
            (len(leaf), *leaf[0].kernel)
        hf_llama._put(tree, path, rng.random(shape, dtype=np.float32) - 0.5)
    return tree


def drop_page_cache(path: Path) -> bool:
    """Evict ``path``'s pages (``posix_fadvise`` DONTNEED after a sync): a cold read next."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except (OSError, AttributeError):
        return False


def read_all(ckpt: hf_llama.Checkpoint, cfg: LlamaConfig, *, hosts: int = 1, host: int = 0
             ) -> int:
    """Bytes read: every leaf whole (``hosts`` 1), or host ``host``'s share of its first axis."""
    nbytes = 0
    for leaf in hf_llama.leaf_tensors(cfg).values():
        stacked = cfg.scan_layers and leaf[0].layer is not None
        shape = (len(leaf), *leaf[0].kernel) if stacked else leaf[0].kernel
        n = shape[0] // hosts if shape[0] % hosts == 0 else shape[0]
        index = (slice(host * n, (host + 1) * n) if n != shape[0] else slice(None),
                 *(slice(None),) * (len(shape) - 1))
        nbytes += hf_llama.read_leaf(ckpt, cfg, leaf, index).nbytes
    return nbytes


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hf_io", description=__doc__)
    p.add_argument("--preset", default="1b")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    cfg = LlamaConfig.preset(args.preset)
    loads: list[dict] = []
    rows: dict[str, dict] = {}

    def measure(name: str, fn, *a, nbytes: int | None = None, **kw):
        before = machine.load_average()
        seconds, out = timed(fn, *a, **kw)
        loads.append({"measurement": name, "before": before, "after": machine.load_average()})
        size = nbytes if nbytes is not None else int(out)
        rows[name] = {"seconds": round(seconds, 3), "bytes": size,
                      "gb_s": round(size / seconds / 1e9, 3) if seconds > 0 else None}
        print(f"{name:<34} {seconds:8.2f} s  {size / 1e9:7.2f} GB  "
              f"{rows[name]['gb_s']} GB/s", flush=True)

    state = {"params": synthetic(cfg)}
    bf16 = np.dtype(ml_dtypes.bfloat16)
    entries = [(t.hf, t.hf_shape) for t in hf_llama.tensors(cfg)]
    total = sum(int(np.prod(s)) for _, s in entries) * bf16.itemsize
    work = Path(tempfile.mkdtemp(prefix="bench-hf-io-"))
    try:
        shards = _shards(entries, bf16.itemsize, 5 * 10**9)

        def export() -> int:
            (work / "hf").mkdir()
            produced = hf_llama.hf_tensors(state["params"], cfg, bf16)
            _write_weights(work / "hf", shards, produced, bf16, 0)
            (work / "hf" / hf_llama.CONFIG).write_text(json.dumps(
                hf_llama.config_to_hf(cfg, dtype="bfloat16")))
            return total

        measure("export (bf16, HF layout)", export)
        state.clear()  # the export's source freed before the reads
        files = sorted((work / "hf").glob("*.safetensors"))
        ckpt = hf_llama.Checkpoint(work / "hf")
        measure("import: whole tree, page cache", read_all, ckpt, cfg)
        measure(f"import: 1 of {args.hosts} hosts, page cache", read_all, ckpt, cfg,
                hosts=args.hosts)
        cold = all(drop_page_cache(f) for f in files)
        if cold:
            ckpt = hf_llama.Checkpoint(work / "hf")
            measure(f"import: 1 of {args.hosts} hosts, cold", read_all, ckpt, cfg,
                    hosts=args.hosts)
            for f in files:
                drop_page_cache(f)
            ckpt = hf_llama.Checkpoint(work / "hf")
            measure("import: whole tree, cold", read_all, ckpt, cfg)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"preset": args.preset, "hosts": args.hosts, "export_dtype": "bfloat16",
              "hf_bytes": total, "rows": rows, "machine": machine.describe(), "loads": loads,
              "validity": machine.validity(loads)}
    v = result["validity"]
    print(f"validity: {'VALID' if v['valid'] else 'NOT A RESULT'} (1-minute load before each "
          f"measurement <= {v['max_load_1min_before']})")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"hf-io-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"json: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
