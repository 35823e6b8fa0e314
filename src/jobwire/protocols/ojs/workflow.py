"""Workflow requests (chain, group, batch): validate `POST /ojs/v1/workflows` bodies.

The conformance suite's shape: `{type, name, steps | jobs: [job...], callbacks?: {on_success,
on_failure, on_complete}}`; each job is a PUSH body. Every job is validated up front, so a
workflow is created whole or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobwire.protocols.ojs.envelope import PushRequest, parse_push
from jobwire.protocols.ojs.errors import OJSError, invalid

WORKFLOW_TYPES = ("chain", "group", "batch")
CALLBACKS = ("on_success", "on_failure", "on_complete")
MAX_STEPS = 1000


@dataclass(slots=True)
class WorkflowRequest:
    type: str
    name: str | None
    steps: list[dict[str, Any]]  # validated job bodies, as sent
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] | None = None


def _job(body: Any, where: str) -> PushRequest:
    if not isinstance(body, dict):
        raise invalid(f"{where} must be a job object {{type, args, options?}}")
    if "depends_on" in body:
        raise OJSError("unsupported", f"{where}: depends_on (DAG workflows) is not supported")
    try:
        return parse_push({k: v for k, v in body.items() if k != "id"})
    except OJSError as exc:
        raise invalid(f"{where}: {exc.message}", status=exc.status) from None


def parse_workflow(body: Any) -> WorkflowRequest:
    if not isinstance(body, dict):
        raise OJSError("invalid_payload", "request body must be a JSON object")
    kind = body.get("type")
    if kind not in WORKFLOW_TYPES:
        raise invalid(f"type must be one of {', '.join(WORKFLOW_TYPES)}")
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid("name must be a string")
    steps = body.get("steps", body.get("jobs"))
    if not isinstance(steps, list) or not steps:
        raise invalid("steps (or jobs) must be a non-empty array of jobs")
    if len(steps) > MAX_STEPS:
        raise invalid(f"a workflow has at most {MAX_STEPS} steps")
    for index, step in enumerate(steps):
        _job(step, f"steps[{index}]")
    raw_callbacks = body.get("callbacks") or {}
    if not isinstance(raw_callbacks, dict):
        raise invalid("callbacks must be an object {on_success?, on_failure?, on_complete?}")
    callbacks: dict[str, dict[str, Any]] = {}
    for key, value in raw_callbacks.items():
        if key not in CALLBACKS:
            raise invalid(f"callbacks keys must be among {', '.join(CALLBACKS)}")
        if value is None:
            continue
        _job(value, f"callbacks.{key}")
        callbacks[key] = value
    if callbacks and kind != "batch":
        raise invalid("callbacks are for batch workflows")
    meta = body.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise invalid("meta must be an object")
    return WorkflowRequest(kind, name, list(steps), callbacks, meta)
