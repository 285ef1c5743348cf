"""Every refusal of the vLLM plugin's pipeline, worded in one place (a mode words its own:
elastic serving's are in ``kvplan.integrations.vllm.elastic``).

Each function returns the :class:`KVPlanError` (or :class:`Diagnostic`) to raise; none has a
side effect. A refusal at start-up (``register``) leads with ``KVP501`` and lists each
problem; a refusal while binding names the worker, its runner and phase, the vLLM version and
the first cause, then lists every diagnostic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvplan.integrations.vllm.pipeline.settings import ENV_BACKEND, ENV_ENABLE, ENV_PLAN_DIR
from kvplan.schemas.errors import Code, Diagnostic, Findings, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.integrations.vllm.versions import RefusedReleases, Resolved

DISABLE_HINT = f"unset {ENV_ENABLE} to start vLLM without kvplan"


@dataclass(frozen=True)
class Where:
    """Which allocation a refusal is about."""

    label: str
    """``rank<N>`` (``rank?`` when the rank could not be read)."""
    runner: str
    phase: str
    site: str


# -- start-up (register) ------------------------------------------------------------------


def _cause(problem: Diagnostic) -> str:
    """A problem named inside a lead: code, place and what is wrong (its fix stays its own)."""
    at = f" at {problem.location}" if problem.location else ""
    return f"{problem.code.value}{at}: {problem.message.rstrip('.')}"


def _fix(problem: Diagnostic) -> str:
    """A problem's fix without its own "or unset KVPLAN_ENABLE" (the lead ends with it)."""
    text = problem.hint.rstrip(".")
    for tail in (f", or {DISABLE_HINT}", f"; {DISABLE_HINT}", f" or {ENV_ENABLE}"):
        text = text.removesuffix(tail)
    return re.sub(rf",? or unset {ENV_ENABLE}$", "", text)


def plugin_refused(version: str, problems: list[Diagnostic]) -> KVPlanError:
    """``KVP501`` leading every start-up problem: one problem's fix, or "each below"."""
    count = f"{len(problems)} problems: " if len(problems) > 1 else ""
    reasons = " | ".join(_cause(p) for p in problems)
    fix = (
        _fix(problems[0])
        if len(problems) == 1 and problems[0].hint
        else "fix each problem listed after this one"
    )
    lead = error(
        Code.INTEGRATION,
        "kvplan.integrations.vllm.plugin",
        f"kvplan's vLLM plugin refused to start (vLLM {version}): {count}{reasons}",
        f"{fix}; or {DISABLE_HINT}",
    )
    return KVPlanError([lead, *problems], led=True)


def internal(exc: BaseException, where: str) -> Diagnostic:
    """Something kvplan did not expect while checking its settings: still a ``KVP501``."""
    return error(
        Code.INTEGRATION,
        where,
        f"{type(exc).__name__} while checking kvplan's settings: {str(exc)[:300]}",
        "please report this with your KVPLAN_* settings",
    )


def led(refusal: KVPlanError, version: str) -> KVPlanError:
    """``refusal`` as every refusal of a running engine reads: led by ``KVP501`` naming its
    first cause and ending with how to start vLLM without kvplan (unchanged if it already
    does, as :func:`bind_refused`'s do)."""
    diagnostics = refusal.diagnostics
    first = diagnostics[0] if diagnostics else None
    if first is not None and first.code is Code.INTEGRATION and DISABLE_HINT in (first.hint or ""):
        return refusal
    cause = _cause(first) if first else "no reason given"
    fix = f"{_fix(first)}; or {DISABLE_HINT}" if first and first.hint else DISABLE_HINT
    lead = error(
        Code.INTEGRATION,
        "kvplan.integrations.vllm.plugin",
        f"kvplan refused to run this vLLM engine (vLLM {version}): {cause}",
        fix,
    )
    return KVPlanError([lead, *diagnostics], led=True)


