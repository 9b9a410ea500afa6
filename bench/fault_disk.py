"""The fault matrix's disk-full row: a run whose checkpoint storage fills up mid-run.

``RUN_DIR/checkpoints`` is a size-limited tmpfs, mounted in a private mount namespace
(``unshare --mount``; without root, in a user namespace as well), so nothing outside this run
sees it and it goes when the run does. At step ``--fill-at`` a file fills what is left of it;
the next save meets ENOSPC for real (Orbax, tensorstore and Ray in the way). Then, as the stop
message says, the space is freed and the same command run again: it must resume from the last
committed checkpoint, none skipped as corrupt.

``python -m bench.fault_disk --probe DIR``: whether a namespace and a tmpfs can be had here
(exit 0). The row itself is ``bench/fault_rows.py: disk_full``; it runs ``inside`` through
``command()`` and reads the JSON ``inside`` writes (the mount is gone afterwards, so what the
checkpoints looked like is listed from inside).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TMPFS_BYTES = 64 * 1024 * 1024
"""The checkpoint storage: room for the tiny run's checkpoints many times over, until filled."""

RUN = ("run.total_steps=60",)


def unshare_argv() -> list[str] | None:
    """``unshare`` arguments for a private mount namespace in which this user may mount a
    tmpfs; None when ``unshare`` is missing."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [exe, *user, "--mount", "--propagation", "private"]


def command(*args: str) -> list[str] | None:
    base = unshare_argv()
    return None if base is None else [*base, sys.executable, "-m", "bench.fault_disk", *args]


def unavailable() -> str | None:
    """Why the row cannot run here (None: it can): a try at the namespace and the mount."""
    from bench import procs

    with tempfile.TemporaryDirectory(prefix="fault-disk-probe-") as tmp:
        cmd = command("--probe", tmp)
        if cmd is None:
            return "needs unshare(1) (util-linux) for a private mount namespace"
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False,
                                  cwd=procs.ROOT, env=procs.child_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"needs a private mount namespace with a tmpfs: {exc}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return ("needs root or unprivileged user namespaces (unshare --user --map-root-user "
                f"--mount) to mount a size-limited tmpfs for the run's checkpoints: {why}")
    return None


def _mount(path: Path, size: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(path)], check=True)


def fill(path: Path) -> int:
    """Write zeros to ``path`` until its filesystem is full; the bytes written."""
    written, chunk = 0, b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2]
                if len(chunk) < 4096:
                    return written


def _listing(ckpt: Path) -> dict:
    names = sorted(p.name for p in ckpt.iterdir() if p.name != "filler")
    return {"steps": sorted(int(n) for n in names if n.isdigit()),
            "other": [n for n in names if not n.isdigit()],
            "free_bytes": shutil.disk_usage(ckpt).free}


def inside(run: Path, fill_at: int, timeout_s: float, out: Path) -> int:
    from bench.fault_kit import Background, cli
    from bench.orchestrated import RunDir

    ckpt = run / "checkpoints"
    _mount(ckpt, TMPFS_BYTES)
    res: dict = {"tmpfs_bytes": TMPFS_BYTES}
    bg = Background.start(run, *RUN)
    try:
        if not bg.wait_step(fill_at, timeout_s):
            res["error"] = f"never reached step {fill_at}: {bg.log_tail(400)}"
        else:
            res["filled_at_step"] = bg.step()
            res["filled_bytes"] = fill(ckpt / "filler")
            res["filled_at"] = time.time()
            res["exit_code"] = bg.wait(timeout_s)
            res["stopped_at"] = time.time()
            res["leftovers"] = bg.leftovers(20.0)
    finally:
        bg.end()
    res["full"] = _listing(ckpt)
    res["first_summary"] = RunDir.read(run).summary
    if "error" not in res:
        (ckpt / "filler").unlink()  # the fix the stop message names: free space, run again
        code, rd = cli(run, *RUN, timeout_s=timeout_s)
        res["rerun"] = {"exit_code": code, "summary": rd.summary, "listing": _listing(ckpt)}
    out.write_text(json.dumps(res, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fault_disk", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--probe", help="mount a 1 MiB tmpfs at this dir and exit 0")
    p.add_argument("--run", help="the run dir (its checkpoints/ becomes the tmpfs)")
    p.add_argument("--fill-at", type=int, default=12)
    p.add_argument("--timeout-s", type=float, default=420.0)
    p.add_argument("--out", help="where the result JSON goes (outside the tmpfs)")
    args = p.parse_args(argv)
    if args.probe:
        _mount(Path(args.probe), 1 << 20)
        return 0
    if not (args.run and args.out):
        p.error("--run and --out are required")
    return inside(Path(args.run), args.fill_at, args.timeout_s, Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
