"""The ports between the engine, the stores and the runtime.

A leaf package: it imports nothing of jobwire but the job type (for annotations), so the
engine and every store can depend on it without depending on each other.

- `Journal` is the engine-facing half of a store: the engine tells it of every job change
  (`job_saved`, `job_removed`) as it happens, on the event loop thread.
- `Committer` is the runtime-facing half: it commits what the journal collected (group
  commit), reports when that is durable, and hands back the new jobs of a batch that could
  not be made durable, which the runtime retracts through one engine call.
- `KeyValueStore` keeps small records beside the jobs (cron entries, workflows, the dead
  letter queue), committed with them.

A store implements all of them (`Store`); the memory store implements them trivially.
"""

from jobwire.ports.journal import Journal, StoreJournal, journal_of
from jobwire.ports.store import (
    Committer,
    KeyValueStore,
    RetractJobs,
    Store,
    StoredJob,
    decode_ext,
    encode_ext,
    key_value_store,
)

__all__ = [
    "Committer",
    "Journal",
    "KeyValueStore",
    "RetractJobs",
    "Store",
    "StoreJournal",
    "StoredJob",
    "decode_ext",
    "encode_ext",
    "journal_of",
    "key_value_store",
]
