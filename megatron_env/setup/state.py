"""The setup chain's vocabulary and its memory: what a step does (`Action`), how it ended
(`Outcome`), and the stamp a step that succeeded leaves (`Stamp`).

A stamp is parsed once, here, into a frozen value; a file that is not a stamp (truncated by a
kill -9 mid-write, edited by hand, from another version) is reported as absent with the reason,
so the step runs again: it never stops the chain with a KeyError. Stamps are written whole or
not at all (a temporary file renamed over the old one).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from megatron_env import files


class Action(Enum):
    """What `decide` settles for a step before anything runs."""

    RUN = "run"
    VERIFY = "verify"  # stamped with the digest its inputs have now: a quick re-check only
    SKIP = "skip"  # this machine cannot run it (no GPU, no toolkit) or --no-builds
    UNCHOSEN = "unchosen"  # outside --only/--from: neither run nor reported


class Outcome(Enum):
    """How a step ended; its value is its word in the table and in `setup --json`. Not a
    check's verdict (findings.Status: pass, warn, fail, skip, which judges a host): an outcome
    says what was done to a step, and the chain stops on FAILED alone."""

    DONE = "done"
    UP_TO_DATE = "up to date"
    SKIPPED = "skipped"
    FAILED = "failed"
    WOULD_RUN = "would run"
    NOT_RUN = "not run"


_DIGEST = re.compile(r"[0-9a-f]{16}")


class BadStamp(ValueError):
    """A stamp file that cannot be a stamp; its text says why."""


@dataclass(frozen=True)
class Stamp:
    """What a step that succeeded recorded: the digest of the inputs it ran with, the line it
    reported, and when."""

    digest: str
    detail: str = ""
    at: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.digest, str) or not _DIGEST.fullmatch(self.digest):
            raise BadStamp(f"its digest {self.digest!r} is not 16 hex digits")
        for name in ("detail", "at"):
            if not isinstance(getattr(self, name), str):
                raise BadStamp(f"its {name} is not text")

    @classmethod
    def parse(cls, text: str) -> Stamp:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadStamp(f"not JSON ({e.msg} at line {e.lineno})") from None
        except RecursionError:
            raise BadStamp("nested deeper than any stamp") from None
        return cls.of(doc)

    @classmethod
    def of(cls, doc: object) -> Stamp:
        """The stamp a parsed JSON value holds (BadStamp when it holds none)."""
        if not isinstance(doc, dict):
            raise BadStamp(f"a JSON {type(doc).__name__}, not an object")
        if "digest" not in doc:
            raise BadStamp("no digest")
        return cls(doc["digest"], doc.get("detail", ""), doc.get("at", ""))

    def text(self) -> str:
        return json.dumps({"digest": self.digest, "detail": self.detail, "at": self.at}) + "\n"


def path(stamps: Path, step: str) -> Path:
    return stamps / f"{step}.json"


def read(stamps: Path, step: str) -> tuple[Stamp | None, str]:
    """(the step's stamp, "") or (None, why there is none usable)."""
    where = path(stamps, step)
    if not where.exists() and not where.is_symlink():
        return None, "no stamp"
    doc, why = files.read_json(where)
    if why:
        return None, f"its stamp is not a stamp ({why})"
    try:
        return Stamp.of(doc), ""
    except BadStamp as e:
        return None, f"its stamp {where} is not a stamp ({e})"


def write(stamps: Path, step: str, digest: str, detail: str) -> Stamp:
    """Record a step's success in one rename: a kill leaves the old stamp or the new one."""
    s = Stamp(digest, detail, time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    files.write_text(path(stamps, step), s.text())
    return s


def remove(stamps: Path, step: str) -> None:
    path(stamps, step).unlink(missing_ok=True)
