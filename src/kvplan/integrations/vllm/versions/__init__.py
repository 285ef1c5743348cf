"""vLLM version adapters: the one place that decides what kvplan does on which vLLM release.

Every module of this package (not starting with ``_``) describes one vLLM version family:
``ADAPTER`` (a :class:`VersionAdapter` for releases kvplan supports) and/or ``REFUSED`` (a
:class:`RefusedReleases` for releases kvplan knows and refuses, with the differences why).
They are discovered, not listed: adding a vLLM release is one new module (plus its fixtures
and a test run). Importing this package imports neither vLLM nor torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from kvplan.integrations.vllm.versions._adapter import (
    ALLOCATE,
    CONFIG,
    HISPARSE,
    PLACEMENT,
    READ,
    RUNNER,
    SHARED_BY,
    STEP,
    TENSORS,
    V1,
    V2,
    Difference,
    EngineCorePlanning,
    RefusedReleases,
    Resolved,
    Target,
    VersionAdapter,
    resolve,
    unwrap,
    version_key,
)

__all__ = [
    "ALLOCATE",
    "CONFIG",
    "HISPARSE",
    "PLACEMENT",
    "READ",
    "RUNNER",
    "SHARED_BY",
    "STEP",
    "TENSORS",
    "V1",
    "V2",
    "Difference",
    "EngineCorePlanning",
    "RefusedReleases",
    "Resolved",
    "Target",
    "VersionAdapter",
    "adapter_for",
    "all_adapters",
    "refused_for",
    "resolve",
    "supported_range",
    "supported_releases",
    "unwrap",
    "version_key",
]


def _release_order(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


@cache
def _discover() -> tuple[tuple[VersionAdapter, ...], tuple[RefusedReleases, ...]]:
    adapters: list[VersionAdapter] = []
    refused: list[RefusedReleases] = []
    owner: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        adapter = getattr(module, "ADAPTER", None)
        refusal = getattr(module, "REFUSED", None)
        if adapter is None and refusal is None:
            raise RuntimeError(f"{module.__name__} declares neither ADAPTER nor REFUSED")
        for entry in (adapter, refusal):
            for release in getattr(entry, "releases", ()):
                if release in owner:
                    raise RuntimeError(
                        f"vLLM {release} is claimed by both {owner[release]} and {module.__name__}"
                    )
                owner[release] = module.__name__
        if adapter is not None:
            adapters.append(adapter)
        if refusal is not None:
            refused.append(refusal)
    adapters.sort(key=lambda a: max(_release_order(r) for r in a.releases))
    return tuple(adapters), tuple(refused)


def all_adapters() -> list[VersionAdapter]:
    """Every supported version family, oldest first (discovered from this package)."""
    return list(_discover()[0])


def adapter_for(version: str) -> VersionAdapter | None:
    """The adapter of vLLM ``version`` (``0.33.0``, ``0.32.1rc1``...), ``None`` if unsupported."""
    key = version_key(version)
    return next((a for a in _discover()[0] if key in a.releases), None)


def refused_for(version: str) -> RefusedReleases | None:
    """What kvplan knows about an unsupported release it refuses (``None``: never looked at)."""
    key = version_key(version)
    return next((r for r in _discover()[1] if key in r.releases), None)


def supported_releases() -> list[str]:
    """Every supported ``major.minor``, oldest first."""
    return sorted({r for a in _discover()[0] for r in a.releases}, key=_release_order)


def supported_range() -> str:
    """The supported releases as ranges, e.g. ``0.32–0.33`` (gaps: ``0.29, 0.32–0.33``)."""
    runs: list[list[str]] = []
    for release in supported_releases():
        major, minor = _release_order(release)[:2]
        if runs:
            last_major, last_minor = _release_order(runs[-1][-1])[:2]
            if (major, minor) == (last_major, last_minor + 1):
                runs[-1].append(release)
                continue
        runs.append([release])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}–{run[-1]}" for run in runs)
