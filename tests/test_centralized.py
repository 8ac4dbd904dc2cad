"""Centralized MAGRPO: one joint actor for every role (scripted completions, training, resume, CLI, data parallel)."""
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comlrl_nb import (CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, MAGRPOConfig, make_tiny_model,
                       node_advantages, read_metrics)
from comlrl_nb.generation import Completions
from comlrl_nb.scoring import collate

GOOD = "<agent_0> good </agent_0> <agent_1> good </agent_1>"
BAD = "<agent_0> bad </agent_0> <agent_1> bad </agent_1>"
ITEMS = [{"id": "task", "prompt": "task prompt"}]
BIN = Path(sys.executable).parent


def both_good(left, right):
    "One point for each role that answered exactly 'good'."
    return [float(a == "good") + float(b == "good") for a, b in zip(left, right)]


def scripted(tr, script, calls):
    "Replace the actor's sampling: completion j of every prompt is script[j % len(script)] (prompts logged)."
    tok = tr.tokenizers[0]
    enc = lambda s: torch.tensor(tok.encode(s, add_special_tokens=False))
    def generate(i, prompts, k=1, keys=None, **kw):
        calls.append(list(prompts))
        texts = [script[j % len(script)] for _ in prompts for j in range(k)]
        pi, pm, ci, cm = collate([enc(p) for p in prompts for _ in range(k)], [enc(t) for t in texts],
                                 tok.pad_token_id)
        return Completions(pi, pm, ci, cm, texts, len(prompts), k, torch.ones(len(texts), dtype=torch.bool))
    tr.team.generate = generate


def make(tmp, script=(GOOD, BAD), reward=both_good, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = dict(num_train_epochs=1, num_generations=2, max_new_tokens=8, agent_learning_rate=1e-3, eval_interval=0,
               rollout_buffer_size=1, output_dir=str(tmp), progress_bar=False, save_steps=-1, logging_steps=1000)
    cfg.update(kw)
    tr = CentralizedMAGRPOTrainer(agents=[m], tokenizer=tok, reward_func=reward, train_dataset=ITEMS * 2,
                                  eval_dataset=ITEMS, formatters=[lambda it: "left", lambda it: "right"],
                                  centralized_prompt_builder=lambda roles, item: "joint " + " ".join(roles),
                                  args=CentralizedMAGRPOConfig(**cfg))
    calls = []
    if script is not None: scripted(tr, list(script), calls)
    return tr, calls


def params(tr):
    return [p.detach().clone() for p in tr.agents[0].parameters()]


def test_config_is_single_turn_and_centralized():
    assert CentralizedMAGRPOConfig().num_turns == 1
    with pytest.raises(ValueError, match="centralized collaboration"):
        CentralizedMAGRPOConfig(collaboration_mode="decentralized")
    with pytest.raises(ValueError, match="num_turns=1"):
        CentralizedMAGRPOConfig(num_turns=2)
    assert CentralizedMAGRPOConfig(discount=0.5).discount == 0.5   # accepted with one warning (test_config: porting)


def test_one_actor_trains_on_the_joint_prompt_with_task_rewards(tmp_path):
    tr, calls = make(tmp_path)
    assert (len(tr.agents), len(tr.optimizers), tr.n, tr.args.num_agents) == (1, 1, 2, 2)
    before = params(tr)
    out = tr.train()
    assert calls and {p for c in calls for p in c} == {"joint left right"}
    assert tr.state["global_batch"] == 2 and tr.state["optimizer_steps"] == [2]
    assert any(not torch.equal(a, b) for a, b in zip(before, params(tr)))
    rows = read_metrics(out["metrics_path"])
    assert [r["turn_1/reward_mean"] for r in rows] == [1.0, 1.0]               # GOOD scores 2, BAD 0
    assert [r["unparsed"] for r in rows] == [0, 0]
    assert rows[0]["agent_0/adv_mean"] == pytest.approx(0.0, abs=1e-6)


def test_the_update_raises_the_good_joint_answer(tmp_path):
    tr, _ = make(tmp_path, num_train_epochs=3, agent_learning_rate=1e-2)
    tok = tr.tokenizers[0]
    enc = lambda s: torch.tensor(tok.encode(s, add_special_tokens=False))
    p = enc(tr.joint_prompt(ITEMS[0])[1])
    from comlrl_nb.scoring import completion_logprobs
    gap = lambda: float(torch.diff(completion_logprobs(tr.agents[0], *collate([p, p], [enc(BAD), enc(GOOD)],
                                                                               tok.pad_token_id))[1]).detach())
    g0 = gap()
    tr.train()
    assert gap() > g0 + 1.0                                    # log pi(GOOD) - log pi(BAD) grows


def test_loss_is_the_policy_gradient_of_the_whole_joint_sequence(tmp_path):
    tr, _ = make(tmp_path)
    model, tok = tr.agents[0], tr.tokenizers[0]
    enc = lambda s: torch.tensor(tok.encode(s, add_special_tokens=False))
    prompt, seqs = enc("joint left right"), [enc(GOOD), enc(BAD)]
    adv = node_advantages(torch.tensor([[2.0, 0.0]]), "mean", True)[0]
    manual = []
    for z, a in zip(seqs, adv):
        logits = model(torch.cat([prompt, z])[None]).logits[0, len(prompt) - 1:-1]
        manual.append(-logits.log_softmax(-1).gather(1, z[:, None]).sum() * a)
    expected = torch.stack(manual).mean()
    g_exp = torch.autograd.grad(expected, model.get_input_embeddings().weight)[0]
    value = tr._joint_loss(model, [prompt, prompt], seqs, adv, [0, 1], tok.pad_token_id)
    assert value == pytest.approx(float(expected.detach()), abs=1e-5)
    g = model.get_input_embeddings().weight.grad
    assert torch.allclose(g, g_exp, atol=1e-5)
    model.zero_grad()


def test_unparsable_completions_score_as_empty_roles_and_are_counted(tmp_path):
    half = "<agent_0> good </agent_0> but no second section"
    tr, _ = make(tmp_path, script=(GOOD, half), reward=lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)])
    out = tr.train()
    rows = read_metrics(out["metrics_path"])
    assert [r["unparsed"] for r in rows] == [1, 1] and rows[0]["unparsed_rate"] == 0.5
    assert rows[0]["turn_1/reward_mean"] == pytest.approx((4 + 4 + 0) / 2)     # "good" + "good", then "" + ""


