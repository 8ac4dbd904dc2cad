"""Shared pieces of the vLLM backend tests (run them with `make test-vllm`, in .venv-vllm)."""
import copy

import pytest
import torch

from comlrl_nb.models import make_tiny_model
from comlrl_nb.vllm_engine import VLLMSampler

torch.set_num_threads(1)
ENGINE = dict(max_model_len=512, kv_cache_bytes=32 << 20)     # an explicit KV cache per engine


def agent(seed: int = 0, noise: float = 0.1, tokenizer=None):
    """A tiny random Llama (tied LM head, head_dim 32) whose weights are jittered with a keyed generator so greedy
    completions vary from token to token (the plain random init repeats one token)."""
    model, tok = make_tiny_model(hidden_size=128, seed=seed, tokenizer=tokenizer)
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return model, tok


def jittered(model, seed: int, noise: float = 0.1):
    "A copy of `model` with every weight moved (the embedding, and so the tied head, included)."
    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return new


@pytest.fixture(scope="session")
def agent_a():
    return agent(0)


@pytest.fixture(scope="session")
def sampler_a(agent_a):
    s = VLLMSampler(agent_a[0], agent_a[1], **ENGINE)
    yield s
    s.close()
