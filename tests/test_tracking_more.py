"""Tracking and checkpoints, issues P3 and S3: the background plot imports nothing once it runs (a caller iterating
`logging`'s logger table after train() returns never sees it change), the tracker's run config names the run as the
library does, and a full or read-only disk during a checkpoint save is named with the fix and leaves nothing behind."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_background_plot_imports_on_the_calling_thread(tmp_path):
    "In a fresh process: once plot_run_background returns, the thread adds no module and no logger."
    code = textwrap.dedent(f"""
        import logging, sys
        from comlrl_nb.tracking import plot_run_background, wait_for_plots
        assert "matplotlib.figure" not in sys.modules, "matplotlib is imported already: the check would prove nothing"
        recs = [{{"batch": b, "turn_1/reward_mean": 0.1 * b, "agent_0/loss": 1.0}} for b in range(1, 9)]
        recs.append({{"batch": 8, "eval/turn_1/reward_mean": 0.5}})
        plot_run_background(recs, {str(tmp_path / "run.png")!r}, "fresh process")
        mods, logs = set(sys.modules), set(logging.root.manager.loggerDict)
        wait_for_plots()
        print("MODULES", sorted(set(sys.modules) - mods))
        print("LOGGERS", sorted(set(logging.root.manager.loggerDict) - logs))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MODULES []" in out.stdout and "LOGGERS []" in out.stdout, out.stdout
    assert (tmp_path / "run.png").stat().st_size > 5000                 # the thread still drew the plot
