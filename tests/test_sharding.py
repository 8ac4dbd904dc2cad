"""`distributed="ddp"` / `"fsdp"`: two CPU processes (gloo, torchrun) on torch's FSDP2 end with the one-process
weights."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
SCRIPT = HERE / "shard_script.py"
# lr 1e-5, 8 optimizer steps per agent: Adam moves each weight by <= ~8e-5, so 1e-4 bounds any float-level difference
# (another split of the mini-batch's rows, another order of the sums) flipping a near-zero gradient's sign
ATOL = 1e-4


def _run(cmd, algo="magrpo", micro=None, evals=False, **extra_env):
    env = {**os.environ, **extra_env, "SHARD_ALGO": algo, "SHARD_MICRO": str(micro or ""),
           "SHARD_EVAL": "1" if evals else "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


def _wait(*procs):
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-6000:]


def _torchrun(out, strategy, port, *extra, nproc=2, algo="magrpo", micro=None, evals=False, **env):
    _wait(_run([BIN / "torchrun", "--nproc_per_node", nproc, "--master_port", port, SCRIPT, out, strategy, *extra],
               algo, micro, evals, **env))


def _params(d):
    return torch.load(Path(d) / "params.pt")


def _rows(d):
    "The run's metrics lines, then (MARLHFIter) its policy phases' lines, round by round."
    files = [Path(d) / "metrics.jsonl", *sorted(Path(d).glob("policy/iteration_*/metrics.jsonl"))]
    return [json.loads(l) for f in files for l in f.read_text().splitlines()]


def _mem(d, rank):
    return json.loads((Path(d) / f"mem_rank{rank}.json").read_text())


def _same_run(one, other, reward_tol=1e-6):
    """The same weights within ATOL, and the same metrics: rewards of the same samples (within `reward_tol`: 1e-6, or
    ATOL where a learned reward model scores them), losses within ATOL, the same batches logged once."""
    a, b = _params(one), _params(other)
    assert len(a) == len(b) == (1 if "centralized" in str(one) else 2)
    assert [list(x) for x in a] == [list(x) for x in b]                    # the same parameter names, full shapes
    diff = max(float((x[k] - y[k]).abs().max()) for x, y in zip(a, b) for k in x)
    assert diff < ATOL, diff
    init = torch.load(Path(one) / "init.pt")
    norm = lambda us, vs: sum(float((u[k] - v[k]).pow(2).sum()) for u, v in zip(us, vs) for k in u) ** 0.5
    # the runs moved the weights alike: a run that did not train would give 1.0 here; seen: <= 0.01 for the RL
    # families, 0.12 for MADPO (its tiny DPO gradients: Adam magnifies float-level differences to ~lr-sized ones)
    assert norm(a, b) < 0.25 * norm(a, init), (norm(a, b), norm(a, init))
    ra, rb = _rows(one), _rows(other)
    assert len(ra) >= 4 and [r["batch"] for r in ra] == [r["batch"] for r in rb]      # written once, by the main one
    checked = 0
    for x, y in zip(ra, rb):
        keys = sorted(k for k in x if k.endswith("loss") or k.endswith("reward_mean"))
        assert keys == sorted(k for k in y if k.endswith("loss") or k.endswith("reward_mean"))
        for k in keys:
            assert x[k] == pytest.approx(y[k], abs=ATOL if k.endswith("loss") else reward_tol), k
            checked += 1
    assert checked >= len(ra)                                              # a number per row at least


def _single(root, algo="magrpo", evals=False):
    "The one-process run (distributed='none'), and the initial weights next to it."
    d = root.mktemp(f"single_{algo}{'_eval' if evals else ''}")
    _wait(_run([sys.executable, SCRIPT, d, "none"], algo, evals=evals))
    if algo == "lora": return d                                        # the script saved the adapters' initial weights
    from comlrl_nb import make_tiny_model
    m0, tok = make_tiny_model(seed=0)
    seeds = (0,) if algo == "centralized" else (0, 1)
    torch.save([make_tiny_model(seed=s, tokenizer=tok)[0].state_dict() for s in seeds], d / "init.pt")
    return d


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    "`one_process(algo)`: the family's one-process run, run once for this module (its fsdp, ddp and micro tests)."
    cache = {}
    def get(algo="magrpo", evals=False):
        if (algo, evals) not in cache: cache[algo, evals] = _single(tmp_path_factory, algo, evals)
        return cache[algo, evals]
    return get


@pytest.fixture(scope="module")
def single(one_process):
    return one_process("magrpo")


def test_fsdp_matches_one_process_and_halves_the_memory(tmp_path, single):
    _torchrun(tmp_path, "fsdp", 29621)
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)
    one, r0, r1 = _mem(single, 0), _mem(tmp_path, 0), _mem(tmp_path, 1)
    assert (r0["world_size"], r0["strategy"], one["strategy"]) == (2, "fsdp", "none")
    for k in ("parameter_bytes", "optimizer_bytes"):             # each process holds half of each agent (its shards)
        assert r0[k] + r1[k] >= one[k] and max(r0[k], r1[k]) <= 0.55 * one[k], (k, one[k], r0[k], r1[k])
    # save_model: ordinary HF directories with the full weights
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "final" / "agent_1")
    assert all(torch.equal(v, _params(tmp_path)[1][k]) for k, v in m.state_dict().items())


def test_ddp_matches_one_process(tmp_path, single):
    _torchrun(tmp_path, "ddp", 29622)
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)
    one, r1 = _mem(single, 0), _mem(tmp_path, 1)
    assert r1["strategy"] == "ddp" and r1["parameter_bytes"] == one["parameter_bytes"]   # replicated: whole agents
    assert r1["optimizer_bytes"] == one["optimizer_bytes"]


def test_fsdp_on_two_nodes(tmp_path, single):
    "Two torchrun invocations, one process each, meeting at a rendezvous on 127.0.0.1: the one-process result."
    _wait(*[_run([BIN / "torchrun", "--nnodes", 2, "--node_rank", r, "--nproc_per_node", 1, "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", "127.0.0.1:29623", "--rdzv-id", "two-nodes", SCRIPT, tmp_path, "fsdp"])
             for r in (0, 1)])
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)
    assert _mem(tmp_path, 0)["world_size"] == 2


def _whole_team_bytes(single):
    "The bytes of the whole team's parameters and optimizer states (the one-process run holds all of them)."
    m = _mem(single, 0)
    return m["parameter_bytes"] + m["optimizer_bytes"]


def _tensor_bytes_per_file(shards):
    "The tensor bytes each DCP file of a checkpoint holds, from its .metadata (the files add pickling overhead)."
    import math
    from torch.distributed.checkpoint import FileSystemReader
    md, out = FileSystemReader(str(shards)).read_metadata(), {}
    for idx, where in md.storage_data.items():
        m = md.state_dict_metadata[idx.fqn]
        if hasattr(m, "chunks"):                                        # a tensor (not pickled bytes)
            c = next(c for c in m.chunks if tuple(c.offsets) == tuple(idx.offset))
            out[where.relative_path] = out.get(where.relative_path, 0) + math.prod(c.sizes) * m.properties.dtype.itemsize
    return out


def test_fsdp_stop_and_resume(tmp_path, single):
    """Stopped after batch 2 and resumed: the uninterrupted run. Each checkpoint holds one shard file per process
    (torch.distributed.checkpoint), none of them the whole team, and a state.pt without the agents."""
    _torchrun(tmp_path, "fsdp", 29720, "stop", 2)
    ck = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ck == ["checkpoint-0000001", "checkpoint-0000002"]                  # nothing temporary left behind
    last = tmp_path / "checkpoints" / ck[-1]
    assert sorted(p.name for p in (last / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    per_file, whole = _tensor_bytes_per_file(last / "shards"), _whole_team_bytes(single)
    assert sorted(per_file) == ["__0_0.distcp", "__1_0.distcp"]
    # every weight and optimizer state once (tied embeddings twice), each process' file about half of them
    assert sum(per_file.values()) >= whole and max(per_file.values()) <= 0.55 * sum(per_file.values()), per_file
    assert (last / "state.pt").stat().st_size < 0.1 * whole                     # the rest: no agent in it
    meta = json.loads((last / "trainer_state.json").read_text())
    assert meta["sharded"] == {"dir": "shards", "world_size": 2, "strategy": "fsdp", "components": ["team"]}
    _torchrun(tmp_path, "fsdp", 29721, "resume", SHARD_SAVE_CHECKPOINT="1")
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)
    saved = tmp_path / "saved_checkpoint"                    # trainer.save_checkpoint: the same layout, all processes
    assert sorted(p.name for p in (saved / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert json.loads((saved / "trainer_state.json").read_text())["sharded"]["world_size"] == 2
    assert not list(tmp_path.glob(".saved_checkpoint*"))      # its temporary folder is gone


def test_fsdp_stop_under_two_resume_under_one(tmp_path, single):
    "A checkpoint written by 2 processes resumes in 1 (DCP reshards on load, no process group): the uninterrupted run."
    _torchrun(tmp_path, "fsdp", 29722, "stop", 2)
    assert (tmp_path / "checkpoints" / "checkpoint-0000002" / "shards" / "__1_0.distcp").is_file()
    _wait(_run([sys.executable, SCRIPT, tmp_path, "fsdp", "resume"]))          # one process: the agents whole
    assert _mem(tmp_path, 0)["world_size"] == 1
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)


def test_fsdp_stop_under_one_resume_under_two(tmp_path, single):
    "A one-process checkpoint (whole agents in state.pt) resumes under 2 processes, each taking its shards of it."
    _wait(_run([sys.executable, SCRIPT, tmp_path, "fsdp", "stop", 2]))
    assert not (tmp_path / "checkpoints" / "checkpoint-0000002" / "shards").exists()
    _torchrun(tmp_path, "fsdp", 29723, "resume")
    assert _mem(tmp_path, 1)["world_size"] == 2
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)


def test_ddp_stop_under_two_resume_under_one(tmp_path, single):
    "'ddp' checkpoints too go through DCP (replicated weights: one process writes each tensor) and resume in 1 process."
    _torchrun(tmp_path, "ddp", 29724, "stop", 2)
    shards = tmp_path / "checkpoints" / "checkpoint-0000002" / "shards"
    assert sum(_tensor_bytes_per_file(shards).values()) >= _whole_team_bytes(single)    # each tensor written once
    assert json.loads((shards.parent / "trainer_state.json").read_text())["sharded"]["strategy"] == "ddp"
    _wait(_run([sys.executable, SCRIPT, tmp_path, "ddp", "resume"]))
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)


def test_iac_stop_under_two_resume_under_one(tmp_path_factory, one_process):
    "IAC's actor optimizers also hold the value heads' parameters (not the model's): they come back exactly too."
    one, out = one_process("iac"), tmp_path_factory.mktemp("resume_iac")
    _torchrun(out, "fsdp", 29725, "stop", 2, algo="iac")
    assert (out / "checkpoints" / "checkpoint-0000002" / "shards" / "__1_0.distcp").is_file()
    _wait(_run([sys.executable, SCRIPT, out, "fsdp", "resume"], "iac"))
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out)


def test_sharded_save_failing_in_one_process_commits_nothing(tmp_path):
    "Process 1 cannot write its shards: both processes raise, no checkpoint-2 (nor its temporary folder) is left."
    root = tmp_path / "checkpoints"
    _wait(_run([BIN / "torchrun", "--nproc_per_node", 2, "--master_port", 29726, HERE / "dcp_atomic_script.py", root]))
    r0, r1 = (json.loads((tmp_path / f"result_rank{r}.json").read_text()) for r in (0, 1))
    for r in (r0, r1):                                  # each names the process that failed and why
        assert "could not save the checkpoint: process 1: OSError: [Errno 28] No space left" in r["error"], r
        assert r["latest"] == ["checkpoint-0000001", 1, [float(i) for i in range(8)]]   # the previous one, intact
    assert r0["folder"] == ["checkpoint-0000001"]                               # nothing of the failed save


@pytest.mark.parametrize("algo,port", [("centralized", 29631), ("maac", 29632), ("iac", 29633), ("madpo", 29634),
                                      ("marlhf", 29635), ("madpo_iter", 29742), ("marlhf_iter", 29743)])
def test_families_under_fsdp(tmp_path_factory, one_process, algo, port):
    """CentralizedMAGRPO (one actor), MAAC (its separate critic sharded too), IAC (value heads on the sharded actors),
    MADPO, MARLHF (its reward model sharded too, gathered with the agents for each rollout: rewards within ATOL),
    MADPOIter (two rounds against the history comparator: whole copies of the sharded agents and their snapshots) and
    MARLHFIter (two rounds against the current agents, a reward model per round: learned rewards within ATOL)."""
    one, out = one_process(algo), tmp_path_factory.mktemp(f"fsdp_{algo}")
    _torchrun(out, "fsdp", port, algo=algo)
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out, ATOL if algo.startswith("marlhf") else 1e-6)
    m1, m = _mem(out, 1), _mem(one, 0)
    assert m1["strategy"] == "fsdp" and m1["parameter_bytes"] <= 0.55 * m["parameter_bytes"]
    assert (m["critic_bytes"] > 0) == (algo == "maac") and m1["critic_bytes"] <= 0.55 * m["critic_bytes"]
    rm = m["reward_model_bytes"]
    assert (rm > 0) == algo.startswith("marlhf") and m1["reward_model_bytes"] <= 0.55 * rm   # sharded too


@pytest.mark.parametrize("algo,stop,port", [("centralized", 2, 29900), ("maac", 2, 29902), ("madpo", 3, 29904),
                                            ("marlhf", 2, 29906), ("madpo_iter", 1, 29908), ("marlhf_iter", 1, 29910)])
def test_families_stop_and_resume_under_fsdp(tmp_path_factory, one_process, algo, stop, port):
    """Every other family under 'fsdp' on 2 processes, stopped mid-run (after batch 2 of 4, MADPO's 3 of 6; the
    iterative ones after round 1 of 2), each process writing its shards, then resumed on 2 processes: the
    uninterrupted one-process run (MARLHF's learned rewards within ATOL), each process holding about half of every
    model it resumed (MARLHF's reward model, reloaded whole from its fit, sharded again)."""
    one, out = one_process(algo), tmp_path_factory.mktemp(f"resume_{algo}")
    _torchrun(out, "fsdp", port, "stop", stop, algo=algo)
    ck = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ck[-1] == f"checkpoint-{stop:07d}" and len(_rows(out)) < len(_rows(one)), (ck, _rows(out))   # mid-run
    shards = out / "checkpoints" / ck[-1] / "shards"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]   # one a process
    stamps = lambda: {p: p.stat().st_mtime_ns for p in shards.parent.rglob("*")}
    before = stamps()
    _torchrun(out, "fsdp", port + 1, "resume", algo=algo)
    assert stamps() == before            # continued from that checkpoint: not written again (no restart from batch 0)
    m1, m = _mem(out, 1), _mem(one, 0)
    assert m1["world_size"] == 2 and m1["parameter_bytes"] <= 0.55 * m["parameter_bytes"]
    for part in ("critic_bytes", "reward_model_bytes"):     # a resumed critic or fitted reward model: sharded too
        assert m1[part] <= 0.55 * m[part], (part, m1[part], m[part])
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out, ATOL if algo.startswith("marlhf") else 1e-6)


