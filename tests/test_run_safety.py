"""The run engine's safety rules, for every trainer through `Run` (issue 16 S, issue 14 P6): run directories that are
never mixed, a lock, a checkpoint on SIGTERM or a failing reward, refusal of a changed config on resume, the library's
checkpoint_dir arguments, and every dataset row checked."""
import json
import os
import signal
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


def _signalled_job(tmp_path, at_call: int, run: str):
    """A training job in a fresh process whose reward sends it SIGTERM (what SLURM / docker stop send) at its
    `at_call`-th call; `run`: the script's last lines. The finished process."""
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
            if len(calls) == {at_call}: os.kill(os.getpid(), signal.SIGTERM)
            return vowels(a, b)
    """) + textwrap.dedent(run))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), str(tmp_path / "run")], env=env, capture_output=True,
                          text=True, timeout=600)


def test_sigterm_stops_at_the_batch_boundary_with_a_checkpoint_and_exit_status_143(tmp_path):
    p = _signalled_job(tmp_path, 2, """
        try: make(sys.argv[1], reward=reward).train()
        except KeyboardInterrupt as e: sys.exit(exit_status(e))
    """)
    assert p.returncode == 143, p.stderr[-2000:]
    assert "SIGTERM received" in p.stderr
    assert checkpoints(tmp_path / "run") == ["checkpoint-0000002"]        # batch 2 finished, batch 3 never started
    tr = make(tmp_path / "run")
    tr.train(resume_from_checkpoint=True)
    assert tr.state["global_batch"] == 4


def test_a_sigterm_after_the_last_batch_is_passed_on_once_the_run_is_saved(tmp_path):
    "The signal arrives during the last batch (after its boundary check): the run ends and saves, then the signal acts."
    p = _signalled_job(tmp_path, 4, """
        make(sys.argv[1], reward=reward, save_steps=1).train()        # SIGTERM during batch 4 of 4
        print("went on after the SIGTERM", flush=True)
    """)
    assert p.returncode == -signal.SIGTERM and "went on" not in p.stdout, (p.returncode, p.stderr[-2000:])
    assert "SIGTERM arrived after the last batch" in p.stderr
    assert checkpoints(tmp_path / "run")[-1] == "checkpoint-0000004"       # everything the run did is saved


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


# ------------------------------------------------------------------ the whole command is one protected unit (S3)
# A scheduler's SIGTERM (or Ctrl-C, or an error) at any stage of `comlrl-nb train`, from model loading to the report,
# keeps what exists (report.json marked incomplete, the agents trained so far) and `--resume` finishes the run with
# the numbers an uninterrupted run gets.
TRAIN = ["train", "--model", "tiny", "--heldout-samples", "2", "--threads", "1", "--set", "progress_bar=false",
         "num_train_epochs=2", "save_plot=false"]
CHILD = textwrap.dedent("""
    import os, sys, time
    stage, argv = sys.argv[1], sys.argv[2:]
    def pause(tag, secs):
        print("@@" + tag, flush=True)
        time.sleep(secs)                       # a signal stops here (or, where the stage defers it, after)
    import comlrl_nb.cli as C, comlrl_nb.models as M, comlrl_nb.team as T
    from comlrl_nb.trainers.reinforce import MAGRPOTrainer
    calls = {"heldout": 0, "update": 0}
    if stage == "loading":
        tiny = M.make_tiny_model
        M.make_tiny_model = lambda *a, **k: pause("loading", 60) or tiny(*a, **k)
    if stage in ("heldout_before", "heldout_after"):
        measure = C.heldout_reward
        def slow_measure(*a, **k):
            calls["heldout"] += 1
            if (calls["heldout"] == 1) == (stage == "heldout_before"): pause(stage, 60)
            return measure(*a, **k)
        C.heldout_reward = slow_measure
    if stage == "training":
        update = MAGRPOTrainer._timed_update
        def slow_update(self):
            calls["update"] += 1
            if calls["update"] == 3: pause("training", 1.5)     # mid-batch: the run stops at the next boundary
            return update(self)
        MAGRPOTrainer._timed_update = slow_update
    if stage == "saving":
        save = T.Team.save_pretrained
        def slow_save(self, out):
            r = save(self, out)
            pause("saving", 1.5)                              # the agents are being written: finished, then stop
            return r
        T.Team.save_pretrained = slow_save
    sys.exit(C.main(argv))
