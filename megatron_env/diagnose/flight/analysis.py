"""Where the ranks of a hung job diverge, from their flight-recorder dumps: pure functions.

Per process group, the first collective (by sequence id) where the members disagree: members
that never entered it, a member that entered another op, sizes or dtypes that differ. Then the
wait-for chain: a rank whose newest collective is not done waits on the members that never
entered it (or on the one that entered another op); a rank whose newest collective is done is
outside every collective. The roots are the ranks the chain ends at: a stall on a subgroup that
holds up the default group is traced to the rank that stalled, not to the subgroup's waiter.

Why not trust the entries' own state: gloo marks every entry "scheduled" and one that timed
out as completed, and NCCL's state lags the watchdog. What the entries of all ranks agree on
(who entered which sequence id) is what tells. Each rank's ring buffer holds only its newest
entries, so a member counts as never having entered a collective only when its newest entry
of that group is older, never because the collective fell out of its buffer.

Membership: from the dump's pg_config where it names ranks (NCCL); gloo leaves it empty, so a
group's members are the ranks whose entries carry it (the default group: every rank dumped).
A group only one rank ever entered has unknown peers; the ranks outside every collective are
then the ones it can be waiting on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, TypeVar

from megatron_env.diagnose.flight.dump import Dump, Entry, frames, shape

Key = tuple[str, int]  # (group, sequence id)


@dataclass(frozen=True)
class Divergence:
    """The first collective of one group where its members disagree."""

    pg: str
    desc: str
    seq: int
    op: str  # what most members entered
    entered: list[int]
    missing: list[int]  # members that never entered it
    other_op: dict[int, str]  # member -> the op it entered instead
    mismatch: dict[int, str]  # member -> "sizes ... / dtypes ..." where they differ
    unknown: list[int] = field(default_factory=list)  # members whose buffer lost the group


@dataclass(frozen=True)
class Wait:
    rank: int
    pg: str
    desc: str
    seq: int
    op: str
    on: list[int]  # the ranks it waits for (empty: all arrived, the collective itself hung)


@dataclass
class Hang:
    roots: list[int]  # where the chain ends, root first
    waits: list[Wait]  # nearest the roots first
    divergences: list[Divergence]
    last_done: dict[int, tuple[str, str, int, str]]  # rank -> (pg, desc, seq, op)
    frames: dict[int, list[tuple[str, str, int]]]  # root's (or first waiter's) stack
    unknown_peers: list[str] = field(default_factory=list)  # groups of one known member

    @property
    def all_arrived(self) -> bool:
        """No rank waits for another: every member entered the collectives still open, alike.
        Either the transport hung, or the ranks were dumped while it completed (gloo and the
        NCCL watchdog mark completion late): no rank to blame."""
        return not self.divergences and all(not w.on for w in self.waits)


def _by_key(d: Dump) -> tuple[dict[Key, list[Entry]], dict[Key, tuple[str, Any]]]:
    """A rank's collectives by (group, sequence id), and each one's (op, shape): a coalesced
    group's entries share one id, its ops joined in order."""
    keyed: dict[Key, list[Entry]] = {}
    sig: dict[Key, tuple[str, Any]] = {}
    for e in d.entries:
        if e.p2p:
            continue
        k = (e.pg, e.seq)
        have = keyed.get(k)
        if have is None:
            keyed[k] = [e]
            sig[k] = (e.op, e.shape)
        else:
            have.append(e)
            sig[k] = (sig[k][0] + "+" + e.op, sig[k][1])
    return keyed, sig


