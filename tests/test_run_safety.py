"""The run engine's safety rules, for every trainer through `Run` (issue 16 S, issue 14 P6): run directories that are
never mixed, a lock, a checkpoint on SIGTERM or a failing reward, refusal of a changed config on resume, the library's
checkpoint_dir arguments, and every dataset row checked."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, make_tiny_model, read_metrics
from comlrl_nb.runs import RunLock

torch.set_num_threads(1)
PROMPTS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
ROOT = Path(__file__).resolve().parents[1]


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def make(out, reward=vowels, data=PROMPTS, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = dict(num_agents=2, num_train_epochs=1, num_generations=4, max_new_tokens=8, temperature=1.0, top_p=1.0,
               top_k=None, agent_learning_rate=1e-2, rollout_batch_size=1, rollout_buffer_size=3, eval_interval=0,
               output_dir=None if out is None else str(out), progress_bar=False, save_steps=-1, logging_steps=1000,
               save_plot=False)
    cfg.update(kw)
    return MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=reward, args=MAGRPOConfig(**cfg), train_dataset=data)


def params(tr):
    return [p.detach().clone() for m in tr.agents for p in m.parameters()]


def checkpoints(d):
    return sorted(p.name for p in (Path(d) / "checkpoints").glob("checkpoint-*"))


def test_a_failing_reward_leaves_the_last_finished_batch_which_resumes_exactly(tmp_path):
    full = make(tmp_path / "full")
    full.train()
    calls = []

    def flaky(a, b):                                       # one call per batch: batch 3 raises
        calls.append(1)
        if len(calls) == 3: raise RuntimeError("reward service down")
        return vowels(a, b)

    with pytest.raises(Exception, match="reward service down"):
        make(tmp_path / "part", reward=flaky).train()
    assert checkpoints(tmp_path / "part") == ["checkpoint-0000002"]
    meta = json.loads((tmp_path / "part" / "checkpoints" / "checkpoint-0000002" / "trainer_state.json").read_text())
    assert meta["batch"] == 2 and meta["config"]["agent_learning_rate"] == 1e-2      # the config record is kept
    resumed = make(tmp_path / "part")                      # the reward fixed
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state["global_batch"] == full.state["global_batch"] == 4
    assert all(torch.equal(x, y) for x, y in zip(params(full), params(resumed)))


def test_sigterm_stops_at_the_batch_boundary_with_a_checkpoint_and_exit_status_143(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, torch
        torch.set_num_threads(1)
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_run_safety import make, vowels
        from comlrl_nb.runs import exit_status
        calls = []
        def reward(a, b):
            calls.append(1)
            if len(calls) == 2: os.kill(os.getpid(), signal.SIGTERM)     # what SLURM / docker stop send
            return vowels(a, b)
        try: make(sys.argv[1], reward=reward).train()
        except KeyboardInterrupt as e: sys.exit(exit_status(e))
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 143, p.stderr[-2000:]
    assert "SIGTERM received" in p.stderr
    assert checkpoints(tmp_path / "run") == ["checkpoint-0000002"]        # batch 2 finished, batch 3 never started
    tr = make(tmp_path / "run")
    tr.train(resume_from_checkpoint=True)
    assert tr.state["global_batch"] == 4


def test_a_fresh_run_into_a_used_directory_is_refused_and_keeps_its_files(tmp_path):
    make(tmp_path / "run").train()
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match="resume_from_checkpoint=True"):
        make(tmp_path / "run").train()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_the_default_directory_is_fresh_per_run_and_resume_finds_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = make(None, save_steps=1)
    st = first.train(stop_after_batch=2)
    d = Path(first.output_dir)
    assert st["stopped"] and d.parent == Path("runs/magrpo") and (d / "metrics.jsonl").exists()
    assert (Path("runs/magrpo/latest")).resolve() == d.resolve()
    again = make(None, save_steps=1)
    again.train(resume_from_checkpoint=True)
    assert Path(again.output_dir).resolve() == d.resolve() and again.state["global_batch"] == 4
    other = make(None)
    other.train()
    assert Path(other.output_dir).resolve() != d.resolve()                 # a new run: a new directory


def test_a_directory_in_use_by_another_run_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    with RunLock(tmp_path / "run"):
        with pytest.raises(RuntimeError, match="in use by another run"):
            make(tmp_path / "run").train()
    make(tmp_path / "run").train()                         # free again: the run goes ahead


def test_an_unwritable_output_dir_fails_before_any_work(tmp_path):
    (tmp_path / "a_file").write_text("x")
    loads = []
    import comlrl_nb.team as team
    real = team.Team.__init__
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(team.Team, "__init__", lambda *a, **k: loads.append(1) or real(*a, **k))
        with pytest.raises(OSError, match="is not writable"):
            make(tmp_path / "a_file" / "run")              # at construction, before the agents are set up
    assert loads == []


def test_resume_with_a_changed_config_names_the_field_unless_allowed(tmp_path):
    make(tmp_path / "run", save_steps=1).train(stop_after_batch=2)
    with pytest.raises(ValueError, match="agent_learning_rate: 0.01 -> 0.02"):
        make(tmp_path / "run", save_steps=1, agent_learning_rate=2e-2).train(resume_from_checkpoint=True)
    tr = make(tmp_path / "run", save_steps=1, agent_learning_rate=2e-2, logging_steps=5)      # logging: always safe
    tr.train(resume_from_checkpoint=True, allow_config_changes=["agent_learning_rate"])
    assert tr.state["global_batch"] == 4


def test_the_library_checkpoint_arguments(tmp_path):
    tr = make(tmp_path / "run", num_train_epochs=3)
    tr.train(checkpoint_dir=tmp_path / "ck", checkpoint_interval=2)
    assert sorted(p.name for p in (tmp_path / "ck").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert checkpoints(tmp_path / "run") == []                       # save_steps=-1: none of ours
    resumed = make(tmp_path / "other", num_train_epochs=3)
    resumed.train(resume_from_checkpoint=tmp_path / "ck" / "checkpoint-2")
    assert resumed.state["global_batch"] == 12
    assert all(torch.equal(x, y) for x, y in zip(params(tr), params(resumed)))
    limited = make(tmp_path / "lim", num_train_epochs=3)
    limited.train(checkpoint_dir=tmp_path / "ck2", checkpoint_total_limit=1)
    assert sorted(p.name for p in (tmp_path / "ck2").glob("checkpoint-*")) == ["checkpoint-3"]


@pytest.mark.parametrize("interval", [True, 1.0, 0, -1, "1"])
def test_invalid_checkpoint_intervals_are_rejected_before_any_work(tmp_path, interval):
    tr = make(tmp_path / "run")
    with pytest.raises(ValueError, match="checkpoint_interval"):
        tr.train(checkpoint_interval=interval)
    assert list((tmp_path / "run").iterdir()) == [] and tr.state["global_batch"] == 0     # nothing written


def test_every_row_is_checked_and_a_dataframe_is_accepted(tmp_path):
    pd = pytest.importorskip("pandas")
    bad = PROMPTS[:2] + [{"prompt": None}] + PROMPTS[2:]
    with pytest.raises(TypeError, match=r"train_dataset\[2\] \(row 3 of 5\)"):
        make(tmp_path / "a", data=bad)
    tr = make(tmp_path / "b", data=pd.DataFrame({"prompt": [r["prompt"] for r in PROMPTS]}))
    assert tr.train_dataset == PROMPTS
    tr.train()
    assert tr.state["global_batch"] == 4


def test_metrics_callback_gets_each_batch_rollouts_and_its_numbers_are_logged(tmp_path):
    seen = []

    def cb(rollouts):
        seen.append(len(rollouts))
        return {"domain/count": len(rollouts), "domain/np": torch.tensor(0.5), "domain/text": "skipped"}

    m, tok = make_tiny_model(seed=0)
    cfg = MAGRPOConfig(num_agents=2, num_train_epochs=1, num_generations=2, max_new_tokens=4, rollout_batch_size=2,
                       eval_interval=0, output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=-1,
                       save_plot=False)
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=PROMPTS,
                       metrics_callback=cb)
    tr.train()
    assert seen == [4, 4]                                  # per batch: 2 items x 2 agents, one sample each
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "batch" in r]
    assert [r["domain/count"] for r in rows] == [4.0, 4.0] and all(r["domain/np"] == 0.5 for r in rows)
    assert not any("domain/text" in r for r in rows)
    with pytest.raises(TypeError, match="metrics_callback must be a function"):
        MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=PROMPTS,
                      metrics_callback={"not": "callable"})


def test_actor_critic_trainers_take_the_library_train_arguments_and_the_callback(tmp_path):
    from comlrl_nb import MAACConfig, MAACTrainer
    m, tok = make_tiny_model(seed=0)
    critic, _ = make_tiny_model(seed=2, tokenizer=tok)
    seen = []
    cfg = MAACConfig(num_agents=2, num_train_epochs=2, num_generations=1, max_new_tokens=4, rollout_batch_size=2,
                     rollout_buffer_size=2, eval_interval=0, output_dir=str(tmp_path / "run"), progress_bar=False,
                     save_steps=-1, save_plot=False)
    tr = MAACTrainer(agents=[m, m], tokenizer=tok, critics=[critic], reward_func=vowels, args=cfg,
                     train_dataset=PROMPTS,
                     metrics_callback=lambda eps: seen.append(len(eps)) or {"domain/n": len(eps)})
    tr.train(checkpoint_dir=tmp_path / "ck", checkpoint_interval=1, checkpoint_total_limit=1)
    assert sorted(p.name for p in (tmp_path / "ck").glob("checkpoint-*")) == ["checkpoint-2"]
    assert seen == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="checkpoint_total_limit=0 is invalid"):
        tr.train(checkpoint_total_limit=0)


def test_iterative_and_marlhf_runs_get_a_fresh_default_directory_each(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_iterative import madpo, marlhf
    monkeypatch.chdir(tmp_path)
    a, b = madpo("-", num_iterations=1, output_dir=None), madpo("-", num_iterations=1, output_dir=None)
    a.train()
    b.train()                                              # repeating a command never fails
    da, db = Path(a.output_dir), Path(b.output_dir)
    assert da != db and da.parent == db.parent == Path("runs/madpo_iter")
    assert list((da / "preference_replay").glob("iteration_*.json"))   # its files inside its own directory
    assert (Path("runs/madpo_iter/latest")).resolve() == db.resolve()
    m = marlhf("-", num_iterations=1, output_dir=None)
    m.train()
    assert (Path(m.output_dir) / "reward_model").is_dir() and Path(m.output_dir).parent == Path("runs/marlhf_iter")


def test_the_cli_writes_into_the_claimed_directory_and_refuses_a_used_one_early(tmp_path, monkeypatch, capsys):
    from comlrl_nb.cli import main
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--model", "tiny", "--heldout-samples", "0", "--set", "num_train_epochs=1", "max_new_tokens=4",
            "num_generations=2", "save_plot=false"]
    assert main(argv) == 0 and main(argv) == 0                       # repeating the command never fails
    runs = sorted(p for p in Path("runs/magrpo").iterdir() if p.name != "latest")
    assert len(runs) == 2 and all((d / "report.json").is_file() and (d / "metrics.jsonl").is_file() for d in runs)
    capsys.readouterr()
    assert main([*argv, "--output-dir", str(runs[0])]) == 2
    err = capsys.readouterr()
    assert "already holds another run" in err.err and "agents loaded" not in err.out     # refused before models load
