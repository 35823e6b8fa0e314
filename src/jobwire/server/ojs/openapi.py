"""The OpenAPI 3.1 description of `/ojs/v1`, served at `/ojs/v1/openapi.json`.

The paths are listed here (one entry per route in `add_routes` of each module); the request
bodies are the typed messages of `protocols/ojs/messages.py`, their schemas generated from the
same structs that decode and validate the requests, so types and limits cannot drift. The
schemathesis test in tests/ojs fuzzes the server against this document.
"""

from __future__ import annotations

from typing import Any

from jobwire import __version__
from jobwire.protocols.ojs.limits import MAX_NAME
from jobwire.protocols.ojs.messages import QUEUE_PATTERN, schemas

JSON = "application/json"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "retryable"],
            "properties": {
                "code": {"type": "string"},
                "type": {"type": "string"},
                "message": {"type": "string"},
                "retryable": {"type": "boolean"},
                "request_id": {"type": "string"},
                "hint": {"type": "string"},
                "docs_url": {"type": "string"},
                "details": {"type": "object"},
            },
        }
    },
}

_QUEUE_NAME = {"type": "string", "pattern": QUEUE_PATTERN, "maxLength": MAX_NAME}

_JOB = {
    "type": "object",
    "required": ["id", "type", "queue", "args", "state", "attempt"],
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string"},
        "queue": {"type": "string"},
        "args": {"type": "array"},
        "state": {
            "type": "string",
            "enum": [
                "scheduled",
                "pending",
                "available",
                "active",
                "retryable",
                "completed",
                "cancelled",
                "discarded",
            ],
        },
        "attempt": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "priority": {"type": "integer"},
    },
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {JSON: {"schema": schema}}}


def _ok(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema or {"type": "object"}}}}


def _op(
    summary: str,
    *,
    body: dict[str, Any] | None = None,
    ok: int = 200,
    result: dict[str, Any] | None = None,
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            str(ok): _ok(summary, result),
            "4XX": {
                "description": "refused: an OJS error body",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
        },
    }
    if body is not None:
        op["requestBody"] = _body(body)
    if parameters:
        op["parameters"] = parameters
    return op


