"""Report the OJS conformance level reached by the conformance run."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.ojs.test_conformance import RESULTS

    if not RESULTS:
        return
    lines = []
    level_reached = -1
    broken = False
    for level in range(5):
        results = [passed for lvl, passed in RESULTS.values() if lvl == level]
        if not results:
            broken = True
            continue
        ok = sum(results)
        lines.append(f"level {level}: {ok}/{len(results)} passed")
        if not broken and ok == len(results):
            level_reached = level
        else:
            broken = True
    terminalreporter.write_sep("=", "OJS conformance")
    for line in lines:
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"conformant level: {level_reached}")