class _View:
    """Who entered what: each rank's collectives by (group, sequence id), its newest and
    oldest sequence id per group, each group's members (the config's where it names them,
    else the ranks whose entries carry the group; the default group: every rank dumped)."""

    def __init__(self, dumps: list[Dump]) -> None:
        self.keyed: dict[int, dict[Key, list[Entry]]] = {}
        self.sig: dict[int, dict[Key, tuple[str, Any]]] = {}
        self.newest: dict[tuple[int, str], int] = {}
        self.oldest: dict[tuple[int, str], int] = {}
        self.desc: dict[str, str] = {}
        carriers: dict[str, set[int]] = defaultdict(set)
        for d in dumps:
            self.keyed[d.rank], self.sig[d.rank] = _by_key(d)
            for pg, seq in self.keyed[d.rank]:
                k = (d.rank, pg)
                self.newest[k] = max(seq, self.newest.get(k, seq))
                self.oldest[k] = min(seq, self.oldest.get(k, seq))
                carriers[pg].add(d.rank)
            for es in self.keyed[d.rank].values():
                self.desc.setdefault(es[0].pg, es[0].desc)
        for d in dumps:
            for pg, ranks in d.members.items():
                if pg in carriers:
                    carriers[pg] |= set(ranks)
        everyone = set(self.keyed)
        self.members = {pg: sorted((everyone if self.desc.get(pg) == "default_pg" else ms)
                                   & everyone) for pg, ms in carriers.items()}
        self.completed = {d.rank: d.completed for d in dumps}
        self.wrapped = {d.rank for d in dumps if d.wrapped}

    def known(self, r: int, pg: str) -> bool:
        """Whether the buffer says where `r` is in `pg`: it holds an entry of the group, or it
        never dropped one (a wrapped buffer without the group says nothing of it)."""
        return r not in self.wrapped or (r, pg) in self.newest

    def entered(self, r: int, pg: str, seq: int) -> bool:
        return self.newest.get((r, pg), -1) >= seq

    def done(self, pg: str, seq: int) -> bool:
        """Every member entered it alike (op, sizes, dtypes), and one went on past it (or all
        dumps say it completed)."""
        ms = [r for r in self.members[pg] if self.known(r, pg)]
        if not all(self.entered(r, pg, seq) for r in ms):
            return False
        sigs = [self.sig[r][(pg, seq)] for r in ms if (pg, seq) in self.sig[r]]
        if any(x != sigs[0] for x in sigs):  # another op, size or dtype: broken, not done
            return False
        return any(self.newest.get((r, pg), -1) > seq for r in ms) or all(
            self.completed[r].get(pg, -1) >= seq for r in ms)


def analyse(dumps: list[Dump]) -> Hang | None:
    """The hang the dumps show, or None when every collective they hold completed."""
    v = _View(dumps)
    divergences = [dv for pg in sorted(v.members, key=_pg_order)
                   if (dv := _diverge(v, pg)) is not None]
    # the ranks others wait for: never entered, or lost from their buffer where they diverge
    missing = {r for dv in divergences for r in (*dv.missing, *dv.unknown)}
    waits, idle, last_done = _positions(v, dumps, missing)
    if not waits:
        return None
    odd = {r: dv for dv in divergences for r in [*dv.other_op, *dv.mismatch]}
    unknown: list[str] = []
    for r, w in list(waits.items()):
        ms = [x for x in v.members[w.pg] if v.known(x, w.pg)]
        on = [x for x in ms if not v.entered(x, w.pg, w.seq)]
        if not on:
            on = [x for x in ms if x in odd and odd[x].pg == w.pg and x != r]
        if not on:  # a member whose buffer lost the group may be the one not there
            on = [x for x in v.members[w.pg] if not v.known(x, w.pg)]
        if not on and r not in odd and ms == [r]:  # peers unknown (gloo): the idle ranks
            unknown.append(w.pg)
            on = list(idle)
        waits[r] = Wait(r, w.pg, w.desc, w.seq, w.op, on)
    roots = _roots(waits, odd)
    order = _distance(waits, roots)
    shown = sorted(waits.values(),
                   key=lambda w: (order.get(w.rank, len(order)), len(w.on), w.rank))
    stacks = {}
    for r in roots:
        src = v.keyed[r].get((waits[r].pg, waits[r].seq), []) if r in waits else []
        last = [e for d in dumps if d.rank == r for e in d.entries[-1:]]
        if (src or last) and (fr := frames((src or last)[0])):
            stacks[r] = fr
    return Hang(roots, shown, divergences, last_done, stacks, unknown)


