"""Workflow requests (chain, group, batch): validate `POST /ojs/v1/workflows` bodies.

The conformance suite's shape: `{type, name, steps | jobs: [job...], callbacks?: {on_success,
on_failure, on_complete}}`; each job is a PUSH body (`messages.Workflow`). Every job is
validated up front, so a workflow is created whole or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobwire.protocols.ojs.envelope import push_request
from jobwire.protocols.ojs.errors import OJSError, invalid
from jobwire.protocols.ojs.limits import MAX_STEPS
from jobwire.protocols.ojs.messages import Template, Workflow, convert

WORKFLOW_TYPES = ("chain", "group", "batch")
CALLBACKS = ("on_success", "on_failure", "on_complete")

__all__ = ["CALLBACKS", "MAX_STEPS", "WORKFLOW_TYPES", "WorkflowRequest", "parse_workflow"]


@dataclass(slots=True)
class WorkflowRequest:
    type: str
    name: str | None
    steps: list[dict[str, Any]]  # validated job bodies, as sent
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] | None = None


def _check_job(env: Template, body: Any, where: str) -> None:
    if isinstance(body, dict) and "depends_on" in body:
        raise OJSError("unsupported", f"{where}: depends_on (DAG workflows) is not supported")
    push_request(env, body)


def parse_workflow(body: Any) -> WorkflowRequest:
    if not isinstance(body, dict):
        raise OJSError("invalid_payload", "request body must be a JSON object")
    raw_callbacks = body.get("callbacks")
    if isinstance(raw_callbacks, dict):
        for key in raw_callbacks:
            if key not in CALLBACKS:
                raise invalid(f"callbacks keys must be among {', '.join(CALLBACKS)}")
    flow = convert(body, Workflow)
    key = "steps" if flow.steps is not None else "jobs"
    envelopes = flow.steps if flow.steps is not None else flow.jobs
    assert envelopes is not None  # Workflow.__post_init__
    raw_steps = body[key]
    for index, (env, raw) in enumerate(zip(envelopes, raw_steps, strict=True)):
        _check_job(env, raw, f"{key}[{index}]")
    callbacks: dict[str, dict[str, Any]] = {}
    if flow.callbacks is not None and isinstance(raw_callbacks, dict):
        for name in CALLBACKS:
            env = getattr(flow.callbacks, name)
            if env is not None:
                _check_job(env, raw_callbacks[name], f"callbacks.{name}")
                callbacks[name] = raw_callbacks[name]
    if callbacks and flow.type != "batch":
        raise invalid("callbacks are for batch workflows")
    return WorkflowRequest(flow.type, flow.name, list(raw_steps), callbacks, flow.meta)
