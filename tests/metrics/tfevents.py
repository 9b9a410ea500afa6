"""Read TensorBoard event files back without TensorFlow or TensorBoard: the TFRecord framing
(length, masked CRC-32C of the length, data, masked CRC-32C of the data; every CRC checked) and
tensorboardX's ``Event`` proto. ``visible`` applies TensorBoard's rule for a step seen again."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c


@dataclass(frozen=True)
class Point:
    tag: str
    step: int
    wall_time: float
    value: float | str
    description: str = ""
    has_metadata: bool = False
    plugin: str = ""


def records(path: Path) -> list[bytes]:
    """The records of one TFRecord file; AssertionError on a bad CRC or a torn record."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        assert crc == masked_crc32c(header), f"{path}: bad length CRC at byte {pos}"
        body = data[pos + 12:pos + 12 + length]
        (crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert len(body) == length and crc == masked_crc32c(body), f"{path}: bad data CRC"
        out.append(body)
        pos += 16 + length
    return out


def read_dir(logdir: Path) -> tuple[list[str], list[Point]]:
    """(file versions, points in file then record order) of every event file in ``logdir``."""
    versions: list[str] = []
    points: list[Point] = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for raw in records(path):
            ev = Event.FromString(raw)
            if ev.file_version:
                versions.append(ev.file_version)
            for v in ev.summary.value:
                plugin = v.metadata.plugin_data.plugin_name
                if plugin == "text":
                    value: float | str = v.tensor.string_val[0].decode()
                elif plugin == "scalars":
                    value = v.tensor.float_val[0]
                else:
                    value = v.simple_value
                points.append(Point(v.tag, ev.step, ev.wall_time, value,
                                    v.metadata.summary_description,
                                    v.HasField("metadata"), plugin))
    return versions, points


def series(points: list[Point], tag: str) -> list[Point]:
    return [p for p in points if p.tag == tag]


def visible(points: list[Point], tag: str) -> list[Point]:
    """What TensorBoard shows of ``tag``: a point at step s drops the tag's earlier points at
    steps >= s (its data server's reservoir preemption)."""
    shown: list[Point] = []
    for p in series(points, tag):
        shown = [q for q in shown if q.step < p.step]
        shown.append(p)
    return shown


def event_jsons(text: str) -> list[dict]:
    """The events of one ``lifecycle/events`` entry: each is a code-block line (4 spaces) of
    JSON under its ``**at training step N**`` heading."""
    return [json.loads(line[4:]) for line in text.splitlines() if line.startswith("    ")]