def _positions(v: _View, dumps: list[Dump], missing: set[int],
               ) -> tuple[dict[int, Wait], list[int], dict[int, tuple[str, str, int, str]]]:
    """Each rank's place: waiting in its newest collective (not done), or idle; and its
    newest collective that is done. A collective of a group only this rank carries (gloo:
    its peers unknown) is not done when others wait for this rank elsewhere (`missing`):
    gloo marks a collective that timed out as completed."""
    waits: dict[int, Wait] = {}
    idle: list[int] = []
    last_done: dict[int, tuple[str, str, int, str]] = {}
    for d in dumps:
        alone = d.rank in missing and len(v.keyed) > 1

        def done(e: Entry, alone: bool = alone, rank: int = d.rank) -> bool:
            return v.done(e.pg, e.seq) and not (alone and v.members[e.pg] == [rank])

        col = [e for e in d.entries if not e.p2p]
        for e in reversed(col):
            if done(e):
                last_done[d.rank] = (e.pg, e.desc, e.seq, e.op)
                break
        if not col or done(col[-1]):
            idle.append(d.rank)
            continue
        e = col[-1]
        waits[d.rank] = Wait(d.rank, e.pg, e.desc, e.seq, v.sig[d.rank][(e.pg, e.seq)][0], [])
    return waits, idle, last_done


def _pg_order(pg: str) -> tuple[int, str]:
    return (int(pg), "") if pg.isdigit() else (1 << 30, pg)


def _diverge(v: _View, pg: str) -> Divergence | None:
    """The first sequence id of `pg` its members disagree on, within what every buffer holds."""
    ranks = [r for r in v.members[pg] if v.known(r, pg)]
    unknown = [r for r in v.members[pg] if not v.known(r, pg)]
    seqs = sorted({s for r in ranks for (g, s) in v.keyed[r] if g == pg})
    start = max((v.oldest[(r, pg)] for r in ranks if (r, pg) in v.oldest), default=0)
    behind = min((v.newest.get((r, pg), -1) for r in ranks), default=-1)
    for s in seqs:
        if s < start:
            continue
        have = {r: v.sig[r][(pg, s)] for r in ranks if (pg, s) in v.sig[r]}
        first = have.get(ranks[0])
        if s <= behind and all(x == first for x in have.values()):
            continue  # the common case: everyone entered it alike
        missing = [r for r in ranks if not v.entered(r, pg, s)]
        major = _majority(Counter(op for op, _ in have.values()))
        other = {r: op for r, (op, _) in have.items() if op != major}
        shapes = {r: shape(v.keyed[r][(pg, s)][0]) for r in have if r not in other}
        common = _majority(Counter(shapes.values())) if shapes else None
        mismatch = {r: sh for r, sh in shapes.items() if sh != common}
        if missing or other or mismatch:
            return Divergence(pg, v.desc.get(pg, ""), s, major, sorted(have), missing, other,
                              mismatch, unknown)
    return None


T = TypeVar("T")


def _majority(c: Counter[T]) -> T:
    """The most common value (ties: the one seen first), so the odd ones are the rest."""
    best = max(c.values())
    return next(k for k, n in c.items() if n == best)


def _roots(waits: dict[int, Wait], odd: dict[int, Divergence]) -> list[int]:
    """Where the wait-for chains end: a rank that waits on nobody (outside every collective,
    or in one all members entered) or that entered another op or shape; every waiter when
    the chains only go round."""
    reach: set[int] = set()
    stack = list(waits)
    while stack:
        r = stack.pop()
        if r in reach:
            continue
        reach.add(r)
        if r in waits and r not in odd:
            stack.extend(waits[r].on)
    roots = [r for r in reach if r in odd or r not in waits or not waits[r].on]
    return sorted(roots) or sorted(waits)


def _distance(waits: dict[int, Wait], roots: list[int]) -> dict[int, int]:
    """How many waits each rank is from a root (BFS against the wait-for edges)."""
    dist = {r: 0 for r in roots}
    frontier = list(roots)
    while frontier:
        nxt = []
        for w in waits.values():
            if w.rank not in dist and any(x in frontier for x in w.on):
                dist[w.rank] = dist[frontier[0]] + 1
                nxt.append(w.rank)
        frontier = nxt
    return dist
