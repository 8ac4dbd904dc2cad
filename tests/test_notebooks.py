"""Every notebook runs top to bottom as a test (cells flagged `#| notest` are skipped, as in nbdev_test)."""
import os
from pathlib import Path

import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"
NOTEBOOKS = sorted(p.name for p in NBS.glob("*.ipynb") if not p.name.startswith("_"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 10, NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook(name, monkeypatch):
    from nbdev.test import test_nb
    monkeypatch.chdir(NBS)
    ok, secs = test_nb(NBS / name, skip_flags=["notest", "slow"], showerr=True)
    assert ok, f"{name} failed (see the traceback above)"
