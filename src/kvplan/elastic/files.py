"""The files elastic engines share with ``kvplan top`` and ``kvplan limit``.

* ``<dir>/rank<N>.stats.json``: one :class:`ElasticStats` snapshot per worker rank, replaced
  atomically (readers see the previous snapshot or the new one, never a torn file).
* ``<dir>/limit.json``: a :class:`LimitRequest`, the physical budget the engines watching
  ``<dir>`` should follow from now on.

Both are small JSON documents written by the project's one writer and read by its one
reader, confined to the directory: nothing is read or written through a symbolic link, and
nothing that is not a regular file is opened (a fifo or a link to ``/proc`` never blocks a
reader). A file that cannot be read or is not a valid document becomes a
:class:`~kvplan.schemas.errors.Diagnostic` (``KVP416`` for stats, ``KVP417`` for a limit),
never an exception. No torch, no vLLM.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, show_value
from kvplan.schemas.loading import (
    decode_text,
    diagnostics_from_validation,
    parse_text,
    read_bytes,
    write_text_atomic,
)

STATS_KIND: Final = "kvplan-elastic-stats"
LIMIT_KIND: Final = "kvplan-elastic-limit"
LIMIT_FILE = "limit.json"
STATS_SUFFIX = ".stats.json"

MAX_FILE_BYTES = 64 << 10
"""Largest stats or limit file read (64 KiB; a real one is under 1 KiB plus ~50 B per mapped
run; the largest valid snapshot, every bound reached, stays under it)."""
MAX_STATS_FILES = 1024
"""Most stats files :func:`read_stats_tree` reads (the rest are reported in one diagnostic)."""
MAX_TREE_ENTRIES = 100_000
"""Most directory entries :func:`read_stats_tree` looks at, all directories together."""
MAX_TREE_DEPTH = 2
"""Subdirectory levels below the given directory that :func:`read_stats_tree` searches."""

HEARTBEAT_SECONDS: Final = 2.0
"""The longest a running engine's stats reporter goes without rewriting its snapshot."""
STALE_HEARTBEATS: Final = 3
"""Heartbeats missed before ``kvplan top`` calls a snapshot stale (its writer stopped)."""
MAX_MAPPED_RUNS: Final = 512
"""Most ``[first_chunk, count]`` runs in one snapshot's ``mapped_runs``, all pools together;
past it the writer coarsens the runs (:func:`mapped_runs`)."""
MAX_MAPPED_POOLS: Final = 64
"""Most pools named in ``mapped_runs`` (vLLM 0.32-0.33 bind one pool)."""
MAX_POOL_NAME_CHARS: Final = 256
MAX_CHUNK_INDEX: Final = 1 << 50
"""Chunk numbers and counts in ``mapped_runs`` stay below this (1 PiB of 1-byte chunks)."""

STEP_SECONDS_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
"""Upper bounds (seconds) of the buckets of ``map_seconds_buckets`` / ``unmap_seconds_buckets``
(one more bucket above the last: +Inf); the ``_seconds`` histograms of ``/metrics`` use them."""

