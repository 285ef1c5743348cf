"""Semantic diff of two plans, keyed by pool and layer name (not by list position)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kvplan.schemas.canonical import to_data
from kvplan.schemas.plan import BindingPlan

ChangeKind = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class Change:
    """One difference: ``section`` (source, pools, views, aliases, summary), key, field."""

    section: str
    key: str
    change: ChangeKind
    field: str = ""
    old: Any = None
    new: Any = None

    def render(self) -> str:
        where = f"{self.section}[{self.key}]" if self.key else self.section
        if self.change == "changed":
            return f"~ {where}.{self.field}: {_fmt(self.old)} -> {_fmt(self.new)}"
        sign = "+" if self.change == "added" else "-"
        return f"{sign} {where}"


def _fmt(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


@dataclass
class PlanDiff:
    changes: list[Change] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.changes

    def to_text(self) -> str:
        if self.same:
            return "plans are identical\n"
        return "".join(c.render() + "\n" for c in self.changes)

    def to_json(self) -> str:
        return (
            json.dumps({"same": self.same, "changes": [asdict(c) for c in self.changes]}, indent=2)
            + "\n"
        )

    def to_markdown(self) -> str:
        if self.same:
            return "**No drift**: the plans are identical.\n"
        lines = [
            f"**{len(self.changes)} change(s)**",
            "",
            "| section | key | change | field | old | new |",
            "|---|---|---|---|---|---|",
        ]
        for c in self.changes:
            old = "" if c.old is None else f"`{_fmt(c.old)}`"
            new = "" if c.new is None else f"`{_fmt(c.new)}`"
            lines.append(f"| {c.section} | `{c.key}` | {c.change} | {c.field} | {old} | {new} |")
        return "\n".join(lines) + "\n"


def _keyed(items: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {str(item[key]): item for item in items}


def _compare(section: str, key: str, a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    out = []
    for name in a.keys() | b.keys():
        if a.get(name) != b.get(name):
            out.append(Change(section, key, "changed", name, a.get(name), b.get(name)))
    return sorted(out, key=lambda c: c.field)


def diff_plans(a: BindingPlan, b: BindingPlan) -> PlanDiff:
    """Field-level differences from ``a`` to ``b``; the fingerprint is compared last."""
    da, db = to_data(a), to_data(b)
    changes: list[Change] = []
    changes += _compare("source", "", da["source"], db["source"])
    for section, key in (("pools", "name"), ("views", "layer"), ("aliases", "layer")):
        ka, kb = _keyed(da[section], key), _keyed(db[section], key)
        for name in ka:
            if name not in kb:
                changes.append(Change(section, name, "removed", old=ka[name]))
            else:
                changes += _compare(section, name, ka[name], kb[name])
        changes += [Change(section, n, "added", new=kb[n]) for n in kb if n not in ka]
    changes += _compare("summary", "", da["summary"], db["summary"])
    if not changes and da["fingerprint"] != db["fingerprint"]:
        changes.append(
            Change("input", "", "changed", "fingerprint", da["fingerprint"], db["fingerprint"])
        )
    return PlanDiff(changes)
