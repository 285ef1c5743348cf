"""Semantic diff of two plans, keyed by pool and layer name (not by list position).

Text and markdown are written for a person at 100 columns: the prefix and suffix every
layer name shares are said once above the changes, each layer by the part that differs, and
shapes and strides as one word (``786432×1×32×512``). JSON keeps every name and value whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kvplan.planner.names import LayerNames, dims
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

    def render(self, names: LayerNames | None = None) -> str:
        key = self.short_key(names)
        where = f"{self.section}[{key}]" if key else self.section
        if self.change == "changed":
            old, new = self.value(self.old, names), self.value(self.new, names)
            return f"~ {where}.{self.field}: {old} -> {new}"
        sign = "+" if self.change == "added" else "-"
        return f"{sign} {where}"

    def short_key(self, names: LayerNames | None) -> str:
        layered = names is not None and self.section in _LAYERED
        return names.short(self.key) if layered and names is not None else self.key

    def value(self, value: Any, names: LayerNames | None) -> str:
        if names is not None and self.field == "target" and isinstance(value, str):
            return names.short(value)
        if names is not None and isinstance(value, list) and all(type(v) is int for v in value):
            return dims(value) if value else "[]"
        return _fmt(value)


_LAYERED = ("views", "aliases")
"""Sections keyed by layer name."""


def _fmt(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


@dataclass
class PlanDiff:
    changes: list[Change] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.changes

    def names(self) -> LayerNames:
        """The layer names the changes key (their shared prefix and suffix said once)."""
        layers = sorted({c.key for c in self.changes if c.section in _LAYERED and c.key})
        return LayerNames(layers if len(layers) > 1 else [])

    def to_text(self) -> str:
        if self.same:
            return "plans are identical\n"
        names = self.names()
        legend = f"layer = {names.pattern}\n" if names.pattern else ""
        return legend + "".join(c.render(names) + "\n" for c in self.changes)

    def to_json(self) -> str:
        return (
            json.dumps({"same": self.same, "changes": [asdict(c) for c in self.changes]}, indent=2)
            + "\n"
        )

    def to_markdown(self) -> str:
        if self.same:
            return "**No drift**: the plans are identical.\n"
        names = self.names()
        legend = f" (layer = `{names.pattern}`)" if names.pattern else ""
        lines = [
            f"**{len(self.changes)} change(s)**{legend}",
            "",
            "| section | key | change | field | old | new |",
            "|---|---|---|---|---|---|",
        ]
        for c in self.changes:
            shown = [c.value(v, names) if c.change == "changed" else None for v in (c.old, c.new)]
            old, new = (f"`{v}`" if v is not None else "" for v in shown)
            key = c.short_key(names)
            lines.append(f"| {c.section} | `{key}` | {c.change} | {c.field} | {old} | {new} |")
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
