"""Elastic mode's own settings: ``KVPLAN_MEMORY_LIMIT``, ``KVPLAN_CACHE_LIMIT``,
``KVPLAN_RESERVE``, ``KVPLAN_BUSY_RESERVE``, ``KVPLAN_BUSY_AHEAD``, ``KVPLAN_POISON``,
``KVPLAN_MAP_RETRY`` and the
test-only ``KVPLAN_DEBUG_SKIP_MAP`` / ``KVPLAN_DEBUG_FAIL_MAP`` (read here, handed to the plugin by
:class:`~kvplan.integrations.vllm.elastic.ElasticMode`), and the defaults derived from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvplan.executor.backends.latency import latency_from
from kvplan.integrations.vllm.pipeline.settings import directory_setting, flag
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error

ENV_MEMORY_LIMIT = "KVPLAN_MEMORY_LIMIT"
ENV_CACHE_LIMIT = "KVPLAN_CACHE_LIMIT"
ENV_RESERVE = "KVPLAN_RESERVE"
ENV_BUSY_RESERVE = "KVPLAN_BUSY_RESERVE"
ENV_POISON = "KVPLAN_POISON"
ENV_BUSY_AHEAD = "KVPLAN_BUSY_AHEAD"
ENV_DEBUG_SKIP_MAP = "KVPLAN_DEBUG_SKIP_MAP"
ENV_DEBUG_FAIL_MAP = "KVPLAN_DEBUG_FAIL_MAP"
ENV_MAP_RETRY = "KVPLAN_MAP_RETRY"
ENV_CAPACITY = "KVPLAN_CAPACITY"
ENV_GROUP = "KVPLAN_GROUP"
ENV_GROUP_BUDGET = "KVPLAN_GROUP_BUDGET"
ENV_GROUP_GUARANTEE = "KVPLAN_GROUP_GUARANTEE"
ENV_ENGINE_NAME = "KVPLAN_ENGINE_NAME"

_TOKENS = re.compile("([0-9]{1,12}) ?(?:t|tok|tokens)")

CACHE_LIMIT_SHARE = 10
"""Default ``KVPLAN_CACHE_LIMIT``: a tenth of the memory limit."""
RESERVE_SHARE = 64
"""Default ``KVPLAN_RESERVE``: 1/64 of the memory limit, at most :data:`RESERVE_MAX`."""
RESERVE_MAX = 256 << 20
BUSY_RESERVE_SHARE = 4
"""Default ``KVPLAN_BUSY_RESERVE``: a quarter of the memory limit, at most
:data:`BUSY_RESERVE_MAX`."""
BUSY_RESERVE_MAX = 1 << 30
MAP_RETRY_SECONDS = 1.0
"""Default ``KVPLAN_MAP_RETRY``: after a failed map, no new memory is mapped for this long
(the blocks already backed are all the engine gets, as if the limit were what is mapped),
then mapping is tried again."""
MAP_RETRY_MAX = 3600.0


@dataclass(frozen=True)
class ElasticSettings:
    """``KVPLAN_MEMORY_LIMIT`` / ``KVPLAN_CACHE_LIMIT`` / ``KVPLAN_RESERVE`` (bytes; ``None``:
    the default), ``KVPLAN_POISON`` and the test-only ``KVPLAN_DEBUG_SKIP_MAP`` /
    ``KVPLAN_DEBUG_FAIL_MAP``."""

    limit: int | None = None
    cache_limit: int | None = None
    reserve: int | None = None
    poison: bool = False
    skip_map: int | None = None
    """Test-only negative control: drop one block from the N-th map (1-based)."""
    fail_map: int | None = None
    """Test-only fault injection: the N-th map (1-based) fails after mapping its chunks."""
    map_retry: float = MAP_RETRY_SECONDS
    """Seconds without new mappings after a failed map (0: try again at the next step)."""
    capacity: int | None = None
    """``KVPLAN_CAPACITY`` in bytes per rank: the KV address space reserved (vLLM's block
    count), whoever else runs (``None``: the default, see ``_capacity``)."""
    capacity_tokens: int | None = None
    """``KVPLAN_CAPACITY`` given in tokens (``65536t``): converted with the model's bytes per
    token when the worker sizes its cache."""
    group: Path | None = None
    """``KVPLAN_GROUP``: the group directory whose one budget this engine draws from."""
    group_budget: int | None = None
    """``KVPLAN_GROUP_BUDGET``: the budget a group is created with (its first member)."""
    group_guarantee: int | None = None
    """``KVPLAN_GROUP_GUARANTEE``: this member's guaranteed bytes (default: its floor)."""
    busy_reserve: int | None = None
    """``KVPLAN_BUSY_RESERVE``: the most free pages a busy engine keeps backed, following what
    its steps take (``None``: the default; 0: the reserve is ``KVPLAN_RESERVE`` busy or not)."""
    device_latency: str | None = None
    """``KVPLAN_HOST_VMM_LATENCY``'s profile (``h100``, ``a100``, ``custom``): host-vmm emulates
    a device's map latency, in sleeps that overlap the forward as a driver's waits would."""
    busy_ahead: bool | None = None
    """``KVPLAN_BUSY_AHEAD``: a busy engine maps its next blocks ahead on each worker's thread
    (``None``, unset: where the backend maps beside the compute, :meth:`maps_ahead_busy`)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "group": None if self.group is None else str(self.group),
            "group_budget": self.group_budget,
            "group_guarantee": self.group_guarantee,
            "capacity": self.capacity,
            "capacity_tokens": self.capacity_tokens,
            "memory_limit": self.limit,
            "cache_limit": self.cache_limit,
            "reserve": self.reserve,
            "busy_reserve": self.busy_reserve,
            "poison": self.poison,
            "debug_skip_map": self.skip_map,
            "debug_fail_map": self.fail_map,
            "map_retry": self.map_retry,
            "device_latency": self.device_latency,
            "busy_ahead": self.busy_ahead,
        }

    def maps_ahead_busy(self, backend: str) -> bool:
        """Whether a busy engine maps its next blocks ahead (``_ahead``): as
        ``KVPLAN_BUSY_AHEAD`` says, else where ``backend``'s maps run beside a step's compute
        (``BackendInfo.maps_beside_compute``: cuda-vmm; or host-vmm emulating a device)."""
        if self.busy_ahead is not None:
            return self.busy_ahead
        from kvplan.executor.backends import backend_info

        return backend_info(backend).maps_beside_compute or self.device_latency is not None


def _size(env: Mapping[str, str], name: str, problems: list[Diagnostic]) -> int | None:
    """A byte size as every ``kvplan`` option reads one: at most 1 PiB (as ``kvplan limit``)."""
    from kvplan.units import MAX_OPTION_BYTES, parse_size

    raw = env.get(name, "").strip()
    if not raw:
        return None
    if raw == "0":
        return 0
    try:
        return parse_size(raw, name, limit=MAX_OPTION_BYTES)
    except (ValueError, KVPlanError) as exc:
        problems.append(
            error(
                Code.INTEGRATION,
                name,
                f"{name}={raw[:40]!r} is not a byte size ({exc}).",
                f"write e.g. {name}=24GiB or 512MiB"
                + ("" if name in (ENV_MEMORY_LIMIT, ENV_CAPACITY) else f", or {name}=0"),
            )
        )
        return None


def read_elastic_settings(env: Mapping[str, str]) -> tuple[ElasticSettings, list[Diagnostic]]:
    """The elastic settings in ``env`` and every problem with them (``KVP501``)."""
    problems: list[Diagnostic] = []
    limit = _size(env, ENV_MEMORY_LIMIT, problems)
    if limit == 0:
        problems.append(
            error(
                Code.INTEGRATION,
                ENV_MEMORY_LIMIT,
                f"{ENV_MEMORY_LIMIT}=0 leaves no memory for the KV cache.",
                f"give a byte size such as {ENV_MEMORY_LIMIT}=4GiB, or unset it",
            )
        )
    cache_limit = _size(env, ENV_CACHE_LIMIT, problems)
    reserve = _size(env, ENV_RESERVE, problems)
    busy_reserve = _size(env, ENV_BUSY_RESERVE, problems)
    for name, value in (
        (ENV_CACHE_LIMIT, cache_limit),
        (ENV_RESERVE, reserve),
        (ENV_BUSY_RESERVE, busy_reserve),
    ):
        if limit and value is not None and value > limit:  # as `kvplan limit` refuses it
            problems.append(
                error(
                    Code.INTEGRATION,
                    name,
                    f"{name} ({value} bytes) is above {ENV_MEMORY_LIMIT} ({limit} bytes): "
                    "the memory limit bounds everything mapped, cached pages and the reserve "
                    "included.",
                    f"set {name} to at most {ENV_MEMORY_LIMIT}, or raise {ENV_MEMORY_LIMIT}",
                )
            )
    poison, bad_poison = flag(env, ENV_POISON)
    if bad_poison is not None:
        problems.append(bad_poison)
    busy_ahead: bool | None = None
    if env.get(ENV_BUSY_AHEAD, "").strip():
        busy_ahead, bad_ahead = flag(env, ENV_BUSY_AHEAD)
        if bad_ahead is not None:
            problems.append(bad_ahead)
        elif busy_ahead and reserve == 0 and busy_reserve == 0:  # it could map nothing
            problems.append(
                error(
                    Code.INTEGRATION,
                    ENV_BUSY_AHEAD,
                    f"{ENV_BUSY_AHEAD}=1 maps a busy engine's next blocks ahead within "
                    f"{ENV_BUSY_RESERVE} (at least {ENV_RESERVE}), and both are 0: nothing "
                    "could be mapped ahead.",
                    f"unset {ENV_BUSY_RESERVE} (its default: a quarter of the limit), or "
                    f"unset {ENV_BUSY_AHEAD}",
                )
            )
    latency = None
    try:  # read by host-vmm itself when it is created: refused here, before any engine starts
        latency = latency_from(env)
    except KVPlanError as exc:
        problems.extend(exc.diagnostics)
    skip = _map_number(env, ENV_DEBUG_SKIP_MAP, problems)
    fail = _map_number(env, ENV_DEBUG_FAIL_MAP, problems)
    retry = _seconds(env, ENV_MAP_RETRY, MAP_RETRY_SECONDS, MAP_RETRY_MAX, problems)
    capacity, tokens = _capacity(env, problems)
    group = directory_setting(env, ENV_GROUP, problems)
    budget = _size(env, ENV_GROUP_BUDGET, problems)
    guarantee = _size(env, ENV_GROUP_GUARANTEE, problems)
    if group is None:
        for name in (ENV_GROUP_BUDGET, ENV_GROUP_GUARANTEE):
            if env.get(name, "").strip():
                problems.append(
                    error(
                        Code.INTEGRATION,
                        name,
                        f"{name} is set but {ENV_GROUP} is not: there is no group to apply it to.",
                        f"set {ENV_GROUP}=DIR (the group's directory), or unset {name}",
                    )
                )
    settings = ElasticSettings(
        limit, cache_limit, reserve, poison, skip, fail, retry, capacity, tokens,
        group, budget, guarantee, busy_reserve, None if latency is None else latency.name,
        busy_ahead,
    )  # fmt: skip
    return settings, problems


def _capacity(env: Mapping[str, str], problems: list[Diagnostic]) -> tuple[int | None, int | None]:
    """``KVPLAN_CAPACITY``: a byte size, or a number of tokens (``65536t``, ``65536 tokens``)."""
    raw = env.get(ENV_CAPACITY, "").strip()
    if not raw:
        return None, None
    tokens = _TOKENS.fullmatch(raw)
    if tokens:
        if int(tokens.group(1)) > 0:
            return None, int(tokens.group(1))
    else:
        size = _size(env, ENV_CAPACITY, problems)
        if size:
            return size, None
        if size is None:
            return None, None  # _size said why
    problems.append(
        error(
            Code.INTEGRATION,
            ENV_CAPACITY,
            f"{ENV_CAPACITY}={raw[:40]!r} reserves no KV cache.",
            f"give a byte size per rank ({ENV_CAPACITY}=8GiB) or tokens ({ENV_CAPACITY}=65536t)",
        )
    )
    return None, None


def _seconds(
    env: Mapping[str, str], name: str, default: float, most: float, problems: list[Diagnostic]
) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    from kvplan.units import parse_number

    try:
        value = parse_number(raw.removesuffix("s"), name, code="KVP501")
    except KVPlanError:
        value = -1.0
    if 0 <= value <= most:  # also refuses nan and inf
        return value
    problems.append(
        error(
            Code.INTEGRATION,
            name,
            f"{name}={raw[:40]!r} is not a number of seconds between 0 and {most:g}.",
            f"write e.g. {name}=1 or {name}=0.5s, or unset it (default {default:g})",
        )
    )
    return default


def _map_number(env: Mapping[str, str], name: str, problems: list[Diagnostic]) -> int | None:
    """A test-only ``KVPLAN_DEBUG_*`` setting: which map of a worker (1-based) it breaks."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    from kvplan.units import parse_int

    try:
        number = parse_int(raw, name, minimum=1, code="KVP501")
    except KVPlanError:
        number = 0
    if 0 < number < 1 << 31:
        return number
    problems.append(
        error(
            Code.INTEGRATION,
            name,
            f"{name}={raw[:40]!r} is not a positive map number.",
            f"unset {name} (it breaks the cache on purpose, for tests)",
        )
    )
    return None


def elastic_chunk_bytes(backend: str) -> int:
    """The elastic mapping unit of ``backend``: its granularity (host-vmm: the OS page;
    cuda-vmm: 2 MiB), known on the scheduler side without creating the backend."""
    from kvplan.executor.backends import backend_info

    return backend_info(backend).granularity_default


def default_limits(settings: ElasticSettings, reserved: int) -> tuple[int, int, int]:
    """``(limit, cache_limit, reserve)`` in bytes, defaults applied."""
    limit = settings.limit if settings.limit is not None else reserved
    cache = settings.cache_limit if settings.cache_limit is not None else limit // CACHE_LIMIT_SHARE
    reserve = (
        settings.reserve
        if settings.reserve is not None
        else min(limit // RESERVE_SHARE, RESERVE_MAX)
    )
    return limit, cache, reserve


def busy_reserve(settings: ElasticSettings, limit: int) -> int:
    """``KVPLAN_BUSY_RESERVE`` in bytes, its default applied (a quarter of ``limit``, at most
    :data:`BUSY_RESERVE_MAX`)."""
    if settings.busy_reserve is not None:
        return settings.busy_reserve
    return min(limit // BUSY_RESERVE_SHARE, BUSY_RESERVE_MAX)