def unsupported_version(
    version: str, supported: str, known: RefusedReleases | None
) -> list[Diagnostic]:
    """``KVP501``: no adapter for ``version``; a known release also names each difference."""
    if known is None or not known.differences_of(version):
        return [
            error(
                Code.INTEGRATION,
                "vllm.__version__",
                f"kvplan's vLLM plugin does not support vLLM {version}; it supports vLLM "
                f"{supported}.",
                "install a supported vLLM (pip install 'kvplan[vllm]'), or unset KVPLAN_ENABLE",
            )
        ]
    return [
        error(
            Code.INTEGRATION,
            d.function,
            f"kvplan's vLLM plugin does not support vLLM {version} (it supports {supported}): "
            f"{d.function} differs from what kvplan was written for: {d.difference}.",
            "install a supported vLLM (pip install 'kvplan[vllm]'), or unset KVPLAN_ENABLE",
        )
        for d in known.differences_of(version)
    ]


def target_unusable(version: str, resolved: Resolved) -> Diagnostic:
    name = resolved.target.name
    return error(
        Code.INTEGRATION,
        name,
        f"vLLM {version}: patch target {name} is unusable: {resolved.problem}.",
        "this vLLM build differs from the release kvplan supports; see docs/integration.md "
        "(adding a vLLM release), or unset KVPLAN_ENABLE",
    )


def foreign_wrapper(version: str, resolved: Resolved) -> Diagnostic:
    """``KVP506``: another plugin wrapped a function kvplan would wrap (kvplan's wrapper would
    replace theirs without calling it)."""
    name, foreign = resolved.target.name, resolved.foreign
    who = f"{foreign.name} from {foreign.module}" if foreign else "another wrapper"
    return error(
        Code.FOREIGN_WRAPPER,
        name,
        f"vLLM {version}: {name} is already wrapped by {who} (another vLLM plugin?); kvplan's "
        "wrapper replaces the function it wraps without calling it, so that plugin's code "
        "would silently never run.",
        "run kvplan without that plugin (VLLM_PLUGINS lists the plugins vLLM loads), or "
        "without kvplan: " + DISABLE_HINT,
    )


def backend_unavailable(backend: str, why: str, instead: list[str] | None = None) -> Diagnostic:
    """``instead``: the backends that would serve the mode asked for here (default: torch,
    which serves eager mode on any device)."""
    others = ["torch (any device)"] if instead is None else instead
    fix = (
        f"set {ENV_BACKEND}={' or '.join(others)}, or install what {backend} needs"
        if others
        else f"install what {backend} needs (no other backend that serves this mode is "
        "available here)"
    )
    return error(
        Code.INTEGRATION, ENV_BACKEND, f"the {backend} backend is unavailable: {why}.", fix
    )


def site_unwrapped(name: str) -> Diagnostic:
    return error(
        Code.INTEGRATION,
        name,
        f"{name} is no longer kvplan's wrapper; calls through it bypass kvplan.",
        "something re-patched vLLM after kvplan; load kvplan's plugin last",
    )


# -- while binding ------------------------------------------------------------------------


def bind_refused(diagnostics: list[Diagnostic], where: Where, version: str) -> KVPlanError:
    errors = Findings(diagnostics).errors or diagnostics
    first = errors[0] if errors else None
    at = f" at {first.location}" if first and first.location else ""
    cause = f"{first.code.value}{at}: {first.message}" if first else "no reason given"
    lead = error(
        Code.INTEGRATION,
        where.site,
        f"kvplan refused to bind the KV cache of {where.label} ({where.runner} runner, "
        f"{where.phase}, vLLM {version}): {cause}",
        DISABLE_HINT,
    )
    return KVPlanError([lead, *diagnostics], led=True)


def unexpected(exc: Exception, where: Where, version: str) -> KVPlanError:
    """A refusal for anything kvplan or torch raised while planning or binding."""
    if isinstance(exc, KVPlanError):
        return bind_refused(exc.diagnostics, where, version)
    problem = error(
        Code.INTEGRATION,
        where.site,
        f"{type(exc).__name__} while planning or binding: {exc}",
        "please report this with the files KVPLAN_DUMP_DIR writes",
    )
    return bind_refused([problem], where, version)


