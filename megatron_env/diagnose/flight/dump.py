"""Reading one flight-recorder dump: recognised by its content, read without running anything.

What torch writes (`torch._C._distributed_c10d._dump_fr_trace()`, or the file per rank that
TORCH_NCCL_DUMP_ON_TIMEOUT / TORCH_FR_DUMP_TEMP_FILE name `<prefix><rank>`) is a protocol-2
pickle of plain dicts, lists, tuples, strings and numbers; `_dump_fr_trace_json()` writes the
same keys as JSON (no stack frames, numbers of `pg_status` as strings). Neither holds the rank:
it is the number the file name ends with, as torch's own analyzer reads it.

Why an allow-list unpickler and not `pickle.load`: a pickle's GLOBAL/STACK_GLOBAL opcodes name
any importable callable and REDUCE/BUILD/NEWOBJ call it, so loading a hostile file runs code.
`_Plain` resolves no name at all (every global, extension code and persistent id is refused,
naming it), which leaves the opcodes that build containers and scalars; what they build is then
checked to have a dump's shape. Every failure is one `UserError` naming the file (exit 2).
"""

from __future__ import annotations

import gc
import io
import json
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_env.errors import UserError

# the oldest dump format read: what torch 2.8 and later write (older ones lack fields the
# analysis needs and have not been seen in a real dump here)
OLDEST = (2, 8)
_HEAD = 512
_PICKLE = re.compile(rb"\A\x80[\x02-\x05]")
# torch writes the JSON form with sorted keys: it opens with one of the dump's own keys
_JSON = re.compile(rb"\A\s*\{\s*\"(?:comm_lib_version|entries|nccl_comm_state|pg_config|"
                   rb"pg_status|version)\"")
_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")
_INTS = re.compile(r"-?\d+")
_FIX = "pass the files the flight recorder wrote, whole (one per rank, named <prefix><rank>)"


@dataclass(slots=True)
class Entry:
    """One recorded collective, as the analysis needs it."""

    pg: str  # the process group's name (the same on every rank: groups are made in one order)
    desc: str
    seq: int  # collective_seq_id within the group
    op: str  # "all_reduce", without the backend's "nccl:" / "gloo:"
    p2p: bool
    shape: tuple[Any, ...]  # (input sizes, output sizes, input dtypes, output dtypes) as read
    raw_frames: list[Any]  # read by `frames` only where shown (2,000 entries x 64 ranks)


@dataclass
class Dump:
    path: str
    rank: int
    version: str
    entries: list[Entry]
    completed: dict[str, int]  # group -> last completed collective, as the dump says
    members: dict[str, list[int]]  # group -> ranks, where pg_config names them (not gloo)
    world: set[int]  # every rank any pg_config entry names (gloo: at most its default group's)
    wrapped: bool = False  # the ring buffer dropped its oldest entries (the first record_id > 0)


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: 64 dumps are millions of small objects and no
    cycle, and its passes over them would cost more than reading and analysing them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def is_dump(head: bytes) -> bool:
    """Whether a file starting with `head` is a flight-recorder dump (a pickle of any kind
    counts: it is no log, and only the reader may say what is in it)."""
    return bool(_PICKLE.match(head) or _JSON.match(head))


def sniff(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return is_dump(f.read(_HEAD))
    except OSError:
        return False


def _bad(path: Path | str, what: str) -> UserError:
    return UserError(f"{path}: {what}", fix=_FIX, kind="triage.bad-dump")


class _Plain(pickle.Unpickler):
    """An unpickler that resolves no global: only containers and scalars can be built."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused GLOBAL {module}.{name}: a dump holds only "
                                     "plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused PERSID: a dump holds only plain data")


def load(path: Path) -> dict[str, Any]:
    """The dump's top-level dict, read safely (pickle or JSON)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise _bad(path, f"cannot read it ({e.strerror})") from None
    if _PICKLE.match(raw):
        try:
            # buffered: the C unpickler then prefetches through peek() instead of calling
            # read() for every opcode (three times faster)
            data = _Plain(io.BufferedReader(io.BytesIO(raw))).load()
        except pickle.UnpicklingError as e:
            msg = str(e)
            raise _bad(path, msg if msg.startswith("refused") else
                       f"not a whole flight-recorder dump ({msg})") from None
        except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
                MemoryError, OverflowError, RecursionError, UnicodeDecodeError) as e:
            raise _bad(path, "not a whole flight-recorder dump (the pickle is cut short or "
                             f"damaged: {type(e).__name__})") from None
    else:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise _bad(path, f"not a whole flight-recorder dump (bad JSON: "
                             f"{str(e)[:80]})") from None
    if not isinstance(data, dict):
        raise _bad(path, f"not a flight-recorder dump (a {type(data).__name__}, not a dict)")
    return data


