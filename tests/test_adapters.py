"""Adapter agents (LoRA over one frozen base) inside the MAGRPO trainer."""
import pytest
import torch

pytest.importorskip("peft", reason="adapter agents need the optional dependency peft (installed by `make test`)")
from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, make_tiny_model  # noqa: E402
from comlrl_nb.adapters import LoRAAgents  # noqa: E402

PROMPTS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def make(tmp, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = dict(num_train_epochs=2, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
               eval_interval=0, output_dir=str(tmp), progress_bar=False, save_steps=-1)
    cfg.update(kw)
    return MAGRPOTrainer(agents=LoRAAgents(m, num_agents=2, r=4, tokenizer=tok), reward_func=vowels,
                         train_dataset=PROMPTS, args=MAGRPOConfig(**cfg)), m


def test_adapters_train_only_their_own_weights(tmp_path):
    tr, base = make(tmp_path, reference_kl_enabled=True)
    frozen = lambda: {n: p.detach().clone() for n, p in base.named_parameters() if "lora_" not in n}
    base_before = frozen()
    a0 = [p.detach().clone() for p in tr.agents[0].parameters()]
    tr.train()
    after = frozen()
    # base frozen
    assert base_before.keys() == after.keys() and all(torch.equal(base_before[k], after[k]) for k in after)
    assert any(not torch.equal(x, y) for x, y in zip(a0, tr.agents[0].parameters()))          # adapter trained
    assert tr.optimizers[0].param_groups[0]["params"][0] is next(tr.agents[0].parameters())
    from comlrl_nb import read_metrics
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["agent_0/kl"] == pytest.approx(0.0, abs=1e-6)                              # starts at the reference
    assert rows[-1]["agent_0/kl"] > 0


def test_adapter_resume_and_save(tmp_path):
    full, _ = make(tmp_path / "full", save_steps=2)
    full.train()
    part, _ = make(tmp_path / "part", save_steps=2)
    part.train(stop_after_batch=3)
    res, _ = make(tmp_path / "part", save_steps=2)
    res.train(resume_from_checkpoint=True)
    for a, b in zip(full.agents, res.agents):
        for x, y in zip(a.parameters(), b.parameters()):
            assert torch.equal(x, y)
    out = res.save_model(tmp_path / "saved")
    assert list((out / "agent_1").rglob("adapter_model.safetensors"))


def test_adapters_refuse_mp(tmp_path):
    with pytest.raises(ValueError, match="cannot run concurrently"):
        make(tmp_path, parallel_training="mp", agent_devices="cpu")
