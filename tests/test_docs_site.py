"""The documentation site (``mkdocs.yml``, ``docs/``) builds in strict mode, and strict mode
really fails on a broken link or anchor: the suite is where the docs' links are checked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    config = str(root / "mkdocs.yml")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def copy_site(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", root / "docs")
    return root


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    proc = build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("index.html", "guides/colocation/index.html", "reference/settings/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    performance = (tmp_path / "site" / "performance" / "index.html").read_text()
    assert 'src="../img/colocation.svg"' in performance  # the benchmark's figure, embedded
    assert (tmp_path / "site" / "img" / "colocation.svg").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    root = copy_site(tmp_path)
    with (root / "docs" / "guides" / "serve.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    proc = build(root, tmp_path / "site")
    out = proc.stdout + proc.stderr
    print(out)  # the demonstration: pytest -s shows mkdocs' words
    assert proc.returncode != 0
    assert "no-such-page.md" in out and "Aborted" in out


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    root = copy_site(tmp_path)
    with (root / "docs" / "guides" / "serve.md").open("a") as page:
        page.write("\nSee [sizes](../cli.md#no-such-heading).\n")
    proc = build(root, tmp_path / "site")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "no-such-heading" in out and "Aborted" in out