@pytest.mark.parametrize("algo,port", [("magrpo_kl", 29760), ("maac_kl", 29761), ("centralized_kl", 29762)])
def test_references_sharded_under_fsdp(tmp_path_factory, one_process, algo, port):
    """With the reference KL under 'fsdp' the frozen references are sharded like the agents (each process holds about
    half of their bytes) and gathered with them for each rollout: the one-process run, its KL metrics included."""
    one, out = one_process(algo), tmp_path_factory.mktemp(f"fsdp_{algo}")
    _torchrun(out, "fsdp", port, algo=algo)
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out)
    m1, m = _mem(out, 1), _mem(one, 0)
    assert m["reference_bytes"] > 0 and m1["reference_bytes"] <= 0.55 * m["reference_bytes"], (m, m1)
    kls = [(k, a[k], b[k]) for a, b in zip(_rows(one), _rows(out)) for k in a
           if k.endswith("kl") and not k.startswith("time/")]
    assert kls and any(v != 0 for _, v, _ in kls), kls                   # the penalty was on, and measured
    for k, v, w in kls: assert w == pytest.approx(v, abs=ATOL), k


@pytest.mark.parametrize("algo,port", [("madpo", 29744), ("maac", 29745), ("madpo_iter", 29746)])
def test_families_under_ddp(tmp_path_factory, one_process, algo, port):
    """Replicated data parallel on torch's reduction (FSDP2 over a (replicate, shard) mesh of shape (2, 1)) for MADPO,
    MAAC (critics whole, on torch's data parallel too) and MADPOIter: the one-process run, each process holding whole agents."""
    one, out = one_process(algo), tmp_path_factory.mktemp(f"ddp_{algo}")
    _torchrun(out, "ddp", port, algo=algo)
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out)
    m1, m = _mem(out, 1), _mem(one, 0)
    assert (m1["strategy"], m1["world_size"]) == ("ddp", 2)
    assert (m1["parameter_bytes"], m1["optimizer_bytes"]) == (m["parameter_bytes"], m["optimizer_bytes"])


