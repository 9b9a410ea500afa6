"""Event intake: every source (Pub/Sub, metadata, Ray, operator CLI) becomes an ``Event``."""

from orchestrator.events.model import Event, EventKind, MalformedEvent, Target

__all__ = ["Event", "EventKind", "MalformedEvent", "Target"]
