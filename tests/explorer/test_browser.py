"""The explorer in a real JupyterLab, driven by Debian's Chromium through Playwright: run a `%%cuvil`
cell, step through the passes with the buttons, open every tab, switch to the dark theme, and
check the DOM. Screenshots go to tests/artifacts/explorer/ (not committed).

Never `playwright install`: the browser is /usr/bin/chromium (the Makefile installs it)."""
from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from explorer_cases import FOLDABLE

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = Path(__file__).resolve().parents[1] / "artifacts" / "explorer"

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no {CHROMIUM}")
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_root(tmp_path: Path) -> tuple[Path, dict]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%load_ext cuvil_explorer"),
                                         nbformat.v4.new_code_cell("%%cuvil\n" + FOLDABLE)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "explore.ipynb")
    # an isolated configuration, with the "get Jupyter news?" toast answered
    settings = tmp_path / ".cfg/lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / ".cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / ".run"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / ".ws"))
    return tmp_path, env


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root, env = make_root(tmp_path_factory.mktemp("lab"))
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1", "--allow-root",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                assert time.monotonic() < deadline, (root / "server.log").read_text()
                time.sleep(0.5)
        yield base, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)   # kernels are in the server's process group
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture
def page():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith(
            ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")) else r.abort())
        pg = ctx.new_page()
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def luminance(css_color: str) -> float:
    r, g, b = (int(v) for v in re.findall(r"\d+", css_color)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def test_explorer_in_jupyterlab(lab, page):
    base, token = lab
    try:
        # the toolbar says "idle" before the kernel's websocket exists: wait for the socket first
        with page.expect_websocket(lambda ws: "/api/kernels/" in ws.url, timeout=120_000):
            page.goto(f"{base}/lab/tree/explore.ipynb?reset&token={token}")
        expect(page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']")
               ).to_have_count(1)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

        out = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-tab"))
        expect(out).to_have_count(1, timeout=120_000)
        position = out.locator(".widget-html-content").filter(has_text=" / 5")
        expect(position).to_contain_text("1 / 5: verify")
        diff = out.locator(".cv-diffview")
        expect(diff.locator("table.cv-diff")).to_have_count(1)
        assert diff.locator("td.cv-add").count() == 0          # verify changes nothing

        # step to canonicalize with the buttons: the kernel re-renders the diff
        next_button = out.get_by_role("button", name="next ▶")
        next_button.click()
        expect(position).to_contain_text("2 / 5: shape-infer")
        next_button.click()
        expect(position).to_contain_text("3 / 5: canonicalize")
        expect(diff.locator("td.cv-del").filter(has_text="cuvil.mul")).to_have_count(1)
        added = diff.locator("td.cv-add")
        assert added.count() > 0
        assert "rgba(46, 160, 67" in added.first.evaluate("e => getComputedStyle(e).backgroundColor")
        page.screenshot(path=str(SHOTS / "pipeline-canonicalize.png"))

        # the search box marks matches and lists the passes that have them
        search = out.get_by_placeholder("search the IR")
        search.fill("permute")
        search.press("Enter")
        expect(out.locator(".widget-html-content").filter(has_text="in 3 of 5 passes")).to_have_count(1)
        expect(diff.locator("mark").first).to_be_attached()   # the diff re-renders after the label
        assert diff.locator("mark").count() >= 2

        # graph of the IR after canonicalize: x, full, add, two relus, add, return
        out.get_by_role("tab", name="Graph").click()
        nodes = out.locator(".cv-graph svg g.node")
        expect(nodes).to_have_count(7)
        titles = sorted(nodes.locator("title").all_text_contents())
        assert titles == ["return", "v2", "v3", "v4", "v5", "v6", "vx"]   # ids from the input IR
        expect(out.locator(".cv-note").filter(has_text="removed:")).to_contain_text("cuvil.mul")
        page.screenshot(path=str(SHOTS / "graph.png"))

        out.get_by_role("tab", name="Summary").click()
        summary = out.locator(".cv-summary")
        expect(summary).to_contain_text("9 → 4")
        expect(summary).to_contain_text("max abs error vs eager PyTorch")
        page.screenshot(path=str(SHOTS / "summary.png"))

        # dark theme: the panels take JupyterLab's colours
        out.get_by_role("tab", name="Pipeline").click()
        page.get_by_role("menuitem", name="Settings", exact=True).click()
        page.locator(".lm-Menu-itemLabel").get_by_text("Theme", exact=True).click()
        page.locator(".lm-Menu-itemLabel").get_by_text("JupyterLab Dark", exact=True).click()
        expect(page.locator("body[data-jp-theme-light='false']")).to_have_count(1)
        code = diff.locator("td.cv-code").first
        page.wait_for_function("e => { const c = getComputedStyle(e).color.match(/\\d+/g);"
                               " return c && +c[0] > 150; }", arg=code.element_handle())
        assert luminance(code.evaluate("e => getComputedStyle(e).color")) > 0.6
        page.wait_for_timeout(1000)   # let the theme's transition finish before the picture
        page.screenshot(path=str(SHOTS / "pipeline-dark.png"))
    except Exception:
        page.screenshot(path=str(SHOTS / "failure.png"))
        raise
