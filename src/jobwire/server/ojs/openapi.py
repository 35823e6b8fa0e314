"""The OpenAPI 3 description of `/ojs/v1`, served at `/ojs/v1/openapi.json`.

Written by hand beside the routes (one entry per route in `add_routes` of each module); the
schemathesis test in tests/ojs fuzzes the server against it, so the two cannot drift far.
"""

from __future__ import annotations

from typing import Any

from jobwire import __version__

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

_RETRY = {
    "type": "object",
    "properties": {
        "max_attempts": {"type": "integer", "minimum": 0},
        "initial_interval": {"type": "string", "example": "PT1S"},
        "backoff_coefficient": {"type": "number", "minimum": 1},
        "max_interval": {"type": "string", "example": "PT5M"},
        "jitter": {"type": "boolean"},
        "backoff_strategy": {
            "type": "string",
            "enum": ["exponential", "linear", "constant", "none", "polynomial"],
        },
        "non_retryable_errors": {"type": "array", "items": {"type": "string"}},
        "on_exhaustion": {"type": "string", "enum": ["discard", "dead_letter"]},
    },
}

_UNIQUE = {
    "type": "object",
    "properties": {
        "keys": {
            "type": "array",
            "items": {"type": "string", "enum": ["type", "queue", "args", "meta"]},
        },
        "args_keys": {"type": "array", "items": {"type": "string"}},
        "meta_keys": {"type": "array", "items": {"type": "string"}},
        "period": {"type": "string", "example": "PT1H"},
        "states": {"type": "array", "items": {"type": "string"}},
        "on_conflict": {"type": "string", "enum": ["reject", "ignore", "replace"]},
    },
}

_QUEUE_NAME = {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$", "maxLength": 255}

_JOB_REQUEST = {
    "type": "object",
    "required": ["type", "args"],
    "properties": {
        "id": {"type": "string", "format": "uuid", "description": "a UUIDv7; generated if absent"},
        "type": {"type": "string", "pattern": "^[a-z][a-z0-9_-]*(\\.[a-z][a-z0-9_-]*)*$"},
        "args": {"type": "array"},
        "meta": {"type": "object"},
        "specversion": {"type": "string", "enum": ["1.0"]},
        "options": {
            "type": "object",
            "properties": {
                "queue": _QUEUE_NAME,
                "priority": {"type": "integer", "minimum": -100, "maximum": 100},
                "timeout_ms": {"type": "integer", "minimum": 0},
                "visibility_timeout_ms": {"type": "integer", "minimum": 0},
                "scheduled_at": {"type": "string", "format": "date-time"},
                "delay_until": {"type": "string", "format": "date-time"},
                "expires_at": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "pending": {"type": "boolean"},
                "retry": _RETRY,
                "unique": _UNIQUE,
                "rate_limit": {
                    "type": "object",
                    "properties": {"max_per_second": {"type": "integer", "minimum": 1}},
                },
            },
        },
    },
}

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

_CRON_REQUEST = {
    "type": "object",
    "required": ["name", "expression", "job_template"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 255},
        "expression": {"type": "string", "example": "*/5 * * * *"},
        "timezone": {"type": "string", "example": "Europe/Paris"},
        "overlap_policy": {
            "type": "string",
            "enum": ["skip", "allow", "cancel_previous", "enqueue"],
        },
        "enabled": {"type": "boolean"},
        "description": {"type": "string"},
        "job_template": _JOB_REQUEST,
    },
}

_WORKFLOW_REQUEST = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"type": "string", "enum": ["chain", "group", "batch"]},
        "name": {"type": "string"},
        "steps": {"type": "array", "items": _JOB_REQUEST, "minItems": 1},
        "jobs": {"type": "array", "items": _JOB_REQUEST, "minItems": 1},
        "callbacks": {
            "type": "object",
            "properties": {
                "on_success": _JOB_REQUEST,
                "on_failure": _JOB_REQUEST,
                "on_complete": _JOB_REQUEST,
            },
        },
    },
}

