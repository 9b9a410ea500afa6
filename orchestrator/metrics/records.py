"""The step and eval records, defined in ``orchestrator.controller.records`` (the controller builds
them and its listener interface names them; metrics sits above the controller). Kept so scripts
that import them from here (``bench/``) still do."""

from orchestrator.controller.records import BadStepRecord, EvalRecord, StepRecord

__all__ = ["BadStepRecord", "EvalRecord", "StepRecord"]
