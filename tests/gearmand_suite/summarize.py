"""Print the pass/fail table of gearmand's test programs from run.sh's logs.

    python3 summarize.py LOGS SERVER... -- PROGRAM...

Each log is one program's output (libtest prints `collection.test [ ok ]` per test), ended
by run.sh's `exit N` line; 124 or 137 means the program hung and was stopped. Tests that
failed are listed under the table.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

RESULT = re.compile(r"^(?P<name>\S.*?)\s+\[ (?P<result>ok|failed|skipped) \]\s*$")
HUNG = {124, 137}


def parse(log: Path) -> tuple[dict[str, int], list[str], int | None]:
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    failed: list[str] = []
    code = None
    if not log.exists():
        return counts, failed, None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("exit "):
            code = int(line.split()[1])
            continue
        match = RESULT.match(line.strip())
        if match:
            counts[match["result"]] += 1
            if match["result"] == "failed":
                failed.append(match["name"])
    return counts, failed, code


def main(argv: list[str]) -> int:
    logs = Path(argv[0])
    split = argv.index("--")
    servers, programs = argv[1:split], argv[split + 1 :]
    header = f"{'program':<16}" + "".join(f"{s:>34}" for s in servers)
    print(header)
    print("-" * len(header))
    notes: list[str] = []
    for program in programs:
        row = f"{'t/' + program:<16}"
        for server in servers:
            counts, failed, code = parse(logs / f"{server}-{program}.log")
            ran = counts["ok"] + counts["failed"]
            cell = f"{counts['ok']}/{ran} ok, {counts['skipped']} skipped"
            if code in HUNG:
                cell += ", HUNG"
            elif code not in (0, None):
                cell += f", exit {code}"
            row += f"{cell:>34}"
            notes += [f"{server} t/{program}: {name}" for name in failed]
            if code in HUNG:
                notes.append(f"{server} t/{program}: stopped after the timeout (hung)")
        print(row)
    if notes:
        print("\nnot passed:")
        print("\n".join(f"  {note}" for note in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
