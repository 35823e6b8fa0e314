"""The representable range of every number, duration and time an OJS request may carry.

Declared once: the typed messages (`messages.py`) take their constraints from here, the
OpenAPI document is generated from those messages, and the README's limits table lists these
values. A value outside them is refused with 400 naming the field, before anything is stored,
so a job, a cron entry or a workflow is never accepted that a later read cannot render.
"""

from __future__ import annotations

from typing import Final

#: Times (scheduled_at, delay_until, expires_at): 1970-01-01T00:00:00Z to the end of year
#: 9999, the range an RFC 3339 timestamp (and Python's datetime) can write back.
MIN_TIME: Final = 0.0
MAX_TIME: Final = 253402300799.999
#: Any duration (timeouts, visibility, retry intervals, unique periods, cron `@every`):
#: at most 100 years (36500 days).
MAX_DURATION_S: Final = 36500 * 86400
MAX_DURATION_MS: Final = MAX_DURATION_S * 1000
#: A time string (RFC 3339 or ISO-8601 duration) is at most this long.
MAX_TIME_TEXT: Final = 64
PRIORITY_MIN: Final = -100
PRIORITY_MAX: Final = 100
#: retry.max_attempts (a 32-bit count: "retry for ever" in practice).
MAX_ATTEMPTS: Final = 2**31 - 1
MAX_BACKOFF_COEFFICIENT: Final = 100.0
#: rate_limit.max_per_second.
MAX_RATE: Final = 1_000_000
#: A progress message (progress extension), in characters.
MAX_MESSAGE: Final = 4096
#: backpressure.max_depth: jobs waiting in one queue.
MAX_DEPTH: Final = 10**9
#: Job types, queue names, cron names, worker ids.
MAX_NAME: Final = 255
#: Jobs per fetch, per batch, steps per workflow.
MAX_FETCH: Final = 1000
MAX_BATCH: Final = 10_000
MAX_STEPS: Final = 1000
#: Integers anywhere in a body (args, meta, results): what every JSON encoder of jobwire
#: writes back exactly (signed 64-bit below, unsigned 64-bit above). Others are refused,
#: never turned into floats.
MIN_INT: Final = -(2**63)
MAX_INT: Final = 2**64 - 1