def rank_unknown(exc: BaseException) -> KVPlanError:
    return KVPlanError(
        error(
            Code.RANK_UNKNOWN,
            "torch.distributed.get_rank",
            f"this worker's rank cannot be read ({type(exc).__name__}: {exc}); kvplan will not "
            "guess it, since dumps and reviewed plans are per rank.",
            "initialise torch.distributed before the KV cache is allocated (vLLM's workers "
            f"do), or {DISABLE_HINT}",
        )
    )


def unknown_sharers(site: str, missing: list[str]) -> KVPlanError:
    return KVPlanError(
        error(
            Code.INTEGRATION,
            site,
            f"{len(missing)} layer(s) sit in a KV cache group but own no tensor, and kvplan "
            f"cannot tell whose cache they read: {', '.join(missing[:4])}.",
            "call allocate_kv_cache through a vLLM runner (which knows its sharing map), or "
            "inside set_current_vllm_config",
        )
    )


def no_sharing_map(site: str, runner: str, version: str) -> KVPlanError:
    return KVPlanError(
        error(
            Code.INTEGRATION,
            site,
            f"the {runner} runner has no shared_kv_cache_layers map (vLLM {version}).",
            DISABLE_HINT,
        )
    )


def hisparse(site: str, version: str) -> KVPlanError:
    return KVPlanError(
        error(
            Code.INTEGRATION,
            site,
            "kvplan's vLLM plugin does not support HiSparse KV caches "
            f"(attention_config.hisparse_config is set; vLLM {version}).",
            DISABLE_HINT,
        )
    )


def bypassed(site: str, runner: str, unpatched: list[str]) -> KVPlanError:
    detail = f" Call sites no longer wrapped: {', '.join(unpatched)}." if unpatched else ""
    return KVPlanError(
        error(
            Code.INTEGRATION,
            site,
            f"vLLM's {runner} runner finished {site} without allocating through kvplan: the KV "
            f"cache came from a path kvplan does not wrap.{detail}",
            "run `kvplan doctor`; " + DISABLE_HINT,
        )
    )


def mismatch(what: str, problems: list[Diagnostic]) -> KVPlanError:
    return KVPlanError(
        [
            error(
                Code.INTEGRATION,
                "verify",
                f"{what} does not match the plan ({len(problems)} difference(s)).",
                "kvplan's model of this vLLM is wrong for this config; please report it",
            ),
            *Findings(problems).as_errors(),
        ]
    )


def pooled_allocation(backend: str, able: list[str]) -> KVPlanError:
    return KVPlanError(
        error(
            Code.INTEGRATION,
            "kv_cache_allocation_context",
            "vLLM asked to place the KV cache in a memory pool (sleep mode's CuMem allocator "
            f"or a KV connector's pool); the {backend} backend maps its own memory outside any "
            "pool.",
            f"set {ENV_BACKEND} to {' or '.join(able) or 'a backend'} (allocates inside the "
            "pool), or turn off sleep mode / the connector's memory pool",
        )
    )


def device_not_supported(
    backend: str, device: object, devices: tuple[str, ...], able: list[str]
) -> KVPlanError:
    return KVPlanError(
        error(
            Code.INTEGRATION,
            ENV_BACKEND,
            f"the {backend} backend binds on {' or '.join(devices)} devices only, but this "
            f"worker's device is {device}.",
            f"set {ENV_BACKEND} to one of: {', '.join(able)}",
        )
    )


def dump_unwritable(path: object, exc: OSError) -> KVPlanError:
    return KVPlanError(
        error(
            Code.INTEGRATION,
            "KVPLAN_DUMP_DIR",
            f"cannot write {path}: {exc.strerror or exc}.",
            "point KVPLAN_DUMP_DIR at a writable directory, or unset it",
        )
    )


