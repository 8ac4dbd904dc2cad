"""The catalogue of bad inputs and faults: each gets an error that names the problem and the fix, early, and no work is lost."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, MARLOOTrainer, make_tiny_model, read_metrics
from comlrl_nb.engine import CheckpointManager

PROMPTS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_model()


# ------------------------------------------------------------------ config fields: values and types
CONFIG_CASES = [
    (dict(num_agents=0), "num_agents=0 is invalid: must be >= 1"),
    (dict(num_agents="2"), "num_agents='2' is invalid: expected an integer (got str)"),
    (dict(num_turns=0), "num_turns=0 is invalid"),
    (dict(num_train_epochs=1.5), "num_train_epochs=1.5 is invalid: expected an integer"),
    (dict(agent_learning_rate=0), "agent_learning_rate=0 is invalid: must be > 0"),
    (dict(agent_learning_rate="1e-5"), "expected a number (got str)"),
    (dict(logging_steps=0), "logging_steps=0"),
    (dict(num_generations=1), "num_generations=1 is invalid: must be >= 2"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(temperature=-1.0), "temperature=-1.0 is invalid: must be >= 0"),
    (dict(top_p=0.0), "top_p=0.0 is invalid: must be > 0"),
    (dict(top_k=0), "top_k=0 is invalid: must be >= 1"),
    (dict(discount=1.5), "discount=1.5 is invalid: must be <= 1"),
    (dict(early_termination_threshold="low"), "early_termination_threshold='low'"),
    (dict(rollout_buffer_size=0), "rollout_buffer_size=0"),
    (dict(train_batch_size=3), "train_batch_size=3 is larger than rollout_buffer_size=2"),
    (dict(eval_interval=-1), "eval_interval=-1"),
    (dict(eval_num_samples=-2), "eval_num_samples=-2"),
    (dict(eval_batch_size=0), "eval_batch_size=0"),
    (dict(joint_mode="product"), "joint_mode='product' is invalid: use one of aligned, cross"),
    (dict(advantage_mode="gae"), "advantage_mode='gae' is invalid: use one of mean, raw, rloo, max"),
    (dict(advantage_normalization=1), "advantage_normalization=1 is invalid: expected True or False"),
    (dict(parallel_training="ddp"), "parallel_training='ddp' is invalid: use one of none, mp"),
    (dict(parallel_training="mp"), "needs agent_devices"),
    (dict(agent_devices=["cpu", "cpu", "cpu"]), "agent_devices has 3 entries for 2 agents"),
    (dict(agent_devices="tpu:9"), "agent_devices"),
    (dict(reference_kl_coef=-0.1), "reference_kl_coef=-0.1"),
    (dict(seed=-1), "seed=-1"),
    (dict(rollout_batch_size=0), "rollout_batch_size=0"),
    (dict(save_steps=-2), "save_steps=-2"),
    (dict(save_total_limit=0), "save_total_limit=0"),
    (dict(autocast_dtype="int4"), "autocast_dtype='int4'"),
    (dict(max_grad_norm=0.0), "max_grad_norm=0.0 is invalid: must be > 0"),
]


@pytest.mark.parametrize("kw, msg", CONFIG_CASES, ids=[next(iter(k)) + "-" + str(i) for i, (k, _) in enumerate(CONFIG_CASES)])
def test_config_rejects(kw, msg):
    with pytest.raises(ValueError) as e:
        MAGRPOConfig(**kw)
    assert msg in str(e.value), str(e.value)
    assert "MAGRPOConfig" in str(e.value)


# ------------------------------------------------------------------ agents, datasets, formatters
def _trainer(tiny, **kw):
    m, tok = tiny
    base = dict(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=PROMPTS,
                args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=4, progress_bar=False, save_steps=-1, output_dir="/tmp/unused"))
    base.update(kw)
    return MAGRPOTrainer(**base)


TRAINER_CASES = [
    (dict(num_agents=3, args=MAGRPOConfig()), "num_agents=3 but args.num_agents=2; make them agree"),
    (dict(agents=[None] * 3), "3 agents were given but args.num_agents=2"),
    (dict(tokenizer=None), "preloaded model objects need tokenizer="),
    (dict(formatters=[str.upper] * 3), "got 3 formatters for 2 agents"),
    (dict(formatters=["not callable", str]), "formatters[0] must be callable"),
    (dict(train_dataset=[]), "train_dataset is empty"),
    (dict(train_dataset=[{"question": "hi"}]), "reads item['prompt'], but the item has ['question']"),
    (dict(train_dataset=[{"prompt": 42}]), "item['prompt'] must be a string, got int"),
    (dict(train_dataset=["a plain string"]), "items must be dicts"),
    (dict(train_dataset=42), "must be a datasets.Dataset or a list of dicts"),
    (dict(eval_dataset=[]), "eval_dataset is empty"),
    (dict(formatters=lambda it: 7), "returned int; it must return the prompt string"),
    (dict(reward_func=None), "reward_func is required"),
    (dict(reward_func="score"), "reward_func must be callable"),
    (dict(reward_func=lambda a, b, c, d: [0.0]), "takes 4 positional parameters (4 required) but there are 2 agents"),
    (dict(reward_processor=3), "reward_processor must be callable"),
    (dict(eval_aggregator=lambda m, num_turns: {}), "eval_logger and eval_aggregator go together"),
    (dict(args={"num_generations": 2}), "args must be a MAGRPOConfig"),
    (dict(args=MAGRPOConfig(num_turns=2)), "num_turns=2 needs external_transition="),
]


@pytest.mark.parametrize("kw, msg", TRAINER_CASES, ids=lambda x: str(x)[:40] if isinstance(x, str) else None)
def test_trainer_rejects(tiny, kw, msg):
    with pytest.raises((ValueError, TypeError, KeyError)) as e:
        _trainer(tiny, **kw)
    assert msg in str(e.value), str(e.value)


def test_unknown_model_id_offline_says_so():
    with pytest.raises(OSError) as e:
        MAGRPOTrainer(agent_model="no-such-org/no-such-model-xyz", reward_func=vowels)
    msg = str(e.value)
    assert "no-such-org/no-such-model-xyz" in msg and "offline" in msg and "local path" in msg


def test_tokenizer_without_pad_token_falls_back_to_eos(tiny):
    m, tok = make_tiny_model()
    tok.pad_token = None
    tr = _trainer((m, tok))
    assert tr.tokenizers[0].pad_token_id == tok.eos_token_id
    ro = tr.rollout(PROMPTS[:1], [0], ("t", 0))                        # borders come from masks, not from the pad id
    assert all(isinstance(t, str) for t in ro["comps"][0].texts)


# ------------------------------------------------------------------ reward functions at run time
REWARD_CASES = [
    (lambda a, b: [0.5], "returned 1 values for 4 joint responses; if it scores one joint response per call, set reward_batched=False"),
    (lambda a, b: None, "returned NoneType"),
    (lambda a, b: [float("nan")] * len(a), "returned nan at position 0; rewards must be finite"),
    (lambda a, b: [float("inf")] * len(a), "returned inf"),
    (lambda a, b: ["high"] * len(a), "returned 'high' (str) at position 0; rewards must be numbers"),
    (lambda a, b: torch.zeros(len(a), 2), "returned an array of shape (4, 2)"),
    (lambda a, b: 1 / 0, "raised ZeroDivisionError"),
]


@pytest.mark.parametrize("fn, msg", REWARD_CASES)
def test_bad_reward_stops_the_run_before_any_update(tiny, tmp_path, fn, msg):
    tr = _trainer(tiny, reward_func=fn, args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=4, progress_bar=False, rollout_batch_size=1,
                                                           save_steps=-1, output_dir=str(tmp_path)))
    before = [p.detach().clone() for p in tr.agents[0].parameters()]
    with pytest.raises(ValueError) as e:
        tr.train()
    assert msg in str(e.value), str(e.value)
    assert all(torch.equal(x, y) for x, y in zip(before, tr.agents[0].parameters()))


@pytest.mark.parametrize("out, msg", [("next", "returned str; it must return a list of 2"), (["only one"], "returned 1 prompts for 2 agents"),
                                      ([1, 2], "returned int for agent 0")])
def test_bad_transition(tiny, tmp_path, out, msg):
    tr = _trainer(tiny, external_transition=lambda **kw: out,
                  args=MAGRPOConfig(num_turns=2, early_termination_threshold=None, max_new_tokens=4, progress_bar=False,
                                    save_steps=-1, output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="external transition") as e:
        tr.train()
    assert msg in str(e.value)


# ------------------------------------------------------------------ checkpoints
def test_checkpoint_from_another_algorithm_or_agent_count(tiny, tmp_path):
    tr = _trainer(tiny, args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=4, progress_bar=False, save_steps=2, output_dir=str(tmp_path)))
    tr.train()
    m, tok = tiny
    other = MARLOOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=PROMPTS,
                          args=MAGRPOConfig(output_dir=str(tmp_path), progress_bar=False, max_new_tokens=4))
    with pytest.raises(ValueError, match="written by magrpo, not marloo; resume it with the same trainer"):
        other.train(resume_from_checkpoint=True)
    three = MAGRPOTrainer(agents=[m, m, m], tokenizer=tok, reward_func=lambda a, b, c: [0.0] * len(a), train_dataset=PROMPTS,
                          args=MAGRPOConfig(num_agents=3, output_dir=str(tmp_path), progress_bar=False, max_new_tokens=4))
    with pytest.raises(ValueError, match="holds 2 agents but this trainer has 3"):
        three.train(resume_from_checkpoint=True)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        _trainer(tiny, args=MAGRPOConfig(output_dir=str(tmp_path), progress_bar=False)).train(resume_from_checkpoint=tmp_path / "nowhere")
    empty = tmp_path / "empty"
    with pytest.raises(FileNotFoundError, match="no complete checkpoint under"):
        _trainer(tiny, args=MAGRPOConfig(output_dir=str(empty), progress_bar=False)).train(resume_from_checkpoint=True)


# ------------------------------------------------------------------ faults: kill, Ctrl-C, full disk
SCRIPT = textwrap.dedent('''
    import sys, torch
    torch.set_num_threads(1)
    from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, make_tiny_model
    def vowels(a, b):
        f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
        return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]
    m, tok = make_tiny_model()
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels,
                       train_dataset=[{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]] * 3,
                       args=MAGRPOConfig(num_train_epochs=int(sys.argv[3]) if len(sys.argv) > 3 else 1, max_new_tokens=4, progress_bar=False, save_steps=1, save_total_limit=3, rollout_batch_size=1,
                                         output_dir=sys.argv[1], agent_learning_rate=1e-3))
    tr.train(resume_from_checkpoint=(len(sys.argv) > 2 and sys.argv[2] == "resume") or None)
    print("DONE", tr.state["global_batch"])
''')


def _script(tmp_path):
    p = tmp_path / "train_script.py"
    p.write_text(SCRIPT)
    return p


def test_sigkill_during_checkpoint_writes_keeps_the_previous_ones(tmp_path):
    import time
    script, out = _script(tmp_path), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:                                       # wait until at least two checkpoints exist
        done = CheckpointManager(out / "checkpoints").complete() if (out / "checkpoints").exists() else []
        if len(done) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    complete = CheckpointManager(out / "checkpoints").complete()
    assert complete, "no complete checkpoint survived"
    for p in complete:                                                  # every checkpoint that claims completeness loads
        torch.load(p / "state.pt", weights_only=False)
    r = subprocess.run([sys.executable, str(script), str(out), "resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "DONE 12" in r.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert [x["batch"] for x in rows] == list(range(1, 13))            # nothing lost, nothing twice


def test_ctrl_c_saves_a_checkpoint_and_exits(tmp_path):
    import time
    script, out = _script(tmp_path), tmp_path / "run"
    # 50 epochs: long enough that the interrupt lands inside the training loop
    proc = subprocess.Popen([sys.executable, str(script), str(out), "fresh", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out_text, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "interrupted: saving a checkpoint" in err
    latest = CheckpointManager(out / "checkpoints").latest()
    assert latest is not None
    assert "DONE" not in out_text and len(read_metrics(out / "metrics.jsonl")) < 600     # stopped early, not at the end


def test_full_disk_gives_a_clear_error_and_no_corrupt_file(tmp_path):
    code = textwrap.dedent(f'''
        import resource, json, sys
        from comlrl_nb.core import atomic_write_json
        atomic_write_json({str(tmp_path / "x.json")!r}, {{"old": True}})
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
        import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        try:
            atomic_write_json({str(tmp_path / "x.json")!r}, {{"new": "y" * 10000}})
        except OSError as e:
            print("ERROR", e); sys.exit(3)
    ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "File too large" in r.stdout, (r.stdout, r.stderr[-1000:])
    assert json.loads((tmp_path / "x.json").read_text()) == {"old": True}          # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]                    # no temp file left


# ------------------------------------------------------------------ command line
@pytest.mark.parametrize("argv, msg", [
    (["train", "--algo", "ppo"], "unknown --algo 'ppo'"),
    (["train", "--model", "tiny", "--set", "learning_rate=1e-3"], "unknown config key 'learning_rate'"),
    (["train", "--model", "tiny", "--set", "temperature=hot"], "temperature='hot' is invalid"),
    (["train", "--task", "chess"], "unknown task 'chess'"),
    (["train", "--config", "/no/such/file.yaml"], "does not exist"),
    (["train", "--set", "novalue"], "--set expects KEY=VALUE"),
])
def test_cli_errors(argv, msg, capsys):
    from comlrl_nb.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1                                # one line, no traceback


def test_sigkill_during_replay_writes_leaves_old_or_new_file(tmp_path):
    "A writer is killed at random moments while rewriting a large replay file; the file always parses, old or new."
    import random
    import time
    code = textwrap.dedent(f'''
        from comlrl_nb.replay import ReplayBuffer
        rb = ReplayBuffer({str(tmp_path / "replay")!r})
        i = 0
        while True:
            i += 1
            rb.register(1, [{{"gen": i, "text": "x" * 2000, "j": j}} for j in range(300)])
            print(i, flush=True)
    ''')
    rng = random.Random(0)
    path = tmp_path / "replay" / "iteration_0001.json"
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()                                   # at least one complete write exists
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL); proc.wait()
        data = json.loads(path.read_text())                      # never a partial file
        assert data["num_pairs"] == len(data["pairs"]) == 300 and len({p["gen"] for p in data["pairs"]}) == 1
