"""The explorer in a real JupyterLab, driven by Debian's Chromium through Playwright: run `%%cuvil`
cells, step through the passes with the buttons, open every tab (code, fusion, memory and profile panels
on the zoo's CNN and BERT-small), select fusion groups and refusals, click in the flame chart, save and download the profiles, switch to
the dark theme, and check the DOM. Screenshots go to tests/artifacts/explorer/ (not committed).

Never `playwright install`: the browser is /usr/bin/chromium (the Makefile installs it)."""
from __future__ import annotations

import base64
import json
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

import cuvil
from cuvil import zoo
from cuvil.profiler.flame import WIDTH

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


MODELS = ["cnn", "bert_small"]


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def make_root(tmp_path: Path) -> tuple[Path, dict]:
    write_notebook(tmp_path / "explore.ipynb", ["%load_ext cuvil_explorer", "%%cuvil --passes O1\n" + FOLDABLE])
    write_notebook(tmp_path / "models.ipynb", [
        "%load_ext cuvil_explorer\nfrom cuvil import zoo\n" + "\n".join(f"{m} = zoo.get({m!r})" for m in MODELS)]
        + [f"%%cuvil --dynamic {m}.dynamic --ranges {m}.ranges\n{m}.model(*{m}.example_inputs)" for m in MODELS])
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
        yield base, token, root
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
            ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "file://")) else r.abort())
        pg = ctx.new_page()
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def luminance(css_color: str) -> float:
    r, g, b = (int(v) for v in re.findall(r"\d+", css_color)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def run_all(page, lab, notebook: str):
    base, token, _ = lab
    # the toolbar says "idle" before the kernel's websocket exists: wait for the socket first
    with page.expect_websocket(lambda ws: "/api/kernels/" in ws.url, timeout=120_000):
        page.goto(f"{base}/lab/tree/{notebook}?reset&token={token}")
    expect(page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']")
           ).to_have_count(1)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def theme(page, dark: bool) -> None:
    """Switch JupyterLab's theme (the choice is saved in the server's settings, for later tests too)."""
    page.get_by_role("menuitem", name="Settings", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Theme", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text(f"JupyterLab {'Dark' if dark else 'Light'}", exact=True).click()
    expect(page.locator(f"body[data-jp-theme-light='{'false' if dark else 'true'}']")).to_have_count(1)


def test_explorer_in_jupyterlab(lab, page):
    try:
        run_all(page, lab, "explore.ipynb")
        out = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-tab"))
        expect(out).to_have_count(1, timeout=120_000)
        position = out.locator(".widget-html-content").filter(has_text=" / 6")
        expect(position).to_contain_text("1 / 6: verify")
        diff = out.locator(".cv-diffview")
        expect(diff.locator("table.cv-diff")).to_have_count(1)
        assert diff.locator("td.cv-add").count() == 0          # verify changes nothing

        # step to canonicalize with the buttons: the kernel re-renders the diff
        next_button = out.get_by_role("button", name="next ▶")
        next_button.click()
        expect(position).to_contain_text("2 / 6: shape-infer")
        next_button.click()
        expect(position).to_contain_text("3 / 6: canonicalize")
        expect(diff.locator("td.cv-del").filter(has_text="cuvil.mul")).to_have_count(1)
        added = diff.locator("td.cv-add")
        assert added.count() > 0
        assert "rgba(46, 160, 67" in added.first.evaluate("e => getComputedStyle(e).backgroundColor")
        page.screenshot(path=str(SHOTS / "pipeline-canonicalize.png"))

        # the search box marks matches and lists the passes that have them
        search = out.get_by_placeholder("search the IR")
        search.fill("permute")
        search.press("Enter")
        expect(out.locator(".widget-html-content").filter(has_text="in 3 of 6 passes")).to_have_count(1)
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
        theme(page, dark=True)
        code = diff.locator("td.cv-code").first
        page.wait_for_function("e => { const c = getComputedStyle(e).color.match(/\\d+/g);"
                               " return c && +c[0] > 150; }", arg=code.element_handle())
        assert luminance(code.evaluate("e => getComputedStyle(e).color")) > 0.6
        page.wait_for_timeout(1000)   # let the theme's transition finish before the picture
        page.screenshot(path=str(SHOTS / "pipeline-dark.png"))
    except Exception:
        page.screenshot(path=str(SHOTS / "failure.png"))
        raise


# ----------------------------------------------------------------------------- code, memory, profile


def visible(out, css: str):
    return out.locator(css).filter(visible=True)


def check_pipeline_panel(page, out, name: str) -> None:
    """Step to O3's layout pass: the CNN's convolutions turn NHWC, BERT-small's linears get packed weights."""
    out.get_by_role("tab", name="Pipeline").click()
    passes = [p.name for p in cuvil.Pipeline.of("O3")]
    n, layout = len(passes), passes.index("layout") + 1
    position = visible(out, ".widget-html-content").filter(has_text=f" / {n}")
    expect(position).to_contain_text(f"1 / {n}: verify")
    for _ in range(layout - 1):
        out.get_by_role("button", name="next ▶").click()
    expect(position).to_contain_text(f"{layout} / {n}: layout")
    added = visible(out, "td.cv-add").filter(has_text='layout = "nhwc"' if name == "cnn" else "out_features")
    expect(added.first).to_be_visible()
    page.screenshot(path=str(SHOTS / f"{name}-pipeline-layout.png"))


def check_code_panel(page, out, name: str) -> None:
    out.get_by_role("tab", name="Code").click()
    sources, kernels = visible(out, ".widget-select select").all()
    # a source line marks the kernels it produced (◆), shows the first, and marks its ops
    sources.select_option(index=2)
    expect(kernels.locator("option", has_text="◆").first).to_be_attached()
    marked = [t for t in kernels.locator("option").all_text_contents() if t.startswith("◆")]
    header = visible(out, ".cv-kernhead")
    expect(header).to_contain_text(marked[0].split()[2])          # "◆ 3. name  12 µs": the first marked kernel
    assert visible(out, ".cv-ops tr.cv-hit").count() >= 1
    assert "kernel @" in visible(out, "pre.cv-codeblock").first.inner_text()
    page.screenshot(path=str(SHOTS / f"{name}-code.png"))
    out.get_by_role("button", name="Assembly", exact=True).click()
    expect(visible(out, "pre.cv-codeblock").first).to_contain_text("ret")
    out.get_by_role("button", name="Side by side", exact=True).click()
    expect(visible(out, ".cv-side pre.cv-codeblock")).to_have_count(3)
    page.screenshot(path=str(SHOTS / f"{name}-code-side.png"))


def check_memory_panel(page, out, name: str) -> None:
    out.get_by_role("tab", name="Memory").click()
    buffer = visible(out, ".widget-dropdown select").first
    n = buffer.locator("option").count() - 1                     # after "(none)"
    expect(visible(out, "svg.cv-timeline g.cv-buf")).to_have_count(n)
    expect(visible(out, "svg.cv-packing g.cv-buf")).to_have_count(n)
    buffer.select_option(index=1)
    expect(visible(out, "g.cv-buf.cv-on")).to_have_count(2)      # the same buffer in both pictures
    expect(visible(out, ".cv-kv").filter(has_text="used by").first).to_be_visible()
    visible(out, "svg.cv-timeline").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / f"{name}-memory.png"))


