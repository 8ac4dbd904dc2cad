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


SECRET = "sk-FAKE-identity-0123456789abcdef"


def _stand_in_wandb(monkeypatch) -> list:
    "A `wandb` module that records each wandb.init call's arguments."
    import types
    seen = []

    def init(**kw):
        seen.append(kw)
        return types.SimpleNamespace(id=f"run{len(seen)}", project=kw.get("project"), entity=None,
                                     log=lambda *a, **k: None, finish=lambda: None)
    import importlib.machinery
    wandb = types.ModuleType("wandb")
    wandb.init, wandb.__spec__ = init, importlib.machinery.ModuleSpec("wandb", None)   # find_spec("wandb") works
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    return seen


def _train_one_batch(trainer_cls, config_cls, tmp_path, **extra):
    "A tiny trainer with a wandb_config holding a secret in a section, trained for one batch; its wandb.init config."
    from comlrl_nb import make_tiny_model
    m, tok = make_tiny_model(seed=0)
    cfg = config_cls(num_agents=2, num_train_epochs=1, num_generations=2, max_new_tokens=4, rollout_batch_size=1,
                     eval_interval=0, output_dir=str(tmp_path), progress_bar=False, save_steps=-1, logging_steps=1)
    wandb_config = {"project": "p", "config": {"note": "mine"},
                    "config_sections": {"api": {"comparator_api_key": SECRET}}}
    tr = trainer_cls(agents=[m] * extra.pop("actors", 2), tokenizer=tok, args=cfg, wandb_config=wandb_config,
                     reward_func=lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)],
                     formatters=[lambda it: "left", lambda it: "right"], train_dataset=[{"prompt": "p"}] * 2, **extra)
    tr.train(stop_after_batch=1)
    return tr


def test_tracker_run_config_names_the_run_as_the_library(tmp_path, monkeypatch):
    import json
    from comlrl_nb import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, MAGRPOConfig, MAGRPOTrainer
    seen = _stand_in_wandb(monkeypatch)
    _train_one_batch(MAGRPOTrainer, MAGRPOConfig, tmp_path / "magrpo")
    _train_one_batch(CentralizedMAGRPOTrainer, CentralizedMAGRPOConfig, tmp_path / "central", actors=1,
                     centralized_prompt_builder=lambda roles, item: "joint " + " ".join(roles))
    assert len(seen) == 2
    dec, cen = seen[0]["config"], seen[1]["config"]
    assert {k: dec[k] for k in ("algorithm", "num_agents", "num_roles", "num_actor_models", "model_name")} == \
        {"algorithm": "MAGRPO", "num_agents": 2, "num_roles": 2, "num_actor_models": 2, "model_name": "llama"}
    # centralized: one actor model writes both roles; the library records num_agents=1 (its actor count)
    assert {k: cen[k] for k in ("algorithm", "num_agents", "num_roles", "num_actor_models", "model_name",
                                "collaboration_mode")} == \
        {"algorithm": "MAGRPO", "num_agents": 1, "num_roles": 2, "num_actor_models": 1, "model_name": "llama",
         "collaboration_mode": "centralized"}
    for c in (dec, cen):                                   # the rest of the record is kept, the secret stays hidden
        assert c["note"] == "mine" and c["api"]["comparator_api_key"] == "***" and c["max_new_tokens"] == 4
    assert SECRET not in json.dumps(seen, default=str)
