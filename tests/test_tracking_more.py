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
    actors, identity = extra.pop("actors", 2), extra.pop("identity", None)
    tr = trainer_cls(agents=[m] * actors, tokenizer=tok, args=cfg, wandb_config=wandb_config,
                     reward_func=lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)],
                     formatters=[lambda it: "left", lambda it: "right"], train_dataset=[{"prompt": "p"}] * 2, **extra)
    if identity is not None: tr.run_identity = identity          # what an owner (MARLHF) sets on its RL backend
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


def test_a_trainer_can_name_its_run(tmp_path, monkeypatch):
    "A backend trained for an owner (MARLHF's RL phase) records the owner's algorithm: the trainer's run_identity."
    from comlrl_nb import MAGRPOConfig, MAGRPOTrainer
    seen = _stand_in_wandb(monkeypatch)
    _train_one_batch(MAGRPOTrainer, MAGRPOConfig, tmp_path, identity={"algorithm": "MARLHF"})
    assert (seen[0]["config"]["algorithm"], seen[0]["config"]["num_agents"]) == ("MARLHF", 2)


def test_marlhf_policy_phase_records_marlhf(tmp_path, monkeypatch):
    "MARLHF trains its policies through an RL backend; the backend's tracker run is recorded as MARLHF, not MAGRPO."
    from comlrl_nb import MARLHFConfig, MARLHFTrainer, make_tiny_model
    seen = _stand_in_wandb(monkeypatch)
    m, tok = make_tiny_model(seed=0)
    cfg = MARLHFConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, rollout_batch_size=1, eval_interval=0,
                       output_dir=str(tmp_path), progress_bar=False, save_steps=-1, logging_steps=1,
                       reward_num_train_epochs=1, save_plot=False)
    tr = MARLHFTrainer(agents=[m, m], tokenizer=tok, args=cfg, wandb_config={"project": "p"},
                       reward_func=lambda a, b: [float(len(x) - len(y)) for x, y in zip(a, b)],
                       train_dataset=[{"prompt": "p"}, {"prompt": "q"}], reward_model=make_tiny_model(seed=1)[0])
    tr.train()
    algos = [kw["config"]["algorithm"] for kw in seen]
    assert algos and set(algos) == {"MARLHF"}, algos

# --- S3: a checkpoint save on a full disk or a read-only folder -------------------------------------------------------
import errno  # noqa: E402
import shutil  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from comlrl_nb.checkpoints import CheckpointManager  # noqa: E402

TORCH_FULL = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file write "
              "failed")


def _with_one_checkpoint(tmp_path):
    cm = CheckpointManager(tmp_path / "ck", total_limit=2, algo="toy")
    cm.save(1, {"w": torch.ones(1000)})                                   # 4000 tensor bytes
    return cm


def _fd_path(fd) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _fails_cleanly(cm, exc, code, *parts):
    "The error names the checkpoint, the free space and the parts; nothing new on disk; checkpoint-1 reads as before."
    e = exc.value
    assert isinstance(e, OSError) and e.errno == code, repr(e)
    msg = str(e)
    assert f"could not save checkpoint {cm.root}/checkpoint-" in msg and "free on that filesystem" in msg, msg
    assert "another checkpoint_dir" in msg, msg
    for part in parts: assert part in msg, (part, msg)
    assert "enforce fail" not in msg                                       # torch's raw text is not the message
    assert sorted(p.name for p in cm.root.iterdir()) == ["checkpoint-0000001"]       # no .tmp, .old, temp file
    assert sorted(p.name for p in (cm.root / "checkpoint-0000001").iterdir()) == ["state.pt", "trainer_state.json"]
    p, state = CheckpointManager(cm.root, algo="toy").load(True)
    assert p.name == "checkpoint-0000001" and torch.equal(state["w"], torch.ones(1000))


def _half_written(exc):
    "A torch.save that writes part of the file, then raises `exc`."
    def save(obj, f, *a, **k):
        Path(f).write_bytes(b"\0" * 100)
        raise exc
    return save


