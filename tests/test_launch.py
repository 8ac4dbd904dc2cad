"""The command line under a launcher: `python -m comlrl_nb` is `comlrl-nb`, and `torchrun --nproc_per_node 2 -m
comlrl_nb train ...` runs the one-process job: one run directory (also the timestamped default), one report.json
(with the launch's `distributed` section), the one-process final weights."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
# a small job: one pass over the tiny task's 24 items (6 batches), no plot; it ends inside --set, so a test appends
# distributed=... there. lr 1e-5 as in tests/test_sharding.py: Adam moves a weight by about lr per step (seen: at most
# 6e-5 over the run), so ATOL=1e-4 bounds any float-level difference (another split of the rows over the processes,
# another order of the sums; seen: 1.4e-6 under fsdp) and `_same_weights` also checks that training moved the weights
JOB = ["train", "--model", "tiny", "--threads", "1", "--set", "num_train_epochs=1",
       "progress_bar=false", "save_plot=false", "agent_learning_rate=1e-5"]
ATOL = 1e-4


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _run(cmd, cwd=None):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=_env(), cwd=cwd, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    return res


def _torchrun(port, *args, cwd=None):
    return _run([BIN / "torchrun", "--nproc_per_node", 2, "--master_port", port, "-m", "comlrl_nb", *args], cwd)


def _report(d):
    return json.loads((Path(d) / "report.json").read_text())


def _weights(d):
    "The final agents' full weights, as `from_pretrained` reads them back."
    from transformers import AutoModelForCausalLM
    return [AutoModelForCausalLM.from_pretrained(Path(d) / "final" / f"agent_{i}").state_dict() for i in (0, 1)]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    "The one-process job through `python -m comlrl_nb` (distributed=fsdp: one process, so the agents stay whole)."
    d = tmp_path_factory.mktemp("single") / "run"
    _run([sys.executable, "-m", "comlrl_nb", *JOB, "distributed=fsdp", "--heldout-samples", "2", "--output-dir", d])
    return d


def _same_weights(one, other):
    a, b = _weights(one), _weights(other)
    from comlrl_nb.models import make_tiny_model
    init = make_tiny_model()[0].state_dict()
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        diff = max(float((x[k] - y[k]).abs().max()) for k in x)
        moved = max(float((x[k] - init[k]).abs().max()) for k in x)
        assert diff < ATOL and moved > 20 * diff, (diff, moved)        # equal, and training did move the weights


def test_python_m_is_the_command(single):
    res = _run([sys.executable, "-m", "comlrl_nb", "--help"])
    assert res.stdout.startswith("usage: comlrl-nb") and "train" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "comlrl_nb", "train", "--heldout-samples", "-1"], capture_output=True,
                         text=True, env=_env())
    assert bad.returncode == 2 and "--heldout-samples -1 is invalid" in bad.stderr, bad.stderr   # main()'s exit codes
    rep = _report(single)
    assert rep["complete"] and rep["trained"]["global_batch"] == 6
    assert (rep["distributed"]["world_size"], rep["distributed"]["strategy"]) == (1, "none")
    assert sorted(p.name for p in (single / "final").iterdir()) == ["agent_0", "agent_1"]


def test_torchrun_fsdp_is_the_one_process_job(tmp_path, single):
    out = tmp_path / "run"
    res = _torchrun(29710, *JOB, "distributed=fsdp", "--heldout-samples", "2", "--output-dir", out)
    assert res.stdout.count("[comlrl-nb] report:") == 1, res.stdout         # the main process alone reports
    rep, one = _report(out), _report(single)
    d = rep["distributed"]
    assert rep["complete"] and (d["world_size"], d["strategy"]) == (2, "fsdp")
    for k in ("parameter_bytes", "optimizer_bytes"):                           # rank 0's shards: half of each agent
        assert 0.45 * one["distributed"][k] <= d[k] <= 0.55 * one["distributed"][k], (k, d[k], one["distributed"][k])
    assert sorted(p.name for p in out.iterdir()) == [".comlrl_nb.lock", "final", "metrics.jsonl", "report.json"]
    assert [json.loads(l)["batch"] for l in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    _same_weights(single, out)
    # the same command again: the main process refuses the used directory and the other one raises the same refusal
    # (nobody waits for a directory that will not come)
    again = subprocess.run([str(c) for c in [BIN / "torchrun", "--nproc_per_node", 2, "--master_port", 29715, "-m",
                                             "comlrl_nb", *JOB, "distributed=fsdp", "--output-dir", out]],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert again.returncode != 0 and again.stderr.count(f"error: output_dir {out} already holds another run") == 2, \
        again.stderr[-3000:]
    # the held-out checks (every process samples them from the gathered agents): the same responses, the same rewards
    assert rep["heldout_before"]["rewards"] == one["heldout_before"]["rewards"]
    assert rep["heldout_after"]["rewards"] == pytest.approx(one["heldout_after"]["rewards"], abs=1e-6)


@pytest.mark.parametrize("strategy,port", [("ddp", 29711), ("none", 29712)])
def test_torchrun_default_dir_is_one_directory(tmp_path, single, strategy, port):
    "No --output-dir: the main process picks runs/magrpo/<timestamp>/ and the other one writes into the same one."
    _torchrun(port, *JOB, f"distributed={strategy}", "--heldout-samples", "0", cwd=tmp_path)
    runs = sorted(p.name for p in (tmp_path / "runs" / "magrpo").iterdir())
    assert len(runs) == 2 and runs[-1] == "latest", runs                      # one run, and the link to it
    out = (tmp_path / "runs" / "magrpo" / "latest").resolve()
    rep = _report(out)
    assert rep["complete"] and rep["config"]["output_dir"] == str(Path("runs") / "magrpo" / runs[0])
    assert (rep["distributed"]["world_size"], rep["distributed"]["strategy"]) == (2, "ddp")   # 'none' runs as 'ddp'
    assert rep["distributed"]["parameter_bytes"] == _report(single)["distributed"]["parameter_bytes"]   # replicas
    _same_weights(single, out)


REWARD = '''import os
calls = [0]

def vowels(a, b, batch_items=None):
    "A smooth reward (the vowel share of both texts); the process of rank $RANK_FAILS fails at its $FAIL_AT-th call."
    calls[0] += 1
    if os.environ.get("RANK") == os.environ.get("RANK_FAILS") and str(calls[0]) == os.environ.get("FAIL_AT"):
        raise RuntimeError("reward server down")
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]
'''


def test_a_failing_process_loses_nothing_and_resume_finishes(tmp_path):
    """Rank 1's reward fails in batch 3 (of 4): the main process keeps batch 2's checkpoint and reports the stop with
    rank 1's reason and the torchrun command that finishes it; that command gives the uninterrupted one-process run."""
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps({"prompt": f"Say {w}."}) for w in
                                                   ("yes", "no", "maybe", "ok", "up", "down", "left", "right")))
    (tmp_path / "rew.py").write_text(REWARD)
    job = ["train", "--model", "tiny", "--dataset", tmp_path / "rows.jsonl", "--reward", f"{tmp_path}/rew.py:vowels",
           "--heldout-samples", "0", "--threads", "1", "--set", "num_train_epochs=1", "progress_bar=false",
           "save_plot=false", "agent_learning_rate=1e-5", "save_steps=1", "rollout_batch_size=2", "distributed=fsdp"]
    one, out = tmp_path / "one", tmp_path / "run"
    _run([sys.executable, "-m", "comlrl_nb", *job, "--output-dir", one])
    cmd = [BIN / "torchrun", "--nproc_per_node", 2, "--master_port", 29713, "-m", "comlrl_nb", *job,
           "--output-dir", out]
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                         env={**_env(), "RANK_FAILS": "1", "FAIL_AT": "3"})
    assert res.returncode != 0
    rep = _report(out)
    st = rep["stopped"]
    assert not rep["complete"] and "checkpoints/checkpoint-0000002" in st["kept"], st
    assert [(o["rank"], o["phase"]) for o in st["other_processes"]] == [(1, "train")], st
    assert "reward server down" in st["other_processes"][0]["reason"], st
    assert st["finish_with"].startswith("torchrun --nproc_per_node 2 -m comlrl_nb train ") and \
        st["finish_with"].endswith(" --resume"), st["finish_with"]
    _torchrun(29714, *job, "--output-dir", out, "--resume")
    # the note is in the report; the main process deletes it after writing the report, or (when the launcher's SIGTERM
    # cuts that short) the next attempt does
    assert not list(out.glob(".stop.rank*.json"))
    rep = _report(out)
    assert rep["complete"] and rep["attempts"] == 2 and rep["trained"]["global_batch"] == 4
    _same_weights(one, out)


def test_a_sigterm_while_the_stop_is_recorded_waits_for_the_report(tmp_path, monkeypatch):
    """The reward fails and, while the main process writes the stop into report.json, a SIGTERM arrives (a launcher's,
    after a peer failed first): the report is written whole, with the failure, and the command still fails."""
    import signal
    from comlrl_nb import cli
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps({"prompt": f"Say {w}."}) for w in ("yes", "no")))
    (tmp_path / "rew.py").write_text("def down(a, b):\n    raise RuntimeError('reward server down')\n")
    real = cli._stop_reason
    def sigterm_now(e):
        os.kill(os.getpid(), signal.SIGTERM)                 # delivered here, in the middle of the stop's report
        return real(e)
    monkeypatch.setattr(cli, "_stop_reason", sigterm_now)
    out = tmp_path / "run"
    code = cli.main(["train", "--model", "tiny", "--dataset", str(tmp_path / "rows.jsonl"), "--reward",
                     f"{tmp_path}/rew.py:down", "--heldout-samples", "0", "--output-dir", str(out), "--set",
                     "progress_bar=false", "num_train_epochs=1"])
    assert code != 0
    st = _report(out)["stopped"]
    assert "reward server down" in st["reason"] and st["finish_with"].endswith(" --resume"), st
