"""MADPO and MARLHF (and, with --algos, the iterative and actor-critic trainers) side by side with the yardstick (comlrl
1.4.3) on its settings: tiny Qwen2, 8 prompts, 2 agents, 4 candidates, 2 pairs per item, 16 new tokens, 1 epoch, 1
thread. Ours and theirs alternate in fresh subprocesses.

    .venv/bin/python benchmarks/pref.py [--repeats 3]

Prints the median wall time of the training call on each side, the ratio, peak RSS, and the split of our time.
Ours runs with its defaults (pair collection in sampling loops of up to 64 rows: all 8 prompts x 4 candidates in one
loop per agent; rollout_batch_size 1 in MARLHF's policy phase) unless --ours-rbs auto: rollout_batch_size=None, one
rollout buffer (2 items) per sampling loop, the same samples and updates as 1 with fewer loops. (Theirs: the yardstick's
own `train_s`; ours: the same call, `train()`, timed the same way.)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.environ.get("PEER_DIR", os.path.join(ROOT, ".peer"))

OURS = r'''
import json, os, resource, sys, tempfile, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[2])
import benchutil as bu
from transformers import AutoModelForCausalLM, AutoTokenizer
from comlrl_nb import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
algo, model, rbs = sys.argv[1], sys.argv[3], sys.argv[4]
tok = AutoTokenizer.from_pretrained(model)
agents = [AutoModelForCausalLM.from_pretrained(model) for _ in range(2)]
common = dict(num_agents=2, max_new_tokens=16, **bu.SAMPLING, num_train_epochs=1, agent_learning_rate=5e-6,
              eval_interval=0, rollout_buffer_size=2, output_dir=tempfile.mkdtemp(), progress_bar=False, save_steps=-1,
              logging_steps=1000, save_plot=False, preference_num_candidates=4, preference_pairs_per_sample=2,
              pair_selection="reward_gap", rollout_batch_size=None if rbs == "auto" else int(rbs))
ds = [{"prompt": p} for p in bu.PROMPTS]
no_rbs = lambda kw: {k: v for k, v in kw.items() if k != "rollout_batch_size"}   # MADPO has no rollout batches
if algo == "madpo":
    tr = MADPOTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward,
                      args=MADPOConfig(**no_rbs(common), dpo_beta=0.1),
                      train_dataset=[{"prompt": p} for p in bu.PROMPTS])
elif algo in ("madpo_iter", "marlhf_iter"):  # the yardstick's iterative settings: 2 rounds, current-policy comparator
    from comlrl_nb import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer
    it = dict(common, num_iterations=2, preference_replay_mode="lambda_decay", preference_replay_lambda=0.5,
              preference_replay_dir=tempfile.mkdtemp(), comparator_policy="current", pair_selection="comparator_reward")
    if algo == "madpo_iter":
        tr = MADPOIterTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=ds,
                              args=MADPOIterConfig(**no_rbs(it), dpo_beta=0.1))
    else:
        tr = MARLHFIterTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=ds,
                               args=MARLHFIterConfig(**it, rl_algorithm="magrpo", num_generations=4,
                                                     early_termination_threshold=None, reward_model_name=model,
                                                     reward_num_train_epochs=1))
elif algo in ("maac", "iac"):  # the yardstick's actor-critic settings: K=4 single-turn, separate critics
    from comlrl_nb import IACConfig, IACTrainer, MAACConfig, MAACTrainer
    ac = dict(num_agents=2, max_new_tokens=16, **bu.SAMPLING, num_train_epochs=1, agent_learning_rate=5e-6,
              critic_learning_rate=5e-6, eval_interval=0, num_generations=4, num_turns=1, rollout_buffer_size=2,
              early_termination_threshold=None, output_dir=tempfile.mkdtemp(), progress_bar=False, save_steps=-1,
              logging_steps=1000, save_plot=False, rollout_batch_size=None if rbs == "auto" else int(rbs))
    cls, cfg = (IACTrainer, IACConfig(**ac, use_separate_critic=True)) if algo == "iac" else \
        (MAACTrainer, MAACConfig(**ac))
    tr = cls(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=ds, args=cfg,
             critic_model=AutoModelForCausalLM.from_pretrained(model))
else:
    tr = MARLHFTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward,
                       train_dataset=[{"prompt": p} for p in bu.PROMPTS],
                       args=MARLHFConfig(**common, rl_algorithm="magrpo", num_generations=4,
                                         early_termination_threshold=None, reward_model_name=model,
                                         reward_learning_rate=1e-5, reward_num_train_epochs=1,
                                         reward_train_batch_size=1))
# Stopwatches around the pieces (the calls still happen unchanged): sampling, the reward/oracle, the reward-model fit
# (MARLHF) and the policy updates (log-probs + backward + AdamW step).
import comlrl_nb.preference as P, comlrl_nb.trainers.reinforce as R, comlrl_nb.trainers.madpo as D, \
    comlrl_nb.rewards as W
import comlrl_nb.trainers.iterative as I, comlrl_nb.comparators as C, comlrl_nb.trainers.actor_critic as A
from comlrl_nb.reward_model import JointRewardModel as J
split = {"generate": 0.0, "reward": 0.0, "reward_model_fit": 0.0, "update": 0.0}
def timed(fn, key):
    def w(*args, **kw):
        t = time.perf_counter()
        try: return fn(*args, **kw)
        finally: split[key] += time.perf_counter() - t
    return w
import comlrl_nb.team as T
for mod in (P, R, D, I, C, A, T):           # every module that samples through its own name of generate_completions
    if hasattr(mod, "generate_completions"): mod.generate_completions = timed(mod.generate_completions, "generate")
W.RewardFunction.__call__ = timed(W.RewardFunction.__call__, "reward")
J.fit_texts = timed(J.fit_texts, "reward_model_fit")
D.MADPOTrainer._update = timed(D.MADPOTrainer._update, "update")
R.MAGRPOTrainer._update_full_buffers = timed(R.MAGRPOTrainer._update_full_buffers, "update")
A.ActorCriticTrainer._update_full_buffers = timed(A.ActorCriticTrainer._update_full_buffers, "update")
bu.seed_like_peer(0)
c0, t0 = time.process_time(), time.perf_counter(); tr.train(); dt, cpu = time.perf_counter() - t0, \
    time.process_time() - c0
split["reward"] = max(0.0, split["reward"])
print("RESULT "
      + json.dumps({"train_s": dt, "train_cpu_s": cpu,
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    "split": split, "pairs": len(getattr(tr, "pairs", []))}))
'''


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=900)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{cmd[0]} ({cmd[-3] if len(cmd) > 3 else ''}) "
                           f"failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[7:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ours-rbs", default="1", help="our rollout_batch_size (MARLHF's policy phase, the actor-critic "
                   "loops): 1 = the default; 'auto' = None, one rollout buffer (the same samples and updates, "
                   "fewer loops)")
    p.add_argument("--algos", default="madpo,marlhf", help="any of madpo, marlhf, madpo_iter, marlhf_iter, maac, iac")
    a = p.parse_args()
    model = os.path.join(PEER, "tiny-model")
    env = {"PEER_DIR": PEER, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    rows = []
    for algo in a.algos.split(","):
        ours, theirs = [], []
        for r in range(a.repeats):
            ours.append(run([sys.executable, "-c", OURS, algo, HERE, model, a.ours_rbs], env))
            theirs.append(run([os.path.join(PEER, "venv", "bin", "python"), "/work/shared/bench/run_peer.py"
                               if os.path.exists("/work/shared/bench/run_peer.py")
                               else os.path.join(ROOT, "..", "shared", "bench", "run_peer.py"), "--single", algo,
                               "--threads", "1"], env))
            print(f"# {algo} round {r + 1}: ours {ours[-1]['train_s']:.3f}s  theirs {theirs[-1]['train_s']:.3f}s",
                  flush=True)
        mo, mt = statistics.median(x["train_s"] for x in ours), statistics.median(x["train_s"] for x in theirs)
        sp = {k: statistics.median(x["split"][k] for x in ours) for k in ours[0]["split"]}
        rows.append((algo, mo, mt, mo / mt, max(x["peak_rss_mb"] for x in ours),
                     max(x.get("peak_rss_mb", float("nan")) for x in theirs), sp))
    print(f"\n# ours with rollout_batch_size={'None (one buffer)' if a.ours_rbs == 'auto' else a.ours_rbs}")
    print(f"{'algo':11s} {'ours s':>8s} {'theirs s':>9s} {'ours/theirs':>12s} {'RSS ours MB':>12s} "
          f"{'RSS theirs MB':>14s}  target <= 0.5")
    for algo, mo, mt, ratio, ro, rt, _ in rows:
        verdict = ("met" if ratio <= 0.5 else "NOT met") if algo in ("madpo", "marlhf") else "(no target set)"
        print(f"{algo:11s} {mo:8.3f} {mt:9.3f} {ratio:12.2f} {ro:12.0f} {rt:14.0f}  {verdict}")
    print(f"\nsplit of our train() (median seconds): generate = sampling loops, reward = task reward / oracle calls,\n"
          "reward_model_fit = MARLHF's Bradley-Terry fit, update = log-probs + backward + AdamW steps, other = "
          "the rest")
    print(f"{'algo':11s} {'generate':>9s} {'reward':>7s} {'rm fit':>7s} {'update':>7s} {'other':>7s}")
    for algo, mo, *_, sp in rows:
        print(f"{algo:11s} {sp['generate']:9.3f} {sp['reward']:7.3f} {sp['reward_model_fit']:7.3f} {sp['update']:7.3f} "
              f"{mo - sum(sp.values()):7.3f}")


if __name__ == "__main__":
    main()
