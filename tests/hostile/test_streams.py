"""Every command × broken standard streams (closed, or a full disk): the exit status is the
command's own (2 when data could not be written), never a kvplan bug (``KVP019``), never a
traceback, never Python's own exit status for a failed flush (120) or an uncaught exception
(1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile._attacks import Area
from tests.hostile._harness import Outcome, assert_no_bug, spawn

COMMANDS: dict[str, Callable[[Area], list[str]]] = {
    "plan": lambda a: ["plan", str(a.input)],
    "validate-bad": lambda a: ["validate", str(_bad(a))],
    "plan-bad": lambda a: ["plan", str(_bad(a))],
    "show": lambda a: ["show", str(a.plan)],
    "diff": lambda a: ["diff", str(a.plan), str(a.input)],
    "schema": lambda a: ["schema", "plan"],
    "golden-check": lambda a: ["golden", "check", str(a.golden), "--input-only"],
    "top": lambda a: ["top", str(a.dump), "--once"],
    "limit": lambda a: ["limit", str(a.dump), "1GiB"],
}
"""Commands that print data, narration, or a refusal."""

CONDITIONS: dict[str, dict[str, object]] = {
    "stdout-closed": {"close": (1,)},
    "stdout-full": {"stdout_path": "/dev/full"},
    "stderr-closed": {"close": (2,)},
    "stderr-full": {"stderr_path": "/dev/full"},
    "both-closed": {"close": (1, 2)},
}


def _bad(area: Area) -> Path:
    path = area.root / "bad.json"
    path.write_text('{"format": "kvplan.input/1", "kv_cache_config": 3}')
    return path


def _expected(normal: Outcome, condition: str) -> int:
    """What the command must exit with under ``condition``: its own status, or 2 when it had
    data for stdout and stdout is broken."""
    if condition.startswith(("stdout", "both")) and normal.stdout:
        return 2
    return normal.exit_code


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_broken_streams_keep_the_exit_status(tmp_path: Path, command: str) -> None:
    area = Area(tmp_path)
    args = COMMANDS[command](area)
    normal = spawn(args)
    assert_no_bug(normal, command)
    for condition, how in CONDITIONS.items():
        outcome = spawn(args, **how)  # type: ignore[arg-type]
        what = f"{command} with {condition}"
        assert_no_bug(outcome, what)
        assert outcome.exit_code == _expected(normal, condition), (
            f"{what}: exit {outcome.exit_code} (normally {normal.exit_code}); "
            f"stderr: {outcome.stderr[:500]}"
        )
        if condition.startswith("stdout") and normal.stdout:
            coded = [line for line in outcome.stderr.splitlines() if line.startswith("KVP")]
            assert coded and coded[0].startswith("KVP018"), f"{what}: {outcome.stderr[:300]}"
