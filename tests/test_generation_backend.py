"""The generation backend field: validated, honoured by every sampling path (the team, comparators, evaluation), and
'hf' trains MAGRPO and MADPO with our sampler's greedy rows; 'vllm' without vLLM stops before any model loads."""
import numpy as np
import pytest
import torch

from comlrl_nb import vllm_engine
from comlrl_nb.engine import read_metrics
from comlrl_nb.generation import generate_completions, hf_generate_completions
from comlrl_nb.models import make_tiny_model
from comlrl_nb.trainers.preference import MADPOConfig, MADPOTrainer
from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

torch.set_num_threads(1)
ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
RUN = dict(num_train_epochs=1, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
           eval_interval=0, progress_bar=False, save_steps=-1, logging_steps=1000)


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


@pytest.fixture
def hf_calls(monkeypatch):
    "Every call the backend makes to the HF sampler, counted (the samples themselves unchanged)."
    calls = []
    def counted(*a, **kw):
        calls.append(len(a[2]))
        return hf_generate_completions(*a, **kw)
    monkeypatch.setattr(vllm_engine, "hf_generate_completions", counted)
    return calls


def test_field_validation():
    assert MAGRPOConfig().generation_backend == "own" and MADPOConfig().generation_backend == "own"
    assert MAGRPOConfig(generation_backend=" HF").generation_backend == "hf"
    with pytest.raises(ValueError, match="generation_backend=.vLLM2. is invalid: use one of own, hf, vllm"):
        MAGRPOConfig(generation_backend="vLLM2")
    with pytest.raises(ValueError, match="vllm_kv_cache_bytes=0 is invalid"):
        MADPOConfig(vllm_kv_cache_bytes=0)
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization=0 is invalid"):
        MAGRPOConfig(vllm_gpu_memory_utilization=0)
    with pytest.raises(ValueError, match="set one"):
        MAGRPOConfig(vllm_kv_cache_bytes=1 << 20, vllm_gpu_memory_utilization=0.3)
    with pytest.raises(ValueError, match="parallel_training='none'"):
        MAGRPOConfig(generation_backend="vllm", parallel_training="mp", agent_devices="cpu")
    with pytest.raises(ValueError, match="distributed='ddp' or 'none'"):
        MAGRPOConfig(generation_backend="vllm", distributed="fsdp")
    with pytest.raises(ValueError, match="set generation_backend='vllm'"):
        MAGRPOConfig(vllm_importance_correction=True)
    with pytest.raises(ValueError, match="MADPOConfig: vllm_importance_correction=True: this trainer's loss"):
        MADPOConfig(generation_backend="vllm", vllm_importance_correction=True)


def test_vllm_missing_names_the_install_before_any_model_loads(tmp_path, monkeypatch):
    if vllm_engine.vllm_available():                              # the vLLM venv (make test-vllm): made to look missing
        monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    missing = str(tmp_path / "no_such_model")                     # loading it would fail with another error
    with pytest.raises(ImportError, match="make vllm"):
        MAGRPOTrainer(agent_model=missing, reward_func=vowels, train_dataset=ITEMS,
                      args=MAGRPOConfig(generation_backend="vllm", output_dir=str(tmp_path / "run")))
    with pytest.raises(ImportError, match="make vllm"):
        MADPOTrainer(agent_model=missing, reward_func=vowels, train_dataset=ITEMS,
                     args=MADPOConfig(generation_backend="vllm", output_dir=str(tmp_path / "run2")))
    with pytest.raises(OSError):                                  # the 'own' backend does reach the loading
        MAGRPOTrainer(agent_model=missing, reward_func=vowels, train_dataset=ITEMS,
                      args=MAGRPOConfig(output_dir=str(tmp_path / "run3")))
    from comlrl_nb.evaluate import evaluate_agents
    from comlrl_nb.tasks import get_task
    with pytest.raises(ImportError, match="make vllm"):
        evaluate_agents(get_task("length_ratio"), missing, args=MAGRPOConfig(generation_backend="vllm"))


def magrpo(tmp, backend, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = dict(RUN, num_generations=4, rollout_batch_size=2, output_dir=str(tmp), generation_backend=backend, **kw)
    return MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MAGRPOConfig(**cfg),
                         train_dataset=ITEMS)


