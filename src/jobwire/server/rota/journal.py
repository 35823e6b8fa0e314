"""What Rota workers report that is not job state: logs per job and alerts, bounded in memory.

Both are diagnostics, not records: the oldest entries make room for new ones, and a restart
forgets them. Bounds: `max_lines` lines per job (the oldest are dropped and counted),
`max_jobs` jobs with logs (the least recently written job's logs go first), `max_line` bytes
per line (longer ones are cut), `max_alerts` alerts in all.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + "…"


class JobLog:
    __slots__ = ("dropped", "lines")

    def __init__(self, max_lines: int) -> None:
        self.lines: deque[dict[str, Any]] = deque(maxlen=max_lines)
        self.dropped = 0


class LogStore:
    def __init__(self, *, max_jobs: int = 10_000, max_lines: int = 1000, max_line: int = 8192):
        self.max_jobs = max_jobs
        self.max_lines = max_lines
        self.max_line = max_line
        self._jobs: OrderedDict[str, JobLog] = OrderedDict()

    def append(self, job_id: str, lines: Iterable[str], *, worker: str, attempt: int) -> None:
        log = self._jobs.get(job_id)
        if log is None:
            log = self._jobs[job_id] = JobLog(self.max_lines)
            while len(self._jobs) > self.max_jobs:
                self._jobs.popitem(last=False)
        else:
            self._jobs.move_to_end(job_id)
        now = time.time()
        for line in lines:
            if len(log.lines) == self.max_lines:
                log.dropped += 1
            log.lines.append(
                {
                    "time": now,
                    "attempt": attempt,
                    "worker": worker,
                    "line": _cut(line, self.max_line),
                }
            )

    def get(self, job_id: str) -> JobLog | None:
        return self._jobs.get(job_id)


class AlertStore:
    def __init__(self, *, max_alerts: int = 1000, max_message: int = 8192) -> None:
        self.max_message = max_message
        self._alerts: deque[dict[str, Any]] = deque(maxlen=max_alerts)
        self._ids = itertools.count(1)

    def add(
        self, level: str, message: str, *, job: str | None, worker: str, hostname: str
    ) -> dict[str, Any]:
        alert = {
            "id": next(self._ids),
            "time": time.time(),
            "level": level,
            "message": _cut(message, self.max_message),
            "job": job,
            "worker": worker,
            "hostname": hostname,
        }
        self._alerts.append(alert)
        return alert

    def since(self, after: int = 0) -> list[dict[str, Any]]:
        """Alerts with an id above `after`, oldest first."""
        return [alert for alert in self._alerts if alert["id"] > after]
