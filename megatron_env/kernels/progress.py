"""A build's progress from ninja's console lines (`[29/73] ...`): one line a person can read,
with a time-left guess once it means something."""

from __future__ import annotations

import re

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_EXTENSION = re.compile(r"-DTORCH_EXTENSION_NAME=(\S+)")


class Progress:
    """Objects compiled over the whole build. torch runs one ninja per extension, each counting
    its own [done/total]; several run at once when extensions build in parallel. Its command
    lines name the extension (-DTORCH_EXTENSION_NAME), which keys the counts."""

    def __init__(self) -> None:
        self.extensions: dict[str, tuple[int, int]] = {}

    def feed(self, line: str) -> bool:
        """Take one line of build output; True when it was a ninja step."""
        if not (m := _NINJA.match(line)):
            return False
        ext = m2.group(1) if (m2 := _EXTENSION.search(line)) else ""
        done, total = int(m.group(1)), int(m.group(2))
        self.extensions[ext] = (max(done, self.extensions.get(ext, (0, 0))[0]), total)
        return True

    def line(self, name: str, elapsed: float) -> str:
        done = sum(d for d, _ in self.extensions.values())
        total = sum(n for _, n in self.extensions.values())
        if len(self.extensions) <= 1:
            return progress_line(name, done, total, elapsed)
        # the total grows as extensions start: no time-left guess from it
        return (f"{name}: compiled {done}/{total} objects of the {len(self.extensions)} "
                f"extensions started, {elapsed:.0f} s")


def progress_line(name: str, done: int, total: int, elapsed: float) -> str:
    """'compiled 29/73 objects, 470 s, about 12 min left'.

    The guess is the rate so far; before a quarter of the objects it is mostly the ramp-up of
    the parallel jobs (three times too long on an H200 build of 73 objects), so none is given."""
    line = f"{name}: compiled {done}/{total} objects, {elapsed:.0f} s"
    if total / 4 <= done < total:
        left = elapsed / done * (total - done)
        line += f", about {left / 60:.0f} min left" if left >= 90 else f", about {left:.0f} s left"
    return line
