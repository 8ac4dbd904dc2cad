"""Data parallel through accelerate: two CPU processes (gloo) end with the weights of a one-process run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comlrl_nb.engine import read_metrics

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
    _run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
          str(29500 + turns + {"maac": 10, "maac_kl": 20}.get(algo, 0)), str(script),
          str(tmp_path / "dp"), str(turns), lr, algo])
    single = torch.load(tmp_path / "single" / "params_rank0.pt")
    r0, r1 = (torch.load(tmp_path / "dp" / f"params_rank{r}.pt") for r in (0, 1))
    for a, b in zip(r0, r1):
        assert torch.equal(a, b)                                   # ranks stay identical
    for a, b in zip(single, r0):
        assert torch.allclose(a, b, atol=1e-4, rtol=0)             # and match one process (8 steps of <= 1e-5 each)
    rows = [json.loads(l) for l in (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()]
    one = [json.loads(l) for l in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in rows] == [r["batch"] for r in one] == [1, 2, 3, 4]  # written once, by the main process
    for a, b in zip(rows, one):
        assert a["turn_1/reward_mean"] == pytest.approx(b["turn_1/reward_mean"], abs=1e-6)
        for k in ("agent_0/loss", "agent_1/loss", "agent_0/kl", "agent_1/kl"):
            if k in b:
                # the same samples and mini-batches; the weights may differ by the flips described above, so a
                # later batch's loss may too (1.5e-5 seen on maac_kl): the weights' own tolerance, 1e-4
                assert a[k] == pytest.approx(b[k], abs=1e-4)
    ck = sorted(p.name for p in (tmp_path / "dp" / "checkpoints").iterdir())
    assert ck == ["checkpoint-0000002", "checkpoint-0000004"]


PREF = HERE / "dp_pref_script.py"
PORTS = {"madpo": 29541, "madpo_central": 29542, "madpo_iter": 29543, "reward_model": 29544, "marlhf": 29545,
         "marlhf_central": 29546}


def _launch(out, algo, port, *extra, strategy="none"):
    _run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port), str(PREF), str(out),
          algo, *extra], env={"DP_STRATEGY": strategy})


def _params(d, rank=0):
    return torch.load(Path(d) / f"params_rank{rank}.pt")


def _same_weights(single, dp):
    r0, r1 = _params(dp, 0), _params(dp, 1)
    assert all(torch.equal(a, b) for a, b in zip(r0, r1))                       # ranks stay identical
    moved = max(float((a - b).abs().max()) for a, b in zip(_params(single), [p for p in r0]))
    assert all(torch.allclose(a, b, atol=1e-4, rtol=0) for a, b in zip(_params(single), r0)), moved


def _json(p):
    return json.loads(Path(p).read_text())


@pytest.mark.parametrize("algo", ["madpo", "madpo_central", "madpo_iter", "reward_model", "marlhf", "marlhf_central"])
def test_preference_two_processes_match_one(tmp_path, algo):
    """MADPO (decentralized and centralized), MADPOIter, the MARLHF reward-model fit and a whole MARLHF run: two
    processes collect, score and train their shares and end with a one-process run's weights, files written once by
    the main process."""
    one, dp = tmp_path / "single", tmp_path / "dp"
    _run([sys.executable, str(PREF), str(one), algo])
    _launch(dp, algo, PORTS[algo])
    _same_weights(one, dp)
    if algo == "reward_model":
        h1, h2 = _json(one / "history.json"), _json(dp / "history.json")
        assert [h["step"] for h in h1] == [h["step"] for h in h2] == list(range(1, 7))
        for a, b in zip(h1, h2):
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-5) and a["accuracy"] == b["accuracy"]
        return
    rows, ref = read_metrics(dp / "metrics.jsonl"), read_metrics(one / "metrics.jsonl")
    key = lambda r: (r["batch"], r.get("phase"))
    assert [key(r) for r in rows] == [key(r) for r in ref]                      # each line once, in the same order
    for a, b in zip(rows, ref):
        for k, v in b.items():
            counted = isinstance(v, (int, float)) and "time" not in k
            if k.startswith(("dpo/", "agent_", "collection/", "round/")) and counted:
                assert a[k] == pytest.approx(v, abs=1e-5, nan_ok=True), k       # the same pairs, losses, counts
    assert sorted(p.name for p in (dp / "checkpoints").iterdir()) == sorted(p.name
                                                                            for p in (one / "checkpoints").iterdir())
    if algo.startswith("marlhf"):                     # pairs, reward-model log and state written once, as alone
        assert _json(dp / "pairs.json") == _json(one / "pairs.json")
        rm_rows = lambda d: read_metrics(d / "reward_model" / "metrics.jsonl")
        assert [r["step"] for r in rm_rows(dp)] == [r["step"] for r in rm_rows(one)]
        for a, b in zip(rm_rows(dp), rm_rows(one)):
            assert a.get("reward_model/loss") == pytest.approx(b.get("reward_model/loss"), abs=1e-5)
        assert (dp / "reward_model" / "state.pt").exists() and len(ref) >= 2
    elif algo == "madpo_iter":
        for f in ("iteration_0001.json", "iteration_0002.json"):
            assert _json(dp / "preference_replay" / f) == _json(one / "preference_replay" / f)
        snaps = lambda d: sorted(p.name for p in (d / "policy_checkpoints").iterdir())
        assert snaps(dp) == snaps(one) == ["policy_0000.pt", "policy_0001.pt", "policy_0002.pt"]
    else:
        assert _json(dp / "pairs.json") == _json(one / "pairs.json")            # the same pairs, in the same order
        assert len(ref) == 9 and [r["dpo/pairs"] for r in ref[1:5]] == [3, 3, 3, 1]   # rank 1's last share is empty


@pytest.mark.parametrize("algo,stop,strategy", [("madpo", "3", "none"), ("madpo_iter", "1", "none"),
                                               ("madpo_iter", "1", "ddp")])
def test_preference_two_processes_resume(tmp_path, algo, stop, strategy):
    """A data-parallel run stopped and resumed ends with the weights and metrics of an uninterrupted data-parallel run.
    MADPOIter under 'ddp': the resumed history comparator's copy of the gathered agents once shared their storage, so
    loading S_0 into it set the agents back to S_0 (`full_state` copies now)."""
    full, part, port = tmp_path / "full", tmp_path / "part", PORTS[algo] + (0 if strategy == "none" else 3)
    _launch(full, algo, port + 10, strategy=strategy)
    _launch(part, algo, port + 20, stop, strategy=strategy)
    _launch(part, algo, port + 30, "-", "resume", strategy=strategy)
    for r in (0, 1):
        assert all(torch.equal(a, b) for a, b in zip(_params(full, r), _params(part, r)))
    strip = lambda rows: [{k: v for k, v in r.items() if "time" not in k and "per_s" not in k} for r in rows]
    assert strip(read_metrics(part / "metrics.jsonl")) == strip(read_metrics(full / "metrics.jsonl"))


EXIT_SCRIPT = '''
import atexit, os, sys, torch
out, user_opened = sys.argv[1], sys.argv[2] == "1"
rank = os.environ["RANK"]
def probe():          # registered first, so it runs after every exit handler the package registers
    open_now = torch.distributed.is_initialized()
    with open(os.path.join(out, f"open_at_exit_{rank}.txt"), "w") as f: f.write(str(open_now))
    if open_now: torch.distributed.destroy_process_group()
atexit.register(probe)
if user_opened: torch.distributed.init_process_group("gloo")
from comlrl_nb.distributed import DistContext
d = DistContext()
assert d.gather(d.rank) == [0, 1]
'''


@pytest.mark.parametrize("user_opened,port", [(False, 29971), (True, 29972)])
def test_the_process_group_the_package_opened_is_closed_at_exit(tmp_path, user_opened, port):
    """A script that ends without `destroy_process_group` leaves no group open into the interpreter's teardown (gloo's
    threads aborted the process there, in CI): the package closes the group it opened; one the user opened is theirs."""
    script = tmp_path / "exit_script.py"
    script.write_text(EXIT_SCRIPT)
    _run([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), str(script), str(tmp_path),
          "1" if user_opened else "0"], env={"PYTHONPATH": str(HERE.parent)})
    assert [(tmp_path / f"open_at_exit_{r}.txt").read_text() for r in (0, 1)] == [str(user_opened)] * 2
