"""Cron routes: register (upsert), list, get, enable/disable, delete.

Accepted bodies: the conformance suite's `{name, expression, job_template: {type, args,
options}}` and the cron spec's `{name, cron, type, args, options}`; both may add `timezone`,
`overlap_policy`, `enabled`, `description`. The job template is validated as a PUSH at
registration, so a schedule never fires a job that cannot be created. Replies carry the
entry under `cron` and `cron_job` (lists under `crons` and `cron_jobs`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from jobwire.engine.cron import CronEntry, new_entry
from jobwire.engine.cronexpr import CronError, zone
from jobwire.protocols.ojs.envelope import parse_push
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.messages import CronRegistration, CronToggle, convert, refused
from jobwire.protocols.ojs.times import format_time
from jobwire.server.ojs.http import BASE, read_object, reply

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    routes = CronRoutes(service)
    router.add_post(BASE + "/cron", routes.register)
    router.add_get(BASE + "/cron", routes.list_entries)
    router.add_get(BASE + "/cron/{name}", routes.get)
    router.add_patch(BASE + "/cron/{name}", routes.toggle)
    router.add_delete(BASE + "/cron/{name}", routes.delete)


def cron_json(entry: CronEntry) -> dict[str, Any]:
    template = entry.template
    options = template.get("options") or {}
    return {
        "name": entry.name,
        "expression": entry.expression.text,
        "cron": entry.expression.text,
        "timezone": entry.timezone,
        "overlap_policy": entry.overlap_policy,
        "enabled": entry.enabled,
        "description": entry.description,
        "job_template": template,
        "type": template.get("type"),
        "args": template.get("args"),
        "options": options,
        "queue": options.get("queue", "default") if isinstance(options, dict) else "default",
        "last_run_at": format_time(entry.last_run_at) if entry.last_run_at else None,
        "next_run_at": format_time(entry.next_run_at) if entry.next_run_at else None,
        "run_count": entry.run_count,
        "last_job_id": entry.last_job_id,
        "created_at": format_time(entry.created_at),
    }


def _template(body: dict[str, Any], reg: CronRegistration) -> dict[str, Any]:
    """The job template, validated as a PUSH (its id dropped: each run gets its own)."""
    if reg.job_template is not None:
        raw, prefix = body["job_template"], "$.job_template"
    else:
        raw = {k: body[k] for k in ("type", "args", "options", "meta") if k in body}
        prefix = "$"
    template = {k: v for k, v in raw.items() if k != "id"}
    template.setdefault("args", [])
    parse_push(template, prefix, template=True)
    return template


class CronRoutes:
    def __init__(self, service: OJSService) -> None:
        self.service = service
        self.cron = service.cron

    def _entry(self, request: web.Request) -> CronEntry:
        name = request.match_info["name"]
        entry = self.cron.get(name)
        if entry is None:
            raise OJSError("not_found", f"no cron registration named {name!r}")
        return entry

    async def register(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        reg = convert(body, CronRegistration)
        expression = reg.expression if reg.expression is not None else reg.cron
        assert expression is not None  # CronRegistration.__post_init__
        template = _template(body, reg)
        try:
            zone(reg.timezone)
        except CronError as exc:
            raise refused(str(exc), "$.timezone") from None
        field = "$.expression" if reg.expression is not None else "$.cron"
        try:
            entry = new_entry(
                reg.name,
                expression,
                template,
                timezone=reg.timezone,
                overlap_policy=reg.overlap_policy,
                enabled=reg.enabled,
                description=reg.description,
            )
            first = self.cron.check(entry)
        except CronError as exc:
            raise refused(str(exc), field) from None
        # Rendered once, as every later read shows it and the store keeps it, before it is.
        now = self.service.engine.clock()
        preview = replace(entry, created_at=now, next_run_at=first if reg.enabled else None)
        try:
            orjson.dumps(cron_json(preview))
            preview.record()
        except (TypeError, ValueError, OverflowError) as exc:
            raise OJSError("invalid_request", f"the cron entry cannot be stored: {exc}") from None
        try:
            entry, created = self.cron.register(entry)
        except CronError as exc:
            raise refused(str(exc), field) from None
        rendered = cron_json(entry)
        return reply({"cron": rendered, "cron_job": rendered}, 201 if created else 200)

    async def list_entries(self, request: web.Request) -> web.Response:
        entries = [cron_json(entry) for entry in self.cron.entries()]
        enabled = request.query.get("enabled")
        if enabled in ("true", "false"):
            entries = [e for e in entries if e["enabled"] == (enabled == "true")]
        return reply({"crons": entries, "cron_jobs": entries, "count": len(entries)})

    async def get(self, request: web.Request) -> web.Response:
        rendered = cron_json(self._entry(request))
        return reply({"cron": rendered, "cron_job": rendered})

    async def toggle(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        toggle = convert(await read_object(request), CronToggle)
        self.cron.set_enabled(entry.name, toggle.enabled)
        rendered = cron_json(entry)
        return reply({"cron": rendered, "cron_job": rendered})

    async def delete(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        self.cron.remove(entry.name)
        rendered = cron_json(entry)
        return reply({"deleted": True, "name": entry.name, "cron": rendered})