# -- reviewed plans (KVPLAN_PLAN_DIR) -----------------------------------------------------


def reviewed_plan_missing(path: object, why: str) -> KVPlanError:
    return KVPlanError(
        error(
            Code.REVIEWED_PLAN_MISSING,
            ENV_PLAN_DIR,
            f"no reviewed plan for this worker: {path} {why}.",
            "write it with `kvplan golden add DIR MODEL` (rank 0) or copy the worker's "
            "KVPLAN_DUMP_DIR plan there after review (docs/integration.md), or unset "
            f"{ENV_PLAN_DIR}",
        )
    )


def reviewed_plan_differs(path: object, label: str, markdown: str, count: int) -> KVPlanError:
    """``KVP503``. A diagnostic is a few lines at most, so the whole diff (``kvplan diff``
    markdown) goes to vLLM's log, each line escaped; the diagnostic names the first changes."""
    import logging

    from kvplan.schemas.errors import printable

    lines = [printable(line) for line in markdown.rstrip().splitlines()]
    logging.getLogger("vllm.kvplan").error(
        "kvplan: the live plan of %s differs from the reviewed plan %s (reviewed -> live):\n%s",
        label,
        printable(str(path)),
        "\n".join(lines),
    )
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| section")]
    first = "; ".join(
        " ".join(cell.strip() for cell in row.strip("|").split("|")) for row in rows[:3]
    )
    more = f" (and {count - 3} more)" if count > 3 else ""
    return KVPlanError(
        error(
            Code.REVIEWED_PLAN_DIFFERS,
            str(path),
            f"the live plan of {label} differs from the reviewed plan ({count} change(s), "
            f"reviewed -> live; the whole diff is in the log): {first}{more}",
            "review the change (`kvplan diff`) and update the reviewed plan, or start vLLM "
            f"with the reviewed settings, or unset {ENV_PLAN_DIR}",
        )
    )


def no_handler(target: str, handler: str | None, mode: str) -> Diagnostic:
    """A patched target whose handler no room defines (a kvplan bug, refused at start-up)."""
    return error(
        Code.INTEGRATION,
        target,
        f"kvplan's adapter names handler {handler!r} for {target}, which no room of the "
        f"plugin defines in {mode} mode.",
        "please report this; " + DISABLE_HINT,
    )


EXTENSIBLE_FLAG = "--enable-extensible-kv-cache"
"""vLLM 0.34's switch for its own extensible KV cache (``enable_extensible_kv_cache``)."""


def extensible_requested(mode: str, version: str) -> KVPlanError:
    """``KVP508``: vLLM's extensible KV cache asked for explicitly while kvplan binds."""
    why = (
        "two managers of one physical memory: kvplan's elastic mode maps and unmaps the KV "
        "cache's pages itself"
        if mode == "elastic"
        else "vLLM would reserve and map the KV cache's memory itself, which kvplan binds"
    )
    return KVPlanError(
        error(
            Code.EXTENSIBLE_KV_CACHE,
            "cache_config.enable_extensible_kv_cache",
            f"vLLM {version}'s extensible KV cache was asked for ({EXTENSIBLE_FLAG}) with "
            f"KVPLAN_MODE={mode}: {why}.",
            f"drop {EXTENSIBLE_FLAG} (with kvplan on, vLLM's extensible KV cache is turned "
            f"off at start-up and a line says so), or {DISABLE_HINT}",
        )
    )


def extensible_in_use(site: str, what: str, version: str) -> KVPlanError:
    """``KVP508``: vLLM's extensible KV cache reached an allocation kvplan binds."""
    return KVPlanError(
        error(
            Code.EXTENSIBLE_KV_CACHE,
            site,
            f"vLLM {version}'s extensible KV cache is on ({what}), but kvplan binds this KV "
            "cache: the engine would have two managers of its memory.",
            f"start vLLM with --no-enable-extensible-kv-cache (kvplan turns it off itself "
            f"unless something turned it on after kvplan's start-up check), or {DISABLE_HINT}",
        )
    )