def check_fusion_panel(page, out, name: str) -> None:
    out.get_by_role("tab", name="Fusion").click()
    groups, refused = visible(out, ".widget-select select").all()
    # a refusal marks its two ops in the IR (a round trip through the kernel)
    assert refused.locator("option").count() > 0
    refused.select_option(index=0)
    expect(visible(out, ".cv-fuseir .cv-irline.cv-cand")).to_have_count(1)
    expect(visible(out, ".cv-fuseir .cv-irline.cv-cons")).to_have_count(1)
    expect(visible(out, "pre.cv-codeblock")).to_have_count(0)       # a refusal has no kernel
    visible(out, ".cv-fusesum").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(SHOTS / f"{name}-fusion-refusal.png"))
    # the last group of several ops: its kernel's code, and its values marked in the IR
    labels = groups.locator("option").all_text_contents()
    groups.select_option(index=max(i for i, t in enumerate(labels) if t.startswith("■")))
    kernel = visible(out, 'tr:has(> th:text-is("kernel")) code').first
    expect(kernel).to_be_visible()
    expect(visible(out, "pre.cv-codeblock")).to_contain_text(f"kernel @{kernel.inner_text()}(")
    assert visible(out, ".cv-fuseir .cv-irline.cv-hit").count() >= 2
    visible(out, ".cv-fusesum").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(SHOTS / f"{name}-fusion.png"))
    # the graph of the output IR boxes the groups, coloured by kernel
    out.get_by_role("tab", name="Graph").click()
    expect(visible(out, ".cv-graph svg g.node").first).to_be_visible(timeout=60_000)   # the first drawing
    stage = visible(out, ".widget-dropdown select").first
    stage.select_option(index=stage.locator("option").count() - 1)
    expect(visible(out, ".cv-graph svg g.cluster").first).to_be_visible(timeout=60_000)
    fused = sum(t.startswith("■") for t in labels)
    assert visible(out, ".cv-graph svg g.cluster").count() == fused
    page.screenshot(path=str(SHOTS / f"{name}-graph-fusion.png"))