def test_eval_passes_the_separate_roles_to_eval_logger(tmp_path):
    tr, _ = make(tmp_path, script=(GOOD,))
    seen = []
    tr.eval_logger = lambda **kw: seen.append(kw) or [{"x": 1}]
    tr.eval_aggregator = lambda logged, num_turns: {"turn_1/domain_metric": 3.0}
    ev = tr.evaluate(num_samples=1)
    assert set(seen[0]) == {"agent_completions_turns", "batch_items", "prompts"}
    assert seen[0]["agent_completions_turns"] == [[["good"]], [["good"]]]
    assert seen[0]["batch_items"] == ITEMS and seen[0]["prompts"] == [["left"], ["right"]]
    assert ev["eval/turn_1/reward_mean"] == 2.0 and ev["eval/turn_1/domain_metric"] == 3.0
    assert ev["eval/unparsed_rate"] == 0.0


@pytest.mark.parametrize("mode", ["rloo", "max"])
def test_the_configs_advantage_mode_is_used(tmp_path, mode):
    tr, _ = make(tmp_path, script=(GOOD, BAD, GOOD), num_generations=3, advantage_mode=mode,
                 advantage_normalization=False)
    ro = tr.rollout(ITEMS, [0], ("t", 0))
    want = node_advantages(torch.tensor([[2.0, 0.0, 2.0]]), mode, False)
    assert torch.allclose(ro.advantages, want) and torch.allclose(ro.samples[0].advantages, want[0])


def test_joint_actor_gets_one_reference_model(tmp_path):
    tr, _ = make(tmp_path, reference_kl_enabled=True, reference_devices=["cpu"], reference_kl_coef=0.1)
    assert len(tr.ref_agents) == 1
    rows = read_metrics(tr.train()["metrics_path"])
    assert tr.state["global_batch"] == 2 and rows[0]["agent_0/kl"] == pytest.approx(0.0, abs=1e-6)
    assert rows[1]["agent_0/kl"] > 0                            # the actor moved away from its frozen copy


def test_rejects_several_actors_and_bad_hooks(tmp_path):
    m, tok = make_tiny_model()
    cfg = CentralizedMAGRPOConfig(output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="exactly one actor"):
        CentralizedMAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=both_good, args=cfg)
    with pytest.raises(ValueError, match="one actor needs one"):
        CentralizedMAGRPOTrainer(agents=[m], tokenizer=[tok, tok], reward_func=both_good, args=cfg)
    with pytest.raises(TypeError, match="CentralizedMAGRPOConfig"):
        CentralizedMAGRPOTrainer(agents=[m], tokenizer=tok, reward_func=both_good, args=MAGRPOConfig())
    with pytest.raises(ValueError, match="go together"):
        CentralizedMAGRPOTrainer(agents=[m], tokenizer=tok, reward_func=both_good, args=cfg, eval_logger=print)


