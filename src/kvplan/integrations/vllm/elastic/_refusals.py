"""Every refusal of elastic serving, worded in one place (``KVP530``–``KVP533``)."""

from __future__ import annotations

from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error


def elastic_unsupported(why: str) -> Diagnostic:
    """``KVP530``: elastic serving cannot run here (raise it in a :class:`KVPlanError`)."""
    return error(
        Code.ELASTIC_UNSUPPORTED,
        "KVPLAN_MODE",
        f"kvplan cannot serve this engine elastically: {why}.",
        "set KVPLAN_MODE=eager (docs/elastic.md says what elastic mode supports)",
    )


def elastic_geometry(label: str, scheduler: str, worker: str) -> KVPlanError:
    """``KVP531``: the scheduler's page geometry is not this worker's."""
    return KVPlanError(
        error(
            Code.ELASTIC_GEOMETRY,
            f"{label}.elastic",
            f"the scheduler planned block pages with fingerprint {scheduler} but {label} "
            f"bound {worker}; the chunks it would map are not the ones the scheduler counts.",
            "set KVPLAN_MODE=eager and report the model and settings (docs/elastic.md)",
        )
    )


def first_message(exc: KVPlanError) -> str:
    """What ``exc`` says first (its first diagnostic's message), for one-line reports."""
    return exc.diagnostics[0].message if exc.diagnostics else str(exc)


def elastic_map_failed(label: str, blocks: int, exc: KVPlanError, why: str) -> KVPlanError:
    """``KVP532``: backing a step's blocks failed (the step's maps were rolled back) and the
    failure cannot be turned into running out of blocks (``why``)."""
    first = first_message(exc)
    return KVPlanError(
        [
            error(
                Code.ELASTIC_MAP_FAILED,
                f"{label}.elastic",
                f"{label} could not back the {blocks} blocks of a step; every map of the step "
                f"was rolled back and the step is refused, since {why} (no block runs "
                f"unbacked): {first}",
                "lower KVPLAN_MEMORY_LIMIT below the memory this device really has free",
            ),
            *exc.diagnostics,
        ]
    )


def elastic_limit_too_small(limit: int, floor: int) -> KVPlanError:
    """``KVP533``: the memory limit cannot hold the null block and one longest request."""
    return KVPlanError(
        error(
            Code.ELASTIC_LIMIT_TOO_SMALL,
            "KVPLAN_MEMORY_LIMIT",
            f"the elastic memory limit of {limit} bytes cannot back vLLM's null block and one "
            f"request of max_model_len tokens ({floor} bytes); that request would wait forever.",
            f"set KVPLAN_MEMORY_LIMIT to at least {floor} bytes, or lower max_model_len",
        )
    )
