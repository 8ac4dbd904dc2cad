"""The library is exactly what nbdev_export makes of the notebooks, notebooks are clean, README matches index."""
import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _copy(tmp):
    for name in ("settings.ini", "setup.py"):
        shutil.copy(ROOT / name, tmp / name)
    shutil.copytree(ROOT / "nbs", tmp / "nbs", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "_proc"))
    shutil.copytree(ROOT / "comlrl_nb", tmp / "comlrl_nb", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp


def _diff(a: Path, b: Path, pattern: str):
    out = []
    for f in sorted(a.rglob(pattern)):
        if "__pycache__" in f.parts or ".ipynb_checkpoints" in f.parts:
            continue
        g = b / f.relative_to(a)
        if not g.exists() or not filecmp.cmp(f, g, shallow=False):
            out.append(str(f.relative_to(a)))
    for g in sorted(b.rglob(pattern)):
        if "__pycache__" not in g.parts and not (a / g.relative_to(b)).exists():
            out.append(f"(extra) {g.relative_to(b)}")
    return out


def test_library_matches_notebooks(tmp_path):
    tmp = _copy(tmp_path)
    subprocess.run([str(BIN / "nbdev_export")], cwd=tmp, check=True, capture_output=True)
    changed = _diff(tmp / "comlrl_nb", ROOT / "comlrl_nb", "*.py")
    assert not changed, f"nbdev_export would change {changed}: run nbdev_export and commit"


def test_notebooks_are_clean(tmp_path):
    tmp = _copy(tmp_path)
    subprocess.run([str(BIN / "nbdev_clean")], cwd=tmp, check=True, capture_output=True)
    changed = _diff(tmp / "nbs", ROOT / "nbs", "*.ipynb")
    assert not changed, f"nbdev_clean would change {changed}: run nbdev_clean and commit"


def test_readme_matches_index():
    from comlrl_nb.cli import render_readme
    assert (ROOT / "README.md").read_text() == render_readme(ROOT / "nbs" / "index.ipynb"), \
        "README.md is out of date: run `make readme` (comlrl-nb readme)"


def test_every_lesson_notebook_says_what_it_teaches_and_ends_with_exercises():
    import json
    missing = []
    for nb in sorted((ROOT / "nbs").glob("[0-9]*.ipynb")):
        cells = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
        if not any(c.startswith("**What this teaches.**") and "**What it assumes.**" in c for c in cells[:4]):
            missing.append(f"{nb.name}: no 'What this teaches / What it assumes' cell after the title")
        if not cells[-1].startswith("## Try this"):
            missing.append(f"{nb.name}: the last cell is not '## Try this'")
    assert not missing, "\n".join(missing)