@pytest.mark.parametrize("algo,port", [("magrpo", 29748), ("madpo", 29749)])
def test_micro_batches_under_fsdp(tmp_path_factory, one_process, algo, port):
    """micro_batch_size=1 under 'fsdp': every process runs as many forward/backward chunks as the process with the most
    rows (`shared_chunk_count`; MADPO's batches of 3 pairs give 2 and 1 per process: the second adds a chunk of weight
    0), gradients accumulated over them: the one-process run with whole batches."""
    one, out = one_process(algo), tmp_path_factory.mktemp(f"micro_{algo}")
    _torchrun(out, "fsdp", port, algo=algo, micro=1)
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out)
    assert _mem(out, 1)["strategy"] == "fsdp"


@pytest.mark.parametrize("algo,port", [("magrpo", 29751), ("madpo", 29752), ("madpo_iter", 29753)])
def test_evaluation_during_training_under_fsdp(tmp_path_factory, one_process, algo, port):
    """eval_interval=1 under 'fsdp': every process evaluates a block of the eval batches (3 items in batches of 1: 2 and
    1) with the agents gathered once, the main one logs: the one-process run's eval metrics and weights."""
    one, out = one_process(algo, evals=True), tmp_path_factory.mktemp(f"eval_{algo}")
    _torchrun(out, "fsdp", port, algo=algo, evals=True)
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out)
    ev = [(r["batch"], r["eval/turn_1/reward_mean"]) for r in _rows(out) if "eval/turn_1/reward_mean" in r]
    assert len(ev) >= 2 and ev == [(r["batch"], r["eval/turn_1/reward_mean"]) for r in _rows(one)
                                   if "eval/turn_1/reward_mean" in r]


