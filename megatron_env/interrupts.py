"""Ctrl-C and SIGTERM held over a few lines that must not be cut in two, then raised.

An interrupt is raised wherever Python happens to be: inside `subprocess.Popen` after the fork
(the child's pid is lost, the child runs on unkilled), halfway through putting back the files a
repair set aside (the environment half restored), inside the removal of a temporary directory
(left behind). Such a section runs under `held()`: a signal that arrives meanwhile is recorded,
and raised by its own handler (KeyboardInterrupt, the command's Terminated) as the section ends,
so the caller unwinds exactly as it would have, with the section whole.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The body runs whole; an interrupt that arrived meanwhile is raised after it. Only
    Python-level handlers are held (a child's signal mask is untouched: it is never blocked);
    off the main thread no handler can be set, and the body runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    handlers = {s: h for s in _HELD if callable(h := signal.getsignal(s))}
    for s in handlers:
        signal.signal(s, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        if got:  # raised as it would have been, by its own handler
            handlers[signal.Signals(got[0])](got[0], None)
