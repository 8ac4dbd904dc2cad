"""Placement per process: under a launcher (torchrun, `accelerate launch`) process r builds every model of the run on
its own GPU, selected once with torch.cuda.set_device before the first model, and its DistContext works there.

Two ranks are played in one test process: the launcher's environment variables are set by hand, CUDA is pretended
(is_available, device_count, set_device recorded) and `Module.to` records where a model is sent instead of sending it,
so nothing really goes to a GPU. accelerate's PartialState is replaced by a stand-in (no process group is made)."""
import os

import pytest
import torch

import comlrl_nb.core as core
from comlrl_nb import MAACConfig, MAACTrainer, MARLHFConfig, MARLHFTrainer, make_tiny_model
from comlrl_nb.distributed import DistContext

DATA = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe"]]
COMMON = dict(num_train_epochs=1, max_new_tokens=4, eval_interval=0, progress_bar=False, logging_steps=1000)


def vowels(a, b):
    return [float(sum(ch in "aeiou" for ch in x + y)) for x, y in zip(a, b)]


class Launch:
    """One process of a pretend launch: `events` lists ('set_device', i) and ('to', module id, device) in order;
    `placed` maps each module sent somewhere with `.to` to its last device; `states` the stand-in PartialStates."""
    def __init__(self, monkeypatch, rank: int, world: int = 2, gpus: int = 2, cpu_flag: bool = False):
        self.events, self.placed, self.states, self.current = [], {}, [], 0
        env = {"WORLD_SIZE": world, "RANK": rank, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world,
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
        for k, v in env.items(): monkeypatch.setenv(k, str(v))
        if cpu_flag: monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
        else: monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
        monkeypatch.setattr(core, "_SELECTED_GPU", [None], raising=False)   # a fresh process: no GPU selected yet
        if gpus:
            monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
            monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
            monkeypatch.setattr(torch.cuda, "set_device", self._set_device)
            monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        real_to, launch = torch.nn.Module.to, self

        def to(module, *args, **kwargs):
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
            if device is not None:
                launch.events.append(("to", id(module), device))
                launch.placed[id(module)] = device
            if device is not None and device.type != "cpu":           # recorded, not sent
                return real_to(module, dtype) if dtype is not None else module
            return real_to(module, *args, **kwargs)
        monkeypatch.setattr(torch.nn.Module, "to", to)
        monkeypatch.setattr("accelerate.PartialState", self._state)
        # no process group here: torch's data parallel (`DistContext.wrap`, 70_distributed) is left out of the pretence;
        # tests/test_sharding.py runs it for real
        monkeypatch.setattr(DistContext, "wrap", lambda ctx, model, replicate=False: model)

    def _set_device(self, d):
        self.current = torch.device(d).index if not isinstance(d, int) else d
        self.events.append(("set_device", self.current))

    def _state(self, cpu: bool = False, **kw):
        st = type("State", (), {"num_processes": int(os.environ["WORLD_SIZE"]),
                                "process_index": int(os.environ["RANK"]), "cpu": cpu})()
        self.states.append(st)
        return st

    def where(self, module) -> torch.device:
        "The device `module` was last sent to with `.to` (KeyError: never sent anywhere)."
        return self.placed[id(module)]


def build_maac(tmp_path, **cfg):
    m, tok = make_tiny_model(seed=0)
    cm, _ = make_tiny_model(seed=3, tokenizer=tok)
    args = MAACConfig(num_generations=2, reference_kl_enabled=True, reference_kl_coef=0.5, output_dir=str(tmp_path),
                      **COMMON, **cfg)
    return MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=DATA, critic_model=cm,
                       args=args)


def build_marlhf(tmp_path, **cfg):
    m, tok = make_tiny_model(seed=0)
    rm, _ = make_tiny_model(seed=5, tokenizer=tok)
    args = MARLHFConfig(num_generations=2, output_dir=str(tmp_path), **COMMON, **cfg)
    return MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=DATA, reward_model=rm,
                         args=args)


def models_of(tr) -> dict:
    "Every model a trainer built, by name."
    out = {f"agent_{i}": m for i, m in enumerate(tr.agents)}
    out.update({f"reference_{i}": m for i, m in enumerate(tr.ref_agents or [])})
    for i, c in enumerate(getattr(tr, "critics", None) or []):
        out[f"critic_{i}"] = c.backbone
        out[f"critic_head_{i}"] = c.head
    if getattr(tr, "reward_model", None) is not None: out["reward_model"] = tr.reward_model
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_builds_agents_references_critics_on_its_gpu(monkeypatch, tmp_path, rank):
    launch = Launch(monkeypatch, rank)
    tr = build_maac(tmp_path)
    mine = torch.device("cuda", rank)
    models = models_of(tr)
    assert {"agent_0", "agent_1", "reference_0", "reference_1", "critic_0", "critic_head_0"} <= set(models)
    assert {k: launch.where(m) for k, m in models.items()} == {k: mine for k in models}
    assert tr.devices == [mine, mine]
    set_calls = [e for e in launch.events if e[0] == "set_device"]
    assert set_calls == [("set_device", rank)]                       # once per process
    assert launch.events[0] == ("set_device", rank)                  # before any model is sent anywhere
    assert tr.dist.device == mine and tr.dist.enabled and tr.dist.rank == rank
    assert launch.states and not any(s.cpu for s in launch.states)    # NCCL, on the GPUs (the team's and the trainer's)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_builds_its_reward_model_on_its_gpu(monkeypatch, tmp_path, rank):
    launch = Launch(monkeypatch, rank)
    tr = build_marlhf(tmp_path)
    mine = torch.device("cuda", rank)
    assert launch.where(tr.reward_model) == mine
    assert [launch.where(m) for m in tr.agents] == [mine, mine]
    assert [e for e in launch.events if e[0] == "set_device"] == [("set_device", rank)]
    assert tr.policy_trainer.dist.device == mine                     # the reward fit's and the policy phase's