@pytest.mark.parametrize("strategy,port", [("ddp", 29764), ("fsdp", 29765)])
def test_lora_adapters_on_one_base_under_a_launcher(tmp_path_factory, one_process, strategy, port):
    """Two LoRA adapters over one base model: the base is handed to torch's data parallel once (the agents are views of
    it), each adapter trained on its own: the one-process run; under 'fsdp' each process holds about half of them."""
    one, out = one_process("lora"), tmp_path_factory.mktemp(f"lora_{strategy}")
    _torchrun(out, strategy, port, algo="lora")
    (out / "init.pt").symlink_to(one / "init.pt")
    _same_run(one, out)
    m1, m = _mem(out, 1), _mem(one, 0)
    share = 0.55 if strategy == "fsdp" else 1
    assert m1["strategy"] == strategy and m1["parameter_bytes"] <= share * m["parameter_bytes"]
    from safetensors.torch import load_file                  # save_model: each adapter in PEFT's format, gathered whole
    for i in (0, 1):
        a, b = (load_file(next((d / "final" / f"agent_{i}").rglob("adapter_model.safetensors"))) for d in (one, out))
        assert sorted(a) == sorted(b) and all(torch.allclose(a[k], b[k], atol=ATOL, rtol=0) for k in a)


def test_adapters_refuse_a_whole_copy_under_a_launcher(tmp_path):
    "MADPOIter's history comparator with LoRA adapters under a launcher: the copy is refused, naming the fix."
    p = _run([BIN / "torchrun", "--nproc_per_node", 2, "--master_port", 29766, SCRIPT, tmp_path, "ddp"], "lora_history")
    out, _ = p.communicate(timeout=600)
    assert p.returncode != 0
    assert "cannot copy the adapter agent 'agent_0' under torch's data parallel" in out
    assert "use comparator_policy='current' (no copy), or train in one process" in out


