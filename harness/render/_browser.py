"""Headless Chromium for the picture tests and the docs images: provision, screenshot, check.

Chromium comes from the Debian packages (``apt-get install -y chromium``). When it is missing,
:func:`ensure_chromium` installs it (as root, after ``apt-get update`` if the first attempt
fails) with a progress message; it raises with the reason when it cannot — never a skip.
The check and the install run under one lock file, so the suite's xdist workers (each opens the
session fixture) install once, one after the other, instead of racing for dpkg's lock; apt-get
itself waits for a dpkg lock held by anything else.
"""

from __future__ import annotations

import contextlib
import fcntl
import html as html_module
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


class BrowserUnavailable(RuntimeError):
    """Chromium is missing and could not be installed (the reason is the message)."""


def find_chromium() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _say(message: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"\n[kvplan tests] {message}\n")
    stream.flush()


#: How long apt-get waits for a dpkg lock another process holds (seconds).
DPKG_LOCK_WAIT_S = 900


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(
        ["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )


def lock_path() -> Path:
    """The lock file every test process takes before it looks for Chromium or installs it."""
    return Path(tempfile.gettempdir()) / "kvplan-tests-chromium.lock"


@contextlib.contextmanager
def _provision_lock() -> Iterator[None]:
    with open(lock_path(), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_chromium() -> str:
    """The Chromium executable, installed with apt-get first when it is missing."""
    found = find_chromium()
    if found:
        return found
    with _provision_lock():
        return _install()


def _install() -> str:
    found = find_chromium()  # another test process may have installed it while this one waited
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise BrowserUnavailable(
            "Chromium is missing and this machine has no apt-get: install Chromium "
            "(Debian: apt-get install -y chromium) and rerun"
        )
    if os.geteuid() != 0:
        raise BrowserUnavailable(
            "Chromium is missing and the tests do not run as root, so they cannot install it: "
            "run `sudo apt-get install -y chromium` and rerun"
        )
    _say("Chromium is missing: installing it with `apt-get install -y chromium` (a minute or two)")
    result = _apt("install", "-y", "chromium")
    if result.returncode != 0:
        _say("apt-get install failed; running `apt-get update` and trying again")
        update = _apt("update")
        if update.returncode != 0:
            raise BrowserUnavailable(f"apt-get update failed:\n{update.stderr[-2000:]}")
        result = _apt("install", "-y", "chromium")
    if result.returncode != 0:
        raise BrowserUnavailable(f"apt-get install -y chromium failed:\n{result.stderr[-2000:]}")
    found = find_chromium()
    if not found:
        raise BrowserUnavailable("apt-get installed chromium but no chromium executable is on PATH")
    _say(f"Chromium installed: {found}")
    return found


def _run(chromium: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    with tempfile.TemporaryDirectory(prefix="kvplan-chromium-") as profile:
        return subprocess.run(
            [chromium, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            timeout=timeout,
            check=False,
        )


def screenshot(chromium: str, page: Path, png: Path, size: tuple[int, int] = (1400, 1000)) -> None:
    """Render ``page`` (a file) in headless Chromium and save a ``size`` PNG of the viewport."""
    png.unlink(missing_ok=True)
    result = _run(
        chromium,
        f"--screenshot={png}",
        f"--window-size={size[0]},{size[1]}",
        page.resolve().as_uri(),
    )
    if result.returncode != 0 or not png.is_file():
        raise RuntimeError(
            f"chromium exited {result.returncode} without a screenshot:\n"
            + result.stderr.decode(errors="replace")[-2000:]
        )


def dump_dom(chromium: str, page: Path) -> str:
    """The DOM Chromium built from ``page`` (serialised after load)."""
    result = _run(chromium, "--dump-dom", page.resolve().as_uri())
    if result.returncode != 0:
        raise RuntimeError(result.stderr.decode(errors="replace")[-2000:])
    return result.stdout.decode()


def png_rows(png: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the filtered scanlines of an 8-bit RGB/RGBA, non-interlaced PNG."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    return width, height, [raw[i * stride : (i + 1) * stride] for i in range(height)]


def drawn_rows(png: Path) -> float:
    """Share of scanlines that are not one flat colour (a blank page gives about 0).

    A flat row, whatever its PNG filter, holds at most three distinct byte values.
    """
    _, height, rows = png_rows(png)
    return sum(1 for row in rows if len(set(row[1:])) > 3) / max(height, 1)


MEASURE_ID = "kvplan-measure"
_MEASURE_JS = """
(function () {
  function box(el) {
    var r = el.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom];
  }
  function title(el) { var t = el.querySelector('title'); return t ? t.textContent : ''; }
  function tip(d) {
    var x = 0, y = 0, parts = d.match(/[MVHL][^MVHL]*/g) || [];
    parts.forEach(function (p) {
      var n = p.slice(1).trim().split(/[ ,]+/).map(Number);
      if (p[0] === 'M' || p[0] === 'L') { x = n[0]; y = n[1]; }
      else if (p[0] === 'V') { y = n[0]; } else { x = n[0]; }
    });
    return [x, y];
  }
  var out = {svgs: []};
  document.querySelectorAll('svg[role=img]').forEach(function (svg) {
    var base = svg.getBoundingClientRect();
    var item = {label: svg.getAttribute('aria-label'), origin: [base.left, base.top],
                texts: [], rects: [], arrows: []};
    svg.querySelectorAll('text').forEach(function (t) {
      item.texts.push({text: t.textContent, cls: t.getAttribute('class') || '', box: box(t)});
    });
    svg.querySelectorAll('rect').forEach(function (r) {
      item.rects.push({cls: r.getAttribute('class') || '', box: box(r), title: title(r),
                       fill: r.getAttribute('fill') || ''});
    });
    svg.querySelectorAll('path.arrow').forEach(function (p) {
      var d = p.getAttribute('d'), end = tip(d);
      var cx = base.left + end[0], cy = base.top + end[1];
      var hits = function (y) {
        return document.elementsFromPoint(cx, y).filter(function (e) {
          return e.tagName === 'rect' && (e.getAttribute('class') || '').indexOf('stripe') >= 0;
        }).map(title);
      };
      item.arrows.push({d: d, title: title(p), tip: [cx, cy],
                        at_tip: hits(cy + 1), at_head_base: hits(cy + 7)});
    });
    out.svgs.push(item);
  });
  var pre = document.createElement('pre');
  pre.id = 'MEASURE_ID';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
""".replace("MEASURE_ID", MEASURE_ID)


def measure(chromium: str, html: str, tmp: Path, size: tuple[int, int] = (1400, 1000)) -> Any:
    """Lay ``html`` out in headless Chromium and return, per drawn SVG (``role=img``), every
    text's and rectangle's box in page pixels (real font metrics) and every arrow's path, tip and
    the stripes under its tip, as a script added to a copy of the page measures them."""
    page = tmp / "measured.html"
    page.write_text(html.replace("</body>", f"<script>{_MEASURE_JS}</script></body>"), "utf-8")
    result = _run(
        chromium,
        f"--window-size={size[0]},{size[1]}",
        "--dump-dom",
        page.resolve().as_uri(),
    )
    dom = result.stdout.decode()
    start = dom.find(f'<pre id="{MEASURE_ID}">')
    if result.returncode != 0 or start < 0:
        raise RuntimeError(
            f"chromium exited {result.returncode} without the measurement:\n"
            + result.stderr.decode(errors="replace")[-2000:]
        )
    body = dom[start + len(f'<pre id="{MEASURE_ID}">') : dom.index("</pre>", start)]
    return json.loads(html_module.unescape(body))
