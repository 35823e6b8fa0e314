"""Workflows: chain (one step after another), group (all at once), batch (a group with
callbacks), on top of ordinary jobs.

A workflow record knows its steps (PUSH bodies) and the job created for each; each job
carries `ext["workflow"] = {"id", "step"}`. The service watches finished jobs (an engine
observer) and moves the workflow on in the same engine turn, so the next step is committed
together with the ACK that finished the previous one:

- chain: step N+1 is created when step N completes, with `parent_results` = [step N's
  result]; a step that is discarded fails the chain, one that is cancelled cancels it, and
  later steps are never created.
- group / batch: every job is created at once; when all have finished the workflow is
  `completed` (all completed) or `failed`. A batch then creates its callbacks: `on_complete`
  always, `on_success` when all completed, `on_failure` when any failed; callbacks get the
  steps' results as `parent_results`.

Records are written to the store's key-value API (when it has one) on every change, so
workflows survive a restart with the durable store; finished ones are dropped after the
engine's finished-job retention.

On a cluster (PostgreSQL store) the node that made a workflow keeps it and moves it on; its
jobs may run anywhere. A node where a workflow's job finishes without the workflow tells the
workflow's node once the end is durable (the operation `workflow.step`, through
`JobOperations`), and the reply that finished the job (an ack) waits for that node to have
moved the workflow on. The end is also written, in the job's own commit, as a shared record
(`STEP_NAMESPACE`) that the workflow's node deletes once it has moved the workflow on: when
the telling fails (the workflow's node died and none has taken it over yet, or this node dies
first), the node keeping the workflow then finds the end at its heartbeat. Reads and cancels
sent to another node go to the workflow's node the same way; a cancel there cancels the
workflow's jobs wherever they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.errors import IllegalTransition, StoreUnavailable
from jobwire.engine.job import ORIGIN_WORKFLOW, Job, JobState
from jobwire.ports import KeyValueStore
from jobwire.protocols.ojs.envelope import parse_push
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.ids import uuid7
from jobwire.protocols.ojs.times import format_time
from jobwire.protocols.ojs.workflow import WorkflowRequest, parse_workflow
from jobwire.server.ojs.http import BASE, read_json, reply
from jobwire.server.ojs.render import result_of

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService

log = logging.getLogger("jobwire.ojs.workflows")

NAMESPACE = "workflow"
#: A step's end on another node, until the workflow's node has moved the workflow on: key
#: "<workflow id><US><step><US><job id>" (`ClusterView.watch_addressed_records`).
STEP_NAMESPACE = "workflow_step"
RUNNING, COMPLETED, FAILED, CANCELLED = "running", "completed", "failed", "cancelled"
#: Seconds a finished workflow stays visible when the engine retains nothing.
DEFAULT_RETENTION = 3600.0
#: Seconds a step's end keeps trying to reach its workflow's node while no node answers
#: for the workflow: long enough for a node that died to be found dead (`--node-lease`,
#: default 15 s) and its workflows taken over by another.
REPORT_PATIENCE = 90.0
#: Seconds a reply waits at most for its steps' ends to reach their workflows' nodes.
REPORT_WAIT = 15.0


@dataclass(slots=True)
class Workflow:
    id: str
    type: str
    name: str | None
    steps: list[dict[str, Any]]
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    job_ids: list[str | None] = field(default_factory=list)
    outcomes: list[str | None] = field(default_factory=list)  # per step: job state name
    results: list[Any] = field(default_factory=list)
    callback_ids: dict[str, str] = field(default_factory=dict)
    state: str = RUNNING
    created_at: float = 0.0
    finished_at: float | None = None
    meta: dict[str, Any] | None = None

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes if o == outcome)

    def to_json(self) -> dict[str, Any]:
        total = len(self.steps)
        completed = self.count("completed")
        failed = self.count("discarded")
        out: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "name": self.name,
            "state": self.state,
            "steps_total": total,
            "steps_completed": completed,
            "jobs_total": total,
            "jobs_completed": completed,
            "jobs_failed": failed,
            "jobs_cancelled": self.count("cancelled"),
            "job_ids": self.job_ids,
            "created_at": format_time(self.created_at),
        }
        if self.callback_ids:
            out["callback_job_ids"] = self.callback_ids
        if self.finished_at is not None:
            out["completed_at"] = format_time(self.finished_at)
        if self.meta is not None:
            out["meta"] = self.meta
        return out


class Workflows:
    def __init__(self, service: OJSService, kv: KeyValueStore | None) -> None:
        self.service = service
        self.engine = service.engine
        self.kv = kv
        self._flows: dict[str, Workflow] = {}
        #: Steps' ends being told to the nodes of their workflows (a cluster only).
        self._reports: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._flows)

    def get(self, workflow_id: str) -> Workflow | None:
        return self._flows.get(workflow_id)

    def all(self) -> list[Workflow]:
        """Every workflow kept (running, and finished ones until they are retired)."""
        return list(self._flows.values())

    def load(self) -> None:
        if self.kv is not None:
            self.adopt(self.kv.kv_load(NAMESPACE))

    def adopt(self, records: dict[str, bytes]) -> None:
        """Keep these stored workflows (at start-up, or a cluster node gone)."""
        for key, raw in records.items():
            try:
                flow = Workflow(**json.loads(raw))
            except (TypeError, ValueError) as exc:
                log.error("workflow %s cannot be restored: %s", key, exc)
                continue
            self._flows[flow.id] = flow
            if flow.state != RUNNING:
                self._retire_later(flow)

    def clear(self) -> None:
        for workflow_id in list(self._flows):
            self._forget(workflow_id)

    # ------------------------------------------------------------------ lifecycle

    def create(self, req: WorkflowRequest) -> Workflow:
        flow = Workflow(
            id=uuid7(),
            type=req.type,
            name=req.name,
            steps=req.steps,
            callbacks=req.callbacks,
            job_ids=[None] * len(req.steps),
            outcomes=[None] * len(req.steps),
            results=[None] * len(req.steps),
            created_at=self.engine.clock(),
            meta=req.meta,
        )
        self._flows[flow.id] = flow
        first = range(1) if flow.type == "chain" else range(len(flow.steps))
        try:
            for index in first:
                self._start_step(flow, index, None)
        except OJSError:  # all or nothing: undo the steps already created
            del self._flows[flow.id]
            for job_id in flow.job_ids:
                job = self.engine.jobs.get(job_id) if job_id else None
                if job is not None and not job.state.terminal:
                    self.engine.cancel(job)
                    self.engine.forget(job)
            raise
        self._save(flow)
        return flow

    def cancel(self, flow: Workflow) -> list[str]:
        """Cancel a running workflow and its unfinished jobs here: the ids of its jobs this
        engine does not hold (another node's, on a cluster), whose ends it has not heard of."""
        if flow.state != RUNNING:
            return []
        self._finish(flow, CANCELLED)
        elsewhere = []
        for index, job_id in enumerate(flow.job_ids):
            job = self.engine.jobs.get(job_id) if job_id else None
            if job is not None and not job.state.terminal:
                with contextlib.suppress(IllegalTransition):
                    self.engine.cancel(job)
            elif job is None and job_id and flow.outcomes[index] is None:
                elsewhere.append(job_id)
        self._save(flow)
        return elsewhere

    def observe(self, event: str, job: Job) -> None:
        """`Engine.finish_observers` hook: a workflow's job finished; move the workflow on."""
        if job.ext is None:
            return
        link = job.ext.get("workflow")
        if not isinstance(link, dict) or "step" not in link:
            return
        flow_id, index = str(link.get("id", "")), link["step"]
        result = result_of(job) if job.state is JobState.COMPLETED else None
        flow = self._flows.get(flow_id)
        if flow is None:
            if self.service.runtime.remote is not None:  # kept by the node that made it
                outcome = {"step": index, "job_id": job.id, "state": job.state.value}
                outcome["result"] = result
                if self.kv is not None:  # committed with the job's end
                    record = json.dumps(outcome, separators=(",", ":"), default=str)
                    self.kv.kv_put(STEP_NAMESPACE, _step_key(flow_id, outcome), record.encode())
                self._report(flow_id, outcome)
            return
        self._step_ended(flow, index, job.id, job.state, result)

    def _step_ended(
        self, flow: Workflow, index: int, job_id: str, state: JobState, result: Any
    ) -> None:
        if flow.state != RUNNING:
            return
        if not 0 <= index < len(flow.steps) or flow.job_ids[index] != job_id:
            return
        flow.outcomes[index] = state.name.lower()
        if state is JobState.COMPLETED:
            flow.results[index] = result
        try:
            if flow.type == "chain":
                self._advance_chain(flow, index, state)
            else:
                self._advance_group(flow)
        except OJSError as exc:  # a later step could not be created (e.g. unique reject)
            log.warning("workflow %s stopped: %s", flow.id, exc.message)
            self._finish(flow, FAILED)
        self._save(flow)

    # ------------------------------------------------------------------ on a cluster

    def _report(self, flow_id: str, outcome: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._tell(flow_id, outcome))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _tell(self, flow_id: str, outcome: dict[str, Any]) -> None:
        """Tell the workflow's node of its step's end, once that end is durable here."""
        try:
            await self.service.runtime.durable()
        except StoreUnavailable:
            return  # the end was not committed: the job runs again, and ends again
        operations = self.service.operations
        deadline = time.monotonic() + REPORT_PATIENCE
        pause = 0.5
        while True:
            try:
                answer = await operations.run_by_id("workflow.step", flow_id, outcome, None)
                status = answer.status
            except OJSError as exc:  # refused here: no live node keeps the workflow (404:
                status = exc.status  # its node died and none took it over yet), or its
            if status not in (404, 503) or time.monotonic() >= deadline:  # node is silent
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)
        if status >= 400:
            log.warning(
                "workflow %s: the end of its step %s reached no node keeping it (%d); it waits"
                " in the store for the node that takes the workflow over",
                flow_id,
                outcome["step"],
                status,
            )

    @property
    def reporting(self) -> bool:
        return bool(self._reports)

    async def reported(self) -> None:
        """Wait until the steps' ends told so far reached their workflows' nodes."""
        if self._reports:
            await asyncio.wait(list(self._reports), timeout=REPORT_WAIT)

    def step_ended_elsewhere(self, flow_id: str, outcome: Any) -> web.Response:
        """The operation `workflow.step`: another node ran one of this node's workflows'
        jobs to its end."""
        flow = self.lookup(flow_id)
        self._apply_step_end(flow, outcome)
        return reply({"workflow": flow.to_json()})

    def _apply_step_end(self, flow: Workflow, outcome: Any) -> None:
        """Another node's end of one of `flow`'s jobs: the workflow moves on (once, however
        often it is told), and the end's record goes in the same commit."""
        try:
            index, job_id = int(outcome["step"]), str(outcome["job_id"])
            state = JobState(int(outcome["state"]))
        except (KeyError, TypeError, ValueError):
            raise OJSError("invalid_request", "a step's end needs step, job_id and state") from None
        if not state.terminal:
            raise OJSError("invalid_request", f"job {job_id} has not ended")
        self._forget_step(_step_key(flow.id, outcome))
        if 0 <= index < len(flow.outcomes) and flow.outcomes[index] == state.name.lower():
            return  # told again: its answer was lost
        self._step_ended(flow, index, job_id, state, outcome.get("result"))

    def step_ends_found(self, records: dict[str, bytes]) -> None:
        """Steps' ends other nodes left in the store for workflows this node keeps, that did
        not reach it directly (`ClusterView.watch_addressed_records`, at each heartbeat)."""
        for key, raw in records.items():
            flow = self._flows.get(key.split("\x1f", 1)[0])
            if flow is None:  # retired here, its record not yet deleted: nothing to move on
                self._forget_step(key)
                continue
            try:
                self._apply_step_end(flow, json.loads(raw))
            except (OJSError, ValueError) as exc:
                log.error("workflow %s: a step's end in the store is unreadable: %s", flow.id, exc)
                self._forget_step(key)
                continue
            log.info("workflow %s: a step's end found in the store (%r)", flow.id, key)

    def _forget_step(self, key: str) -> None:
        if self.kv is not None:
            self.kv.kv_put(STEP_NAMESPACE, key, None)

    def lookup(self, workflow_id: str) -> Workflow:
        flow = self._flows.get(workflow_id)
        if flow is None:
            raise OJSError("not_found", f"workflow {workflow_id} not found")
        return flow

    async def cancel_anywhere(self, workflow_id: str, _arguments: Any) -> web.Response:
        """The operation `workflow.cancel`: the workflow ends, and so do its jobs, on this
        node or wherever they are."""
        flow = self.lookup(workflow_id)
        elsewhere = self.cancel(flow)
        for job_id in elsewhere:
            with contextlib.suppress(OJSError):  # it ended meanwhile (409), or is gone (404)
                await self.service.operations.run_by_id("cancel", job_id, None, None)
        return reply({"workflow": flow.to_json()})

    def _advance_chain(self, flow: Workflow, index: int, state: JobState) -> None:
        if state is JobState.CANCELLED:
            self._finish(flow, CANCELLED)
        elif state is not JobState.COMPLETED:
            self._finish(flow, FAILED)
        elif index + 1 < len(flow.steps):
            self._start_step(flow, index + 1, [flow.results[index]])
        else:
            self._finish(flow, COMPLETED)

    def _advance_group(self, flow: Workflow) -> None:
        if any(outcome is None for outcome in flow.outcomes):
            return
        succeeded = all(outcome == "completed" for outcome in flow.outcomes)
        self._finish(flow, COMPLETED if succeeded else FAILED)
        if flow.type == "batch":
            any_failed = any(outcome == "discarded" for outcome in flow.outcomes)
            wanted = ["on_complete"]
            if succeeded:
                wanted.append("on_success")
            if any_failed:
                wanted.append("on_failure")
            for name in wanted:
                if name in flow.callbacks:
                    self._start_callback(flow, name)

    def _start_step(self, flow: Workflow, index: int, parents: list[Any] | None) -> None:
        ext: dict[str, Any] = {"workflow": {"id": flow.id, "step": index}}
        if parents is not None:
            ext["parent_results"] = parents
        job, _ = self.service.submit(parse_push(flow.steps[index]), ext, ORIGIN_WORKFLOW)
        flow.job_ids[index] = job.id

    def _start_callback(self, flow: Workflow, name: str) -> None:
        ext: dict[str, Any] = {
            "workflow": {"id": flow.id, "callback": name},
            "parent_results": flow.results,
        }
        job, _ = self.service.submit(parse_push(flow.callbacks[name]), ext, ORIGIN_WORKFLOW)
        flow.callback_ids[name] = job.id

    def _finish(self, flow: Workflow, state: str) -> None:
        flow.state = state
        flow.finished_at = self.engine.clock()
        self.service.events.record(
            f"workflow.{state}",
            flow.id,
            None,
            {"workflow_id": flow.id, "workflow_name": flow.name, "total_steps": len(flow.steps)},
        )
        self._retire_later(flow)

    # ------------------------------------------------------------------ retention

    def _retire_later(self, flow: Workflow) -> None:
        retain = self.engine.config.retain_finished or DEFAULT_RETENTION
        finished = flow.finished_at if flow.finished_at is not None else self.engine.clock()
        self.engine.timers.add(finished + retain, self._retire, flow)

    def _retire(self, flow: Workflow, when: float) -> None:
        if self._flows.get(flow.id) is flow:
            self._forget(flow.id)

    def _forget(self, workflow_id: str) -> None:
        self._flows.pop(workflow_id, None)
        if self.kv is not None:
            self.kv.kv_put(NAMESPACE, workflow_id, None)

    def _save(self, flow: Workflow) -> None:
        if self.kv is not None and self._flows.get(flow.id) is flow:
            record = json.dumps(asdict(flow), separators=(",", ":"), default=str)
            self.kv.kv_put(NAMESPACE, flow.id, record.encode())


