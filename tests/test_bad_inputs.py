"""The catalogue of bad inputs and faults: each gets an error that names the problem and the fix, early, and no work is
lost."""
import json
import shutil
import os
import signal
import subprocess
import sys
import textwrap
import time
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
    (dict(agent_learning_rate="fast"), "expected a number (got str)"),
    (dict(logging_steps=0), "logging_steps=0"),
    (dict(num_generations=1), "num_generations=1 is invalid: must be >= 2"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(temperature=-1.0), "temperature=-1.0 is invalid: must be >= 0"),
    (dict(top_p=0.0), "top_p=0.0 is invalid: must be > 0"),
    (dict(top_k=-1), "top_k=-1 is invalid: must be >= 0"),
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
    (dict(parallel_training="auto"), "parallel_training='auto' is invalid: use one of none, mp"),
    (dict(parallel_training="invalid"), "parallel_training='invalid' is invalid: use one of none, mp"),
    (dict(reference_devices=["cpu"] * 3), "reference_devices length 3 does not fit 2 agents"),
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


@pytest.mark.parametrize("kw, msg", CONFIG_CASES,
                         ids=[next(iter(k)) + "-" + str(i) for i, (k, _) in enumerate(CONFIG_CASES)])
def test_config_rejects(kw, msg):
    with pytest.raises(ValueError) as e:
        MAGRPOConfig(**kw)
    assert msg in str(e.value), str(e.value)
    assert "MAGRPOConfig" in str(e.value)


def test_top_k_zero_is_accepted_and_means_no_filtering():
    "top_k=0 is comlrl 1.4.3's (and HF generate's) spelling of 'no top-k': the config stores None, and sampling with 0 "
    "draws from the whole vocabulary exactly as with None."
    from comlrl_nb.generation import filter_and_sample
    assert MAGRPOConfig(top_k=0).top_k is None and MAGRPOConfig(top_k=None).top_k is None
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(64)]
    off = filter_and_sample(logits, gens(), 1.0, 1.0, 0)
    assert torch.equal(off, filter_and_sample(logits, gens(), 1.0, 1.0, None))
    top1 = filter_and_sample(logits, gens(), 1.0, 1.0, 1)                 # a real top-k still filters
    assert torch.equal(top1, logits.argmax(-1)) and not torch.equal(off, top1)


@pytest.mark.parametrize("spelling", [None, "null", "NULL", " none ", "None"])
def test_parallel_training_accepts_the_library_spellings_of_none(spelling):
    assert MAGRPOConfig(parallel_training=spelling).parallel_training == "none"
    assert MAGRPOConfig(parallel_training=" MP ", agent_devices="cpu").parallel_training == "mp"


# ------------------------------------------------------------------ agents, datasets, formatters
def _trainer(tiny, **kw):
    m, tok = tiny
    base = dict(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=PROMPTS,
                args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=4, progress_bar=False, save_steps=-1,
                                  output_dir="/tmp/unused"))
    base.update(kw)
    return MAGRPOTrainer(**base)


TRAINER_CASES = [
    (dict(num_agents=3, args=MAGRPOConfig(num_agents=4)), "num_agents=3 but args.num_agents=4; make them agree"),
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
    (lambda a, b: [0.5, 0.5],
     "returned 2 values for 4 joint responses; if it scores one joint response per call, set reward_batched=False"),
    (lambda a, b: None, "returned NoneType"),
    (lambda a, b: [float("nan")] * len(a), "returned nan at position 0; rewards must be finite"),
    (lambda a, b: [float("inf")] * len(a), "returned inf"),
    (lambda a, b: ["high"] * len(a), "returned 'high' (str) at position 0; rewards must be numbers"),
    (lambda a, b: torch.zeros(len(a), 2), "returned an array of shape (4, 2)"),
    (lambda a, b: 1 / 0, "raised ZeroDivisionError"),
]


@pytest.mark.parametrize("fn, msg", REWARD_CASES)
def test_bad_reward_stops_the_run_before_any_update(tiny, tmp_path, fn, msg):
    tr = _trainer(tiny, reward_func=fn,
                  args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=4, progress_bar=False, rollout_batch_size=1,
                                    save_steps=-1, output_dir=str(tmp_path)))
    before = [p.detach().clone() for p in tr.agents[0].parameters()]
    with pytest.raises(ValueError) as e:
        tr.train()
    assert msg in str(e.value), str(e.value)
    assert all(torch.equal(x, y) for x, y in zip(before, tr.agents[0].parameters()))


@pytest.mark.parametrize("out, msg",
                         [("next", "returned str; it must return a list of 2"),
                          (["only one"], "returned 1 prompts for 2 agents"), ([1, 2], "returned int for agent 0")])