def _path_param(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema or {"type": "string"}}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def openapi_document() -> dict[str, Any]:
    job_id = [_path_param("id")]
    queue = [_path_param("name", _QUEUE_NAME)]
    job_reply = {"type": "object", "properties": {"job": {"$ref": "#/components/schemas/Job"}}}
    paths: dict[str, Any] = {
        "/health": {"get": _op("Health")},
        "/jobs": {"post": _op("Push a job", body=_ref("Envelope"), ok=201, result=job_reply)},
        "/jobs/batch": {
            "post": _op(
                "Push jobs, all or nothing",
                body=_ref("Batch"),
                ok=201,
            )
        },
        "/jobs/{id}": {
            "get": _op("Get a job", parameters=job_id, result=job_reply),
            "delete": _op("Cancel a job", parameters=job_id, result=job_reply),
        },
        "/jobs/{id}/activate": {"post": _op("Activate a pending job", parameters=job_id)},
        "/workers/fetch": {
            "post": _op(
                "Fetch jobs",
                body=_ref("Fetch"),
            )
        },
        "/workers/ack": {
            "post": _op(
                "Acknowledge (complete) a job",
                body=_ref("Ack"),
            )
        },
        "/workers/nack": {
            "post": _op(
                "Fail a job",
                body=_ref("Nack"),
            )
        },
        "/workers/heartbeat": {
            "post": _op(
                "Heartbeat (BEAT): extend leases, learn the directed state",
                body=_ref("Heartbeat"),
            )
        },
        "/workers/register": {
            "post": _op(
                "Register a worker (jobwire extension)",
                body=_ref("Register"),
            )
        },
        "/workers/deregister": {
            "post": _op(
                "Deregister a worker (jobwire extension)",
                body=_ref("Deregister"),
            )
        },
        "/workers": {"get": _op("List workers")},
        "/admin/workers/{worker_id}/state": {
            "post": _op(
                "Set a worker's lifecycle state (operator)",
                parameters=[_path_param("worker_id")],
                body=_ref("WorkerDirective"),
            )
        },
        "/queues": {"get": _op("List queues")},
        "/queues/{name}/stats": {"get": _op("Queue statistics", parameters=queue)},
        "/queues/{name}/pause": {"post": _op("Pause a queue", parameters=queue)},
        "/queues/{name}/resume": {"post": _op("Resume a queue", parameters=queue)},
        "/dead-letter": {
            "get": _op(
                "List dead letter jobs",
                parameters=[
                    _query("queue", _QUEUE_NAME),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}),
                    _query("offset", {"type": "integer", "minimum": 0}),
                ],
            )
        },
        "/dead-letter/{id}/retry": {"post": _op("Retry a dead letter job", parameters=job_id)},
        "/dead-letter/{id}": {"delete": _op("Delete a dead letter job", parameters=job_id)},
        "/events": {
            "get": _op(
                "Recent job, cron and workflow events",
                parameters=[
                    _query("types", {"type": "string"}),
                    _query("queues", {"type": "string"}),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}),
                    _query("after", {"type": "integer", "minimum": 0}),
                ],
            )
        },
        "/cron": {
            "get": _op("List cron registrations"),
            "post": _op("Register (upsert) a cron schedule", body=_ref("CronRegistration"), ok=201),
        },
        "/cron/{name}": {
            "get": _op("Get a cron registration", parameters=[_path_param("name")]),
            "patch": _op(
                "Enable or disable a cron registration",
                parameters=[_path_param("name")],
                body=_ref("CronToggle"),
            ),
            "delete": _op("Delete a cron registration", parameters=[_path_param("name")]),
        },
        "/workflows": {"post": _op("Create a workflow", body=_ref("Workflow"), ok=201)},
        "/workflows/{id}": {
            "get": _op("Get a workflow", parameters=job_id),
            "delete": _op("Cancel a workflow", parameters=job_id),
        },
        # The OJS worker protocol's own paths, aliases of /workers/fetch, ack and nack.
        "/jobs/fetch": {"post": _op("Fetch jobs (worker protocol path)", body=_ref("Fetch"))},
        "/jobs/{id}/ack": {
            "post": _op("Acknowledge a job (worker protocol path)", parameters=job_id)
        },
        "/jobs/{id}/nack": {"post": _op("Fail a job (worker protocol path)", parameters=job_id)},
        # Extensions (README: which ones jobwire passes).
        "/jobs/{id}/progress": {
            "put": _op("Report a job's progress", parameters=job_id, body=_ref("Progress")),
            "get": _op("A job's progress", parameters=job_id),
        },
        "/workers/beat": {"post": _op("Heartbeat (extensions' path)", body=_ref("Heartbeat"))},
        "/workers/{worker_id}/health": {
            "get": _op("A worker's liveness", parameters=[_path_param("worker_id")])
        },
        "/rate-limits/{key}": {"get": _op("A rate limit's state", parameters=[_path_param("key")])},
        "/admin/stats": {"get": _op("Server statistics")},
        "/admin/queues": {"get": _op("Queues, with their settings")},
        "/admin/queues/{name}/pause": {"post": _op("Pause a queue", parameters=queue)},
        "/admin/queues/{name}/resume": {"post": _op("Resume a queue", parameters=queue)},
        "/admin/queues/{name}/config": {
            "get": _op("A queue's settings", parameters=queue),
            "put": _op("Set a queue's settings", parameters=queue, body=_ref("QueueConfig")),
        },
        "/admin/workers": {"get": _op("Workers of every protocol")},
        "/admin/jobs/bulk/retry": {"post": _op("Retry jobs in bulk", body=_ref("BulkRetry"))},
        "/admin/jobs/{id}": {"get": _op("A job in detail", parameters=job_id)},
        "/admin/dead-letter": {"get": _op("Dead letter jobs")},
        "/admin/dead-letter/stats": {"get": _op("Dead letter statistics")},
        "/admin/dead-letter/{id}/retry": {
            "post": _op("Retry a dead letter job", parameters=job_id)
        },
        "/admin/dead-letter/{id}": {"delete": _op("Delete a dead letter job", parameters=job_id)},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jobwire: Open Job Spec HTTP binding",
            "version": __version__,
            "description": "The /ojs/v1 API of jobwire. Every refusal is an OJS error body.",
        },
        "servers": [{"url": "/ojs/v1"}],
        "paths": paths,
        "components": {"schemas": {"Error": _ERROR, "Job": _JOB, **schemas()}},
    }