def test_full_disk_at_the_state_file(tmp_path, monkeypatch):
    cm = _with_one_checkpoint(tmp_path)
    monkeypatch.setattr(torch, "save", _half_written(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError) as exc:
        cm.save(2, {"w": torch.zeros(1000)})
    _fails_cleanly(cm, exc, errno.ENOSPC, "no space left", ".checkpoint-0000002.tmp/state.pt", "4000 bytes to write",
                   "checkpoint_total_limit", "free space there")


def test_torch_writer_error_on_a_full_disk_is_named(tmp_path, monkeypatch):
    "torch's own error carries no errno: less free space than the state needs makes it a full disk."
    cm = _with_one_checkpoint(tmp_path)
    monkeypatch.setattr(torch, "save", _half_written(RuntimeError(TORCH_FULL)))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: types.SimpleNamespace(total=10**9, used=10**9, free=123))
    with pytest.raises(OSError) as exc:
        cm.save(2, {"w": torch.zeros(1000)})
    _fails_cleanly(cm, exc, errno.ENOSPC, "no space left", "state.pt", "4000 bytes to write", "123 bytes free",
                   "checkpoint_total_limit")


def test_full_disk_at_the_second_file(tmp_path, monkeypatch):
    cm = _with_one_checkpoint(tmp_path)
    real = os.fsync
    def fsync(fd):
        if "trainer_state.json" in _fd_path(fd): raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as exc:
        cm.save(2, {"w": torch.zeros(1000)})
    _fails_cleanly(cm, exc, errno.ENOSPC, "trainer_state.json", "bytes to write", "checkpoint_total_limit")


@pytest.mark.parametrize("resave", [False, True])
def test_full_disk_at_the_directory_rename(tmp_path, monkeypatch, resave):
    "The new directory cannot be renamed into place (a new number, or a re-save without an atomic exchange)."
    from comlrl_nb import checkpoints
    cm = _with_one_checkpoint(tmp_path)
    monkeypatch.setattr(checkpoints, "_swap", lambda a, b: False)
    real = os.replace
    def replace(a, b):
        if Path(a).name.endswith(".tmp") and Path(a).is_dir(): raise OSError(errno.ENOSPC, "No space left on device")
        return real(a, b)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError) as exc:
        cm.save(1 if resave else 2, {"w": torch.zeros(1000)})
    _fails_cleanly(cm, exc, errno.ENOSPC, "renaming", "checkpoint_total_limit")


def test_read_only_folder(tmp_path, monkeypatch):
    "Tests run as root, so chmod cannot make a folder unwritable: mkdir says EROFS, as on a read-only mount."
    cm = _with_one_checkpoint(tmp_path)
    real = Path.mkdir
    def mkdir(self, *a, **k):
        if self.name.endswith(".tmp"): raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *a, **k)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(OSError) as exc:
        cm.save(2, {"w": torch.zeros(1000)})
    _fails_cleanly(cm, exc, errno.EROFS, "not writable", "Read-only file system", "make that folder writable")


def test_permission_denied_at_the_state_file(tmp_path, monkeypatch):
    cm = _with_one_checkpoint(tmp_path)
    monkeypatch.setattr(torch, "save", _half_written(PermissionError(errno.EACCES, "Permission denied")))
    with pytest.raises(PermissionError) as exc:
        cm.save(2, {"w": torch.zeros(1000)})
    _fails_cleanly(cm, exc, errno.EACCES, "not writable", "state.pt", "4000 bytes to write")


def test_atomic_write_on_a_full_disk_names_it_and_leaves_no_temp_file(tmp_path, monkeypatch):
    from comlrl_nb.core import atomic_write_text
    p = atomic_write_text(tmp_path / "a.txt", "old")
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
                        if ".a.txt." in _fd_path(fd) else real(fd))
    with pytest.raises(OSError) as exc:
        atomic_write_text(p, "new text")
    assert exc.value.errno == errno.ENOSPC
    for part in (f"cannot write {p}", "no space left", "8 bytes to write", "free there"): assert part in str(exc.value)
    assert [q.name for q in tmp_path.iterdir()] == ["a.txt"] and p.read_text() == "old"