def _step_key(flow_id: str, outcome: dict[str, Any]) -> str:
    return f"{flow_id}\x1f{outcome['step']}\x1f{outcome['job_id']}"


# ---------------------------------------------------------------------- routes


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    flows = service.workflows
    operations = service.operations

    def holds(workflow_id: str) -> bool:
        return flows.get(workflow_id) is not None

    def get_here(workflow_id: str, _arguments: Any) -> web.Response:
        return reply({"workflow": flows.lookup(workflow_id).to_json()})

    operations.add("workflow.get", get_here, holds)
    operations.add("workflow.cancel", flows.cancel_anywhere, holds)
    operations.add("workflow.step", flows.step_ended_elsewhere, holds)

    async def create(request: web.Request) -> web.Response:
        req = parse_workflow(await read_json(request))
        flow = flows.create(req)
        return reply({"workflow": flow.to_json()}, 201, {"Location": f"{BASE}/workflows/{flow.id}"})

    async def get(request: web.Request) -> web.Response:
        return await operations.run(request, "workflow.get", request.match_info["id"], None)

    async def cancel(request: web.Request) -> web.Response:
        return await operations.run(request, "workflow.cancel", request.match_info["id"], None)

    router.add_post(BASE + "/workflows", create)
    router.add_get(BASE + "/workflows/{id}", get)
    router.add_delete(BASE + "/workflows/{id}", cancel)