def test_bad_transition(tiny, tmp_path, out, msg):
    tr = _trainer(tiny, external_transition=lambda **kw: out,
                  args=MAGRPOConfig(num_turns=2, early_termination_threshold=None, max_new_tokens=4, progress_bar=False,
                                    save_steps=-1, output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="external transition") as e:
        tr.train()
    assert msg in str(e.value)


# ------------------------------------------------------------------ checkpoints
def test_checkpoint_from_another_algorithm_or_agent_count(tiny, tmp_path):
    tr = _trainer(tiny, args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=4, progress_bar=False, save_steps=2,
                                          output_dir=str(tmp_path)))
    tr.train()
    m, tok = tiny
    other = MARLOOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=PROMPTS,
                          args=MAGRPOConfig(output_dir=str(tmp_path), progress_bar=False, max_new_tokens=4))
    with pytest.raises(ValueError, match="written by magrpo, not marloo; resume it with the same trainer"):
        other.train(resume_from_checkpoint=True)
    three = MAGRPOTrainer(agents=[m, m, m], tokenizer=tok, reward_func=lambda a, b, c: [0.0] * len(a),
                          train_dataset=PROMPTS,
                          args=MAGRPOConfig(num_agents=3, output_dir=str(tmp_path), progress_bar=False,
                                            max_new_tokens=4))
    with pytest.raises(ValueError, match="holds 2 agents but this trainer has 3"):
        three.train(resume_from_checkpoint=True)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        _trainer(tiny, args=MAGRPOConfig(output_dir=str(tmp_path), progress_bar=False)).train(
            resume_from_checkpoint=tmp_path / "nowhere")
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
                       train_dataset=[{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe",
                                                              "Describe a city"]] * 3,
                       args=MAGRPOConfig(num_train_epochs=int(sys.argv[3]) if len(sys.argv) > 3 else 1,
                                         max_new_tokens=4, progress_bar=False, save_steps=1, save_total_limit=3,
                                         rollout_batch_size=1, output_dir=sys.argv[1], agent_learning_rate=1e-3))
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
    for p in complete:  # every checkpoint that claims completeness loads
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
    proc = subprocess.Popen([sys.executable, str(script), str(out), "fresh", "50"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
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
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        data = json.loads(path.read_text())                      # never a partial file
        assert data["num_pairs"] == len(data["pairs"]) == 300 and len({p["gen"] for p in data["pairs"]}) == 1


# ------------------------------------------------------------------ code rewards the model cannot forge
from comlrl_nb.envs.code import code_level_reward, load_problems, problem_item  # noqa: E402
from comlrl_nb.sandbox import run_sandboxed, run_tests  # noqa: E402

_PROBLEM = load_problems()[0]                                   # primes_below(n), helper aux(k)
_AUX = "```python\n" + _PROBLEM["reference_aux"] + "```"
_BANK = str(Path(__import__("comlrl_nb").__file__).resolve().parent / "data" / "code_problems.json")
_WRONG = "    return [-1]\n"
EXPLOITS = {
    "always-equal object": "class Any:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                           "def primes_below(n):\n    aux(n)\n    return Any()\n",
    "list subclass with forged __eq__": "class L(list):\n    def __eq__(self, o): return True\n"
                                        "def primes_below(n):\n    aux(n)\n    return L()\n",
    "int subclass in a list": "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
                              "def primes_below(n):\n    aux(n)\n    return [I(0)]\n",
    "forged result records on every fd": "import os\nfor fd in range(3, 64):\n    for i in range(4):\n        try: "
                                         "os.write(fd, ('{\"test\": %d, \"error\": null}\\n' % i).encode())\n        "
                                         "except OSError: pass\ndef primes_below(n):\n    aux(n)\n" + _WRONG,
    "nonce read from the harness frames": "import sys, os\nf, found = sys._getframe(), []\nwhile f is not None:\n"
                                          "    found += [v for k, v in f.f_locals.items() if k in ('nonce', "
                                          "'payload')]\n    f = f.f_back\nfor fd in range(3, 64):\n    for i in "
                                          "range(4):\n        try: os.write(fd, (repr(found) + '{\"test\": %d, "
                                          "\"error\": null}\\n' % i).encode())\n        except OSError: pass\ndef "
                                          "primes_below(n):\n    aux(n)\n" + _WRONG,
    "harness patched through gc": "import gc\nfor o in gc.get_objects():\n    if callable(o) and getattr(o, "
                                  "'__name__', '') in ('_run_one_test', '_ask', 'emit', '_dec', 'timed'):\n        "
                                  "o.__code__ = (lambda *a, **k: None).__code__\ndef primes_below(n):\n    aux(n)\n"
                                  + _WRONG,
    "test strings searched in memory": "import gc\nseen = [o for o in gc.get_objects() if isinstance(o, str) and "
                                       "'primes_below(' in o]\ndef primes_below(n):\n    aux(n)\n    for s in "
                                       "seen:\n        if 'primes_below(%d) ==' % n in s:\n            return "
                                       "eval(s.split('==', 1)[1])\n" + _WRONG,
    "answers read from the problem bank": f"import json\nbank = json.load(open({_BANK!r}))['problems']\n"
                                          "ns = {}\nexec(bank[0]['reference_aux'] + bank[0]['reference_main'], ns)\n"
                                          "def primes_below(n):\n    aux(n)\n    return ns['primes_below'](n)\n",
    "answers written ahead into the answer pipe": "import os, json\nfor fd in range(3, 64):\n    for i in range(50):\n"
                                                  "        try: os.write(fd, (json.dumps({'id': '%016x' % i, 'ok': "
                                                  "{'l': []}}) + '\\n').encode())\n        except OSError: pass\ndef "
                                                  "primes_below(n):\n    aux(n)\n" + _WRONG,
    "harness killed at load": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef primes_below(n):\n    "
                              "aux(n)\n" + _WRONG,
    "exit(0) inside the function": "import os\ndef primes_below(n):\n    aux(n)\n    os._exit(0)\n",
    "harness memory through /proc": "import os\nfor p in ('/proc/%d/mem' % os.getppid(), '/proc/%d/fd/3' % "
                                    "os.getppid()):\n    try: open(p, 'rb').read(1); print('OPENED', p)\n    except "
                                    "OSError: pass\ndef primes_below(n):\n    aux(n)\n" + _WRONG,
}


def test_reference_solutions_get_full_points():
    probs = load_problems()
    rewards = code_level_reward(["```python\n" + p["reference_aux"] + "```" for p in probs],
                                ["```python\n" + p["reference_main"] + "```" for p in probs],
                                [problem_item(p) for p in probs])
    assert rewards == [4.0] * len(probs)


@pytest.mark.parametrize("name", list(EXPLOITS))
def test_code_exploit_earns_no_test_points(name):
    main = "```python\n" + EXPLOITS[name] + "```"
    (r,) = code_level_reward([_AUX], [main], [problem_item(_PROBLEM)])
    assert r <= 1.5, (name, r)  # aux + main defined + runs at most: no test, no collaboration points
    rep = run_tests(_PROBLEM["reference_aux"] + EXPLOITS[name], _PROBLEM["tests"])
    assert rep.passed == [False] * len(_PROBLEM["tests"]), (name, rep.errors)
    assert "OPENED" not in rep.result.stdout  # the harness's memory and descriptors are out of reach


def test_hostile_objects_are_reported_not_compared():
    code = "class Bad:\n    def __eq__(self, o): raise SystemExit\n    def __repr__(self): raise SystemExit\n    " \
           "__hash__ = None\n" \
           "def f():\n    return Bad()\ndef g():\n    return {1: Bad()}\n"
    rep = run_tests(code, ["assert f() == 1", "assert g() == {1: 1}", "assert f() is not None"])
    assert rep.passed == [False, False, False]
    assert all("not a plain value" in e for e in rep.errors), rep.errors


def test_builtins_in_tests_cannot_be_replaced():
    code = "abs = lambda x: 0\nlen = lambda x: 3\ndef f(x):\n    return 100\n"
    rep = run_tests(code, ["assert abs(f(1) - 1.5) < 1e-6", "assert len(str(f(1))) == 3"])
    assert rep.passed == [False, True]                          # 100 is honestly 3 characters long


def test_test_harness_semantics_kept():
    code = "import math\nLIMIT = 10\ndef f(x, scale=1):\n    if x < 0: raise ValueError('negative')\n    return [x * " \
           "scale, {'a': (1, 2.5)}]\n" \
           "def loop():\n    while True: pass\n"
    tests = ["assert f(2, scale=3) == [6, {'a': (1, 2.5)}]", "assert LIMIT == 10",
             "try:\n    f(-1)\n    assert False\nexcept ValueError as e:\n    assert str(e) == 'negative'",
             "assert loop() is None", "assert f(1)[0] == 1",
             "def check(candidate):\n    assert candidate(4)[0] == 4\ncheck(f)"]
    rep = run_tests(code, tests, test_timeout=0.5)
    assert rep.passed == [True, True, True, False, True, True], rep.errors
    assert rep.errors[3] == "timed out"


# ------------------------------------------------------------------ a sandbox that contains
IPC = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n")


def _host_shm_keys():
    return {int(line.split()[0]) for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:] if line.strip()}


def test_sysv_shared_memory_does_not_outlive_the_run():
    before = _host_shm_keys()
    r = run_sandboxed(IPC + "i = libc.shmget(4242, 1 << 20, 0o1666)\nprint('created', i >= 0)\n"
                      "print('again', libc.shmget(4242, 0, 0o666) >= 0)")
    assert r.stdout == "created True\nagain True\n", (r.stdout, r.stderr)
    r2 = run_sandboxed(IPC + "print('found', libc.shmget(4242, 0, 0o666) >= 0)")
    assert r2.stdout == "found False\n"                           # a new IPC namespace per run
    assert 4242 not in _host_shm_keys() - before and "ipcns" in r.isolation


def test_sysv_shared_memory_counts_against_memory_mb():
    code = IPC + ("total = 0\nfor k in range(64):\n    i = libc.shmget(1000 + k, 32 << 20, 0o1600)\n    if i < "
                  "0: break\n    a = libc.shmat(i, None, 0)\n    if a in (None, ctypes.c_void_p(-1).value): break\n"
                  "    ctypes.memset(a, 1, 32 << 20); libc.shmdt(ctypes.c_void_p(a)); total += 32\nprint(total)")
    r = run_sandboxed(code, memory_mb=128, timeout=10)
    assert int(r.stdout.strip() or 0) <= 128, r.stdout            # not 64 x 32 MB = 2 GB


def test_run_lock_and_host_directories_are_not_there():
    mark = "comlrl_nb_persist_" + os.urandom(4).hex()
    code = ("import os\nfor d in ['/run/lock', '/var/lock', '/run', '/work', '/home', '/root/.cache']:\n"
            f"    try: open(os.path.join(d, '{mark}'), 'w').write('x'); print('KEPT', d)\n"
            "    except OSError as e: print('no', type(e).__name__)\n")
    r = run_sandboxed(code)
    assert "KEPT" not in r.stdout and r.stdout.count("no ") == 6, r.stdout
    assert not any(Path(d, mark).exists() for d in ["/run/lock", "/var/lock", "/run"])


def test_host_unix_sockets_are_unreachable(tmp_path):
    import socket
    path = str(tmp_path / "svc.sock")
    srv, abstract = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    abstract.bind("\0comlrl_nb_test_" + os.urandom(4).hex())
    abstract.listen(1)
    try:
        code = ("import socket\nfor a in [%r, %r, '/run/systemd/private', '/var/run/docker.sock']:\n"
                "    s = socket.socket(socket.AF_UNIX)\n    try: s.connect(a); print('CONNECTED', a)\n"
                "    except OSError as e: print('no', type(e).__name__)\n") % (path, abstract.getsockname())
        r = run_sandboxed(code)
        assert "CONNECTED" not in r.stdout and r.stdout.count("no ") == 4, r.stdout
    finally:
        srv.close()
        abstract.close()


def test_scratch_quota_holds_whatever_tmpdir_is(monkeypatch):
    import tempfile
    other = tempfile.mkdtemp(dir="/var/tmp")                    # TMPDIR outside /tmp
    monkeypatch.setattr(tempfile, "tempdir", other)
    try:
        r = run_sandboxed("import os\nn = 0\ntry:\n    for i in range(100):\n        open('f%d' % i, 'wb').write(b'x' "
                          "* (1 << 20)); n += 1\nexcept OSError as e: print(type(e).__name__, e.errno)\nprint(n)",
                          file_size_mb=4)
        assert int(r.stdout.split()[-1]) <= 16 and "OSError 28" in r.stdout, r.stdout      # ENOSPC at the 16 MB cap
        assert os.listdir(other) == []
    finally:
        os.rmdir(other)


def test_site_packages_and_problem_bank_are_hidden():
    import site
    dirs = [d for d in site.getsitepackages() + [str(Path(__import__("comlrl_nb").__file__).parents[1])]
            if os.path.isdir(d)]
    code = (f"import sys, os\nsys.path[:0] = {dirs!r}\nfor m in ['torch', 'numpy', 'comlrl_nb']:\n"
            "    try: __import__(m); print('IMPORTED', m)\n    except ImportError: print('no', m)\n"
            f"print(os.path.exists({_BANK!r}))")
    r = run_sandboxed(code)
    assert r.stdout == "no torch\nno numpy\nno comlrl_nb\nFalse\n", (r.stdout, r.stderr)


def test_weak_mode_warns_on_every_run_and_blocks_bypasses(caplog):
    import logging
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    codes = ["import _xxsubinterpreters", "import _posixsubprocess", "import subprocess",
             "import os\nopen('/proc/self/mem', 'rb')"]
    for c in codes:
        r = run_sandboxed(c, namespaces=False)
        assert r.returncode == 1 and "not allowed" in r.stderr and "weak" in r.isolation, (c, r.stderr)
    assert sum("WEAK isolation" in m for m in caplog.messages) == len(codes)


def test_full_mode_is_the_default():
    r = run_sandboxed("pass")
    assert {"netns", "pidns", "mntns", "ipcns", "private-root"} <= set(r.isolation) and "weak" not in r.isolation


# ------------------------------------------------------------------ secrets that stay secret
import base64  # noqa: E402
import logging  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from comlrl_nb.api import (APIComparatorClient, APIComparatorConfig, APIError, MockAPIServer, redact,  # noqa: E402
                           scrub_secrets)

KEY = "sk-live-" + "9f3b2c7d1e8a4b6c0d5e2f7a1b3c9d8e"
FAST = dict(comparator_api_backoff=0.001, comparator_api_backoff_cap=0.01, comparator_api_max_retries=1)


def _no_fragment(text, secret=KEY, k=8):
    "No run of k characters of the secret (or of its base64) in text."
    variants = [secret, base64.b64encode(secret.encode()).decode(),
                base64.b64encode(b"user:" + secret.encode()).decode()[8:-4]]
    return not any(v[i:i + k] in text for v in variants for i in range(len(v) - k + 1))


def test_key_with_trailing_newline_is_cleaned_and_never_echoed():
    with MockAPIServer() as srv:
        c = APIComparatorClient(comparator_api_url=srv.url(), comparator_api_key=KEY + "\n", **FAST)
        assert c.generate("hi", 1) and srv.requests[-1]["headers"]["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("bad",
                         [KEY[:10] + "\n" + KEY[10:], KEY + "\x00", "sk-ключ-" + KEY[8:], KEY[:20] + "\r\nX-Evil: 1"])
def test_malformed_key_is_refused_without_echo(bad):
    with pytest.raises(ValueError) as e:
        APIComparatorConfig(comparator_api_url="http://127.0.0.1:9/x", comparator_api_key=bad)
    assert "control or non-ASCII character at position" in str(e.value) and _no_fragment(str(e.value), bad)


def test_malformed_env_key_is_refused_without_echo(monkeypatch):
    monkeypatch.setenv("COMLRL_NB_TEST_KEY", KEY[:12] + "\x1b[2J" + KEY[12:])
    with pytest.raises(ValueError) as e:
        APIComparatorClient(comparator_api_url="http://127.0.0.1:9/x", comparator_api_key_env="COMLRL_NB_TEST_KEY")
    assert "$COMLRL_NB_TEST_KEY" in str(e.value) and _no_fragment(str(e.value))


@pytest.mark.parametrize("echo",
                         [KEY[2:-2], KEY[:14] + "..." + KEY[-14:], base64.b64encode(b"user:" + KEY.encode()).decode(),
                          base64.urlsafe_b64encode(KEY.encode()).decode(), KEY.upper().lower()[3:]])
def test_server_echoing_parts_of_the_key_is_redacted(echo, caplog):
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    with MockAPIServer() as srv:
        c = APIComparatorClient(comparator_api_url=srv.url(), comparator_api_key=KEY, **FAST)
        srv.script(429, {"error": f"slow down {echo}"}, headers={"Retry-After": "0"})
        srv.script(401, {"error": f"bad key {echo}"})
        with pytest.raises(APIError) as e:
            c.generate("hi", 1)
    assert e.value.status == 401 and _no_fragment(str(e.value)) and _no_fragment(caplog.text), \
        (str(e.value), caplog.text)


def test_redact_fragments_but_keeps_other_text():
    assert redact(f"error near {KEY[5:30]} at line 3", [KEY]) == "error near *** at line 3"
    assert redact("nothing secret here", [KEY]) == "nothing secret here"


def test_secret_extra_body_and_headers_hidden_everywhere():
    from comlrl_nb.trainers.iterative import MADPOIterConfig, config_record
    extra = {"api_key": KEY, "metadata": {"session_token": KEY[::-1]}, "max_tokens": 64, "seed": 1}
    cfg = APIComparatorConfig(comparator_api_url="http://127.0.0.1:9/x", comparator_api_extra_body=extra,
                              comparator_api_headers={"X-Goog-Api-Key": KEY, "X-Trace": "t1"})
    for text in (repr(cfg), json.dumps(scrub_secrets(cfg))):
        assert _no_fragment(text) and _no_fragment(text, KEY[::-1]) \
            and '"max_tokens": 64' in json.dumps(scrub_secrets(cfg))
    assert scrub_secrets(cfg)["comparator_api_headers"] == {"X-Goog-Api-Key": "***", "X-Trace": "t1"}
    it = MADPOIterConfig(comparator_policy="api", comparator_api_url="http://127.0.0.1:9/x",
                         comparator_api_extra_body=extra)
    assert _no_fragment(json.dumps(config_record(it))) and _no_fragment(repr(it))


def test_server_echoing_an_extra_body_secret_is_redacted():
    with MockAPIServer() as srv:
        c = APIComparatorClient(comparator_api_url=srv.url(), comparator_api_extra_body={"auth": {"token": KEY}},
                                **FAST)
        srv.script(400, {"error": f"unknown field auth.token={KEY}"})
        with pytest.raises(APIError) as e:
            c.generate("hi", 1)
    assert "HTTP 400" in str(e.value) and _no_fragment(str(e.value))


def _raw_server(handler):
    "A one-thread TCP server on 127.0.0.1 that runs handler(conn) for each connection."
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()
    def loop():
        while not stop.is_set():
            try: conn, _ = srv.accept()
            except OSError: return
            threading.Thread(target=lambda: _serve(conn, handler, stop), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
    return srv, stop, f"http://127.0.0.1:{srv.getsockname()[1]}/generic"


def _serve(conn, handler, stop):
    "Read the whole request (so closing never resets the connection), then answer."
    try:
        data = b""
        while b"\r\n\r\n" not in data: data += conn.recv(65536) or b"\r\n\r\n"
        head, body = data.split(b"\r\n\r\n", 1)
        length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")),
                      0)
        while len(body) < length: body += conn.recv(65536) or b" " * length
        handler(conn, stop)
        conn.shutdown(socket.SHUT_WR)
    except OSError: pass
    finally: conn.close()


def _trickle_body(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    while not stop.is_set():
        conn.sendall(b" ")
        time.sleep(0.05)


def _trickle_headers(conn, stop):
    for ch in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 10000:
        if stop.is_set(): return
        conn.sendall(bytes([ch]))
        time.sleep(0.05)


@pytest.mark.parametrize("handler", [_trickle_body, _trickle_headers])
def test_trickling_response_hits_a_total_deadline(handler):
    srv, stop, url = _raw_server(handler)
    try:
        c = APIComparatorClient(comparator_api_url=url, comparator_api_timeout=0.5, sleep=lambda s: None, **FAST)
        t0 = time.time()
        with pytest.raises(APIError) as e:
            c.generate("hi", 1)
        assert time.time() - t0 < 2.5 and "timed out" in str(e.value) and "total deadline" in str(e.value)
    finally:
        stop.set()
        srv.close()


@pytest.mark.parametrize("length", [True, False])
def test_response_size_is_capped(length):
    big = b'{"completions": ["' + b"x" * (3 << 20) + b'"]}'
    def send(conn, stop):
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + (b"Content-Length: %d\r\n" % len(big)
                                                                           if length else b"Connection: close\r\n")
        conn.sendall(head + b"\r\n" + big)
    srv, stop, url = _raw_server(send)
    try:
        c = APIComparatorClient(comparator_api_url=url, **FAST)
        c.max_response_bytes = 1 << 20
        with pytest.raises(APIError, match="max_response_bytes=1048576"):
            c.generate("hi", 1)
    finally:
        stop.set()
        srv.close()


@pytest.mark.parametrize("body", [b"[" * 100000 + b"]" * 100000, b'{"completions": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                                  b'{"completions": [[[["a"]]]]}', b"\xff\xfe not utf-8"])
def test_every_client_failure_is_an_api_error(body):
    with MockAPIServer() as srv:
        c = APIComparatorClient(comparator_api_url=srv.url(), **FAST)
        srv.script(200, body, headers={"Content-Type": "application/json"})
        with pytest.raises(APIError) as e:
            c.generate("hi", 1)
    assert "comparator API (generic" in str(e.value) and len(str(e.value)) < 1000


def test_bad_header_name_or_prefix_is_refused():
    with pytest.raises(ValueError, match="not an HTTP header name"):
        APIComparatorConfig(comparator_api_url="http://127.0.0.1:9/x", comparator_api_key_header="X Key:")
    with pytest.raises(ValueError, match="comparator_api_key_prefix is invalid"):
        APIComparatorConfig(comparator_api_url="http://127.0.0.1:9/x", comparator_api_key_prefix="Bearer\n")


# ------------------------------------------------------------------ bad data found early, with the row
from comlrl_nb.core import check_number  # noqa: E402
from comlrl_nb.dataset import as_rows, check_dataset  # noqa: E402
from comlrl_nb.engine import MetricsLogger  # noqa: E402
from comlrl_nb.rewards import (FormatterError, RewardError, RewardFunction, default_formatter,  # noqa: E402
                               format_prompt)

GOOD = [{"prompt": f"Write story {i}"} for i in range(50)]


@pytest.mark.parametrize("bad, where, msg", [
    ({"prompt": None}, 37, "item['prompt'] must be a string, got NoneType"),
    ({"question": "hi"}, 49, "reads item['prompt'], but the item has ['question']"),
    ("just text", 3, "a str, but items must be dicts"),
    ({"prompt": ""}, 10, "returned an empty prompt"),
    ({"prompt": 7}, 0, "item['prompt'] must be a string, got int"),
])
def test_every_row_is_checked_and_named(bad, where, msg):
    rows = GOOD[:where] + [bad] + GOOD[where + 1:]
    with pytest.raises((ValueError, TypeError)) as e:
        check_dataset(rows, [default_formatter, default_formatter])
    assert f"train_dataset[{where}] (row {where + 1} of 50)" in str(e.value) and msg in str(e.value), str(e.value)


def test_dataframe_and_dict_of_columns_are_rows():
    import pandas as pd
    df = pd.DataFrame({"prompt": ["a", "b", None], "answer": [1, 2, 3]})
    with pytest.raises(ValueError, match=r"train_dataset\[2\] \(row 3 of 3\).*must be a string, got float"):
        check_dataset(df, [default_formatter])
    assert check_dataset(df.iloc[:2], [default_formatter]) == [{"prompt": "a", "answer": 1},
                                                               {"prompt": "b", "answer": 2}]
    assert check_dataset({"prompt": ["x", "y"]}, [default_formatter],
                         "eval_dataset") == [{"prompt": "x"}, {"prompt": "y"}]
    with pytest.raises(ValueError, match="columns have different lengths"):
        as_rows({"prompt": ["x", "y"], "id": [1]})
    with pytest.raises(TypeError, match="a pandas DataFrame or a dict of columns is converted"):
        as_rows(iter(GOOD))


def test_formatter_exception_is_wrapped_with_agent_and_row():
    fmt = lambda it: it["text"].upper()
    with pytest.raises(FormatterError) as e:
        check_dataset([{"text": "ok", "prompt": "p"}, {"text": None, "prompt": "p"}], [fmt, default_formatter],
                      "eval_dataset")
    msg = str(e.value)
    assert "eval_dataset[1] (row 2 of 2)" in msg and "<lambda>) raised AttributeError: 'NoneType'" in msg
    with pytest.raises(FormatterError,
                       match=r"formatter of agent 2 \(.*<lambda>\) raised KeyError: missing key 'text'"):
        format_prompt(fmt, {}, 1)


def test_reward_processor_exception_is_wrapped():
    rf = RewardFunction(lambda a, b: [1.0] * len(a), 2, processor=lambda v: {}["scale"] * v)
    with pytest.raises(RewardError, match=r"reward_processor '.*<lambda>' raised KeyError on the reward 1.0"):
        rf([["x"], ["y"]])
    bad = RewardFunction(lambda a, b: [1.0] * len(a), 2, processor=lambda v: "high")
    with pytest.raises(RewardError, match="returned 'high'"):
        bad([["x"], ["y"]])


@pytest.mark.parametrize("text, value", [("5e-6", 5e-6), (" 1e-3 ", 1e-3), ("2", 2.0), ("-0.5", -0.5)])
def test_numeric_strings_accepted_for_float_fields(text, value):
    assert check_number(text, "agent_learning_rate", "MAGRPOConfig") == value
    with pytest.raises(ValueError, match="expected an integer"):
        check_number(text, "num_agents", "MAGRPOConfig", integer=True)


def test_yaml_5e_minus_6_reaches_the_config_as_a_float(tmp_path):
    from comlrl_nb.cli import build_config, load_config_file
    p = tmp_path / "c.yaml"
    p.write_text("agent_learning_rate: 5e-6\nnum_train_epochs: 2\n")
    data = load_config_file(p)
    assert data["agent_learning_rate"] == "5e-6"                             # YAML 1.1 gives a string...
    cfg = build_config(MAGRPOConfig, data)
    assert cfg.agent_learning_rate == 5e-6 and isinstance(cfg.agent_learning_rate, float)   # ...the config a float
    with pytest.raises(ValueError, match="agent_learning_rate='fast' is invalid: expected a number"):
        build_config(MAGRPOConfig, {"agent_learning_rate": "fast"})


def test_metrics_logger_takes_numpy_and_tensor_values(tmp_path):
    import numpy as np
    m = MetricsLogger(tmp_path)
    m.log({"batch": np.int64(3), "stopped": np.bool_(True), "loss": np.float32(0.5), "t": torch.tensor(2.0),
           "hist": np.array([1, 2]), "odd": {1, 2}, "big": torch.ones(2)}, step=1)
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert row["batch"] == 3 and type(row["batch"]) is int and row["stopped"] is True and row["loss"] == 0.5
    assert row["t"] == 2.0 and row["hist"] == [1, 2] and row["odd"] == "{1, 2}" and row["big"] == [1.0, 1.0]


def test_prompt_longer_than_the_context(tiny, caplog):
    from comlrl_nb.generation import context_length, generate_completions
    m, tok = tiny
    limit = context_length(m)
    assert limit == 512
    long = " ".join(["word"] * (limit + 50))
    c = generate_completions(m, tok, ["short", long], k=2, max_new_tokens=16, temperature=0.0)
    assert c.prompt_ids.shape[1] + c.completion_ids.shape[1] <= limit                 # never past the positions
    kept = tok.decode(c.prompt_ids[2][c.prompt_mask[2] == 1])                          # row 2: prompt 1, sample 0
    assert long.endswith(kept.strip()) and len(kept) < len(long)  # cut from the left: the end stays
    assert "prompt(s) longer than the 496 positions" in caplog.text and "were cut from the left" in caplog.text
    caplog.clear()
    c = generate_completions(m, tok, ["short"], k=1, max_new_tokens=limit, temperature=0.0)
    assert c.completion_ids.shape[1] <= limit // 2 and f"generating at most {limit // 2} new tokens" in caplog.text


# ------------------------------------------------------------------ never lose work, never mix runs
from comlrl_nb.replay import ReplayBuffer, iteration_path  # noqa: E402
from comlrl_nb.runs import (RunLock, Terminated, check_resume_config, config_changes, exit_status,  # noqa: E402
                            prepare_output_dir, sigterm_as_interrupt)


def _fake_run(d, batches=(1, 2)):
    ck = CheckpointManager(Path(d) / "checkpoints", algo="magrpo", num_agents=2)
    for b in batches: ck.save(b, {"w": torch.full((3,), float(b))})
    (Path(d) / "metrics.jsonl").write_text("".join(json.dumps({"batch": b}) + "\n" for b in batches))
    return ck


@pytest.mark.parametrize("what", ["checkpoints", "metrics"])
def test_fresh_run_into_a_used_dir_refuses_and_keeps_the_files(tmp_path, what):
    ck = _fake_run(tmp_path)
    if what == "metrics": shutil.rmtree(tmp_path / "checkpoints")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(FileExistsError) as e:
        prepare_output_dir(tmp_path, "magrpo")
    msg = str(e.value)
    assert "--resume" in msg and "resume_from_checkpoint=True" in msg and "fresh directory" in msg
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert prepare_output_dir(tmp_path, "magrpo", resume=True) == tmp_path


def test_default_output_dir_is_fresh_per_run_and_resume_finds_the_newest(tmp_path):
    a = prepare_output_dir(None, "maac", root=tmp_path, now=1_700_000_000)
    _fake_run(a)
    b = prepare_output_dir(None, "maac", root=tmp_path, now=1_700_000_000)
    assert a != b and b.parent == a.parent and (tmp_path / "maac" / "latest").resolve() == b.resolve()
    assert prepare_output_dir(None, "maac", resume=True, root=tmp_path) == a.resolve()      # b holds no run yet
    _fake_run(b)
    assert prepare_output_dir(None, "maac", resume=True, root=tmp_path) == b.resolve()
    with pytest.raises(FileNotFoundError, match="no run under"):
        prepare_output_dir(None, "iac", resume=True, root=tmp_path)


def test_unwritable_output_dir_is_found_before_any_work(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match=r"output_dir .*file/run is not writable"):
        prepare_output_dir(tmp_path / "file" / "run", "magrpo")
    with pytest.raises(OSError, match="is not writable"):
        prepare_output_dir("/proc/comlrl_nb_run", "magrpo")


_HOLD = "import sys, time\nfrom comlrl_nb.runs import RunLock\nRunLock(sys.argv[1]).acquire()\nprint('locked', " \
        "flush=True)\ntime.sleep(120)\n"


def test_second_live_process_is_refused_and_a_killed_ones_lock_taken_over(tmp_path, caplog):
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(RuntimeError, match=rf"in use by another run \(pid {p.pid} on "):
            RunLock(tmp_path).acquire()
    finally:
        p.kill()
        p.wait()
    with RunLock(tmp_path) as lock:
        assert lock.holder()["pid"] == os.getpid()
    assert f"took over the lock left by pid {p.pid}" in caplog.text


def test_config_change_that_breaks_exact_resume_is_named():
    saved = {"agent_learning_rate": 1e-5, "num_generations": 4, "seed": 0, "logging_steps": 1, "eval_interval": 4,
             "comparator_api_key": "***", "agent_devices": ["cpu", "cpu"]}
    same = {**saved, "logging_steps": 5, "eval_interval": 0, "comparator_api_key": "sk-rotated",
            "agent_devices": ("cpu", "cpu")}
    assert config_changes(saved, same) == {}
    with pytest.raises(ValueError) as e:
        check_resume_config(saved, {**same, "num_generations": 8, "seed": 3})
    msg = str(e.value)
    assert "num_generations: 4 -> 8" in msg and "seed: 0 -> 3" in msg \
        and "allow_config_changes=['num_generations', 'seed']" in msg
    assert check_resume_config(saved, {**same, "seed": 3}, allow=["seed"]) == ["seed"]


_TERM = textwrap.dedent('''
    import sys, time
    from comlrl_nb.runs import sigterm_as_interrupt, exit_status
    try:
        with sigterm_as_interrupt(defer=sys.argv[2] == "defer") as stop:
            for step in range(10**6):
                if step == 0: print("ready", flush=True)
                time.sleep(0.01)
                stop.check()                       # the batch boundary
    except KeyboardInterrupt as e:
        open(sys.argv[1], "w").write("checkpoint at step %d" % step)
        sys.exit(exit_status(e))
''')


@pytest.mark.parametrize("mode", ["now", "defer"])
def test_sigterm_takes_the_ctrl_c_path(tmp_path, mode):
    p = subprocess.Popen([sys.executable, "-c", _TERM, str(tmp_path / "saved"), mode], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 143 and (tmp_path / "saved").read_text().startswith("checkpoint at step")
    assert exit_status(Terminated()) == 143 and exit_status(KeyboardInterrupt()) == 130


def test_resave_never_leaves_no_checkpoint(tmp_path, monkeypatch):
    from comlrl_nb import checkpoints
    ck = CheckpointManager(tmp_path, total_limit=1)
    ck.save(5, {"v": 1})
    monkeypatch.setattr(checkpoints, "_swap", lambda a, b: False)         # no atomic exchange: the two-rename path
    real, calls = os.replace, []
    def crash_after_first(a, b):
        if Path(a).is_dir(): calls.append(a)                               # the checkpoint directories' renames
        real(a, b)
        if len(calls) == 1: raise KeyboardInterrupt("killed between the renames")
    monkeypatch.setattr(checkpoints.os, "replace", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        ck.save(5, {"v": 2})
    monkeypatch.setattr(checkpoints.os, "replace", real)
    assert len(calls) == 1 and Path(calls[0]).name == "checkpoint-0000005"  # it died after moving the old one aside
    p, state = CheckpointManager(tmp_path).load(True)                     # the old one is recovered
    assert p.name == "checkpoint-0000005" and state == {"v": 1}
    monkeypatch.undo()
    ck.save(5, {"v": 3})
    assert [q.name for q in tmp_path.iterdir()] == ["checkpoint-0000005"] and ck.load(True)[1] == {"v": 3}


_RESAVE = textwrap.dedent('''
    import sys, torch
    from comlrl_nb.engine import CheckpointManager
    ck = CheckpointManager(sys.argv[1], total_limit=1)
    i = 0
    while True:
        i += 1
        ck.save(7, {"i": i, "w": torch.randn(200_000)})
        print(i, flush=True)
''')


def test_resave_killed_at_random_moments_keeps_a_complete_checkpoint(tmp_path):
    import random
    rng = random.Random(1)
    for _ in range(6):
        p = subprocess.Popen([sys.executable, "-c", _RESAVE, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        p.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.4))
        p.kill()
        p.wait()
        path, state = CheckpointManager(tmp_path).load(True)
        assert path.name == "checkpoint-0000007" and state["w"].shape == (200_000,)


def test_pruning_ignores_what_it_did_not_write(tmp_path):
    (tmp_path / "checkpoint-best").mkdir()
    (tmp_path / "checkpoint-best" / "trainer_state.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    other = CheckpointManager(tmp_path)
    other.save(90, {"other": True})                                            # a later batch number (another run)
    ck = CheckpointManager(tmp_path, total_limit=2)
    for b in range(1, 6): ck.save(b, {"b": b})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-0000004", "checkpoint-0000005",
                                                           "checkpoint-0000090", "checkpoint-best", "notes.txt"]


@pytest.mark.parametrize("damage", ["state.pt", "trainer_state.json"])
def test_truncated_checkpoint_file_is_named_and_the_previous_used(tmp_path, damage, caplog):
    ck = CheckpointManager(tmp_path)
    for b in (1, 2, 3): ck.save(b, {"b": b, "w": torch.ones(1000)})
    f = tmp_path / "checkpoint-0000003" / damage
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    p, state = ck.load(True)
    assert p.name == "checkpoint-0000002" and state["b"] == 2
    assert str(f) in caplog.text and "falling back to the previous checkpoint" in caplog.text
    with pytest.raises(ValueError,
                       match=rf"{f}.*resume from another checkpoint \(checkpoint-0000001, checkpoint-0000002\)"):
        ck.load(tmp_path / "checkpoint-0000003")


def test_replay_restore_leaves_another_runs_files_alone(tmp_path):
    a = ReplayBuffer(tmp_path)
    a.register(1, [{"x": 1}])
    state = a.state_dict()
    a.register(2, [{"x": 2}])  # after a's checkpoint: a's own, removed on restore
    b = ReplayBuffer(tmp_path)
    b.register(1, [{"b": 1}])
    b.register(3, [{"b": 3}])                                             # another run shares the directory
    theirs = {n: iteration_path(tmp_path, n).read_bytes() for n in (1, 3)}
    back = ReplayBuffer(tmp_path)
    back.load_state_dict(state)
    assert {n: iteration_path(tmp_path, n).read_bytes() for n in (1, 3)} == theirs
    assert not iteration_path(tmp_path, 2).exists() and back.select(1) == [{"x": 1}]


def test_missing_isolation_refuses_instead_of_degrading(monkeypatch):
    from comlrl_nb import sandbox
    from comlrl_nb.sandbox import SandboxError
    # a namespace this runner never makes
    monkeypatch.setattr(sandbox, "_FULL_ISOLATION", sandbox._FULL_ISOLATION + ("timens",))
    sandbox._runner_source.cache_clear()
    try:
        with pytest.raises(SandboxError) as e:
            run_sandboxed("open('/tmp/ran', 'w').write('x')")
        assert "missing: timens" in str(e.value) and "namespaces=False" in str(e.value)
        assert "weak" in run_sandboxed("pass", namespaces=False).isolation  # asked for: runs, and says so
    finally:
        monkeypatch.undo()
        sandbox._runner_source.cache_clear()



def test_pruning_killed_midway_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    from comlrl_nb import engine
    ck = CheckpointManager(tmp_path, total_limit=2)
    for b in (1, 2):
        ck.save(b, {"b": b})
    real = shutil.rmtree
    def killed(p, *a, **kw):                                              # the kill lands between the two files
        p = Path(p)
        if (p / "state.pt").exists() and (p / "trainer_state.json").exists():
            (p / "state.pt").unlink()
            raise KeyboardInterrupt("killed while deleting")
        return real(p, *a, **kw)
    monkeypatch.setattr(engine.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ck.save(3, {"b": 3})                                              # pruning checkpoint 1 is interrupted
    monkeypatch.undo()
    complete = CheckpointManager(tmp_path).complete()
    assert [p.name for p in complete] == ["checkpoint-0000002", "checkpoint-0000003"]
    for p in complete:  # every checkpoint that claims completeness loads
        torch.load(p / "state.pt", weights_only=False)
    assert not list(tmp_path.glob(".checkpoint-*"))                       # the interrupted deletion was finished


# ------------------------------------------------------------------ resume into other models (P3, S3)
def _stopped_run(tmp_path, m, tok):
    from comlrl_nb import MAGRPOConfig, MAGRPOTrainer
    cfg = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=3, rollout_batch_size=1, eval_interval=0,
                       output_dir=str(tmp_path), progress_bar=False, save_steps=1, save_plot=False)
    return MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [float(len(x)) for x in a], args=cfg,
                         train_dataset=[{"prompt": "x"}, {"prompt": "y"}, {"prompt": "z"}])


@pytest.mark.parametrize("change, shown", [(dict(hidden_size=48), "hidden_size=32"),
                                           (dict(rope_theta=500.0), "rope_theta=")])
def test_resume_into_agents_of_another_architecture_names_it(tmp_path, change, shown):
    "The library refuses a resume whose models changed; here too, naming the agent and the settings (not torch's raw "
    "size-mismatch error, and never silently for a change that keeps the shapes)."
    m, tok = make_tiny_model(seed=0)
    _stopped_run(tmp_path, m, tok).train(stop_after_batch=1)
    other, _ = make_tiny_model(seed=0, **{k: v for k, v in change.items() if k == "hidden_size"})
    for k, v in change.items():
        setattr(other.config, k, v)
    with pytest.raises(ValueError) as e:
        _stopped_run(tmp_path, other, tok).train(resume_from_checkpoint=True)
    assert "cannot resume: agent 0 was a model with" in str(e.value) and shown in str(e.value), str(e.value)
    assert "size mismatch for" not in str(e.value).split("(")[0]
# ------------------------------------------------------------------ config files (S3): file, line, field and fix
from comlrl_nb.config_files import (MAX_YAML_VALUES, UserFileError, config_from_file,  # noqa: E402
                                    read_config_file)


def _cfg(tmp_path, name, text, section=None, **kw):
    p = tmp_path / name
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    return config_from_file(MAGRPOConfig, p, section, **kw)


@pytest.mark.parametrize("name, text, msg", [
    ("dup.yaml", "seed: 1\nnum_generations: 4\nseed: 2\n",
     "dup.yaml, line 3: the key 'seed' is given twice in one mapping, on lines 1 and 3"),
    ("nested.yaml", "magrpo:\n  seed: 1\n  temperature: 0.7\n  temperature: 0.9\nmaac: {seed: 1}\n",
     "nested.yaml, line 4: the key 'temperature' is given twice in one mapping, on lines 3 and 4"),
    ("flow.yaml", "magrpo: {seed: 1, seed: 2}\n", "flow.yaml, line 1: the key 'seed' is given twice"),
    ("dup.json", '{\n  "seed": 1,\n  "num_generations": 4,\n  "seed": 2\n}',
     "dup.json, line 4: the key 'seed' is given twice, on lines 2 and 4"),
    ("nested.json", '{"magrpo": {"seed": 1,\n "top_k": 5},\n "maac": {"seed": 1, "top_k": 3,\n "top_k": 4}}',
     "nested.json, line 4: the key 'top_k' is given twice (in maac), on lines 3 and 4"),
    ("escaped.json", '{"se\\u0065d": 1,\n "seed": 2}', "escaped.json, line 2: the key 'seed' is given twice"),
])
def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path, name, text, msg):
    (tmp_path / name).write_text(text)
    with pytest.raises(UserFileError) as e: read_config_file(tmp_path / name)
    assert msg in str(e.value) and str(e.value).endswith("keeps only the last, silently; remove one of them")


def test_yaml_merge_keys_may_be_overridden_and_lists_may_repeat_values(tmp_path):
    text = "base: &b {seed: 1, temperature: 0.5}\nmagrpo:\n  <<: *b\n  seed: 3\n  stop: [a, a]\n"
    (tmp_path / "m.yaml").write_text(text)
    assert read_config_file(tmp_path / "m.yaml", "magrpo") == {"seed": 3, "temperature": 0.5, "stop": ["a", "a"]}


def test_yaml_alias_bombs_and_cycles_are_refused_quickly(tmp_path):
    levels = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))   # 10**9 values
    (tmp_path / "laughs.yaml").write_text(levels)
    t0 = time.perf_counter()
    with pytest.raises(UserFileError, match=rf"laughs.yaml, line \d+: its aliases \(\*name\) expand to more than "
                                            rf"{MAX_YAML_VALUES} values"):
        read_config_file(tmp_path / "laughs.yaml")
    assert time.perf_counter() - t0 < 2.0
    (tmp_path / "wide.yaml").write_text("a: &a {" + ", ".join(f"k{i}: {i}" for i in range(400)) + "}\n"
                                        + "".join(f"b{j}: *a\n" for j in range(400)))          # 160k values, flat
    with pytest.raises(UserFileError, match="expand to more than"): read_config_file(tmp_path / "wide.yaml")
    (tmp_path / "loop.yaml").write_text("magrpo: &m\n  seed: 1\n  again: *m\n")
    with pytest.raises(UserFileError, match="loop.yaml, line 1: an alias refers to a mapping or list that contains "
                                            "it"):
        read_config_file(tmp_path / "loop.yaml")
    (tmp_path / "fine.yaml").write_text("d: &d {seed: 2}\nmagrpo: *d\n")             # ordinary aliases still work
    assert read_config_file(tmp_path / "fine.yaml", "magrpo") == {"seed": 2}


@pytest.mark.parametrize("text, msg", [
    ("seed: '3'\n", "line 1, field 'seed': MAGRPOConfig.seed='3' is invalid: expected a whole number, got str; "
                    "write the number without quotes"),
    ("num_generations: 4.5\n", "line 1, field 'num_generations': MAGRPOConfig.num_generations=4.5 is invalid: "
                               "expected a whole number, got float; write a whole number"),
    ("temperature: 0.7\njoint_mode: off\n", "line 2, field 'joint_mode': MAGRPOConfig.joint_mode=False is invalid: "
                                            "expected a string, got bool; YAML reads yes/no/on/off/true/false as a "
                                            "boolean: put the word in quotes"),
    ("use_chat_template: 'yes'\n", "field 'use_chat_template': MAGRPOConfig.use_chat_template='yes' is invalid: "
                                   "expected true or false, got str"),
    ("output_dir: 5\n", "field 'output_dir': MAGRPOConfig.output_dir=5 is invalid: expected a string (or null)"),
    ("top_k: [5]\n", "field 'top_k': MAGRPOConfig.top_k=[5] is invalid: expected a whole number (or null), got list"),
    ("early_termination_threshold: {a: 1}\n", "field 'early_termination_threshold'"),
    ("agent_learning_rate: 1e-3x\n", "field 'agent_learning_rate': MAGRPOConfig.agent_learning_rate='1e-3x' is "
                                     "invalid: expected a number, got str; give it a number"),
    ("seed: 2024-01-01\n", "field 'seed': MAGRPOConfig.seed=datetime.date(2024, 1, 1) is invalid"),
])
def test_every_fields_type_is_checked_with_the_file_line_and_field(tmp_path, text, msg):
    with pytest.raises(ValueError) as e: _cfg(tmp_path, "types.yaml", text)
    assert "types.yaml, line " in str(e.value) and msg in str(e.value), str(e.value)


def test_numbers_that_mean_the_same_are_accepted(tmp_path):
    cfg = _cfg(tmp_path, "ok.json", '{"num_generations": 4.0, "agent_learning_rate": "5e-6", "top_k": null, '
                                     '"max_grad_norm": 1}')
    assert (cfg.num_generations, type(cfg.num_generations), cfg.agent_learning_rate, cfg.top_k, cfg.max_grad_norm) \
        == (4, int, 5e-6, None, 1)


def test_range_and_unknown_key_errors_from_a_file_name_its_line(tmp_path):
    with pytest.raises(ValueError, match=r"r.yaml, line 3: MAGRPOConfig.num_generations=1 is invalid: must be >= 2"):
        _cfg(tmp_path, "r.yaml", "# comment\nseed: 1\nnum_generations: 1\n")
    with pytest.raises(ValueError, match=r"r.yaml, line 2: unknown config key 'num_generation' for MAGRPOConfig. Did "
                                         r"you mean 'num_generations'\?"):
        _cfg(tmp_path, "r.yaml", "seed: 1\nnum_generation: 4\n")
    with pytest.raises(ValueError, match=r"s.yaml, line 3: MAGRPOConfig.seed=-1 is invalid"):
        _cfg(tmp_path, "s.yaml", "magrpo:\n  top_k: 3\n  seed: -1\n", "magrpo")
    assert _cfg(tmp_path, "s.yaml", "magrpo:\n  seed: -1\n", "magrpo", seed=4).seed == 4   # the override wins


@pytest.mark.parametrize("name, data, msg", [
    ("latin1.yaml", "seed: 1\n# caf\u00e9\n".encode("latin-1"),
     r"latin1.yaml, line 2, column 6: byte 0xe9 is not UTF-8 .*; save it as UTF-8 \(`iconv -f latin1 -t utf-8"),
    ("cp1252.json", b'{"seed": 1,\n "output_dir": "r\x93un\x94"}', r"cp1252.json, line 2, column 18: byte 0x93"),
    ("utf16.yaml", "seed: 1\n".encode("utf-16"), r"utf16.yaml: is UTF-16 text, not UTF-8; save it as UTF-8"),
    ("binary.json", b'{"seed": 1}\x00\x00\x01', r"binary.json, line 1, column 12: holds a NUL byte"),
    ("tab.yaml", b"magrpo:\n\tseed: 1\n", r"tab.yaml, line 2, column 1: not valid YAML \(found character '\\t' "
                                          r"that cannot start any token"),
    ("open.yaml", b"seed: [1, 2\ntop_k: 3\n", r"open.yaml, line 2, column 6: not valid YAML"),
    ("comma.json", b'{"seed": 1,\n "top_k": 3,\n}', r"comma.json, line 3, column 1: not valid JSON \(Expecting "
                                                    r"property name enclosed in double quotes\); fix the JSON there"),
    ("two.yaml", b"seed: 1\n---\nseed: 2\n", r"two.yaml, line 2, column 1: not valid YAML \(but found another "
                                             r"document"),
    ("list.json", b"[1, 2]", r"list.json: holds a list, not a mapping of config fields"),
    ("deep.json", b"[" * 100000 + b"]" * 100000, r"deep.json: nested too deeply"),
    ("run.toml", b"seed = 1", r"run.toml: a config file is YAML \(.yaml, .yml\) or JSON \(.json\), not .toml"),
])
def test_unreadable_config_files_name_the_file_line_and_fix(tmp_path, name, data, msg):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(UserFileError, match=msg):
        read_config_file(tmp_path / name)


def test_a_directory_or_a_huge_file_is_refused_before_parsing(tmp_path):
    with pytest.raises(UserFileError, match="d.yaml: is a directory, not a config file"):
        (tmp_path / "d.yaml").mkdir() or read_config_file(tmp_path / "d.yaml")
    with open(tmp_path / "big.yaml", "wb") as f: f.truncate(9 << 20)
    with pytest.raises(UserFileError, match=r"big.yaml: is 9.0 MiB, more than a config file can be \(8 MiB\)"):
        read_config_file(tmp_path / "big.yaml")


@pytest.mark.parametrize("text, msg", [
    ("seed: 1\nseed: 2\n", "c.yaml, line 2: the key 'seed' is given twice"),
    ("seed: 1\ntemperature: hot\n", "c.yaml, line 2, field 'temperature': MAGRPOConfig.temperature='hot' is invalid"),
    ("seed: 1\nnum_generations: 1\n", "c.yaml, line 2: MAGRPOConfig.num_generations=1 is invalid: must be >= 2"),
    ("seed: [1\n", "c.yaml, line 2, column 1: not valid YAML"),
])
def test_the_cli_reports_a_bad_config_file_in_one_line(tmp_path, text, msg, capsys):
    from comlrl_nb.cli import main
    (tmp_path / "c.yaml").write_text(text)
    assert main(["train", "--model", "tiny", "--config", str(tmp_path / "c.yaml"), "--output-dir",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
