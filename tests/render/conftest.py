"""Headless Chromium for the page tests, provisioned once per session (never skipped)."""

from __future__ import annotations

import pytest

from harness.render._browser import BrowserUnavailable, ensure_chromium


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium executable; installed with apt-get when missing, an error if that fails."""
    try:
        return ensure_chromium()
    except BrowserUnavailable as exc:
        raise RuntimeError(f"the page tests need headless Chromium: {exc}") from None