_WORKER_ID = {"type": "string", "minLength": 1}


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
        "/jobs": {"post": _op("Push a job", body=_JOB_REQUEST, ok=201, result=job_reply)},
        "/jobs/batch": {
            "post": _op(
                "Push jobs, all or nothing",
                body={
                    "type": "object",
                    "required": ["jobs"],
                    "properties": {"jobs": {"type": "array", "items": _JOB_REQUEST}},
                },
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
                body={
                    "type": "object",
                    "properties": {
                        "queues": {"type": "array", "items": _QUEUE_NAME, "minItems": 1},
                        "count": {"type": "integer", "minimum": 1, "maximum": 1000},
                        "worker_id": _WORKER_ID,
                        "visibility_timeout_ms": {"type": "integer", "minimum": 1},
                    },
                },
            )
        },
        "/workers/ack": {
            "post": _op(
                "Acknowledge (complete) a job",
                body={
                    "type": "object",
                    "required": ["job_id"],
                    "properties": {"job_id": {"type": "string"}, "result": {}},
                },
            )
        },
        "/workers/nack": {
            "post": _op(
                "Fail a job",
                body={
                    "type": "object",
                    "required": ["job_id"],
                    "properties": {
                        "job_id": {"type": "string"},
                        "requeue": {"type": "boolean"},
                        "error": {
                            "type": "object",
                            "properties": {
                                "code": {"type": "string"},
                                "type": {"type": "string"},
                                "message": {"type": "string"},
                                "retryable": {"type": "boolean"},
                                "details": {"type": "object"},
                            },
                        },
                    },
                },
            )
        },
        "/workers/heartbeat": {
            "post": _op(
                "Heartbeat (BEAT): extend leases, learn the directed state",
                body={
                    "type": "object",
                    "required": ["worker_id"],
                    "properties": {
                        "worker_id": _WORKER_ID,
                        "state": {"type": "string", "enum": ["running", "quiet", "terminate"]},
                        "active_jobs": {"type": "array", "items": {"type": "string"}},
                        "active_job_ids": {"type": "array", "items": {"type": "string"}},
                        "visibility_timeout_ms": {"type": "integer", "minimum": 1},
                    },
                },
            )
        },
        "/workers/register": {
            "post": _op(
                "Register a worker (jobwire extension)",
                body={
                    "type": "object",
                    "properties": {
                        "worker_id": _WORKER_ID,
                        "hostname": {"type": "string"},
                        "pid": {"type": "integer"},
                        "queues": {"type": "array", "items": _QUEUE_NAME, "minItems": 1},
                        "concurrency": {"type": "integer", "minimum": 1},
                        "labels": {"type": "array", "items": {"type": "string"}},
                    },
                },
            )
        },
        "/workers/deregister": {
            "post": _op(
                "Deregister a worker (jobwire extension)",
                body={
                    "type": "object",
                    "required": ["worker_id"],
                    "properties": {"worker_id": _WORKER_ID},
                },
            )
        },
        "/workers": {"get": _op("List workers")},
        "/admin/workers/{worker_id}/state": {
            "post": _op(
                "Set a worker's lifecycle state (operator)",
                parameters=[_path_param("worker_id")],
                body={
                    "type": "object",
                    "required": ["state"],
                    "properties": {
                        "state": {"type": "string", "enum": ["running", "quiet", "terminate"]}
                    },
                },
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
            "post": _op("Register (upsert) a cron schedule", body=_CRON_REQUEST, ok=201),
        },
        "/cron/{name}": {
            "get": _op("Get a cron registration", parameters=[_path_param("name")]),
            "patch": _op(
                "Enable or disable a cron registration",
                parameters=[_path_param("name")],
                body={
                    "type": "object",
                    "required": ["enabled"],
                    "properties": {"enabled": {"type": "boolean"}},
                },
            ),
            "delete": _op("Delete a cron registration", parameters=[_path_param("name")]),
        },
        "/workflows": {"post": _op("Create a workflow", body=_WORKFLOW_REQUEST, ok=201)},
        "/workflows/{id}": {
            "get": _op("Get a workflow", parameters=job_id),
            "delete": _op("Cancel a workflow", parameters=job_id),
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "jobwire: Open Job Spec HTTP binding",
            "version": __version__,
            "description": "The /ojs/v1 API of jobwire. Every refusal is an OJS error body.",
        },
        "servers": [{"url": "/ojs/v1"}],
        "paths": paths,
        "components": {"schemas": {"Error": _ERROR, "Job": _JOB}},
    }
