"""The unique key a job holds in the whole cluster (`jobs.ukey`, unique while the job lives).

Two kinds, kept apart by their first letter:

- `e`: the engine's coalescing key (Gearman's unique id, and the other listeners' that use
  it), of background and foreground jobs alike: the function and the unique id, or for `-` a
  digest of the payload.
- `o`: an OJS unique fingerprint, when the job's policy `reject`s or `ignore`s a conflict
  (`OJSService.commit` marks the shareable ones; `replace` coalesces on the node that took
  the job only). The key is held while the job lives; a policy with a `period` or fewer
  states is checked against the holder once the index names it (`server/ojs/unique.py`).
"""

from __future__ import annotations

import hashlib

from jobwire.engine.job import Job

#: `Job.ext` marker of an OJS job whose unique fingerprint the cluster keeps.
OJS_SHARED = "unique_shared"


def shared_key(job: Job) -> str | None:
    """The key `job` holds in the cluster's index, if any (a foreground job's too: clients on
    other nodes join it, `jobwire.store.pgfollow`)."""
    unique = job.unique
    if unique:
        if unique == "-":
            digest = hashlib.sha256(job.payload).hexdigest()
            return f"e\x1f{job.function}\x1f-{digest}"
        return f"e\x1f{job.function}\x1f{unique}"
    ext = job.ext
    if ext is not None and ext.get(OJS_SHARED):
        fingerprint = ext.get("unique_key")
        if isinstance(fingerprint, str):
            return ojs_key(fingerprint)
    return None


def ojs_key(fingerprint: str) -> str:
    """The index's key of an OJS unique fingerprint."""
    return f"o\x1f{fingerprint}"


#: Notifications of shared state, on the cluster's channel (work notifications are
#: "function<US>queue", "nodes" a node coming or going): the cron registrations changed
#: (a batch wrote a record of this key-value namespace); the paused queues changed; the
#: queues' rate limits changed.
SHARED_NOTE = "\x1e"
CRON_NAMESPACE = "cron"
CRON_CHANGED = SHARED_NOTE + "cron"
PAUSES_CHANGED = SHARED_NOTE + "pause"
RATES_CHANGED = SHARED_NOTE + "rate"