def test_hf_greedy_equals_own_through_the_team(tmp_path):
    own, hf = magrpo(tmp_path / "own", "own").team, magrpo(tmp_path / "hf", "hf").team
    prompts = own.prompts(ITEMS)
    keys = [[(0, "x", j, i) for j in range(len(ITEMS))] for i in range(2)]
    a = own.generate_all(prompts, 2, keys, temperature=0, max_new_tokens=10)
    b = hf.generate_all(prompts, 2, keys, temperature=0, max_new_tokens=10)
    for x, y in zip(a, b):
        for f in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "ended"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f
        assert x.texts == y.texts


def test_hf_backend_trains_magrpo(tmp_path, hf_calls):
    tr = magrpo(tmp_path, "hf")
    before = [p.detach().clone() for p in tr.agents[0].parameters()]
    tr.train()
    assert len(hf_calls) == 2 * 2                                  # 2 batches x 2 agents, each through model.generate
    assert any(not torch.equal(x, y) for x, y in zip(before, tr.agents[0].parameters()))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    vals = [r[k] for r in rows for k in r if k.endswith("/loss") or k.endswith("reward_mean")]
    assert vals and all(np.isfinite(vals))


def test_hf_backend_trains_madpo(tmp_path, hf_calls):
    m, tok = make_tiny_model(seed=0)
    cfg = dict(RUN, preference_num_candidates=4, preference_pairs_per_sample=2, agent_learning_rate=3e-3, dpo_beta=0.5,
               output_dir=str(tmp_path), generation_backend="hf")
    tr = MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MADPOConfig(**cfg), train_dataset=ITEMS)
    before = [p.detach().clone() for p in tr.agents[0].parameters()]
    out = tr.train()
    assert hf_calls and sum(hf_calls) == 2 * len(ITEMS)            # every agent's candidates of every item
    assert out["num_pairs"] > 0
    assert any(not torch.equal(x, y) for x, y in zip(before, tr.agents[0].parameters()))
    losses = [r["dpo/loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "dpo/loss" in r]
    assert losses and all(np.isfinite(losses))


def test_comparator_and_evaluation_sample_through_the_backend(tmp_path, hf_calls):
    from comlrl_nb.comparators import ModelGenerator
    from comlrl_nb.evaluate import evaluate_agents
    from comlrl_nb.tasks import get_task
    m, tok = make_tiny_model(seed=0)
    gen = ModelGenerator([m, m], [tok, tok], max_new_tokens=6, temperature=0,
                         sampler=vllm_engine.BackendSampler("hf"))
    texts, ended = gen(0, ["Write a story", "Hi"], 2, [{}, {}], [0, 1], 1)
    assert hf_calls == [2]
    want = generate_completions(m, tok, ["Write a story", "Hi"], k=2, max_new_tokens=6, temperature=0)
    assert texts == want.texts and ended == want.ended.tolist()
    task = get_task("length_ratio")
    res = evaluate_agents(task, ([m, m], [tok, tok]), items=task.train_dataset[:2], num_samples=2,
                          args=MAGRPOConfig(num_agents=task.num_agents, generation_backend="hf", max_new_tokens=6))
    assert len(hf_calls) == 1 + task.num_agents and np.isfinite(res["mean"])


class ShiftedEngine:
    "A stand-in engine: our sampler's rows, with 'engine log-probs' the learner's own moved by 0.25 (a known gap)."
    backend = "vllm"
    def __call__(self, model, tok, prompts, **kw):
        from comlrl_nb.scoring import completion_logprobs
        from comlrl_nb.vllm_engine import SampledCompletions
        c = generate_completions(model, tok, prompts, **kw)
        lp, _ = completion_logprobs(model, c.prompt_ids, c.prompt_mask, c.completion_ids, c.completion_mask)
        fields = {f: getattr(c, f) for f in c.__dataclass_fields__}
        return SampledCompletions(**fields, sample_logprobs=(lp - 0.25) * c.completion_mask)
    def close(self): pass


def test_sampler_metrics_from_the_engines_logprobs(tmp_path):
    tr = magrpo(tmp_path, "own")
    tr.team.backend = ShiftedEngine()
    tr.train()
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "agent_0/sampler/logp_abs_diff" in r]
    assert rows
    for r in rows:
        for i in (0, 1):
            assert r[f"agent_{i}/sampler/logp_abs_diff"] == pytest.approx(0.25, abs=1e-4)
            assert r[f"agent_{i}/sampler/tis_weight"] == pytest.approx(1.0)      # the learner is the surer one
    assert not any("sampler/" in k for r in read_metrics(magrpo_metrics(tmp_path / "own")) for k in r)


def magrpo_metrics(tmp):
    magrpo(tmp, "own").train()
    return tmp / "metrics.jsonl"


def test_importance_correction_weights_the_loss(tmp_path, monkeypatch):
    "An engine surer than the learner by 0.25 nats a token: every token's weight is exp(-0.25), and so is the loss's."
    import math
    from comlrl_nb.trainers import reinforce
    from comlrl_nb.trainers.reinforce import policy_rows_loss, weighted_sums
    tok_lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    assert torch.allclose(weighted_sums(tok_lp, [torch.ones(2), torch.ones(1)]), tok_lp.sum(-1))
    assert torch.allclose(weighted_sums(tok_lp, [torch.tensor([0.5, 1.0]), torch.tensor([2.0])]),
                          torch.tensor([-2.5, -1.0]))
    class SurerEngine(ShiftedEngine):
        def __call__(self, *a, **kw):
            c = super().__call__(*a, **kw)
            c.sample_logprobs = (c.sample_logprobs + 0.5) * c.completion_mask     # learner - 0.25 + 0.5
            return c
    tr = magrpo(tmp_path, "own")
    tr.team.backend = SurerEngine()
    tr.args.vllm_importance_correction = True                   # (the config refuses it without a vLLM install)
    seen, update = [], reinforce.MAGRPOTrainer._update_agent
    def spy(self, i, samples):
        prompts = [s.prompt for s in samples for _ in s.completions]
        comps, ws = [c for s in samples for c in s.completions], [w for s in samples for w in s.weights]
        adv, rows, pad = torch.cat([s.advantages for s in samples]), list(range(len(comps))), 0
        with torch.no_grad():
            plain = policy_rows_loss(self.team.agents[i], prompts, comps, adv, rows, pad)
            weighted = policy_rows_loss(self.team.agents[i], prompts, comps, adv, rows, pad, weights=ws)
        seen.append((torch.cat(ws), float(plain), float(weighted)))
        return update(self, i, samples)
    monkeypatch.setattr(reinforce.MAGRPOTrainer, "_update_agent", spy)
    tr.train()
    assert seen
    for w, plain, weighted in seen:
        assert torch.allclose(w, torch.full_like(w, math.exp(-0.25)), atol=1e-4)
        assert weighted == pytest.approx(plain * math.exp(-0.25), rel=1e-3, abs=1e-6)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert all(np.isfinite(r[k]) for r in rows for k in r if k.endswith("/loss"))
    assert rows[0]["agent_0/sampler/tis_weight"] == pytest.approx(math.exp(-0.25), abs=1e-4)


def test_marlhf_collects_and_trains_through_the_backend(tmp_path, hf_calls):
    "MARLHF: the pair collection and the policy phase (its MAGRPO backend) both sample through the chosen backend."
    from comlrl_nb.trainers.preference import MARLHFConfig, MARLHFTrainer
    m, tok = make_tiny_model(seed=0)
    cfg = MARLHFConfig(**{**RUN, "top_k": None}, preference_num_candidates=4, preference_pairs_per_sample=2,
                       num_generations=4, rollout_batch_size=2, reward_learning_rate=1e-3, reward_num_train_epochs=1,
                       reward_train_batch_size=2, output_dir=str(tmp_path), generation_backend="hf")
    tr = MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS, reward_model=m)
    assert tr.policy_trainer.args.generation_backend == "hf"
    tr.train()
    collect = 2 * len(ITEMS)                                        # every agent's candidates of every item
    assert sum(hf_calls) > collect                                  # and then the policy phase's batches