@pytest.mark.parametrize("rank", [0, 1])
def test_number_sums_on_the_process_gpu(monkeypatch, tmp_path, rank):
    "Under NCCL a summed number lives on the process' own GPU, the device of its models."
    launch = Launch(monkeypatch, rank)
    tr = build_maac(tmp_path)
    made, real_tensor = [], torch.tensor

    def tensor(data, *args, device=None, **kw):
        made.append(device)                                          # as given (today's code gave an index)
        return real_tensor(data, *args, **kw)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, op=None: t.mul_(2))
    monkeypatch.setattr(torch, "tensor", tensor)
    assert tr.dist.sum(1.5) == 3.0
    assert made == [torch.device("cuda", rank)] == [launch.where(tr.agents[0])]


def test_device_maps_are_read_per_process(monkeypatch, tmp_path):
    """4 GPUs, 2 processes: process 1 owns GPUs 2 and 3, and the maps name its own (local indices): mp agents on
    cuda:0/cuda:1 are on 2 and 3, the references and the critic follow their own maps, the reward model too."""
    launch = Launch(monkeypatch, 1, gpus=4)
    tr = build_maac(tmp_path, agent_devices=["cuda:0", "cuda:1"], parallel_training="mp",
                    reference_devices=["cuda:1", "cuda:0"], critic_devices="cuda:1")
    cuda = lambda i: torch.device("cuda", i)
    assert [launch.where(m) for m in tr.agents] == [cuda(2), cuda(3)]
    assert [launch.where(m) for m in tr.ref_agents] == [cuda(3), cuda(2)]
    assert launch.where(tr.critics[0].backbone) == cuda(3)
    assert tr.dist.device == cuda(2)
    assert [e for e in launch.events if e[0] == "set_device"] == [("set_device", 2)]
    rm = build_marlhf(tmp_path / "rlhf", reward_model_device="cuda:1").reward_model
    assert launch.where(rm) == cuda(3)


def test_a_device_beyond_the_process_share_is_refused(monkeypatch, tmp_path):
    "One GPU each: cuda:1 is not process 0's (it is process 1's); the error says indices are local."
    Launch(monkeypatch, 0)
    with pytest.raises(ValueError, match="local to the process"):
        build_maac(tmp_path, agent_devices=["cuda:0", "cuda:1"], parallel_training="mp", critic_devices="cuda:0")


def test_cpu_only_machine_keeps_everything_on_cpu(monkeypatch, tmp_path):
    "No CUDA under a launcher: every model stays on cpu, no GPU is selected, accelerate's state is gloo (cpu)."
    assert not torch.cuda.is_available()
    launch = Launch(monkeypatch, 1, gpus=0)
    tr = build_maac(tmp_path)
    assert all(launch.placed.get(id(m), torch.device("cpu")) == torch.device("cpu") for m in models_of(tr).values())
    assert all(p.device.type == "cpu" for m in models_of(tr).values() for p in m.parameters())
    assert not [e for e in launch.events if e[0] == "set_device"]
    assert tr.dist.device == torch.device("cpu")
    assert launch.states and all(s.cpu for s in launch.states)


def test_accelerate_cpu_flag_keeps_everything_on_cpu_with_gpus_present(monkeypatch, tmp_path):
    "`accelerate launch --cpu` (ACCELERATE_USE_CPU) on a GPU machine: cpu and gloo, no GPU selected."
    launch = Launch(monkeypatch, 1, cpu_flag=True)
    tr = build_maac(tmp_path)
    assert all(launch.placed.get(id(m), torch.device("cpu")) == torch.device("cpu") for m in models_of(tr).values())
    assert not [e for e in launch.events if e[0] == "set_device"]
    assert tr.dist.device == torch.device("cpu")
    assert launch.states and all(s.cpu for s in launch.states)


def test_one_process_is_unchanged(monkeypatch, tmp_path):
    "No launcher: the default device is `cuda` (no index, the current device) when present, and nothing is selected."
    launch = Launch(monkeypatch, 0)
    monkeypatch.setenv("WORLD_SIZE", "1")
    tr = build_maac(tmp_path)
    assert tr.devices == [torch.device("cuda")] * 2
    assert not [e for e in launch.events if e[0] == "set_device"] and not launch.states
    assert tr.dist.enabled is False