def test_resume_gives_the_weights_of_an_uninterrupted_run(tmp_path):
    kw = dict(script=None, num_train_epochs=2, num_generations=3, rollout_buffer_size=3, rollout_batch_size=1,
              agent_learning_rate=1e-2, save_steps=1, temperature=1.0, top_p=1.0, top_k=None,
              reward=lambda a, b: [float(sum(c in "aeiou " for c in x + y)) for x, y in zip(a, b)])
    data = [{"prompt": p} for p in ["a story", "physics", "a recipe", "a city"]]
    def build(d):
        tr, _ = make(d, **kw)
        tr.train_dataset = data
        return tr
    full = build(tmp_path / "full")
    full.train()
    assert build(tmp_path / "part").train(stop_after_batch=3)["stopped"]
    part = build(tmp_path / "part")
    part.train(resume_from_checkpoint=True)
    assert part.state == full.state and full.state["optimizer_steps"] == [4]    # 8 items, buffer of 3, flushes
    assert all(torch.equal(a, b) for a, b in zip(params(full), params(part)))
    strip = lambda rows: [{k: v for k, v in r.items() if "time" not in k and "per_s" not in k} for r in rows]
    assert strip(read_metrics(tmp_path / "part" / "metrics.jsonl")) == \
        strip(read_metrics(tmp_path / "full" / "metrics.jsonl"))


def test_imports_flat_and_from_reinforce():
    import comlrl_nb
    from comlrl_nb.trainers.reinforce import CentralizedMAGRPOConfig as C, CentralizedMAGRPOTrainer as T
    assert T is comlrl_nb.CentralizedMAGRPOTrainer and C is comlrl_nb.CentralizedMAGRPOConfig
    import comlrl_nb.trainers.reinforce as R
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        R.Nope


def test_cli_trains_centralized_magrpo(tmp_path):
    from comlrl_nb.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--algo", "centralized_magrpo", "--model", "tiny", "--output-dir", str(tmp_path),
                     "--heldout-samples", "2", "--set", "num_train_epochs=1", "--set", "advantage_mode=rloo"]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["config"]["collaboration_mode"] == "centralized" and rep["config"]["advantage_mode"] == "rloo"
    assert rep["heldout_before"]["n"] > 0 and "unparsed" in rep["heldout_after"]
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["unparsed_rate"] == 1.0      # the random model writes no tags


DP_SCRIPT = '''
import os, sys, torch
torch.set_num_threads(1)
from comlrl_nb import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, make_tiny_model
m, tok = make_tiny_model(seed=0)
halves = lambda t, n: [t[: len(t) // 2], t[len(t) // 2:]]
vow = lambda a, b: [sum(c in "aeiou " for c in x + y) / max(len(x + y), 1) for x, y in zip(a, b)]
data = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city", "A poem"]]
tr = CentralizedMAGRPOTrainer(agents=[m], tokenizer=tok, reward_func=vow, train_dataset=data, centralized_parser=halves,
    args=CentralizedMAGRPOConfig(num_train_epochs=2, num_generations=3, max_new_tokens=6, temperature=1.0, top_p=1.0,
        top_k=None, agent_learning_rate=1e-5, rollout_batch_size=3, rollout_buffer_size=4, train_batch_size=3,
        eval_interval=0, output_dir=sys.argv[1], progress_bar=False, save_steps=-1, logging_steps=1000))
tr.train()
whole = lambda p: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()   # torch's DTensors, whole
torch.save([whole(p) for p in tr.agents[0].parameters()],
           os.path.join(sys.argv[1], f"p{os.environ.get('RANK', '0')}.pt"))
'''


def _run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"


def test_two_processes_match_one(tmp_path):
    script = tmp_path / "dp.py"
    script.write_text(DP_SCRIPT)
    _run([sys.executable, str(script), str(tmp_path / "one")])
    _run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29531", str(script),
          str(tmp_path / "dp")])
    one, r0, r1 = (torch.load(p)
                   for p in (tmp_path / "one" / "p0.pt", tmp_path / "dp" / "p0.pt", tmp_path / "dp" / "p1.pt"))
    assert all(torch.equal(a, b) for a, b in zip(r0, r1))
    assert all(torch.allclose(a, b, atol=1e-4, rtol=0) for a, b in zip(one, r0))
    rows = lambda d: read_metrics(tmp_path / d / "metrics.jsonl")
    assert [r["batch"] for r in rows("dp")] == [r["batch"] for r in rows("one")] == [1, 2, 3, 4]
    for a, b in zip(rows("dp"), rows("one")):
        assert a["turn_1/reward_mean"] == pytest.approx(b["turn_1/reward_mean"], abs=1e-6)
        if "agent_0/loss" in b: assert a["agent_0/loss"] == pytest.approx(b["agent_0/loss"], abs=1e-5)
