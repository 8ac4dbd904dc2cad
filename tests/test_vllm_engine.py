"""The vLLM backend's pieces that need no vLLM (the main venv): the module imports without it, using it names
`make vllm`, and the truncated importance weights and mismatch metric are right. The engine itself: tests_vllm/."""
import math

import pytest
import torch

from comlrl_nb import vllm_engine as ve


def test_imports_without_vllm_and_names_make_vllm():
    if ve.vllm_available():
        pytest.fail("vllm is importable in this venv; these checks are for the main venv (the engine: make test-vllm)")
    with pytest.raises(ImportError, match="make vllm"):
        ve.require_vllm()
    with pytest.raises(ImportError, match="make vllm"):
        ve.VLLMSampler("/nonexistent")


def test_truncated_importance_weights():
    lt = torch.tensor([[-0.1, -2.0, -1.0]], requires_grad=True)
    ls = torch.tensor([[-0.5, -1.0, -1.0]])
    w = ve.truncated_importance_weights(lt, ls)
    torch.testing.assert_close(w.detach(), torch.tensor([[1.0, math.exp(-1.0), 1.0]]))
    w.sum().backward()                                       # capped tokens (above 1) carry no gradient
    torch.testing.assert_close(lt.grad, torch.tensor([[0.0, math.exp(-1.0), 1.0]]))
    with pytest.raises(ValueError, match="positive cap"):
        ve.truncated_importance_weights(lt, ls, cap=-1.0)


def test_sampler_mismatch_ignores_padding():
    lt, ls = torch.tensor([[-1.0, -2.0, -9.0]]), torch.tensor([[-1.5, -2.0, 0.0]])
    m = ve.sampler_mismatch(lt, ls, torch.tensor([[1, 1, 0]]))
    assert m["sampler/logp_abs_diff"] == pytest.approx(0.25)
    assert m["sampler/logp_max_diff"] == pytest.approx(0.5)
    assert m["sampler/kl_k3"] == pytest.approx((math.exp(0.5) - 0.5 - 1) / 2)
    assert m["sampler/tis_weight"] == pytest.approx(1.0)
