"""How an engine venv's build fills the shared wheelhouse (``harness.engine.harness``): a
release whose dependencies are already there downloads its own wheel alone, not everything
again (pip resolves every dependency for ~50 s of CPU even when all wheels are present)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine import harness

RELEASE = harness.RELEASES["0.30"]
PACKAGES = [RELEASE.package, "pytest>=8"]
DEPENDENCIES = {RELEASE.package: {"torch"}, "pytest>=8": {"pluggy"}}


class Wheelhouse:
    """Installs succeed when every package and dependency is there; downloads add them."""

    def __init__(self, *present: str) -> None:
        self.present = set(present)
        self.downloads: list[list[str]] = []

    def install(self) -> None:
        needed = set(PACKAGES).union(*DEPENDENCIES.values())
        if not needed <= self.present:
            raise harness.EngineEnvError(f"missing {sorted(needed - self.present)}")

    def download(self, packages: list[str], what: str) -> None:
        self.downloads.append(packages)
        named = [p for p in packages if not p.startswith("--")]
        self.present.update(named)
        if "--no-deps" not in packages:
            self.present.update(*(DEPENDENCIES[p] for p in named))


def _fill(house: Wheelhouse, tmp_path: Path) -> list[str]:
    said: list[str] = []
    harness._install_from_wheelhouse(
        house.install, house.download, RELEASE, PACKAGES, tmp_path / "wheels", said.append
    )
    return said


def test_a_full_wheelhouse_downloads_nothing(tmp_path: Path) -> None:
    house = Wheelhouse(*PACKAGES, "torch", "pluggy")
    assert _fill(house, tmp_path) == [] and house.downloads == []


def test_another_releases_dependencies_are_not_resolved_again(tmp_path: Path) -> None:
    house = Wheelhouse("pytest>=8", "torch", "pluggy")  # another release built before
    said = _fill(house, tmp_path)
    assert house.downloads == [["--no-deps", RELEASE.package]]
    assert said == [f"engine venv: 0.30: {tmp_path / 'wheels'} lacks wheels: downloading them"]


def test_a_cold_wheelhouse_gets_everything(tmp_path: Path) -> None:
    house = Wheelhouse()
    said = _fill(house, tmp_path)
    assert house.downloads == [["--no-deps", RELEASE.package], PACKAGES]
    assert "lacks dependencies" in said[-1]
    assert (tmp_path / "wheels").is_dir()


def test_a_wheelhouse_that_cannot_be_filled_fails_the_build(tmp_path: Path) -> None:
    house = Wheelhouse()
    house.download = lambda packages, what: None  # type: ignore[method-assign]
    with pytest.raises(harness.EngineEnvError, match="missing"):
        _fill(house, tmp_path)
