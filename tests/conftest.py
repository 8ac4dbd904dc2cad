import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _one_thread():
    "Small models on a shared 2-core machine: one torch thread is faster and deterministic."
    import torch
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _plots_written_before_temporary_dirs_go(monkeypatch):
    """A run's final plot is drawn in a background thread after train() returns (25_engine); its docs ask to call
    `wait_for_plots()` before removing a run directory. Tests and notebook cells remove theirs at the end of a
    `tempfile.TemporaryDirectory()` block, so that block's cleanup waits for the plots first: otherwise the PNG can land
    while the directory is being removed ("Directory not empty")."""
    import tempfile

    from comlrl_nb.tracking import wait_for_plots
    cleanup = tempfile.TemporaryDirectory.cleanup

    def cleanup_after_plots(self):
        wait_for_plots()
        return cleanup(self)

    monkeypatch.setattr(tempfile.TemporaryDirectory, "cleanup", cleanup_after_plots)
    yield


@pytest.fixture
def stopped_and_resumed():
    """`run(build, tmp_path)`: a full run of `build(dir)`, and a second run stopped after batch 3 (checked) and resumed
    from its checkpoint; returns (full trainer, resumed trainer, the resumed train()'s state)."""
    def run(build, tmp_path, stop_after: int = 3):
        full = build(tmp_path / "full")
        full.train()
        st = build(tmp_path / "part").train(stop_after_batch=stop_after)
        assert st["stopped"] and st["global_batch"] == stop_after
        resumed = build(tmp_path / "part")
        return full, resumed, resumed.train(resume_from_checkpoint=True)
    return run
