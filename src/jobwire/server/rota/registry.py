"""The registered job specs (the status quo) and the verdict on each spec a worker offers.

Registering a spec with a new checksum replaces the old one: from then on only workers that
offer the new checksum get its jobs. With a file, the registry survives restarts (the file is
rewritten whole and renamed into place, so a crash leaves the old or the new one).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from jobwire.protocols.rota import SpecError, SpecRef, SpecVerdict, checksum, validate_spec

log = logging.getLogger("jobwire.rota")

CHECKSUM_MISMATCH = "checksum_mismatch"
NOT_REGISTERED = "not_registered"


@dataclass(frozen=True, slots=True)
class RegisteredSpec:
    name: str
    checksum: str
    spec: dict[str, Any]
    registered_at: float

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "checksum": self.checksum,
            "registered_at": self.registered_at,
            "spec": self.spec,
        }


class SpecRegistry:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._specs: dict[str, RegisteredSpec] = {}
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            rows = orjson.loads(path.read_bytes())
            for row in rows:
                spec = row["spec"]
                name = validate_spec(spec)
                self._specs[name] = RegisteredSpec(
                    name, checksum(spec), spec, float(row["registered_at"])
                )
        except (OSError, orjson.JSONDecodeError, SpecError, KeyError, TypeError) as exc:
            raise SystemExit(f"jobwire: cannot read the Rota spec file {path}: {exc}") from exc
        log.info("loaded %d Rota job specs from %s", len(self._specs), path)

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = orjson.dumps([entry.json() for entry in self._specs.values()])
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def register(self, spec: dict[str, Any]) -> tuple[RegisteredSpec, RegisteredSpec | None]:
        """Make `spec` the status quo for its name; return it and the one it replaced."""
        name = validate_spec(spec)
        entry = RegisteredSpec(name, checksum(spec), spec, time.time())
        previous = self._specs.get(name)
        if previous is not None and previous.checksum == entry.checksum:
            return previous, previous
        self._specs[name] = entry
        try:
            self._save()
        except OSError:
            if previous is None:
                del self._specs[name]
            else:
                self._specs[name] = previous
            raise
        return entry, previous

    def get(self, name: str) -> RegisteredSpec | None:
        return self._specs.get(name)

    def all(self) -> list[RegisteredSpec]:
        return sorted(self._specs.values(), key=lambda entry: entry.name)

    def verdict(self, ref: SpecRef) -> SpecVerdict:
        entry = self._specs.get(ref.name)
        if entry is None:
            return SpecVerdict(ref.name, ref.checksum, False, NOT_REGISTERED)
        if entry.checksum != ref.checksum:
            return SpecVerdict(ref.name, ref.checksum, False, CHECKSUM_MISMATCH)
        return SpecVerdict(ref.name, ref.checksum, True)
