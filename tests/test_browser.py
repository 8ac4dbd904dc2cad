"""Live check in a real browser: JupyterLab runs the widget notebooks, a slider is moved and the plot must change;
the rendered pages typeset their math and play their animations offline. Screenshots are saved.

Run it with `make browser-test` (installs Debian's chromium if missing, then sets COMLRL_NB_BROWSER=1). Without
that variable the tests are skipped, so `make test` stays free of a browser. The browser is Debian's
/usr/bin/chromium driven by Playwright; no browser is ever downloaded (never `playwright install`).
Screenshots go to $COMLRL_NB_SCREENSHOTS (default: a pytest temporary folder).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
CHROMIUM = os.environ.get("COMLRL_NB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--force-device-scale-factor=1"]

#: (notebook, marker, name, factory) for every notebook with a live widget: `marker` is text of the code cell that
#: displays the widget, `name` the variable that holds it in the kernel, `factory` an expression that builds a fresh
#: one at its defaults. The test runs the notebook in JupyterLab, checks that the displayed widget opens at its
#: defaults (the notebook's checks used their own instances), then moves EVERY control (each slider away and back,
#: each checkbox on and off) and after each move asserts that the kernel received the new value (kernel-side
#: readout == browser readout), that the callback ran with it and that the picture changed.
#: A notebook with a widget adds its row here.
LIVE_WIDGETS = [
    ("10_advantages.ipynb", "w = advantages_widget()", "w", "advantages_widget()"),
    ("11_losses.ipynb", "w = madpo_widget()", "w", "madpo_widget()"),
    ("41_reward_model.ipynb", "w = bradley_terry_widget()", "w", "bradley_terry_widget()"),
    ("50_replay.ipynb", "w = weights_widget()", "w", "weights_widget()"),
]
NB_IDS = [row[0] for row in LIVE_WIDGETS]
#: how many times each slider is dragged away and back (raise it, e.g. COMLRL_NB_DRAGS=10, to hunt lost updates)
DRAGS = int(os.environ.get("COMLRL_NB_DRAGS", "1"))

#: screenshots that also go into the README (shrunk, < 150 KB) when COMLRL_NB_README_IMAGES names a folder
#: (`COMLRL_NB_README_IMAGES=nbs/images make browser-test` refreshes the pictures of nbs/index.ipynb)
#: (the Lab pictures are taken at the widgets' opening state, right after Run All)
README_IMAGES = {"lab_10_advantages_page.png": "lab_advantages_widget.png",
                 "site_10_advantages_math.png": "site_advantages_math.png",
                 "site_10_advantages_animation.png": "site_advantages_animation.png",
                 **{f"lab_{Path(row[0]).stem}_widget_open.png": f"lab_{Path(row[0]).stem}_widget_open.png"
                    for row in LIVE_WIDGETS}}

pytestmark = pytest.mark.skipif(os.environ.get("COMLRL_NB_BROWSER") != "1",
                                reason="browser test: run `make browser-test` (needs Debian's chromium and playwright)")


def _shot(target, folder: Path, name: str):
    "Screenshot `target` (a page or a locator) to folder/name, and a shrunk copy for the README when asked to."
    target.screenshot(path=str(folder / name))
    readme = os.environ.get("COMLRL_NB_README_IMAGES")
    if readme and name in README_IMAGES:
        from PIL import Image
        img = Image.open(folder / name).convert("RGB")
        dst = Path(readme) / README_IMAGES[name]
        dst.parent.mkdir(parents=True, exist_ok=True)
        for width in (900, 800, 700, 600):
            small = img.resize((width, round(img.height * width / img.width)), Image.LANCZOS)
            small.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
            if dst.stat().st_size < 150_000: break


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("COMLRL_NB_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: `apt-get install chromium` (make browser-test does it)")
    from playwright.sync_api import sync_playwright
    profile = tempfile.mkdtemp(prefix="comlrl-chromium-")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                   args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900},
                                                   device_scale_factor=1)
        ctx.set_default_timeout(60_000)
        yield ctx
        ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    "JupyterLab on 127.0.0.1 over a copy of the notebooks (so autosave never touches nbs/), fresh settings."
    root = tmp_path_factory.mktemp("lab")
    work, settings = root / "nbs", root / "settings"
    work.mkdir()
    for nb in NB_IDS: shutil.copy(NBS / nb, work / nb)
    for rel, value in [("@jupyterlab/apputils-extension/notification.jupyterlab-settings",
                        {"checkForUpdates": False, "fetchNews": "false"}),
                       ("@jupyterlab/notebook-extension/tracker.jupyterlab-settings", {"windowingMode": "none"})]:
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}   # inline plots in the kernel, not Agg
    env.update(JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(root / "ws"),
               JUPYTER_RUNTIME_DIR=str(root / "rt"), JUPYTER_CONFIG_DIR=str(root / "cfg"), HF_HUB_OFFLINE="1")
    port, token = _free_port(), "comlrl-test-token"
    log = open(root / "lab.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                             f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
                             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                             "--LabApp.expose_app_in_browser=True"],  # window.jupyterapp, to run commands
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None: break
                time.sleep(0.5)
        else: pytest.fail("JupyterLab did not start in 60 s:\n" + (root / "lab.log").read_text()[-3000:])
        if proc.poll() is not None: pytest.fail("JupyterLab exited:\n" + (root / "lab.log").read_text()[-3000:])
        yield base, token, work
    finally:
        proc.terminate()
        try: proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _kernel_idle(page) -> bool:
    "The current notebook's kernel is idle (other notebooks that the workspace restored do not count)."
    return page.evaluate("""() => { const w = jupyterapp.shell.currentWidget;
      const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
      return !!k && k.status === 'idle'; }""")


def _prompts(page) -> list:
    "The input prompts of the current notebook's code cells ('[3]:', '[*]:', '[ ]:')."
    return [p.strip() for p in page.evaluate("""() => Array.from(jupyterapp.shell.currentWidget.node.querySelectorAll(
      '.jp-CodeCell .jp-InputPrompt')).map(e => e.textContent)""")]


KERNEL_READY = """(nb) => { const w = window.jupyterapp && jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && w.context.path.endsWith(nb) && k.connectionStatus === 'connected' && k.status === 'idle'; }"""


def _run_all(page, nb: str, shot: Path, timeout_s: int = 300):
    "Run every cell of `nb` (the current notebook: the workspace may restore others) through JupyterLab's command."
    page.wait_for_function(KERNEL_READY, arg=nb, timeout=timeout_s * 1000)
    page.evaluate("() => jupyterapp.commands.execute('notebook:run-all-cells')")
    t0, quiet = time.time(), None
    while time.time() - t0 < timeout_s:
        prompts = _prompts(page)
        if prompts and all(p[1:-2].isdigit() for p in prompts): return
        if "[*]:" in prompts or not _kernel_idle(page): quiet = None
        elif quiet is None: quiet = time.time()
        elif time.time() - quiet > 10: break                # nothing runs any more: a cell failed and Run All stopped
        time.sleep(0.5)
    page.screenshot(path=str(shot))
    tb = page.locator(".jp-OutputArea-output", has_text="Traceback (most recent call last)")
    if tb.count(): raise AssertionError(f"a cell failed during Run All:\n{tb.first.inner_text()[:2000]}")
    raise AssertionError(f"Run All left cells without a count (see {shot}): {prompts}")


def _png(signature: str) -> bytes:
    "The PNG bytes of the first image of a plot signature (data URLs joined by '|')."
    import base64
    return base64.b64decode(signature.split("|")[0].split(",", 1)[1])


def _ink(png: bytes) -> int:
    "Number of dark pixels: a half-drawn or blank plot has far fewer than a whole one."
    import io
    from PIL import Image
    return sum(Image.open(io.BytesIO(png)).convert("L").point(lambda v: 255 if v < 128 else 0).histogram()[255:])


def _plot_signature(cell) -> str:
    "The images inside the widget's output area (their data URLs), i.e. what the reader sees."
    return cell.locator(".widget-output").first.evaluate(
        "el => Array.from(el.querySelectorAll('img')).map(i => i.src).join('|')")


def _settled(page, cell, before: str, timeout_s: float = 30) -> str:
    "Wait until the plot differs from `before`, the kernel is idle and the picture has stayed the same for 1.5 s."
    t0, last, since = time.time(), None, time.time()
    while time.time() - t0 < timeout_s:
        sig = _plot_signature(cell)
        if sig != last: last, since = sig, time.time()
        elif sig and sig != before and _kernel_idle(page) and time.time() - since > 1.5: break
        time.sleep(0.25)
    page.evaluate("el => Promise.all(Array.from(el.querySelectorAll('img')).map(i => i.decode().catch(() => null)))",
                  cell.element_handle())
    return last


KERNEL_EVAL = """async (code) => { const k = jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const f = k.requestExecute({code, silent: false, store_history: false}); let out = '';
  f.onIOPub = m => { if (m.header.msg_type === 'stream') out += m.content.text;
                     if (m.header.msg_type === 'error') out += 'ERROR ' + m.content.ename + ': ' + m.content.evalue; };
  await f.done; return out; }"""


def _kernel_json(page, expr: str):
    "The value of the Python expression `expr` in the notebook's kernel (JSON round trip, main shell)."
    out = page.evaluate(KERNEL_EVAL, f"import json as _j; print(_j.dumps({expr}))")
    assert not out.startswith("ERROR"), out
    return json.loads(out.strip().splitlines()[-1])


def _kernel_state(page, name: str) -> dict:
    "What the kernel holds: the widget's control values and the arguments of its last callback run."
    return _kernel_json(page, f"{{'values': [c.value for c in {name}.kwargs_widgets], "
                              f"'called': [{name}.kwargs.get(c._kwarg) for c in {name}.kwargs_widgets]}}")


def _browser_values(controls) -> list:
    "What the browser shows: slider readouts as numbers, checkboxes as booleans (DOM order = kwargs order)."
    out = []
    for kind, c in controls:
        if kind == "slider":                      # (the readout writes a minus sign, U+2212)
            out.append(float(c.locator(".widget-readout").first.inner_text().strip().replace("\u2212", "-")))
        else: out.append(c.locator("input[type=checkbox]").first.is_checked())
    return out


def _same(browser_vals, kernel_vals, tol: float = 0.0051) -> bool:
    "Readouts are rounded (2 decimals): equal within half a unit of the last shown digit (`tol`)."
    if len(browser_vals) != len(kernel_vals): return False
    return all((b is k) if isinstance(b, bool) or isinstance(k, bool) else abs(b - float(k)) <= tol
               for b, k in zip(browser_vals, kernel_vals))


def _controls(cell) -> list:
    "(kind, locator) of every slider and checkbox of the widget, in DOM order."
    els = cell.locator(".jp-OutputArea-output .widget-slider, .jp-OutputArea-output .widget-checkbox")
    return [("slider" if "widget-slider" in (els.nth(i).get_attribute("class") or "") else "checkbox", els.nth(i))
            for i in range(els.count())]


def _move(page, kind, control, direction: int):
    "Drag a slider's handle ~70 px (in `direction`, with intermediate mouse moves), or click a checkbox."
    if kind == "checkbox":
        control.locator("input[type=checkbox]").first.click()
        return
    handle = control.locator(".noUi-handle").first
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 70 * direction, y, steps=10)
    page.mouse.up()


@pytest.mark.parametrize("nb,marker,name,factory", LIVE_WIDGETS, ids=NB_IDS)
def test_widget_moves_the_plot(lab, browser, shots, nb, marker, name, factory):
    base, token, _ = lab
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/lab/tree/{nb}?reset&token={token}")   # reset: no restored tabs
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
    stem = Path(nb).stem
    _run_all(page, nb, shots / f"lab_{stem}_run_all_failed.png")
    tb = page.locator(".jp-OutputArea-output", has_text="Traceback (most recent call last)")
    assert tb.count() == 0, tb.first.inner_text()[:2000]
    cell = page.locator(".jp-CodeCell", has_text=marker).first
    cell.scroll_into_view_if_needed()
    cell.locator(".widget-slider .noUi-handle").first.wait_for(state="visible")
    page.wait_for_function("el => el.querySelectorAll('.widget-output img').length > 0", arg=cell.element_handle())
    # the widget opens at its defaults: the notebook's checks did not move the displayed instance
    opening = _kernel_state(page, name)
    defaults = _kernel_json(page, f"[c.value for c in ({factory}).kwargs_widgets]")
    # (the browser snaps a slider to min + k * step, so 0.2 may come back as 0.19999999999999996)
    assert _same(opening["values"], defaults, 1e-9), f"{name} does not open at its defaults {defaults}: {opening}"
    controls = _controls(cell)
    assert controls and _same(_browser_values(controls), opening["values"]), (_browser_values(controls), opening)
    _shot(cell, shots, f"lab_{stem}_widget_open.png")
    page.evaluate("() => jupyterapp.commands.execute('application:toggle-left-area')")   # hide the file browser
    page.wait_for_timeout(500)
    cell.scroll_into_view_if_needed()
    _shot(page, shots, f"lab_{stem}_page.png")
    moves = 0
    for j, (kind, control) in enumerate(controls):
        control.scroll_into_view_if_needed()
        for rep in range(DRAGS if kind == "slider" else 1):
            for leg in (0, 1):                                 # away and back (checkbox: on and off)
                before, shown = _plot_signature(cell), _browser_values(controls)
                if kind == "slider" and leg == 0:              # away from the nearer end, then back
                    track = control.locator(".noUi-base").first.bounding_box()
                    hb = control.locator(".noUi-handle").first.bounding_box()
                    direction = 1 if hb["x"] + hb["width"] / 2 < track["x"] + track["width"] / 2 else -1
                _move(page, kind, control, 0 if kind == "checkbox" else direction if leg == 0 else -direction)
                moves += 1
                after = _settled(page, cell, before)
                now = _browser_values(controls)
                assert now[j] != shown[j], f"control {j} of {nb} did not move in the browser: {shown} -> {now}"
                state = _kernel_state(page, name)
                # a lost update: the readout moved in the browser but the kernel never got the value
                assert _same(now, state["values"]), (f"lost update in {nb}, control {j}, move {moves}: the browser "
                                                     f"shows {now}, the kernel holds {state['values']}")
                assert _same(state["called"], state["values"], 0), \
                    f"the callback did not run with the new values: {state}"
                assert after and after != before, f"the plot of {nb} did not change after moving control {j}"
                # a whole plot, not a half-drawn one (what pyplot called from a kernel subshell thread produces)
                assert _ink(_png(after)) > 0.25 * _ink(_png(before)), f"the new plot is (partly) blank: see {shots}"
    _shot(cell, shots, f"lab_{stem}_widget_after.png")
    (shots / f"lab_{stem}_plot_after.png").write_bytes(_png(after))           # the picture as the kernel sent it
    print(f"{nb}: {len(controls)} controls, {moves} moves, every one reached the kernel and redrew the plot")
    anim = page.locator(".jp-OutputArea-output .animation")
    if anim.count():                                   # animations play in JupyterLab too, with visible buttons
        anim.first.scroll_into_view_if_needed()
        img = anim.first.locator("img").first
        first = img.get_attribute("src")
        anim.first.locator("button[title='Play']").click()
        page.wait_for_timeout(1200)
        assert img.get_attribute("src") != first, "the animation does not play in JupyterLab"
        anim.first.locator("button[title='Pause']").click()
        _shot(anim.first, shots, f"lab_{stem}_animation.png")
        icon = anim.first.locator("button[title='Play'] i").first.bounding_box()
        assert icon and icon["width"] > 4, "the animation's play button shows no icon (Font Awesome comes from a CDN)"
    assert not errors, errors
    page.close()


@pytest.mark.parametrize("nb,marker,name,factory", LIVE_WIDGETS, ids=NB_IDS)
def test_widget_moves_while_cells_run(lab, browser, shots, nb, marker, name, factory):
    """Move every slider while Run All is still executing the cells after the widget, then check that nothing was lost.

    The lost update (a slider of 10_advantages whose readout moved while the plot did not, with no error): ipykernel 7
    sends a widget's messages to the shell that last published on its channel (the main shell, for a widget a cell
    created), and a comm message that arrives while that shell is inside another message is handled "concurrently",
    WITHOUT the busy/idle status pair. ipywidgets' front end waits for that idle before it sends the slider's next
    value (one message in flight per control), so every later value stays in the browser. Reproduced with continuous
    updates and quick drags over the four sliders (lost in 4 of 5 sessions, one slider stuck for good in 2).
    The widgets now send one message per drag (continuous_update=False) and let their messages go to the subshell
    the browser chose (`off_main_shell`); this test and the per-move kernel check catch it if it comes back."""
    base, token, _ = lab
    page = browser.new_page()
    page.goto(f"{base}/lab/tree/{nb}?reset&token={token}")   # reset: no restored tabs
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
    page.wait_for_function(KERNEL_READY, arg=nb, timeout=300_000)
    page.evaluate("() => jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.evaluate("() => { jupyterapp.commands.execute('notebook:run-all-cells'); }")    # do not wait for the end
    cell = page.locator(".jp-CodeCell", has_text=marker).first
    page.wait_for_function("el => el.querySelectorAll('.widget-output img').length > 0", arg=cell.element_handle(),
                           timeout=300_000)
    cell.scroll_into_view_if_needed()
    sliders = [c for kind, c in _controls(cell) if kind == "slider"]
    running = lambda: "[*]:" in _prompts(page) or not _kernel_idle(page)
    during = 0
    for rep in range(3):                                   # away, back, away: while the later cells still run
        for c in sliders:
            if not running(): break
            _move(page, "slider", c, 1 if rep % 2 == 0 else -1)
            during += 1
    assert during > 0, f"Run All of {nb} ended before a slider could be moved: nothing was tested"
    t0, quiet = time.time(), time.time()
    while time.time() - t0 < 300 and time.time() - quiet < 3:        # until nothing has run for 3 s
        if running(): quiet = time.time()
        time.sleep(0.5)
    controls = _controls(cell)
    for _ in range(60):                                    # let the last values arrive (or not)
        if _kernel_idle(page) and _same(_browser_values(controls), _kernel_state(page, name)["values"]): break
        time.sleep(0.5)
    now, state = _browser_values(controls), _kernel_state(page, name)
    assert _same(now, state["values"]), (f"lost update in {nb} after {during} moves during Run All: the browser shows "
                                         f"{now}, the kernel holds {state['values']}")
    for kind, c in controls:                               # and every slider still reaches the kernel afterwards
        if kind != "slider": continue
        before = _plot_signature(cell)
        _move(page, kind, c, -1)
        _settled(page, cell, before)
        now, state = _browser_values(controls), _kernel_state(page, name)
        assert _same(now, state["values"]), f"a slider of {nb} no longer reaches the kernel: {now} vs {state['values']}"
    print(f"{nb}: {during} slider moves during Run All, none lost")
    page.close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args): pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    "A site built from the widget notebooks, served on 127.0.0.1."
    from comlrl_nb.site import build_site
    out = tmp_path_factory.mktemp("site")
    m = build_site(out, NBS, only=[Path(n).stem for n in NB_IDS], log=lambda s: None)
    assert m["failed"] == [], m
    srv = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(out)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", out
    srv.shutdown()


def _open_offline(browser, url):
    "Open `url`, recording every request that would leave 127.0.0.1; wait for MathJax to finish."
    page = browser.new_page()
    remote, errors = [], []
    page.on("request", lambda r: remote.append(r.url)
            if not r.url.startswith(("http://127.0.0.1", "data:", "blob:", "about:")) else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load")
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
    page.evaluate("() => MathJax.startup.promise")
    return page, remote, errors


def _default_controls(factory: str) -> list:
    "'description = value' of each control of a fresh widget, as the site's snapshot writes them."
    import comlrl_nb.advantages, comlrl_nb.losses, comlrl_nb.replay, comlrl_nb.reward_model
    from comlrl_nb.site import _control_text
    ns = {k: v for m in (comlrl_nb.advantages, comlrl_nb.losses, comlrl_nb.replay, comlrl_nb.reward_model)
          for k, v in vars(m).items()}
    return [_control_text(c.get_state()) for c in eval(factory, ns).kwargs_widgets]


def test_rendered_pages_offline(site, browser, shots):
    base, _ = site
    for nb, _, _, factory in LIVE_WIDGETS:
        stem = Path(nb).stem
        page, remote, errors = _open_offline(browser, f"{base}/{stem}.html")
        assert page.locator("mjx-container").count() >= 1, "MathJax typeset nothing"
        text = page.locator("main").inner_text()
        for raw in ("\\frac", "\\mathbb", "$$"): assert raw not in text, f"raw LaTeX {raw!r} left on the page"
        assert page.locator(".comlrl-widget-static").count() >= 1
        # the picture on the page is the widget's opening state: its controls read their defaults
        values = " | ".join(page.locator(".comlrl-widget-values").all_inner_texts())
        for want in _default_controls(factory):
            assert want in values, f"the page of {nb} shows the widget at {values!r}, not at its default {want!r}"
        # the first displayed equation (or the first formula, on a page without one), for the screenshot
        shown = page.locator("mjx-container[display='true']")
        (shown if shown.count() else page.locator("mjx-container")).first.scroll_into_view_if_needed()
        _shot(page, shots, f"site_{stem}_math.png")
        anim = page.locator(".animation")
        if anim.count():
            img = anim.first.locator("img").first
            anim.first.scroll_into_view_if_needed()
            first = img.get_attribute("src")
            anim.first.locator("button[title='Play']").click()
            page.wait_for_timeout(1200)
            assert img.get_attribute("src") != first, "the animation does not play"
            anim.first.locator("button[title='Pause']").click()
            page.locator(".animation").first.evaluate("el => el.closest('.jp-Cell').scrollIntoView()")
            _shot(page, shots, f"site_{stem}_animation.png")
        w = page.locator(".comlrl-widget-static").first
        w.evaluate("el => el.closest('.jp-Cell').scrollIntoView()")
        _shot(page, shots, f"site_{stem}_widget.png")
        assert not remote, f"the page tried to load from the network: {remote}"
        assert not errors, errors
        page.close()
    page, remote, errors = _open_offline(browser, f"{base}/index.html")
    assert page.locator("a[href='10_advantages.html']").count() >= 1
    page.locator("h2", has_text="All pages").scroll_into_view_if_needed()
    _shot(page, shots, "site_index.png")
    assert not remote and not errors, (remote, errors)
    page.close()
