"""One physical KV budget for a group of engines on one host: the files and the processes.

A group is a directory (``KVPLAN_GROUP=DIR``); every engine naming it is a member. Files:

* ``group.lock``: ``flock(LOCK_EX)`` around every read-check-write of the ledger (bounded
  wait, then ``KVP540``). Never removed (removing a lock file splits waiters across inodes).
* ``ledger.json``: the :class:`GroupLedger` (budget, members, grants, claims), replaced
  atomically (a unique temporary file renamed over it): a reader, and a writer killed at any
  instant, leave it whole. Read without following symbolic links, regular files only.
* ``members/<lease>.lease``: one per member. The member's processes hold ``flock(LOCK_SH)``
  on it for as long as they live (the engine core from :meth:`GroupMember.join`, every
  worker that maps memory through :func:`attach`). A reaper's ``LOCK_EX|LOCK_NB`` succeeds
  only when every holder is gone, so the kernel says who is dead and a reused pid does not
  matter. Every accounting operation first reaps dead members: their grants return.

The policy (grants, guarantees, claims, what borrowers owe) is :mod:`kvplan.elastic.grants`;
this module runs it inside the lock. No torch, no vLLM.

**Fork.** Every descriptor is opened ``O_CLOEXEC`` (a program that ``exec``\\ s gets none).
A plain ``fork()`` copies the descriptors, and with them the *same* open file description
and its flock: an inherited lease would keep the member alive for as long as the child
lives, and a child unlocking it would release the parent's lock. So a child closes every
inherited kvplan descriptor right after ``os.fork()`` (``os.register_at_fork``) without
unlocking; a forked process that maps memory attaches with :func:`attach` like any worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from kvplan.elastic import grants
from kvplan.elastic._group_admin import (
    GroupSnapshot,
    MemberSnapshot,
    clear_guarantee,
    is_group_directory,
    read_snapshot,
    set_budget,
    set_guarantee,
    snapshot_of,
)
from kvplan.elastic._group_files import (
    _NAME,
    _RDONLY,
    HOLD_SECONDS,
    LEASE_SUFFIX,
    LEDGER_FILE,
    LEDGER_KIND,
    LOCK_FILE,
    LOCK_TIMEOUT,
    MAX_BYTES,
    MAX_FACTOR,
    MAX_LEDGER_BYTES,
    MAX_MEMBERS,
    MAX_SCAN,
    MEMBERS_DIR,
    SNAPSHOT_KIND,
    TICK_SECONDS,
    GroupLedger,
    GroupLock,
    GroupPaths,
    Lease,
    Liveness,
    MemberRecord,
    check_bytes,
    check_directory,
    check_range,
    clean,
    ensure_members_dir,
    fail,
    flock_bounded,
    ledger_problem,
    ledger_stamp,
    open_regular,
    policy_error,
    probe_lease,
    read_ledger,
    reap,
    refuse_forgetting,
    signature,
    still_alive,
    tampered,
    to_ledger,
    to_state,
    write_ledger,
)
from kvplan.elastic.grants import GroupState, MemberState, PolicyError
from kvplan.schemas.errors import Code, show_value

__all__ = [
    "HOLD_SECONDS",
    "LEASE_SUFFIX",
    "LEDGER_FILE",
    "LEDGER_KIND",
    "LOCK_FILE",
    "LOCK_TIMEOUT",
    "MAX_BYTES",
    "MAX_FACTOR",
    "MAX_LEDGER_BYTES",
    "MAX_MEMBERS",
    "MAX_SCAN",
    "MEMBERS_DIR",
    "SNAPSHOT_KIND",
    "TICK_SECONDS",
    "GroupLedger",
    "GroupLock",
    "GroupMember",
    "GroupPaths",
    "GroupSnapshot",
    "Lease",
    "Liveness",
    "MemberRecord",
    "MemberSnapshot",
    "attach",
    "clear_guarantee",
    "is_group_directory",
    "probe_lease",
    "read_ledger",
    "read_snapshot",
    "reap",
    "set_budget",
    "set_guarantee",
    "snapshot_of",
    "to_ledger",
    "to_state",
    "write_ledger",
]

# -- a member ---------------------------------------------------------------------------------


class GroupMember:
    """This engine's membership of a group (made by :meth:`join`; one per engine core).

    Cheap reads for every step: :attr:`effective_limit` (bytes it must get under) and
    :attr:`granted` (bytes it may map). Group I/O only in :meth:`request` past the grant,
    :meth:`release` past the hysteresis, and :meth:`tick` when the ledger changed.
    """

    def __init__(
        self, paths: GroupPaths, lock: GroupLock, lease: Lease, name: str, lease_id: str
    ) -> None:
        self.paths = paths
        self.name = name
        self.lease_id = lease_id
        """This membership's lease (``members/<lease_id>.lease``), new at every join."""
        self._lock = lock
        self._lease = lease
        self.lock_timeout = LOCK_TIMEOUT
        """Seconds to wait for the group's lock (``KVP540`` after)."""
        self.tick_seconds = TICK_SECONDS
        """Seconds between two looks at the ledger from :meth:`tick`."""
        self.hold_seconds = HOLD_SECONDS
        """Seconds a grant that just grew is kept before it is given back voluntarily."""
        # what the ledger said of this member at the last group operation (see _adopt)
        self.granted = 0
        """Bytes this engine may map (its grant)."""
        self.effective_limit = 0
        """Bytes it must get under: its grant less what it owes to others' claims."""
        self.claim = 0
        """Bytes it waits for below its guarantee (others give them back at their ticks)."""
        self.guarantee = 0
        """Bytes the group keeps for it (at least its floor)."""
        self.factor = 1
        """Ranks charged per byte."""
        self.quantum = 1
        """The smallest growth of its grant (bytes)."""
        self.budget = 0
        """The group's budget (charged bytes), for messages."""
        self.free = 0
        """Bytes (its own) no member holds: what a grant may still grow by without a claim."""
        self.created = False
        """Whether this join created the group (with the budget it was given)."""
        self._stamp: tuple[int, int, int] | None = None
        self._next_tick = 0.0
        self._grew_at = 0.0
        self._owed_to: tuple[str, ...] = ()
        self.group_ops = 0
        """Read-check-writes done under the lock (for tests and benchmarks)."""

    # -- joining ----------------------------------------------------------------------------
    @classmethod
    def join(
        cls,
        directory: Path | str,
        name: str,
        *,
        floor: int,
        ceiling: int,
        guarantee: int | None = None,
        factor: int = 1,
        initial: int = 0,
        budget: int | None = None,
        timeout: float = LOCK_TIMEOUT,
    ) -> GroupMember:
        """Join the group in ``directory`` as ``name`` and take its lease.

        ``floor``: the least the engine runs with (null block plus one ``max_model_len``
        request per KV cache group); ``guarantee`` defaults to it. ``ceiling``: its whole
        reservation. ``factor``: ranks charged per byte. ``initial``: bytes granted now if
        free (else claimed up to the guarantee; see :meth:`acquire`). ``budget``: the budget
        of a group that has no ledger yet (ignored once the group exists: see
        :attr:`budget`). ``KVP540``-``KVP547`` when it cannot join.
        """
        if not re.fullmatch(_NAME, name):
            raise fail(
                Code.GROUP_MEMBER_REFUSED,
                directory,
                f"the member name {show_value(name)} is not valid (1-128 letters, digits and "
                "._:@+- , starting with a letter or digit).",
                "set KVPLAN_ENGINE_NAME to such a name",
            )
        check_range(
            directory,
            "charge factor",
            factor,
            MAX_FACTOR,
            low=1,
            hint="pass the number of ranks whose memory the group holds",
        )
        for label, value in (("floor", floor), ("ceiling", ceiling), ("initial", initial)):
            check_bytes(directory, label, value)
        if budget is not None:
            check_bytes(directory, "budget", budget)
        paths = check_directory(directory)
        lock = GroupLock(paths, create=True)
        lease_id = secrets.token_hex(16)
        member_lease: Lease | None = None
        try:
            with lock.hold(timeout):
                ensure_members_dir(paths)  # after the lock: a refused group makes none
                ledger = read_ledger(paths)
                created = ledger is None
                if ledger is None:
                    refuse_forgetting(paths, "ledger (ledger.json)")
                    if budget is None:
                        raise fail(
                            Code.GROUP_BUDGET_MISSING,
                            paths.directory,
                            "the group has no ledger yet and no budget was given to create "
                            "it with.",
                            "set the group's budget (KVPLAN_GROUP_BUDGET, or kvplan limit "
                            "DIR SIZE) before the first engine joins",
                        )
                    state = GroupState(budget=budget)
                else:
                    state = to_state(ledger)
                reap(paths, state)
                clean(paths, ledger)
                taken = state.members.get(name)
                if taken is not None and not still_alive(paths, taken):
                    grants.leave(state, name)  # dead: a reader's probe hid it for a moment
                    with contextlib.suppress(OSError):
                        os.unlink(paths.lease_name(taken.lease))
                if name in state.members:
                    raise fail(
                        Code.GROUP_MEMBER_REFUSED,
                        paths.directory,
                        f"a live member is already named {name} (pid {state.members[name].pid}).",
                        "give the engine another name (KVPLAN_ENGINE_NAME) or stop the other",
                    )
                if len(state.members) >= MAX_MEMBERS:
                    raise fail(
                        Code.GROUP_MEMBER_REFUSED,
                        paths.directory,
                        f"the group is full ({MAX_MEMBERS} members).",
                        "use another group directory",
                    )
                member_lease = Lease.create(paths, lease_id)
                kept = state.kept.get(name)
                chosen = floor if guarantee is None else guarantee
                if kept is not None:  # an operator's, kept across restarts (within bounds)
                    chosen = min(max(kept, floor), ceiling)
                record = MemberState(
                    name=name,
                    factor=factor,
                    floor=floor,
                    guarantee=chosen,
                    ceiling=ceiling,
                    lease=lease_id,
                    lease_inode=member_lease.inode,
                    pid=os.getpid(),
                    joined_at=time.time(),
                )
                try:
                    grants.join(state, record)
                except PolicyError as exc:
                    if kept is not None:
                        exc = PolicyError(
                            exc.kind,
                            f"{exc} ({name}'s guarantee is the one kept for it by `kvplan "
                            f"limit --group DIR --member {name} SIZE`; `--member {name} "
                            "--clear` forgets it)",
                        )
                    raise policy_error(exc, paths.directory) from None
                if initial:
                    grants.request(state, name, min(initial, ceiling))
                write_ledger(paths, to_ledger(state))
        except BaseException:
            if member_lease is not None:
                with contextlib.suppress(OSError):
                    os.unlink(member_lease.path)
                member_lease.close()
            lock.close()
            raise
        member = cls(paths, lock, member_lease, name, lease_id)
        member.created = created
        member.lock_timeout = timeout
        member._adopt(state)
        member._stamp = ledger_stamp(paths)
        member._next_tick = time.monotonic() + member.tick_seconds
        return member

    @property
    def lease_path(self) -> Path:
        """The lease file workers attach to (:func:`attach`)."""
        return self.paths.lease(self.lease_id)

    # -- the locked operation -------------------------------------------------------------
    def _adopt(self, state: GroupState) -> None:
        m = state.members[self.name]
        shares = grants.owed(state)
        before = self.granted
        self.granted = m.granted
        self.effective_limit = grants.effective_limit(state, self.name, shares)
        self.claim = m.claim
        self.guarantee = m.guarantee
        self.factor = m.factor
        self.quantum = state.quantum(m)
        self.budget = state.budget
        self.free = max(0, state.free()) // m.factor
        if self.granted > before:
            self._grew_at = time.monotonic()
        self._owed_to = (
            tuple(n for n, o in state.members.items() if o.claim > 0)
            if shares.get(self.name)
            else ()
        )

    def _mine(self, state: GroupState) -> MemberState:
        m = state.members.get(self.name)
        if m is None or m.lease != self.lease_id or not self._lease.still_mine():
            raise fail(
                Code.GROUP_LEASE_LOST,
                self.paths.directory,
                f"member {self.name} is no longer in the group (its lease was lost or the "
                "ledger was replaced); it must not map more.",
                "restart the engine: it rejoins with a new lease",
            )
        return m

    def _heal_lease(self, state: GroupState) -> None:
        """A lease file removed under this live member (``rm``): make a new one at the same
        path and record its inode (inside the lock), so the member stays provably alive."""
        m = state.members.get(self.name)
        if m is None or m.lease != self.lease_id or not self._lease.removed():
            return
        fresh = Lease.create(self.paths, self.lease_id)
        self._lease.close()
        self._lease = fresh
        m.lease_inode = fresh.inode

    @contextlib.contextmanager
    def _locked(self) -> Iterator[GroupState]:
        with self._lock.hold(self.lock_timeout):
            ledger = read_ledger(self.paths)
            if ledger is None:
                raise ledger_problem(self.paths, "is missing.")
            state = to_state(ledger)
            self._heal_lease(state)
            self._mine(state)
            before = signature(to_state(ledger))
            reap(self.paths, state, keep=self.name)
            yield state
            self.group_ops += 1
            if signature(state) != before or state.revision != ledger.revision:
                if state.revision == ledger.revision:
                    state.revision += 1
                write_ledger(self.paths, to_ledger(state))
            self._adopt(state)
            self._stamp = ledger_stamp(self.paths)

    # -- accounting ---------------------------------------------------------------------------
    def request(self, need: int) -> bool:
        """Make the grant cover ``need`` bytes (what the engine would map in all, its bytes)
        before it hands out blocks that map them. True when granted (``effective_limit``
        then covers ``need``). No group I/O when ``need`` is within the effective limit; a
        grant grows by at least a quantum (1/64 of the budget). False when the group cannot
        give it now: the member then claims up to its guarantee, and a later call (or
        :meth:`tick`) sees the claim served."""
        if need <= self.effective_limit:
            return True
        if need <= self.granted:
            return False  # it owes bytes to claims: give back first (tick sees the change)
        with self._locked() as state:
            grants.request(state, self.name, need)
        return need <= self.effective_limit

    def acquire(self, need: int, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until ``need`` bytes are granted; ``KVP546`` else.
        For start-up: the bytes a bound engine maps before its first step."""
        deadline = time.monotonic() + timeout
        while not self.request(need):
            if time.monotonic() >= deadline:
                raise fail(
                    Code.GROUP_NOT_GRANTED,
                    self.paths.directory,
                    f"member {self.name} was not granted {need} bytes within {timeout:g} s "
                    f"(granted {self.granted}, guarantee {self.guarantee}, budget "
                    f"{self.budget} charged bytes).",
                    "raise the group's budget or lower the other members' use",
                )
            time.sleep(0.02)
            self.tick(force=True)

    def release(self, mapped: int) -> int:
        """Tell the group the engine maps ``mapped`` bytes now (after its workers unmapped);
        bytes given back. Shrinks the grant when it owes bytes to claims (down to its
        effective limit, or to ``mapped`` if that is above) or when the grant exceeds
        ``mapped`` by more than two quanta and did not grow in the last second (to ``mapped``
        plus a quantum). No group I/O otherwise. Never below ``mapped``."""
        target = self._release_target(self.granted, self.effective_limit, mapped, self.claim)
        if target is None:
            return 0
        with self._locked() as state:
            m = state.members[self.name]
            shares = grants.owed(state)
            eff = grants.effective_limit(state, self.name, shares)
            target = self._release_target(m.granted, eff, mapped, m.claim)
            freed = 0 if target is None else grants.release(state, self.name, target)
        return freed

    def give_back(self, to: int) -> int:
        """Shrink the grant to ``to`` bytes now, whatever the hysteresis says (an idle
        engine, or one about to stop); bytes given back. The engine must map no more than
        ``to`` when it calls this."""
        if to >= self.granted and not self.claim:
            return 0
        with self._locked() as state:
            freed = grants.release(state, self.name, to)
        return freed

    def _release_target(self, granted: int, eff: int, mapped: int, claim: int) -> int | None:
        q = self.quantum
        if granted > eff:
            target = max(mapped, min(eff, mapped + q))
        elif claim > 0 or granted - mapped <= 2 * q or self._held():
            return None
        else:
            target = mapped + q
        return target if target < granted else None

    def stamp(self) -> object:
        """The ledger file's identity now (one ``lstat``): it changes with every write of any
        member, so an unchanged stamp means nothing changed since the last look."""
        return ledger_stamp(self.paths)

    def changed(self) -> bool:
        """Whether the ledger was written since this member last read or wrote it (one
        ``lstat``; for a watcher that must not take the lock to find out)."""
        return ledger_stamp(self.paths) != self._stamp

    def _held(self) -> bool:
        return time.monotonic() - self._grew_at < self.hold_seconds

    def tick(self, *, force: bool = False) -> bool:
        """Look at the group (at most every :data:`TICK_SECONDS` unless ``force``): a new
        budget, claims this member must give back to, its own claim served, a claimant that
        died. True when this member's figures changed. Cheap when nothing changed (a clock
        read, then one ``lstat`` of the ledger)."""
        now = time.monotonic()
        if not force and now < self._next_tick:
            return False
        self._next_tick = now + self.tick_seconds
        before = (self.granted, self.effective_limit, self.claim)
        if self._lease.look() != Lease.MINE:
            with self._locked():
                pass  # a removed lease is made again (_heal_lease), a replaced one fails
        stamp = ledger_stamp(self.paths)
        if stamp != self._stamp or self._owed_to:
            ledger = read_ledger(self.paths)
            if ledger is None:
                raise ledger_problem(self.paths, "is missing.")
            state = to_state(ledger)
            self._mine(state)
            self._stamp = stamp
            self._adopt(state)
            if any(
                probe_lease(self.paths, o.lease, o.lease_inode, o.pid, o.joined_at)
                != Liveness.ALIVE
                for o in (state.members[n] for n in self._owed_to if n in state.members)
            ):
                with self._locked():
                    pass  # reaps the dead claimants; their claims vanish
        return (self.granted, self.effective_limit, self.claim) != before

    def check(self) -> None:
        """One look at the group through everything the accounting goes through: the lock,
        the ledger, this member's lease (a :class:`KVPlanError` when any of them fails), the
        member's figures adopted. For an engine whose accounting failed, to learn that it
        can be reached again -- a look that skips one of them would say so too early."""
        with self._locked():
            pass

    def leave(self) -> None:
        """Leave the group: the grant returns, the lease file is removed."""
        if self._lease.fd is None:
            return
        try:
            with self._lock.hold(self.lock_timeout):
                ledger = read_ledger(self.paths)
                if ledger is not None:
                    state = to_state(ledger)
                    m = state.members.get(self.name)
                    if m is not None and m.lease == self.lease_id:
                        grants.leave(state, self.name)
                        write_ledger(self.paths, to_ledger(state))
                with contextlib.suppress(OSError):
                    if self._lease.still_mine():
                        os.unlink(self._lease.path)
        finally:
            self._lease.close()
            self._lock.close()

    def close_descriptors(self) -> None:
        """Drop the lease and lock without touching the ledger (as a crash would: the next
        accounting operation of another member reaps this one). For tests."""
        self._lease.close()
        self._lock.close()


def attach(directory: Path | str, name: str, timeout: float = LOCK_TIMEOUT) -> Lease:
    """For a worker process of member ``name`` that maps memory: hold the member's lease
    (shared) for this process's life. ``KVP545`` when the member is not in the group or its
    lease is gone (it was reaped: the engine must not map).

    Takes no group lock (a storm of grant changes cannot starve a starting worker): the lease
    is locked, then found still at its path and still the member's. A reaper takes a lease
    only when nobody holds it, and removes the file while holding it; so either this process
    holds the lease first (and the member is alive) or it sees the file gone or replaced.
    """
    paths = check_directory(directory)
    GroupLock(paths, create=False).close()  # a kvplan group (KVP540 otherwise)

    def record() -> MemberRecord:
        ledger = read_ledger(paths)
        found = next((m for m in (ledger.members if ledger else []) if m.name == name), None)
        if found is None:
            raise fail(
                Code.GROUP_LEASE_LOST,
                paths.directory,
                f"member {name} is not in the group.",
                "the engine core joins first; restart the engine",
            )
        return found

    member = record()
    path = paths.lease(member.lease)
    try:
        fd = open_regular(path, _RDONLY, "lease file", Code.GROUP_LEASE_LOST)
    except FileNotFoundError:
        raise fail(
            Code.GROUP_LEASE_LOST, path, f"the lease of {name} is gone.", "restart the engine"
        ) from None
    try:
        if os.fstat(fd).st_ino != member.lease_inode:
            raise tampered(paths, member.lease, name)
        flock_bounded(fd, fcntl.LOCK_SH, timeout, path, f"the lease of {name}")
        again = record()
        if again.lease != member.lease or not _same_inode(path, member.lease_inode):
            raise fail(
                Code.GROUP_LEASE_LOST,
                path,
                f"member {name} was reaped while this worker attached.",
                "restart the engine",
            )
    except BaseException:
        os.close(fd)
        raise
    return Lease(fd, path, member.lease_inode)


def _same_inode(path: Path, inode: int) -> bool:
    try:
        return os.lstat(path).st_ino == inode
    except OSError:
        return False