""")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    "An uninterrupted run of the same command: what every stopped-and-resumed run must end with."
    from comlrl_nb.cli import main
    out = tmp_path_factory.mktemp("reference") / "run"
    assert main(TRAIN + ["--output-dir", str(out)]) == 0
    return json.loads((out / "report.json").read_text()), out


def _agents_equal(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file
    for i in (0, 1):
        x, y = load_file(a / f"agent_{i}" / "model.safetensors"), load_file(b / f"agent_{i}" / "model.safetensors")
        if x.keys() != y.keys() or not all(torch.equal(x[k], y[k]) for k in x): return False
    return True


def _stop_at(stage, out, sig=None, extra=()):
    import signal as S
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", CHILD, stage, *TRAIN, "--output-dir", str(out), *extra], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("@@" + stage):
            p.send_signal(sig or S.SIGTERM)
            break
    out_text, err = p.communicate(timeout=300)
    return p.returncode, err


@pytest.mark.parametrize("stage, phase, kept", [
    ("loading", "load", []),
    ("heldout_before", "heldout_before", []),
    ("training", "train", ["checkpoints/checkpoint-", "metrics.jsonl", "heldout_before"]),
    ("saving", "save_agents", ["final/ (the trained agents)", "metrics.jsonl", "heldout_before"]),
    ("heldout_after", "heldout_after", ["final/ (the trained agents)", "metrics.jsonl", "heldout_before"]),
])
def test_sigterm_at_every_stage_keeps_what_exists_and_resume_finishes_it(tmp_path, reference, stage, phase, kept,
                                                                         capsys):
    from comlrl_nb.cli import main
    ref, ref_out = reference
    out = tmp_path / "run"
    rc, err = _stop_at(stage, out)
    assert rc == 143, err[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["complete"] is False and rep["stopped"]["phase"] == phase, rep.get("stopped")
    assert rep["stopped"]["reason"] == "signal SIGTERM"
    assert [k for k in kept if not any(x.startswith(k) for x in rep["stopped"]["kept"])] == [], rep["stopped"]["kept"]
    assert rep["stopped"]["finish_with"].endswith("--resume") and str(out) in rep["stopped"]["finish_with"]
    assert not list(out.glob(".*partial*")) and not list((out / "checkpoints").glob(".*tmp*"))   # no half files
    if stage == "saving": assert _agents_equal(out / "final", ref_out / "final")       # the write was finished
    if stage in ("loading", "heldout_before", "training"): assert not (out / "final").exists()
    assert f"finish with: comlrl-nb" in err
    capsys.readouterr()
    assert main(TRAIN + ["--output-dir", str(out), "--resume"]) == 0
    done = json.loads((out / "report.json").read_text())
    assert done["complete"] is True and done["attempts"] == 2 and "stopped" not in done
    for k in ("heldout_before", "heldout_after", "heldout_change"):
        assert done[k]["mean"] == ref[k]["mean"] and done[k].get("rewards") == ref[k].get("rewards"), k
    assert done["trained"]["global_batch"] == ref["trained"]["global_batch"] == 12
    assert _agents_equal(out / "final", ref_out / "final")
    assert main(TRAIN + ["--output-dir", str(out), "--resume"]) == 0                  # nothing left to do
    assert "is complete (report.json); nothing to resume" in capsys.readouterr().out


def test_ctrl_c_in_the_heldout_check_after_training_is_kept_too(tmp_path, reference):
    import signal as S
    from comlrl_nb.cli import main
    out = tmp_path / "run"
    rc, err = _stop_at("heldout_after", out, S.SIGINT)
    assert rc == 130, err[-2000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["stopped"]["reason"] == "Ctrl-C" and (out / "final" / "agent_1").is_dir()
    assert main(TRAIN + ["--output-dir", str(out), "--resume"]) == 0
    assert json.loads((out / "report.json").read_text())["heldout_after"]["rewards"] == \
        reference[0]["heldout_after"]["rewards"]


def test_an_error_after_training_keeps_the_agents_and_resume_finishes_once_it_is_fixed(tmp_path, capsys):
    from comlrl_nb.cli import main
    rows = [{"prompt": f"Say {w}.", "answer": w} for w in ("yes", "no", "maybe", "ok")]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "held.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    flag = tmp_path / "service_down"
    (tmp_path / "r.py").write_text(
        "import os\n"
        "def says(a, b, batch_items=None):\n"
        f"    if os.path.exists({str(flag)!r}) and os.environ.get('PHASE') == 'after': raise ConnectionError('reward "
        "service down')\n"
        "    return [float(it['answer'] in x + y) for x, y, it in zip(a, b, batch_items)]\n")
    import comlrl_nb.cli as C
    measure, calls = C.heldout_reward, []
    def heldout(*a, **k):                                 # the second measurement (after training) meets the outage
        calls.append(1)
        os.environ["PHASE"] = "after" if len(calls) == 2 else "before"
        return measure(*a, **k)
    argv = ["train", "--model", "tiny", "--dataset", str(tmp_path / "rows.jsonl"), "--eval-dataset",
            str(tmp_path / "held.jsonl"), "--reward", f"{tmp_path}/r.py:says", "--output-dir", str(tmp_path / "run"),
            "--heldout-samples", "2", "--set", "progress_bar=false", "save_plot=false"]
    flag.write_text("down")
    try:
        C.heldout_reward = heldout
        assert main(argv) != 0
    finally:
        C.heldout_reward = measure
        os.environ.pop("PHASE", None)
    rep = json.loads((tmp_path / "run" / "report.json").read_text())
    assert rep["stopped"]["phase"] == "heldout_after" and "reward service down" in rep["stopped"]["reason"]
    assert "final/ (the trained agents)" in rep["stopped"]["kept"]
    flag.unlink()                                          # the service is back
    capsys.readouterr()
    assert main(argv + ["--resume"]) == 0
    done = json.loads((tmp_path / "run" / "report.json").read_text())
    assert done["complete"] and done["heldout_before"] == rep["heldout_before"] and "heldout_after" in done
    assert "resuming: training is done" in capsys.readouterr().out


def test_resume_needs_a_run_and_a_fresh_run_refuses_a_stopped_one(tmp_path, capsys):
    from comlrl_nb.cli import main
    assert main(TRAIN + ["--output-dir", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err
    out = tmp_path / "run"
    rc, _ = _stop_at("heldout_before", out)
    assert rc == 143
    assert main(TRAIN + ["--output-dir", str(out)]) == 2                        # a fresh run over it: refused
    assert "already holds another run (report.json)" in capsys.readouterr().err