def check_profile_panel(page, out, name: str, root: Path) -> None:
    out.get_by_role("tab", name="Profile").click()
    svg = visible(out, "svg.cv-flamesvg")
    frames = svg.locator("g.cv-fl")
    assert frames.count() > 2
    # click to zoom (in the browser, no kernel round trip) on the widest frame below the top bar
    widths = frames.evaluate_all("fs => fs.map(f => +f.querySelector('rect').getAttribute('width'))")
    frame = frames.nth(max(range(1, len(widths)), key=widths.__getitem__))
    before = float(frame.locator("rect").get_attribute("width"))
    visible(out, ".cv-flame").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / f"{name}-profile.png"))
    frame.locator("rect").click()
    assert before < WIDTH - 1 and float(frame.locator("rect").get_attribute("width")) == pytest.approx(WIDTH, abs=0.5)
    expect(visible(out, ".cv-fl-info")).to_contain_text("% of run")
    page.screenshot(path=str(SHOTS / f"{name}-profile-zoom.png"))
    frames.nth(0).locator("rect").click()                        # the top bar zooms out
    assert float(frame.locator("rect").get_attribute("width")) == pytest.approx(before, abs=0.5)
    # the download link carries the Chrome trace itself
    link = visible(out, "a.cv-download").first
    href = link.get_attribute("href")
    assert href.startswith("data:application/json;base64,")
    trace = json.loads(base64.b64decode(href.split(",", 1)[1]))
    assert {e["ph"] for e in trace["traceEvents"]} == {"M", "X"}
    # the save button writes next to the notebook (the kernel's directory)
    out.get_by_role("button", name="save Chrome trace").click()
    note = visible(out, ".widget-html-content").filter(has_text="saved")
    expect(note).to_contain_text(".trace.json")
    path = Path(note.inner_text().split("saved", 1)[1].strip())
    assert path.parent == root.resolve() and path.name.startswith(f"cuvil-{name}.")
    saved = json.loads(path.read_text())
    assert any(e["ph"] == "X" and e["cat"] == "run" for e in saved["traceEvents"])
    # "show its code" opens the kernel in the Code tab
    kernel = visible(out, ".widget-dropdown select").first
    wanted = kernel.locator("option").nth(1).inner_text().split()[1]      # "12. name  3.4 µs"
    kernel.select_option(index=1)
    out.get_by_role("button", name="show its code").click()
    expect(out.get_by_role("tab", name="Code")).to_have_attribute("aria-selected", "true")
    expect(visible(out, ".cv-kernhead")).to_contain_text(wanted)


def test_code_memory_and_profile_panels(lab, page):
    root = Path(lab[2])
    try:
        run_all(page, lab, "models.ipynb")
        theme(page, dark=False)
        outs = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-tab"))
        expect(outs).to_have_count(len(MODELS), timeout=240_000)
        for name, out in zip(MODELS, outs.all()):
            out.scroll_into_view_if_needed()
            out.get_by_role("tab", name="Summary").click()
            expect(visible(out, ".cv-summary")).to_contain_text("as fast as eager PyTorch")
            expect(visible(out, ".cv-summary")).to_contain_text("arena")
            page.screenshot(path=str(SHOTS / f"{name}-summary.png"))
            check_pipeline_panel(page, out, name)
            check_code_panel(page, out, name)
            check_fusion_panel(page, out, name)
            check_memory_panel(page, out, name)
            check_profile_panel(page, out, name, root)
        # the pass bisection on the CNN: O1 does not change its results
        cnn = outs.first
        cnn.get_by_role("tab", name="Pipeline").click()
        cnn.get_by_role("button", name="bisect numerics").click()
        expect(visible(cnn, ".cv-bisect")).to_contain_text("No pass changed the results")
        page.screenshot(path=str(SHOTS / "cnn-bisect.png"))
        bert = outs.last
        bert.scroll_into_view_if_needed()
        bert.get_by_role("tab", name="Memory").click()
        visible(bert, "svg.cv-packing").scroll_into_view_if_needed()
        theme(page, dark=True)
        page.wait_for_timeout(1000)   # let the theme's transition finish before the picture
        page.screenshot(path=str(SHOTS / "bert_small-memory-dark.png"))
        bert.get_by_role("tab", name="Profile").click()
        visible(bert, ".cv-flame").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "bert_small-profile-dark.png"))
        bert.get_by_role("tab", name="Fusion").click()
        ir = visible(bert, "pre.cv-fuseir")
        ir.scroll_into_view_if_needed()
        assert luminance(ir.evaluate("e => getComputedStyle(e).color")) > 0.6
        page.screenshot(path=str(SHOTS / "bert_small-fusion-dark.png"))
    except Exception:
        page.screenshot(path=str(SHOTS / "models-failure.png"))
        raise


