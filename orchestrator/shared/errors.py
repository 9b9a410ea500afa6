"""One exception family for the orchestrator; every message names the fix.

Errors cross actor boundaries, so they stay picklable: plain attributes, args passed through.
``retryable`` separates what may be retried (an unreachable cluster: autoresume backs off) from what
must stop the run (a bad config, an incompatible checkpoint): a host call raising a non-retryable
error ends the run (``Fatal``), never a re-form. Lost hosts and hangs are not exceptions here: the
worker group reports them as typed statuses (``orchestrator.controller.seam``).
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base of every error this project raises on purpose."""

    retryable: bool = False

    def __init__(self, message: str, *, fix: str = "") -> None:
        self.message = message
        self.fix = fix
        super().__init__(message, fix)

    def __str__(self) -> str:
        return f"{self.message} Fix: {self.fix}" if self.fix else self.message

    def __reduce__(self):  # keep kwargs across pickling (Ray ships errors between processes)
        return (_rebuild, (type(self), self.message, self.fix, self.__dict__))


def _rebuild(cls, message, fix, state):
    obj = cls.__new__(cls)
    OrchestratorError.__init__(obj, message, fix=fix)
    obj.__dict__.update(state)
    return obj


class ConfigError(OrchestratorError):
    """A setting is invalid. ``setting`` is the dotted name the user should change."""

    def __init__(self, setting: str, problem: str, fix: str) -> None:
        self.setting = setting
        super().__init__(f"Invalid config `{setting}`: {problem}", fix=fix)


class TaskCodeError(ConfigError):
    """The task's own code (its data, loss, step or eval) does something the contract refuses.

    A ``ConfigError`` of ``task.kind`` (the setting that names the task) so callers that catch
    config errors still do, but worded as what it is: the config is fine, the code it names is
    not. ``part`` says which (``data``, ``eval data``, ``step``, ...)."""

    def __init__(self, part: str, problem: str, fix: str) -> None:
        super().__init__("task.kind", problem, fix)
        self.part, self.problem = part, problem
        self.message = f"The task's {part} is refused: {problem}"
        self.args = (self.message, fix)


class TopologyError(OrchestratorError):
    """The cluster cannot host the requested mesh (too few hosts, devices, slices)."""


class ClusterUnreachableError(OrchestratorError):
    """Ray is not where the config says it is."""

    retryable = True


class DoesNotFit(OrchestratorError):
    """The train state needs more memory than a device or a host has (``workers/training/memory.py``
    works it out from abstract shapes). ``component`` names which part (``device``, ``host``,
    ``ram_tier``), ``need``/``have`` are bytes. Bad input: exit 2 before anything starts."""

    def __init__(self, *, component: str, need: int, have: int, message: str,
                 fix: str) -> None:
        self.component = component
        self.need = need
        self.have = have
        super().__init__(message, fix=fix)


class CheckpointError(OrchestratorError):
    """A checkpoint is missing, incomplete or incompatible with the model."""


class CheckpointCorrupt(CheckpointError):
    """A committed checkpoint step cannot be read (truncated, garbled or missing array data).

    Raised by a host when its part of ``step`` fails to restore in a multi-process group: the
    peers are then stuck in Orbax's restore barrier, so the group cannot fall back in place.
    The driver re-forms and restores with ``skip_steps`` including ``step``; the host then
    moves the step directory aside (never deletes it) and restores the previous committed step.
    Not retryable as is: restoring the same step again fails the same way.
    """

    def __init__(self, *, step: int, reason: str, hosts: tuple[int, ...] = ()) -> None:
        self.step = step
        self.reason = reason
        self.hosts = hosts
        super().__init__(
            f"Checkpoint step {step} is corrupt: {reason}",
            fix=f"restore with skip_steps including {step} (the driver does this); the step "
                "directory is then moved aside as <step>.corrupt-<n> for inspection")


class DataError(ConfigError):
    """The training data is not what the run was set up with: a missing, unreadable or changed
    shard, a manifest that does not match its files, another tokenizer, a corrupt record, a
    sequence length or vocabulary the model does not take (``orchestrator/data``,
    ``workers/input``). Bad input like a bad setting: before the group forms it is exit 2 with
    the fix; on a host during the run it ends the run (not retryable) with the same message."""
