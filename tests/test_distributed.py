"""Data parallel through accelerate: two CPU processes (gloo) end with the weights of a one-process run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def _run(cmd, env=None):
    e = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"


@pytest.mark.parametrize("algo,turns", [("magrpo", 1), ("magrpo", 2), ("maac", 1), ("maac_kl", 1)])
def test_two_processes_match_one(tmp_path, algo, turns):
    script = HERE / "dp_train_script.py"
    # A small learning rate keeps both runs on the same samples: Adam's first steps are ~lr * sign(g), so float-level
    # differences in g (different padding per process) can flip a near-zero component by 2 * lr, and a large lr would
    # let those differences change later samples.
    lr = "1e-5"
    _run([sys.executable, str(script), str(tmp_path / "single"), str(turns), lr, algo])
    _run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
          "--dynamo_backend", "no", "--main_process_port", str(29500 + turns + {"maac": 10, "maac_kl": 20}.get(algo, 0)), str(script),
          str(tmp_path / "dp"), str(turns), lr, algo])
    single = torch.load(tmp_path / "single" / "params_rank0.pt")
    r0, r1 = (torch.load(tmp_path / "dp" / f"params_rank{r}.pt") for r in (0, 1))
    for a, b in zip(r0, r1):
        assert torch.equal(a, b)                                   # ranks stay identical
    for a, b in zip(single, r0):
        assert torch.allclose(a, b, atol=1e-4, rtol=0)             # and match one process (8 steps of <= 1e-5 each)
    rows = [json.loads(l) for l in (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()]
    one = [json.loads(l) for l in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in rows] == [r["batch"] for r in one] == [1, 2, 3, 4]     # written once, by the main process
    for a, b in zip(rows, one):
        assert a["turn_1/reward_mean"] == pytest.approx(b["turn_1/reward_mean"], abs=1e-6)
        for k in ("agent_0/loss", "agent_1/loss", "agent_0/kl", "agent_1/kl"):
            if k in b:
                assert a[k] == pytest.approx(b[k], abs=1e-5)         # the same loss: the same samples and mini-batches
    ck = sorted(p.name for p in (tmp_path / "dp" / "checkpoints").iterdir())
    assert ck == ["checkpoint-0000002", "checkpoint-0000004"]
