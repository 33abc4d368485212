"""Shared helpers: build snapshot directories from the real captures under fixtures/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURES = FIXTURES / "captures"
H200 = FIXTURES / "h200-1gpu"


@pytest.fixture
def make_snapshot(tmp_path):
    """make_snapshot(base=H200, **{snapshot_name: capture_name or text}) -> a snapshot dir."""
    counter = iter(range(1000))

    def make(base: Path | None = H200, **files: str) -> Path:
        d = tmp_path / f"snap{next(counter)}"
        if base is not None:
            shutil.copytree(base, d)
        else:
            d.mkdir()
        for key, value in files.items():
            name = key.replace("_", "-") + ".txt" if not key.endswith("json") else key
            target = d / name
            if value is None:
                target.unlink(missing_ok=True)
            elif "\n" not in value and (CAPTURES / value).is_file():
                shutil.copy(CAPTURES / value, target)
            else:
                target.write_text(value)
        return d

    return make
