"""How the suite provisions Chromium on a fresh machine (apt-get faked; nothing installed)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.render import _browser as browser


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


def test_processes_that_provision_at_once_install_once_one_after_the_other(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Each xdist worker opens the session fixture: on a fresh machine two of them found Chromium
    # missing at the same moment and the second apt-get failed on dpkg's lock (CI, stop 34).
    # flock locks belong to an open file, so two threads that open the lock file conflict as two
    # processes do.
    monkeypatch.setattr(browser.tempfile, "gettempdir", lambda: str(tmp_path))
    installed: list[bool] = []
    running: list[int] = []
    overlaps: list[int] = []
    lock = threading.Lock()

    def apt(*args: str) -> subprocess.CompletedProcess[str]:
        with lock:
            running.append(1)
            overlaps.append(len(running))
        time.sleep(0.2)
        with lock:
            running.pop()
            installed.append(True)
        return subprocess.CompletedProcess(["apt-get", *args], 0, "", "")

    monkeypatch.setattr(browser, "_apt", apt)
    monkeypatch.setattr(
        browser, "find_chromium", lambda: "/usr/bin/chromium" if installed else None
    )
    monkeypatch.setattr(browser.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    got: list[str] = []
    threads = [
        threading.Thread(target=lambda: got.append(browser.ensure_chromium())) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert got == ["/usr/bin/chromium"] * 3
    assert len(installed) == 1 and overlaps == [1]
    assert browser.lock_path().parent == tmp_path


def test_apt_get_waits_for_a_dpkg_lock_held_by_something_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(browser.subprocess, "run", run)
    browser._apt("install", "-y", "chromium")
    assert seen == [
        [
            "apt-get",
            "-o",
            f"DPkg::Lock::Timeout={browser.DPKG_LOCK_WAIT_S}",
            "install",
            "-y",
            "chromium",
        ]
    ]
