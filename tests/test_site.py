"""`comlrl-nb site`: an executed build of the advantages notebook is a static page that works offline.

Building runs the notebook in a fresh kernel (about 10 s) and vendors MathJax from the npm package (cached in
~/.cache/comlrl_nb after the first `npm pack`)."""
import json
import re
from pathlib import Path

import pytest

from comlrl_nb.cli import main
from comlrl_nb.site import MATHJAX_VERSION, build_site, page_names

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
# anything a page would load from another host (a CDN); the pages may only load files that sit next to them
REMOTE = re.compile(r"""<(?:script|link|img|iframe|source|embed|object|video|audio|track)\b[^>]*"""
                    r"""\b(?:src|href|data)\s*=\s*["']?\s*(?:https?:)?//"""
                    r"""|url\(\s*["']?\s*(?:https?:)?//|@import\s+["']?(?:https?:)?//""", re.I)
CDN_WORDS = ("cdn.", "cdnjs", "jsdelivr", "unpkg", "bootstrapcdn", "googleapis", "MathJax.Hub")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    manifest = build_site(out, NBS, only=["10_advantages"], log=lambda s: None)
    return out, manifest


def test_build_runs_the_notebook(site):
    out, m = site
    assert m["failed"] == [], m
    assert [p["name"] for p in m["pages"]] == ["index", "10_advantages"]
    adv = m["pages"][1]
    assert adv["title"] == "Advantages" and adv["seconds"] > 0 and adv["error"] is None
    assert json.loads((out / "site.json").read_text()) == m
    assert m["mathjax"] == MATHJAX_VERSION


def test_no_cdn_anywhere(site):
    out, _ = site
    pages = sorted(out.glob("*.html"))
    assert len(pages) == 2
    for p in pages:
        text = p.read_text()
        assert REMOTE.findall(text) == [], (p.name, REMOTE.findall(text)[:5])
        for w in CDN_WORDS: assert w not in text, (p.name, w)


def test_mathjax_is_vendored(site):
    out, _ = site
    mj = out / "_static" / "mathjax"
    assert (mj / "tex-chtml-full.js").stat().st_size > 500_000
    assert any((mj / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert (mj / "LICENSE").exists()
    page = (out / "10_advantages.html").read_text()
    assert re.search(r'<script[^>]*\bsrc="_static/mathjax/tex-chtml-full.js"', page)
    assert r"\mathbb{E}\Big[\frac{1}{K}" in page          # the math reaches the page untouched, for MathJax
    assert "inlineMath: [['$', '$']" in page


def test_widget_static_fallback(site):
    out, _ = site
    page = (out / "10_advantages.html").read_text()
    assert "interactive(children" not in page and "widget-view+json" not in page and "widget-state" not in page
    i = page.index("Interactive widget, shown as a snapshot")
    assert "R^1 = 0.2" in page[i:i + 2000] and "normalize = False" in page[i:i + 2000]  # the widget's opening state
    assert "data:image/png;base64," in page[i:i + 5000]                             # the picture right below it


def test_animation_is_embedded_and_offline(site):
    out, _ = site
    page = (out / "10_advantages.html").read_text()
    assert page.count('<div class="animation">') == 1
    assert "play_animation()" in page and page.count("data:image/png;base64,") > 24   # 24 frames + the plots
    assert "font-awesome" not in page and ".fa-play::before" in page                  # icons without a CDN font


def test_pages_have_navigation_and_no_tracebacks(site):
    out, _ = site
    index = (out / "index.html").read_text()
    adv = (out / "10_advantages.html").read_text()
    assert 'href="10_advantages.html"' in index and "All pages" in index
    assert adv.count("comlrl_nb · contents</a>") == 2            # bar above and below
    assert "Traceback" not in adv and "class=\"comlrl-banner" not in adv
    assert "#| export" not in adv and "default_exp" not in adv     # directives are not shown


def test_page_names_follow_the_folder():
    names = page_names(NBS)
    assert names[0] == "index" and "10_advantages" in names and names == ["index"] + sorted(names[1:])


def test_cli_site_without_execution(tmp_path, capsys):
    assert main(["site", "--out", str(tmp_path), "--only", "00_core", "--no-execute"]) == 0
    assert (tmp_path / "00_core.html").exists() and (tmp_path / "index.html").exists()
    assert main(["site", "--out", str(tmp_path), "--only", "no_such_notebook"]) == 2
    assert "no notebook named no_such_notebook" in capsys.readouterr().err


def test_index_maps_every_notebook():
    "The front page links every notebook (the map a reader follows), and its pictures exist and are small."
    import nbformat
    nb = nbformat.read(NBS / "index.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    missing = [n for n in page_names(NBS) if n != "index" and f"]({n}.ipynb)" not in text]
    assert missing == [], f"nbs/index.ipynb does not link {missing}: add them to the reading order"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images, "the index shows no screenshot"
    for rel in images:
        assert (NBS / rel).exists() and (NBS / rel).stat().st_size < 150_000, rel
