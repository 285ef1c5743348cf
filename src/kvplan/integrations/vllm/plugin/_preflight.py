"""Everything the plugin checks before it wraps anything, in one place: the plugin runs it at
``register()`` (any problem refuses with ``KVP501``), ``kvplan doctor`` runs the same and reports.

The modes are composed here: the pipeline's :class:`~kvplan.integrations.vllm.pipeline.
EagerMode` and elastic serving's :class:`~kvplan.integrations.vllm.elastic.ElasticMode`, each
reading its own settings. ``KVPLAN_MODE`` is decided once; the :class:`Preflight` carries the
chosen mode object to the runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvplan.integrations.vllm import versions
from kvplan.integrations.vllm.elastic import ElasticMode
from kvplan.integrations.vllm.pipeline import EagerMode, Mode
from kvplan.integrations.vllm.pipeline import refusals as refusals
from kvplan.integrations.vllm.pipeline.settings import Settings, prepare_dump_dir, read_settings
from kvplan.schemas.errors import Diagnostic


def _eager(env: Mapping[str, str], settings: Settings) -> tuple[Mode, list[Diagnostic]]:
    return EagerMode(), []


MODES: dict[str, Callable[[Mapping[str, str], Settings], tuple[Mode, list[Diagnostic]]]] = {
    "eager": _eager,
    "elastic": ElasticMode.from_environment,
}
"""``KVPLAN_MODE`` → how that mode is made from the environment (it reads its own settings)."""


@dataclass
class Preflight:
    """The settings, the mode, the release's adapter and its resolved targets, and every
    problem found (the plugin starts only when there is none)."""

    settings: Settings
    mode: Mode
    version: str | None
    adapter: versions.VersionAdapter | None = None
    resolved: list[versions.Resolved] = field(default_factory=list)
    problems: list[Diagnostic] = field(default_factory=list)

    def settings_dict(self) -> dict[str, Any]:
        out = self.settings.as_dict()
        described = self.mode.describe()
        if described:
            out[self.mode.name] = described
        return out


def read_mode(env: Mapping[str, str]) -> tuple[Settings, Mode, list[Diagnostic]]:
    """The plugin's settings and mode from ``env``, with every problem in either."""
    settings, problems = read_settings(env, tuple(MODES))
    mode, mode_problems = MODES[settings.mode](env, settings)
    return settings, mode, [*problems, *mode_problems]


def preflight(
    environ: Mapping[str, str] | None = None, vllm_version: str | None = None
) -> Preflight:
    """Every check of :func:`~kvplan.integrations.vllm.plugin.register`, none of its effects
    beyond creating ``KVPLAN_DUMP_DIR`` (``vllm_version`` ``None``: vLLM is not importable,
    the release checks are left out)."""
    from kvplan.executor.backends import backend_class

    env = os.environ if environ is None else environ
    settings, mode, problems = read_mode(env)
    found = Preflight(settings, mode, vllm_version, problems=problems)
    if not problems:
        why = backend_class(settings.backend).available()
        if why is not None:
            problems.append(refusals.backend_unavailable(settings.backend, why))
        if settings.dump_dir is not None:
            bad = prepare_dump_dir(settings.dump_dir)
            problems.extend([bad] if bad else [])
    if vllm_version is None:
        return found
    adapter = versions.adapter_for(vllm_version)
    found.adapter = adapter
    if adapter is None:
        problems.extend(
            refusals.unsupported_version(
                vllm_version, versions.supported_range(), versions.refused_for(vllm_version)
            )
        )
        return found
    problems.extend(mode.check(adapter, vllm_version))
    found.resolved = [versions.resolve(t) for t in adapter.targets if mode.wraps(t)]
    problems.extend(
        refusals.foreign_wrapper(vllm_version, r)
        if r.foreign
        else refusals.target_unusable(vllm_version, r)
        for r in found.resolved
        if not r.ok
    )
    return found
