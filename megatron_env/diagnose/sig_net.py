"""Signatures of the network and rendezvous family: c10d stores and torchelastic's rendezvous
that could not be reached, with the store's address (the error, a line near it, or torchrun's
--rdzv_endpoint)."""

from __future__ import annotations

import re
from collections import deque
from itertools import islice
from typing import Any

from megatron_env.diagnose.joblog import Line
from megatron_env.diagnose.model import Events, Rendezvous, rank_of

_RENDEZVOUS = re.compile(r"(DistNetworkError|DistStoreError|RendezvousConnectionError)\b:? "
                         r"(.*?(?:\(errno: \d+ - [^)]*\)|timed out|$))")
# where a store was: "(host, 29500)", "to host:29500", "[host]:29500", "host=h, port=29500"
_STORE_AT = re.compile(r"(?:\(|to |\[)([\w.:-]*?[\w-])\]?[,:] ?(\d{2,5})\)?"
                       r"|host=([\w.-]+), port=(\d+)")
_STORE_LINE = re.compile(r"(?:to connect to|connect to any network address|TCPStore\(|"
                         r"Connection to) \S")
_ENDPOINT = re.compile(r"rdzv_endpoint\s*[:=]\s*'?([\w.-]+(?::\d+)?)")
# dynamic rendezvous naming its node "host_pid_n"
_RDZV_NODE = re.compile(r"The node '([\w.-]+?)_(\d+)_\d+' has failed to (\w+) the rendezvous "
                        r"'[^']*' due to an error of type (\w+)")
_RAISED = re.compile(r"^\w*(?:Error|Exception): (.+)")
def _rendezvous(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _RENDEZVOUS.search(t):
        store = _store(m.group(2)) or next(
            (s for x in islice(ahead, 4) if _STORE_LINE.search(x.text)
             and (s := _store(x.text))), None)
        ev.add(Rendezvous(error=m.group(1), what=m.group(2).strip(), store=store,
                          rank=rank_of(line), host=line.host),
               key=(m.group(1), line.host))


def _store(text: str) -> str | None:
    if m := _STORE_AT.search(text):
        return f"{m.group(1)}:{m.group(2)}" if m.group(1) else f"{m.group(3)}:{m.group(4)}"
    return None


def _store_line(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """A c10d client that could not reach the store: its address, for the rendezvous finding."""
    if (m := _STORE_LINE.search(t)) and (s := _store(t[m.start():])) and (
            s not in ev.stores and len(ev.stores) < 16):
        ev.stores.append(s)


def _rdzv_node(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """Dynamic rendezvous failing on a node; the exception it names follows a few lines on."""
    if m := _RDZV_NODE.search(t):
        why = next((r.group(1) for x in ahead if (r := _RAISED.match(x.text))), "")
        ev.add(Rendezvous(error=m.group(4), what=f"failed to {m.group(3)} the rendezvous"
                          + (f": {why}" if why else ""), store=None, rank=rank_of(line),
                          host=m.group(1), pid=m.group(2)),
               key=(m.group(4), m.group(1)))


def _endpoint(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """torchrun's --rdzv_endpoint, as its launch configuration prints it: where the store is."""
    if (m := _ENDPOINT.search(t)) and m.group(1) not in ev.stores and len(ev.stores) < 16:
        ev.stores.append(m.group(1))




_INIT_METHOD = re.compile(r"tcp://\[?([\w.:-]+?)\]?:(\d{2,5})\b")


def _init_method(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """init_process_group's `tcp://host:port`: where the store is."""
    if (m := _INIT_METHOD.search(t)) and (s := f"{m.group(1)}:{m.group(2)}") not in ev.stores \
            and len(ev.stores) < 16:
        ev.stores.append(s)


READERS = [
    ("tcp://", _init_method),
    ("Dist", _rendezvous), ("Rendezvous", _rendezvous), ("connect to", _store_line),
    ("Connection to", _store_line), ("TCPStore(", _store_line), ("the rendezvous", _rdzv_node),
    ("rdzv_endpoint", _endpoint),
]