def version(path: Path, data: dict[str, Any]) -> str:
    v = str(data.get("version"))
    parts = v.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise _bad(path, f"not a flight-recorder dump (version {v!r})")
    if (int(parts[0]), int(parts[1])) < OLDEST:
        raise UserError(f"{path}: flight-recorder dump version {v} (written by torch older "
                        "than 2.8) is not read", fix="dump with torch >= 2.8, or read it with "
                        "that torch's own `torchfrtrace`", kind="triage.old-dump")
    return v


def rank_of(path: Path) -> int:
    m = _RANK.search(path.name)
    if not m:
        raise _bad(path, "its name does not end in the rank number (torch writes "
                         "<prefix><rank>)")
    return int(m.group(1))


def read(path: Path) -> Dump:
    """One dump, checked whole: any field of the wrong shape refuses the file."""
    rank = rank_of(path)
    data = load(path)
    v = version(path, data)
    entries = data.get("entries", [])
    if not isinstance(entries, list):
        raise _bad(path, "its 'entries' are not a list")
    try:
        return Dump(str(path), rank, v, [_entry(e) for e in entries],
                    _completed(data.get("pg_status") or {}),
                    _members(data.get("pg_config") or {}),
                    {r for c in (data.get("pg_config") or {}).values() for r in _ranks(c)},
                    bool(entries) and int(entries[0].get("record_id") or 0) > 0)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise _bad(path, f"an entry is not of a dump's shape ({type(e).__name__}: "
                         f"{str(e)[:60]})") from None


def _entry(e: dict[str, Any]) -> Entry:
    pg = e["process_group"]
    name, desc = (str(pg[0]), str(pg[1])) if isinstance(pg, (list, tuple)) else (str(pg), "")
    op = e["profiling_name"]
    if not isinstance(op, str):
        raise TypeError("profiling_name")
    frames = e.get("frames") or []
    if not isinstance(frames, list):
        raise TypeError("frames")
    return Entry(name, desc, int(e["collective_seq_id"]), op.rpartition(":")[2],
                 bool(e.get("is_p2p")), (e.get("input_sizes"), e.get("output_sizes"),
                                         e.get("input_dtypes"), e.get("output_dtypes")), frames)


def shape(e: Entry) -> str:
    """'sizes [[8]] -> [[8]], dtypes ['Float'] -> ['Float']'."""
    ins, outs, idt, odt = e.shape
    return f"sizes {ins} -> {outs}, dtypes {idt} -> {odt}"


def frames(e: Entry) -> list[tuple[str, str, int]]:
    """The entry's stack, innermost first (the JSON form has none); a frame not of a dump's
    shape is left out."""
    out = []
    for f in e.raw_frames:
        if isinstance(f, dict) and isinstance(f.get("line"), int):
            out.append((str(f.get("name")), str(f.get("filename")), f["line"]))
    return out


def _completed(status: dict[str, Any]) -> dict[str, int]:
    return {str(pg): int(s["last_completed_collective"]) for pg, s in status.items()}


def _members(config: dict[str, Any]) -> dict[str, list[int]]:
    """Group -> its ranks, where the config says (gloo leaves it empty: the entries tell)."""
    out = {}
    for name, c in config.items():
        if name and (ranks := _ranks(c)):
            out[str(name)] = ranks
    return out


def _ranks(c: dict[str, Any]) -> list[int]:
    """A pg_config entry's ranks: a string such as "[0, 1, 2]", read as numbers (never eval)."""
    return [int(x) for x in _INTS.findall(str(c.get("ranks", "")))]
