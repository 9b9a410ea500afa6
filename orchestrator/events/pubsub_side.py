"""The intake's Pub/Sub side: the emulator it starts when none is given, the topic and
subscription an emulator needs (again after each restart: it forgets everything), the
pulling source, and their shutdown. The intake hands it the per-run config and a callback."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from orchestrator.events.config import PubSubConfig
from orchestrator.events.pubsub_source import (
    Delivery,
    PubSubSource,
    ensure_topic_and_subscription,
)
from orchestrator.shared.files import atomic_write_text

log = structlog.get_logger(__name__)

PUBSUB_INFO_FILE = "pubsub.json"  # where a driver-started emulator is, for the CLI


class PubSubSide:
    """Starts and stops the Pub/Sub source for one run; ``cfg`` is the config in effect (the
    embedded emulator's host once started)."""

    def __init__(self, cfg: PubSubConfig, *, run_dir: Path, job: str,
                 on_delivery: Callable[[Delivery], None],
                 subscriber_factory: Callable[[PubSubConfig], Any],
                 publisher_factory: Callable[[PubSubConfig], Any],
                 emulator_factory: Callable[[], Any] | None) -> None:
        self.cfg = cfg
        self.run_dir, self.job = run_dir, job
        self._on_delivery = on_delivery
        self._subscriber_factory = subscriber_factory
        self._publisher_factory = publisher_factory
        self._emulator_factory = emulator_factory
        self.source: PubSubSource | None = None
        self._emulator: Any = None

    def start(self) -> None:
        cfg = self.cfg
        prepare = None
        if cfg.emulator:
            if not (cfg.emulator_host or _env_emulator()):
                started = self._start_emulator(cfg)
                if started is None:
                    return
                cfg = started
            info = {"emulator_host": cfg.emulator_host or _env_emulator(), "project": cfg.project,
                    "topic": cfg.topic, "subscription": cfg.subscription, "job": self.job}
            atomic_write_text(self.run_dir / PUBSUB_INFO_FILE, json.dumps(info))  # no link
            emulated = cfg

            def prepare() -> None:  # the emulator forgets everything when restarted
                publisher = self._publisher_factory(emulated)
                subscriber = self._subscriber_factory(emulated)
                try:
                    ensure_topic_and_subscription(publisher, subscriber, emulated.project or "",
                                                  emulated.topic or "",
                                                  emulated.subscription or "")
                finally:
                    subscriber.close()
                    publisher.transport.close()
        if not cfg.enabled:
            return
        self.cfg = cfg
        self.source = PubSubSource(cfg, self._on_delivery,
                                   subscriber_factory=self._subscriber_factory, prepare=prepare)
        self.source.start()

    def _start_emulator(self, cfg: PubSubConfig) -> PubSubConfig | None:
        """Embedded default: run Google's emulator for this driver when gcloud exists."""
        from orchestrator.events.emulator import EmulatorProcess, gcloud_available

        if self._emulator_factory is None and not gcloud_available():
            log.warning("pubsub_emulator_unavailable",
                        fix="install the Google Cloud CLI, or publish with the inbox "
                            "(python -m orchestrator.events publish --run-dir ...)")
            return None
        try:
            self._emulator = (self._emulator_factory or EmulatorProcess)()
            host = self._emulator.start()
        except Exception as exc:
            log.warning("pubsub_emulator_failed", error=str(exc)[:300],
                        fix="the inbox still works; check `gcloud beta emulators pubsub start`")
            self._emulator = None
            return None
        log.info("pubsub_emulator_started", emulator_host=host)
        return replace(cfg, emulator_host=host)

    def stop(self) -> None:
        """Stop the source and the emulator this side started. Idempotent."""
        if self.source is not None:
            self.source.stop()
            self.source = None
        if self._emulator is not None:
            try:
                self._emulator.close()
            finally:
                self._emulator = None
        (self.run_dir / PUBSUB_INFO_FILE).unlink(missing_ok=True)


def _env_emulator() -> str | None:
    return os.environ.get("PUBSUB_EMULATOR_HOST") or None