def test_accelerate_fsdp_plugin_is_honoured(tmp_path, single):
    """`accelerate launch --use_fsdp` with the config's distributed='none': the agents are sharded (the plugin read,
    `launcher_sharding`), each process holding about half, and the run is the one-process run."""
    _wait(_run([BIN / "accelerate", "launch", "--use_fsdp", "--fsdp_sharding_strategy", "FULL_SHARD", "--num_processes",
                2, "--num_machines", 1, "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", 29763,
                SCRIPT, tmp_path, "none"]))
    m1, m = _mem(tmp_path, 1), _mem(single, 0)
    assert (m1["strategy"], m1["world_size"]) == ("fsdp", 2) and m1["parameter_bytes"] <= 0.55 * m["parameter_bytes"]
    (tmp_path / "init.pt").symlink_to(single / "init.pt")
    _same_run(single, tmp_path)


def test_distributed_field():
    from comlrl_nb import MAACConfig, MAGRPOConfig, MADPOConfig
    for cls in (MAGRPOConfig, MAACConfig, MADPOConfig):
        assert cls().distributed == "none" and cls(distributed=" DDP").distributed == "ddp"
        with pytest.raises(ValueError, match="distributed='zero' is invalid: use one of none, ddp, fsdp"):
            cls(distributed="zero")
    with pytest.raises(ValueError, match="parallel_training='mp'"):
        MAGRPOConfig(distributed="fsdp", parallel_training="mp", agent_devices="cpu")


def test_report_has_a_distributed_section(tmp_path):
    "comlrl-nb train's report.json: world size, strategy, this process' parameter and optimizer bytes."
    import contextlib
    import io
    from comlrl_nb.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--algo", "magrpo", "--model", "tiny", "--output-dir", str(tmp_path), "--heldout-samples",
                     "0", "--no-final", "--set", "num_train_epochs=1", "--set", "distributed=fsdp"]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    d = rep["distributed"]
    assert (d["world_size"], d["strategy"], rep["config"]["distributed"]) == (1, "none", "fsdp")   # one process
    p, o = d["parameter_bytes"], d["optimizer_bytes"]
    assert p > 0 and 0 <= o - 2 * p < 0.01 * p                  # AdamW: two moments per weight (and a step counter)