_STATS_NAME = re.compile(r"rank([0-9]{1,9})\.stats\.json")


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ElasticStats(_Document):
    """One worker's elastic-memory figures at one moment (bytes, counts, seconds)."""

    kind: Literal["kvplan-elastic-stats"] = STATS_KIND
    version: Literal[1] = 1
    engine: str = Field(
        max_length=512, description="the writer's engine id, e.g. '<hostname>:<pid>'"
    )
    rank: int = Field(ge=0)
    pid: int = Field(ge=0)
    time: float = Field(description="unix seconds of this snapshot")
    state: Literal["bound", "running", "closed"]
    backend: str = Field(max_length=64)
    chunk_bytes: int = Field(ge=0)
    num_blocks: int = Field(ge=0)
    reserved_bytes: int = Field(ge=0)
    mapped_bytes: int = Field(ge=0)
    peak_mapped_bytes: int = Field(ge=0)
    limit_bytes: int = Field(ge=0)
    cache_limit_bytes: int = Field(ge=0)
    reserve_bytes: int = Field(ge=0, description="pre-backed chunks kept off the critical path")
    live_blocks: int = Field(ge=0)
    cached_blocks: int = Field(ge=0, description="freed blocks whose KV stays for prefix hits")
    maps: int = Field(ge=0)
    unmaps: int = Field(ge=0)
    map_seconds: float = Field(ge=0)
    unmap_seconds: float = Field(ge=0)
    failed_maps: int = Field(ge=0)
    rollbacks: int = Field(
        default=0, ge=0, description="chunks a failed map mapped and unmapped again (not unmaps)"
    )
    steps: int = Field(ge=0)
    # optional: absent in files of older writers (None / the default then)
    host: str | None = Field(
        default=None,
        max_length=255,
        description="the writer's host name (socket.gethostname()); kvplan top checks the pid "
        "of engines on its own host only",
    )
    pid_namespace: str | None = Field(
        default=None,
        max_length=64,
        description="the writer's pid namespace (readlink /proc/self/ns/pid); with host, says "
        "whether pid names the same process for kvplan top",
    )
    floor_bytes: int | None = Field(
        default=None,
        ge=0,
        description="the smallest limit the engine accepts: the null block plus one request of "
        "max_model_len tokens in every KV cache group; a lower limit is raised to it",
    )
    asked_limit_bytes: int | None = Field(
        default=None,
        ge=0,
        description="the limit asked (KVPLAN_MEMORY_LIMIT or limit.json); None: the default "
        "(the reservation). limit_bytes is the limit in force",
    )
    over_limit_preemptions: int | None = Field(
        default=None,
        ge=0,
        description="requests the engine core preempted so far because blocks in use exceeded "
        "the effective limit (a lowered limit, another member's claim); None: an older writer",
    )
    ahead_maps: int | None = Field(
        default=None,
        ge=0,
        description="of maps, the chunks mapped ahead of need, outside any step's critical path: "
        "an idle engine's reserve, and a busy engine's next blocks mapped while a step ran; "
        "None: an older writer",
    )
    plan_fingerprint: str | None = Field(
        default=None, max_length=128, description="fingerprint of the plan the worker bound"
    )
    group: str | None = Field(
        default=None, max_length=4096, description="the group directory (KVPLAN_GROUP), if any"
    )
    group_member: str | None = Field(
        default=None, max_length=128, description="the engine's member name in that group"
    )
    mapped_runs: dict[str, list[tuple[int, int]]] | None = Field(
        default=None,
        description="per pool, the mapped chunks as sorted, disjoint [first_chunk, count] runs "
        "(chunk i = bytes [i*chunk_bytes, (i+1)*chunk_bytes) of the pool), in units of "
        "mapped_runs_unit chunks",
    )
    mapped_runs_unit: int = Field(
        default=1,
        ge=1,
        le=MAX_CHUNK_INDEX,
        description="chunks per unit of mapped_runs: 1 exact; N > 1 a unit is listed when any "
        "of its N chunks is mapped (the writer coarsens past MAX_MAPPED_RUNS runs)",
    )

    map_seconds_buckets: list[int] | None = Field(
        default=None,
        description="steps that mapped, counted by how long their map took: one count per "
        "bound of STEP_SECONDS_BUCKETS and a last one above it (not cumulative)",
    )
    unmap_seconds_buckets: list[int] | None = Field(
        default=None,
        description="steps that unmapped, counted by how long their unmap took (as "
        "map_seconds_buckets)",
    )

    @field_validator("map_seconds_buckets", "unmap_seconds_buckets")
    @classmethod
    def _check_buckets(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (
            len(value) != len(STEP_SECONDS_BUCKETS) + 1 or any(n < 0 for n in value)
        ):
            raise ValueError(
                f"needs {len(STEP_SECONDS_BUCKETS) + 1} counts >= 0 (one per bound of "
                "STEP_SECONDS_BUCKETS, then one above the last)"
            )
        return value

    @field_validator("mapped_runs")
    @classmethod
    def _check_runs(
        cls, value: dict[str, list[tuple[int, int]]] | None
    ) -> dict[str, list[tuple[int, int]]] | None:
        if value is None:
            return None
        check_mapped_runs(value)
        return value


class LimitRequest(_Document):
    """A physical budget for the engines watching a directory (``kvplan limit``)."""

    kind: Literal["kvplan-elastic-limit"] = LIMIT_KIND
    version: Literal[1] = 1
    limit_bytes: int = Field(ge=0)
    cache_limit_bytes: int | None = Field(default=None, ge=0)
    written_at: float = Field(description="unix seconds when the request was written")


# -- pure helpers ---------------------------------------------------------------------------


def check_mapped_runs(runs: Mapping[str, list[tuple[int, int]]]) -> None:
    """Raise ``ValueError`` unless ``runs`` is bounded, sorted and disjoint (see the field)."""
    if len(runs) > MAX_MAPPED_POOLS:
        raise ValueError(f"more than {MAX_MAPPED_POOLS} pools")
    total = 0
    for pool, items in runs.items():
        if not 0 < len(pool) <= MAX_POOL_NAME_CHARS:
            raise ValueError(f"a pool name must have 1 to {MAX_POOL_NAME_CHARS} characters")
        total += len(items)
        if total > MAX_MAPPED_RUNS:
            raise ValueError(f"more than {MAX_MAPPED_RUNS} runs")
        end = -1
        for first, count in items:
            if first < 0 or count < 1 or first + count > MAX_CHUNK_INDEX:
                raise ValueError(
                    f"run [{first}, {count}] of pool {pool[:80]!r} is not a first chunk >= 0 "
                    f"and a count >= 1 below 2**50"
                )
            if first <= end:
                raise ValueError(f"the runs of pool {pool[:80]!r} are not sorted and disjoint")
            end = first + count - 1


def run_lengths(chunks: Iterable[int]) -> list[tuple[int, int]]:
    """Chunk numbers (any order, repeats allowed) as sorted ``(first, count)`` runs."""
    ordered = sorted(set(chunks))
    n = len(ordered)
    # a run breaks where a number does not follow the one before it
    bounds = [0, *(i for i in range(1, n) if ordered[i] != ordered[i - 1] + 1), n]
    return [(ordered[a], b - a) for a, b in pairwise(bounds) if b > a]


def mapped_runs(
    chunks_by_pool: Mapping[str, Iterable[int]], max_runs: int = MAX_MAPPED_RUNS
) -> tuple[dict[str, list[tuple[int, int]]] | None, int]:
    """``(mapped_runs, mapped_runs_unit)`` for a snapshot, from the mapped chunk numbers per
    pool (as the worker's bound cache keeps them).

    Exact (unit 1) when the runs fit in ``max_runs``; else in the smallest power-of-two unit of
    chunks that fits, a unit listed when any of its chunks is mapped. Pools without a mapped
    chunk are left out. ``(None, 1)`` when the runs cannot be recorded (more mapped pools than
    ``max_runs`` or :data:`MAX_MAPPED_POOLS`, a pool name longer than
    :data:`MAX_POOL_NAME_CHARS`): the snapshot then has no runs.

    A GPU's pools have tens of thousands of chunks, and the stats reporter's thread computes
    this under the interpreter lock the engine's steps need: each doubling of the unit halves
    the runs of the one before (a unit of ``2u`` is listed when either of its halves is), so
    the passes after the first cost half, a quarter, ... of it.
    """
    runs = {pool: run_lengths(ids) for pool, ids in chunks_by_pool.items()}
    runs = {pool: found for pool, found in runs.items() if found}
    limit = min(max_runs, MAX_MAPPED_RUNS)
    if len(runs) > min(limit, MAX_MAPPED_POOLS) or any(
        not 0 < len(pool) <= MAX_POOL_NAME_CHARS for pool in runs
    ):
        return None, 1
    unit = 1
    while sum(len(r) for r in runs.values()) > limit:
        unit *= 2
        runs = {pool: _halved(r) for pool, r in runs.items()}
    return runs, unit


def _halved(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` (sorted, disjoint) in units twice as large: a unit listed when either half is."""
    out: list[tuple[int, int]] = []
    for first, count in runs:
        lo, hi = first >> 1, ((first + count - 1) >> 1) + 1
        if out and out[-1][0] + out[-1][1] >= lo:
            start = out[-1][0]
            out[-1] = (start, max(start + out[-1][1], hi) - start)
        else:
            out.append((lo, hi - lo))
    return out


def is_stale(stats: ElasticStats, now: float) -> bool:
    """Whether the writer of ``stats`` stopped: not ``closed`` and more than
    :data:`STALE_HEARTBEATS` heartbeats old (a running engine rewrites its snapshot at least
    every :data:`HEARTBEAT_SECONDS`, idle or not)."""
    return stats.state != "closed" and now - stats.time > STALE_HEARTBEATS * HEARTBEAT_SECONDS


def _to_text(model: BaseModel) -> str:
    return model.model_dump_json(indent=2) + "\n"


# -- stats --------------------------------------------------------------------------------


def stats_path(directory: Path, rank: int) -> Path:
    """``<directory>/rank<rank>.stats.json``."""
    return Path(directory) / f"rank{int(rank)}{STATS_SUFFIX}"


def write_stats(directory: Path, stats: ElasticStats) -> Path:
    """Replace this rank's stats file atomically; its path. ``KVP016`` if it cannot be written.

    Not fsynced: a snapshot rewritten every half second must survive its writer's death (the
    rename does) but not the machine's, and must never wait for a disk busy writing back
    (a signal's last snapshot is written this way too)."""
    path = stats_path(directory, stats.rank)
    write_text_atomic(path, _to_text(stats), within=directory, durable=False, own=True)
    return path


def read_stats(path: Path, *, within: Path | None = None) -> ElasticStats | Diagnostic:
    """One stats file, or a ``KVP416`` diagnostic saying why it cannot be used.

    Read below ``within`` (default: the file's own directory) without following a link."""
    folder = Path(path).parent if within is None else within
    return _read(path, folder, ElasticStats, STATS_KIND, Code.STATS_UNREADABLE, "stats file")


def read_stats_tree(directory: Path) -> list[tuple[Path, ElasticStats | Diagnostic]]:
    """Every ``rank<N>.stats.json`` in ``directory`` and two subdirectory levels below it.

    Sorted by path. A file that cannot be read or is invalid yields a ``KVP416`` diagnostic;
    a directory that cannot be listed, ``KVP419``. At most :data:`MAX_STATS_FILES` files are
    read and :data:`MAX_TREE_ENTRIES` entries looked at; past either bound one diagnostic
    (located at ``directory``) says what was left out. Never raises for what it finds.
    """
    root = Path(directory)
    found: list[Path] = []
    problems: list[tuple[Path, Diagnostic]] = []
    budget = [MAX_TREE_ENTRIES]
    _walk(root, 0, found, problems, budget)
    found.sort()
    out: list[tuple[Path, ElasticStats | Diagnostic]] = [
        (p, read_stats(p, within=root)) for p in found[:MAX_STATS_FILES]
    ]
    out.extend(problems)
    if len(found) > MAX_STATS_FILES or budget[0] < 0:
        what = (
            f"more than {MAX_STATS_FILES} stats files"
            if len(found) > MAX_STATS_FILES
            else f"more than {MAX_TREE_ENTRIES} directory entries"
        )
        out.append(
            (
                root,
                error(
                    Code.STATS_UNREADABLE,
                    str(root),
                    f"the directory holds {what}; only the first are shown.",
                    "point kvplan top at one engine's dump directory",
                ),
            )
        )
    out.sort(key=lambda item: str(item[0]))
    return out


def _walk(
    folder: Path,
    depth: int,
    found: list[Path],
    problems: list[tuple[Path, Diagnostic]],
    budget: list[int],
) -> None:
    try:
        with os.scandir(folder) as entries:
            subdirs: list[Path] = []
            for entry in entries:
                budget[0] -= 1
                if budget[0] < 0:
                    return
                if _STATS_NAME.fullmatch(entry.name):
                    found.append(Path(entry.path))
                elif depth < MAX_TREE_DEPTH and _is_dir(entry):
                    subdirs.append(Path(entry.path))
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        problems.append(
            (
                folder,
                error(
                    Code.DIRECTORY_MISSING,
                    str(folder),
                    f"cannot list the directory: {reason}.",
                    "check the path and its permissions",
                ),
            )
        )
        return
    for sub in sorted(subdirs):
        _walk(sub, depth + 1, found, problems, budget)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


# -- limit --------------------------------------------------------------------------------


def limit_path(directory: Path) -> Path:
    return Path(directory) / LIMIT_FILE


def write_limit(directory: Path, limit_bytes: int, cache_limit_bytes: int | None = None) -> Path:
    """Write ``<directory>/limit.json`` atomically; its path.

    ``KVP418`` for a negative size; ``KVP016`` if the file cannot be written (the previous
    request, if any, stays intact).
    """
    try:
        request = LimitRequest(
            limit_bytes=limit_bytes, cache_limit_bytes=cache_limit_bytes, written_at=time.time()
        )
    except ValidationError as exc:
        raise KVPlanError(
            error(
                Code.BAD_LIMIT,
                "limit",
                f"the limit is not a byte count >= 0 (limit {show_value(limit_bytes)}, "
                f"cache limit {show_value(cache_limit_bytes)}; {exc.error_count()} error(s)).",
                "pass sizes such as 24GiB",
            )
        ) from None
    path = limit_path(directory)
    write_text_atomic(path, _to_text(request), within=directory, own=True)
    return path


def read_limit(directory: Path) -> LimitRequest | Diagnostic | None:
    """The limit request of ``directory``; ``None`` when there is no ``limit.json``.

    A file that cannot be read or is not a valid request yields a ``KVP417`` diagnostic.
    """
    path = limit_path(directory)
    try:
        os.lstat(path)  # a dangling link is there: refused by the read, not ignored
    except FileNotFoundError:
        return None
    except OSError:
        pass  # reported by the read below, with its reason
    return _read(
        path, Path(directory), LimitRequest, LIMIT_KIND, Code.LIMIT_UNREADABLE, "limit file"
    )


# -- reading ------------------------------------------------------------------------------

_M = TypeVar("_M", bound=_Document)


def _read(
    path: Path, within: Path, model: type[_M], kind: str, code: Code, what: str
) -> _M | Diagnostic:
    name = str(path)

    def problem(message: str, hint: str) -> Diagnostic:
        return error(code, name, f"the {what} {message}", hint)

    try:
        raw = read_bytes(path, limit=MAX_FILE_BYTES, within=within, own=True)
        data: Any = parse_text(decode_text(raw, name), name)
    except KVPlanError as exc:
        first = exc.diagnostics[0]
        return problem(
            f"cannot be used: {first.code.value} {first.message.rstrip('.')}.",
            first.hint or "rewrite it",
        )
    if not isinstance(data, dict) or data.get("kind") != kind:
        got = show_value(data.get("kind")) if isinstance(data, dict) else show_value(data)
        return problem(
            f"is not a {kind} document (kind {got}).", f"remove it; kvplan writes {what}s"
        )
    if data.get("version") != 1:
        return problem(
            f"has version {show_value(data.get('version'))}; this kvplan reads version 1.",
            "use the kvplan release that the engines run",
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        diags = diagnostics_from_validation(exc, name, data)
        first = diags[0]
        more = f" (and {len(diags) - 1} more)" if len(diags) > 1 else ""
        field = first.location.removeprefix(name).lstrip(":. ") or "?"
        return problem(f"has a bad field {field}: {first.message}{more}.", "rewrite or remove it")
