"""The checkpoint process: apply finished redo log files to SQLite.

    python -m jobwire.store.checkpoint DB GENERATION FSYNC TIMEOUT PARENT_PID

The server starts one when a log generation is complete. It runs what opening the store
runs on the files a crash left (`jobwire.store.sqlite.apply_log`), up to GENERATION: the
rows go to SQLite in one transaction that also records the generation, then those log
files are deleted. In a process of its own, binding the rows never holds the server's GIL.

It dies with the server (the kernel kills it when its parent exits, so its transaction is
rolled back), and exits 1 if it cannot finish; the log files stay in both cases and the
next checkpoint, or the next start, applies them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import signal
import sys
from pathlib import Path

from jobwire.store.sqlite import StoreError, apply_log, connect

_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> bool:
    """Ask the kernel to kill this process when its parent exits; False if it already did."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: an orphan finishes its transaction, which is harmless
    return os.getppid() == parent


def main(argv: list[str]) -> int:
    path, through, fsync = Path(argv[1]), int(argv[2]), argv[3]
    timeout, parent = float(argv[4]), int(argv[5])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when to stop
    # A run decodes hundreds of thousands of rows (tuples) that reference counting frees;
    # collecting them for cycles cost 5 % of its CPU, which the server's loop shares.
    gc.disable()
    if not _die_with(parent):
        return 1
    try:
        conn = connect(path, fsync, timeout=timeout)
        try:
            apply_log(conn, path, through)
        finally:
            conn.close()
    except StoreError as exc:
        print(f"jobwire checkpoint of {path}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
