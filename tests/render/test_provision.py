"""How the suite provisions Chromium on a fresh machine (apt-get faked; nothing installed)."""

from __future__ import annotations

import subprocess

import pytest

from tests.render import _browser as browser


def _fake(
    monkeypatch: pytest.MonkeyPatch, results: dict[str, list[int]], root: bool = True
) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []
    installed: list[bool] = []

    def apt(*args: str) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        code = results[args[0]].pop(0)
        if args[0] == "install" and code == 0:
            installed.append(True)
        return subprocess.CompletedProcess(["apt-get", *args], code, "", f"E: {args[0]} {code}")

    monkeypatch.setattr(browser, "_apt", apt)
    monkeypatch.setattr(
        browser, "find_chromium", lambda: "/usr/bin/chromium" if installed else None
    )
    monkeypatch.setattr(browser.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0 if root else 1000)
    return calls


def test_installs_after_apt_get_update_when_the_first_install_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _fake(monkeypatch, {"install": [100, 0], "update": [0]})
    assert browser.ensure_chromium() == "/usr/bin/chromium"
    assert calls == [("install", "-y", "chromium"), ("update",), ("install", "-y", "chromium")]


def test_a_failed_install_is_an_error_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, {"install": [100, 100], "update": [0]})
    with pytest.raises(browser.BrowserUnavailable, match="install -y chromium failed"):
        browser.ensure_chromium()


def test_a_failed_update_is_an_error_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, {"install": [100], "update": [1]})
    with pytest.raises(browser.BrowserUnavailable, match="apt-get update failed"):
        browser.ensure_chromium()


def test_without_root_it_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake(monkeypatch, {"install": [], "update": []}, root=False)
    with pytest.raises(browser.BrowserUnavailable, match="apt-get install -y chromium"):
        browser.ensure_chromium()
    assert calls == []