def test_static_report_works_without_a_kernel(page, tmp_path):
    """The static page's Code tab provenance and the flame chart's zoom run in the browser alone."""
    cnn = zoo.get("cnn")
    compiled = cuvil.compile(cnn.model, dynamic=cnn.dynamic, ranges=cnn.ranges)
    compiled.profile(*cnn.example_inputs)
    report = compiled.report
    path = tmp_path / "cnn.html"
    report.save_html(path)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.get_by_role("button", name="Code", exact=True).click()
    (line,) = [s for s in report.sources if "self.depthwise" in s.text]
    expected = [k["name"] for k in report.kernels if {op["id"] for op in k["ops"]} & set(line.ops)]
    page.locator(".cv-srclist button").filter(has_text="self.depthwise").click()
    marked = page.locator(".cv-kernlist button.cv-hit")
    expect(marked).to_have_count(len(expected))
    assert [b.get_attribute("data-k") for b in marked.all()] == expected
    shown = page.locator(".cv-kern").filter(visible=True)
    expect(shown).to_have_attribute("data-k", expected[0])
    shown.get_by_role("button", name="Assembly", exact=True).click()
    expect(shown.locator(".cv-kview").filter(visible=True)).to_contain_text("ret")
    page.screenshot(path=str(SHOTS / "cnn-static-code.png"))
    page.get_by_role("button", name="Profile", exact=True).click()
    chart = page.locator("svg.cv-flamesvg").nth(1)                 # the run
    frames = chart.locator("g.cv-fl")
    widths = frames.evaluate_all("fs => fs.map(f => +f.querySelector('rect').getAttribute('width'))")
    frame = frames.nth(max(range(1, len(widths)), key=widths.__getitem__))
    frame.locator("rect").click()
    assert float(frame.locator("rect").get_attribute("width")) == pytest.approx(WIDTH, abs=0.5)
    page.screenshot(path=str(SHOTS / "cnn-static-profile.png"))
    page.get_by_role("button", name="Memory", exact=True).click()
    expect(page.locator("svg.cv-timeline g.cv-buf")).to_have_count(len(report.memory["buffers"]))
    page.screenshot(path=str(SHOTS / "cnn-static-memory.png"))
    # Fusion tab: a refusal marks its two ops; the rule filter; a group links to its kernel's code
    page.get_by_role("button", name="Fusion", exact=True).click()
    refused = report.fusion["refused"]
    page.locator('.cv-fuselist button[data-f="r0"]').click()
    item = page.locator(".cv-fuseitem").filter(visible=True)
    expect(item).to_have_attribute("data-f", "r0")
    expect(item.locator(".cv-irline.cv-cand")).to_have_count(1)
    page.locator("#cv-fuse-rule").select_option(refused[0]["rule"])
    shown = page.locator(".cv-fuselist button[data-rule]").filter(visible=True)
    expect(shown).to_have_count(sum(r["rule"] == refused[0]["rule"] for r in refused))
    (last,) = [i for i, g in enumerate(report.fusion["groups"]) if g["kind"] != "single"][-1:]
    page.locator(f'.cv-fuselist button[data-f="g{last}"]').click()
    expect(page.locator(".cv-fuseitem").filter(visible=True).locator(".cv-irline.cv-hit")).to_have_count(
        len(report.fusion["groups"][last]["values"]))
    page.screenshot(path=str(SHOTS / "cnn-static-fusion.png"))
    page.locator(".cv-fuseitem").filter(visible=True).locator(".cv-tokernel").click()
    expect(page.locator(".cv-kern").filter(visible=True)).to_have_attribute(
        "data-k", report.fusion["groups"][last]["kernel"])
    assert errors == []
