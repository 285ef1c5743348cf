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
from pathlib import Path
from typing import Any

from kvplan.integrations.vllm import versions
from kvplan.integrations.vllm.elastic import ElasticMode, read_elastic_settings
from kvplan.integrations.vllm.pipeline import EagerMode, Mode
from kvplan.integrations.vllm.pipeline import refusals as refusals
from kvplan.integrations.vllm.pipeline.settings import (
    ENV_PLAN_DIR,
    Settings,
    check_plan_dir,
    prepare_dump_dir,
    read_settings,
)
from kvplan.schemas.errors import Code, Diagnostic, error

GOLDEN_PLAN = "plan.json"
"""The reviewed plan of rank 0 as ``kvplan golden`` names it (see ``pipeline._reviewed``)."""


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
    """The plugin's settings and mode from ``env``, with every problem in any setting: the
    one validation of ``KVPLAN_*`` (the plugin's ``register()`` and ``kvplan doctor`` both
    run it). A malformed elastic setting is refused in eager mode too (it would silently do
    nothing), and ``KVPLAN_PLAN_DIR`` must hold a reviewed plan."""
    settings, problems = read_settings(env, tuple(MODES))
    mode, mode_problems = MODES[settings.mode](env, settings)
    problems = [*problems, *mode_problems]
    if settings.mode != "elastic":
        problems.extend(read_elastic_settings(env)[1])
    if settings.plan_dir is not None and not any(p.location == ENV_PLAN_DIR for p in problems):
        untrusted = check_plan_dir(settings.plan_dir)
        problems.extend(
            [untrusted]
            if untrusted is not None
            else _plan_dir_problems(settings.plan_dir, env.get(ENV_PLAN_DIR, ""))
        )
    return settings, mode, problems


MAX_PLAN_DIR_ENTRIES = 1024
"""Most entries of ``KVPLAN_PLAN_DIR`` looked at for a model's folder of reviewed plans."""


def _holds_plans(folder: Path) -> bool:
    try:
        if (folder / GOLDEN_PLAN).is_file():
            return True
        with os.scandir(folder) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_PLAN_DIR_ENTRIES:
                    return False
                if entry.name.startswith("rank") and entry.name.endswith(".plan.json"):
                    return True
    except (OSError, ValueError):
        return False
    return False


def _plan_dir_problems(plan_dir: Path, raw: str) -> list[Diagnostic]:
    """``KVP504`` unless ``plan_dir`` is a model's folder of reviewed plans or holds one
    (``/proc`` or an empty directory is neither: every worker would refuse to bind)."""
    if _holds_plans(plan_dir):
        return []
    try:
        with os.scandir(plan_dir) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_PLAN_DIR_ENTRIES:
                    break
                if entry.is_dir(follow_symlinks=False) and _holds_plans(Path(entry.path)):
                    return []
    except (OSError, ValueError):
        pass
    return [
        error(
            Code.REVIEWED_PLAN_MISSING,
            ENV_PLAN_DIR,
            f"{ENV_PLAN_DIR}={raw.strip()[:80]!r} holds no reviewed plan (no {GOLDEN_PLAN} "
            "or rank<N>.plan.json in it or in a model's folder below it): every worker would "
            "refuse to bind.",
            f"point {ENV_PLAN_DIR} at a directory `kvplan golden add` wrote, or unset it",
        )
    ]


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
            problems.append(
                refusals.backend_unavailable(settings.backend, why, _instead(settings, mode))
            )
        if settings.dump_dir is not None:
            bad = prepare_dump_dir(settings.dump_dir)
            problems.extend([bad] if bad else [])
    if not problems and settings.enabled:  # a group member refused before vLLM loads
        problems.extend(_group_refusals(mode, settings))
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


def _instead(settings: Settings, mode: Mode) -> list[str] | None:
    """The backends that would serve ``mode`` here, for a refusal's fix (``None``: eager
    mode's usual advice, torch)."""
    from kvplan.executor.backends import backend_class, backend_info, backend_names

    if getattr(mode, "name", "eager") != "elastic":
        return None
    return [
        name
        for name in backend_names(plugin=True)
        if name != settings.backend
        and backend_info(name).elastic
        and backend_class(name).available() is None
    ]


def _group_refusals(mode: Mode, settings: Settings) -> list[Diagnostic]:
    """What an elastic engine's group join would refuse, found before vLLM loads the model
    (``elastic._early``): a group directory that cannot be used (``KVP540``, ``KVP541``), no
    ledger and no budget (``KVP544``), an explicit guarantee that does not fit (``KVP542``)."""
    from kvplan.integrations.vllm.elastic import ElasticMode, group_refusals

    if not isinstance(mode, ElasticMode):
        return []
    return group_refusals(mode.settings, settings.dump_dir)
