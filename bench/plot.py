"""Throughput against worker concurrency, jobwire and its peers, from bench/e2e.py's rows.

    .venv/bin/pip install -e '.[bench]'           # matplotlib
    S=jobwire-sqlite-plain,jobwire-sqlite,dramatiq-rabbitmq,celery-redis,rq-plain,arq
    for n in 1 4 16 64; do .venv/bin/python bench/e2e.py --slots $n --jobs 3000 --systems $S; done
    .venv/bin/python bench/plot.py --jobs 3000    # -> docs/throughput-vs-concurrency.png

Reads bench/out/e2e.jsonl (every run appends to it) and plots, for each system, jobs/s end
to end against the worker slots (`--slots`), taking the median of the rows of the latest
jobwire revision that has them (`--rev` picks another; `--tail N` takes the file's last N
rows instead, whatever their revision, and `--jobs N` the rows of runs made with `--jobs N`).
Log scales: the systems differ by orders of magnitude.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
DEFAULT_IN = BENCH / "out" / "e2e.jsonl"
DEFAULT_OUT = BENCH.parent / "docs" / "throughput-vs-concurrency.png"
LABELS = {
    "jobwire-sqlite-plain": "jobwire, plain loop (Client.submit_background)",
    "jobwire-sqlite": "jobwire, batched (submit_many, 1,000 per call)",
    "jobwire-memory-plain": "jobwire memory store, plain loop",
    "dramatiq-rabbitmq": "Dramatiq + RabbitMQ (actor.send)",
    "dramatiq-redis": "Dramatiq + Redis (actor.send)",
    "celery-redis": "Celery + Redis (task.delay)",
    "rq-plain": "RQ (Queue.enqueue)",
    "rq": "RQ, forking worker (enqueue_many)",
    "rq-simple": "RQ (enqueue_many)",
    "arq": "arq (enqueue_job)",
}


def load(
    path: Path, rev: str | None, tail: int | None, jobs: int | None
) -> tuple[dict[str, dict[int, float]], dict[str, object]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if tail:
        rows = rows[-tail:]
    if jobs:
        rows = [r for r in rows if r["args"].get("jobs") == jobs]
    rows = [r for r in rows if r.get("jobs_per_s") and not r.get("error")]
    if (
        rev is None and not tail and not jobs
    ):  # the latest revision with rows at more than one concurrency
        for row in reversed(rows):
            same = {r["args"].get("slots", 16) for r in rows if _rev(r) == _rev(row)}
            if len(same) > 1:
                rev = _rev(row)
                break
    picked = [r for r in rows if rev is None or _rev(r) == rev]
    rates: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in picked:
        rates[r["system"]][int(r["args"].get("slots", 16))].append(float(r["jobs_per_s"]))
    medians = {
        system: {slots: statistics.median(v) for slots, v in sorted(by.items())}
        for system, by in rates.items()
    }
    machine = picked[-1]["machine"] if picked else {}
    return medians, machine


def _rev(row: dict[str, object]) -> str:
    machine = row.get("machine")
    return str(machine.get("jobwire_rev", "")) if isinstance(machine, dict) else ""


def plot(medians: dict[str, dict[int, float]], machine: dict[str, object], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    order = [name for name in LABELS if name in medians]
    order += sorted(set(medians) - set(order))
    for system in order:
        points = medians[system]
        xs = sorted(points)
        style = "-" if system.startswith("jobwire") else "--"
        ax.plot(xs, [points[x] for x in xs], style, marker="o", label=LABELS.get(system, system))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("worker slots (concurrency)")
    ax.set_ylabel("no-op jobs/s, end to end")
    every = sorted({x for points in medians.values() for x in points})
    ax.set_xticks(every, [str(x) for x in every])
    title = "Throughput vs concurrency (bench/e2e.py)"
    if machine:
        title += f"\n{machine.get('cpus')} CPUs {machine.get('cpu')}, jobwire "
        title += f"{machine.get('jobwire_rev')}, a shared VM: compare the lines, not absolutes"
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_IN)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--rev", help="jobwire revision of the rows to plot (default: latest)")
    parser.add_argument("--tail", type=int, help="plot the last N rows of the file, any revision")
    parser.add_argument("--jobs", type=int, help="only rows of runs with this --jobs, any revision")
    args = parser.parse_args()
    medians, machine = load(args.input, args.rev, args.tail, args.jobs)
    if not medians:
        raise SystemExit(f"no usable rows in {args.input}")
    for system, points in medians.items():
        print(system, {k: round(v) for k, v in points.items()})
    plot(medians, machine, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
