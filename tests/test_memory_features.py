"""Memory settings (MemoryFields): each one checked against the plain path on tiny models."""
import copy
import math

import pytest
import torch

from comlrl_nb.core import micro_backward, micro_chunks
from comlrl_nb.models import make_tiny_model
from comlrl_nb.trainers.actor_critic import MAACConfig, MAACTrainer
from comlrl_nb.trainers.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from comlrl_nb.trainers.madpo import MADPOConfig, MADPOTrainer
from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

torch.set_num_threads(1)
ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics"]]
RUN = dict(num_train_epochs=1, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
           eval_interval=0, progress_bar=False, save_steps=-1, logging_steps=1000, seed=3)


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def weights(models):
    "Every parameter, whole (torch's data parallel holds DTensors)."
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for m in models for p in m.parameters()]


def assert_close(a, b, rtol=1e-6, atol=1e-8):
    for x, y in zip(a, b): torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def sgd(tr, lr=1e-2):
    """Plain SGD for the comparison: a step is lr * gradient, so equal gradients give equal weights (AdamW divides by
    |g| + eps, which magnifies float noise on gradients near eps)."""
    tr.team.optimizers[:] = [torch.optim.SGD(m.parameters(), lr=lr) for m in tr.team.agents]
    for c, crit in enumerate(getattr(tr, "critics", None) or []):
        tr.critic_optimizers[c] = torch.optim.SGD(crit.parameters(), lr=lr)
    return tr


def magrpo(tmp, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MAGRPOConfig(**RUN, num_generations=4, rollout_batch_size=2, rollout_buffer_size=2, train_batch_size=2,
                       output_dir=str(tmp), **kw)
    return sgd(MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS))


def test_micro_chunks_and_accumulation():
    assert micro_chunks(range(7), 3) == [[0, 1, 2], [3, 4, 5], [6]] and micro_chunks([], 2) == []
    gen = lambda seed: torch.Generator().manual_seed(seed)      # x seeded too: 5 of 200 random ones miss rtol 1e-6
    w, x = torch.nn.Parameter(torch.randn(4, generator=gen(0))), torch.randn(9, 4, generator=gen(1))
    loss = lambda rows: torch.tanh(x[rows] @ w).pow(2).mean()
    full = loss(list(range(9)))
    full.backward()
    g, w.grad = w.grad.clone(), None
    assert math.isclose(micro_backward(loss, range(9), 9, 4), float(full.detach()), rel_tol=1e-6)
    torch.testing.assert_close(w.grad, g, rtol=1e-6, atol=0)


def test_magrpo_micro_batches_make_the_same_step(tmp_path):
    plain, micro = magrpo(tmp_path / "a"), magrpo(tmp_path / "b", micro_batch_size=3)   # 8 rows: chunks 3, 3, 2
    before = weights(plain.agents)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] == [1, 1]
    assert not all(torch.equal(a, b) for a, b in zip(before, weights(plain.agents)))
    assert_close(weights(micro.agents), weights(plain.agents))


def test_centralized_micro_batches_make_the_same_step(tmp_path):
    def make(d, **kw):
        m, tok = make_tiny_model(seed=0)
        cfg = CentralizedMAGRPOConfig(**RUN, num_generations=3, rollout_batch_size=2, rollout_buffer_size=2,
                                      train_batch_size=2, output_dir=str(d), **kw)
        return sgd(CentralizedMAGRPOTrainer(agents=[m], tokenizer=tok, reward_func=vowels, train_dataset=ITEMS,
                                            args=cfg, formatters=[lambda it: "left", lambda it: "right"],
                                            centralized_prompt_builder=lambda roles, item: "joint " + " ".join(roles)))
    plain, micro = make(tmp_path / "a"), make(tmp_path / "b", micro_batch_size=4)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] == [1]
    assert_close(weights(micro.agents), weights(plain.agents))


def test_actor_critic_micro_batches_make_the_same_step(tmp_path):
    def make(d, **kw):
        m, tok = make_tiny_model(seed=0)
        cm, _ = make_tiny_model(seed=3, tokenizer=tok)
        cfg = MAACConfig(**RUN, critic_learning_rate=1e-2, rollout_batch_size=4, rollout_buffer_size=4,
                         train_batch_size=4, output_dir=str(d), **kw)
        return sgd(MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, critic_model=cm,
                               train_dataset=ITEMS * 2))
    plain, micro = make(tmp_path / "a"), make(tmp_path / "b", micro_batch_size=3)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] == [1, 1]
    assert plain.state["critic_steps"] == micro.state["critic_steps"] == [1]
    assert_close(weights(micro.agents + list(micro.critics)), weights(plain.agents + list(plain.critics)))


def test_madpo_micro_batches_follow_the_plain_run(tmp_path):
    def make(d, **kw):
        m, tok = make_tiny_model(seed=0)
        cfg = MADPOConfig(**{**RUN, "agent_learning_rate": 3e-3}, preference_num_candidates=4,
                          preference_pairs_per_sample=2, dpo_beta=0.5, output_dir=str(d), **kw)
        return sgd(MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS * 2))
    plain, micro = make(tmp_path / "a"), make(tmp_path / "b", micro_batch_size=1)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] and plain.state["optimizer_steps"][0] > 0
    assert_close(weights(micro.agents), weights(plain.agents), rtol=1e-5, atol=1e-8)


def checkpointed(model) -> bool:
    "Whether HF activation (gradient) checkpointing is on (the attribute's name changed in transformers 5)."
    return bool(getattr(model, "is_activation_checkpointing", None)
                if hasattr(model, "is_activation_checkpointing") else model.is_gradient_checkpointing)


def grads(models):
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for m in models
            for p in m.parameters()]


def test_gradient_checkpointing_gives_the_same_first_update(tmp_path):
    plain, ckpt = magrpo(tmp_path / "a"), magrpo(tmp_path / "b", gradient_checkpointing=True)
    assert all(checkpointed(m) for m in ckpt.agents)
    assert not any(checkpointed(m) for m in plain.agents)
    plain.train()
    ckpt.train()
    assert plain.state["optimizer_steps"] == [1, 1]
    # the first (only) update's gradients; the recomputed forward may round a near-zero entry otherwise (1.9e-8 seen)
    assert_close(grads(ckpt.agents), grads(plain.agents), rtol=1e-5, atol=1e-7)
    assert_close(weights(ckpt.agents), weights(plain.agents))


def bf16_training(master_weights, dtype=torch.bfloat16, steps=20, lr=1e-5):
    "A Team of one tiny model loaded in `dtype`, `steps` AdamW steps on a fixed loss; its weights (as fp32)."
    from comlrl_nb.team import Team
    m, tok = make_tiny_model(seed=0)
    team = Team(agents=[m.to(dtype)], tokenizer=tok, num_roles=1, learning_rate=lr, master_weights=master_weights)
    ids = torch.arange(2, 34).view(2, 16)
    for _ in range(steps):
        team.optimizers[0].zero_grad(set_to_none=True)
        team.agents[0](input_ids=ids, labels=ids).loss.backward()
        team.optimizers[0].step()
    return team, [p.detach().float().clone() for p in team.agents[0].parameters()]


def test_bf16_weights_keep_an_fp32_master_copy():
    from comlrl_nb.sampling import MasterAdamW
    start = [p.detach().float() for p in make_tiny_model(seed=0)[0].to(torch.bfloat16).parameters()]
    team, master = bf16_training(True)
    assert isinstance(team.optimizers[0], MasterAdamW) and team.agents[0].dtype == torch.bfloat16
    _, plain = bf16_training(False)
    _, fp32 = bf16_training(True, torch.float32)            # fp32 weights: a plain AdamW, master_weights or not
    moved = lambda ws: sum(int((w != s).sum()) for w, s in zip(ws, start)) / sum(s.numel() for s in start)
    assert moved(plain) < 0.3 and moved(master) > 0.9       # plain bf16 AdamW rounds most 1e-5 steps away
    gap = lambda ws: sum(float((w - f).abs().sum()) for w, f in zip(ws, fp32))
    assert gap(master) < 0.25 * gap(plain)                  # the master path follows fp32 training
    for w, f in zip(master, fp32):                          # within bf16 rounding (2^-8 relative, a few ulps)
        assert ((w - f).abs() <= 4 * 2 ** -8 * f.abs() + 1e-4).float().mean() > 0.99


def test_float16_training_is_refused_with_the_fix():
    from comlrl_nb.team import Team
    with pytest.raises(ValueError, match=r"autocast_dtype=.float16.*autocast_dtype='bfloat16'"):
        MAGRPOConfig(autocast_dtype="float16")
    m, tok = make_tiny_model(seed=0)
    with pytest.raises(ValueError, match=r"float16.*loss scaler.*model_config=\{'dtype': 'bfloat16'\}"):
        Team(agents=[m.half()], tokenizer=tok, num_roles=1)


def test_agents_from_one_base_share_one_reference(tmp_path):
    tr = magrpo(tmp_path, reference_kl_enabled=True, reference_kl_coef=0.1)
    refs = tr.team.ref_agents
    assert refs[0] is refs[1] and tr.agents[0] is not tr.agents[1]
    for p in tr.agents[1].parameters(): p.data.add_(0.01 * torch.randn_like(p))   # agents differ, as after training
    ro = tr.rollout(ITEMS, [0, 1], 0)
    shared = [t.kl for t in ro.turns]
    tr.team.ref_agents = [copy.deepcopy(refs[0]), copy.deepcopy(refs[0])]          # the old way: one copy per agent
    own = [tr._reference_kl(t.comps) for t in ro.turns]
    for a, b in zip(shared, own):
        for x, y in zip(a, b): assert torch.equal(x, y)
    assert not torch.equal(shared[0][0], shared[0][1])      # each agent's KL against its own policy
    m2, tok = make_tiny_model(seed=1)
    two = MAGRPOTrainer(agents=[make_tiny_model(seed=0, tokenizer=tok)[0], m2], tokenizer=tok, reward_func=vowels,
                        args=MAGRPOConfig(reference_kl_enabled=True, output_dir=str(tmp_path / "b")),
                        train_dataset=ITEMS)
    assert two.team.ref_agents[0] is not two.team.ref_agents[1]  # two bases: a reference each


def _leave_together(dist):
    "Both processes past their last collective before either tears gloo down (a peer gone first aborts the other)."
    dist.barrier()
    dist.destroy_process_group()


def _replicate_worker(rank, world, init, out):
    import torch.distributed as dist
    from comlrl_nb.distributed import DistContext, full_state, is_sharded, load_full_state
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ctx = DistContext(from_env=False)
    ctx.world, ctx.rank = world, rank
    torch.manual_seed(rank)                                # other weights on each process: wrap takes rank 0's
    head = ctx.wrap(torch.nn.Linear(4, 1), replicate=True)
    assert is_sharded(head) and ctx.wrap(head) is head     # wrapped once
    for _ in range(rank + 1):                              # forwards without gradient: as many as a process needs
        with torch.no_grad(): head(torch.ones(2, 4))
    x = torch.full((3, 4), float(rank + 1))
    head(x).sum().backward()                               # one backward each: torch sums the gradients
    load_full_state(head, {k: v + 1 for k, v in full_state(head).items()})
    kept = sorted(full_state(head, keep=rank == 0))        # the process that writes keeps the copy; the other none
    torch.save({"grad": head.weight.grad.full_tensor(), "state": full_state(head), "kept": kept}, f"{out}/rank{rank}.pt")
    _leave_together(dist)


def test_a_replicated_module_gets_the_gradient_sum_from_torch(tmp_path):
    """`DistContext.wrap(replicate=True)` (value heads under a launcher): every process starts from the main one's weights
    (built from other seeds here), whole on every process, a process may run more forwards than another, and each
    backward's gradient is the sum over processes; whole states go out and back in, kept only where asked (`keep`)."""
    import torch.multiprocessing as mp
    mp.spawn(_replicate_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    want = torch.full((1, 4), 3 * 1.0 + 3 * 2.0)           # d/dW of sum(x W^T) is the column sums of x: 3 rows each
    assert torch.equal(r0["grad"], want) and torch.equal(r1["grad"], want)
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 1)
    for r in (r0, r1):
        for k, v in lin.state_dict().items(): assert torch.equal(r["state"][k], v + 1), k
    assert (r0["kept"], r1["kept"]) == (["bias", "weight"], [])


def _tiny_mixed(rank):
    "Float and bf16 weights, float and int64 buffers, built from the process' own seed (its own weights)."
    torch.manual_seed(rank)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 3).to(torch.bfloat16), torch.nn.BatchNorm1d(3))
    m[2].running_mean.add_(rank + 1)
    m[2].num_batches_tracked.add_(rank + 5)
    return m


def _sync_worker(rank, world, init, out):
    import torch.distributed as dist
    from comlrl_nb.distributed import DistContext
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ctx = DistContext(from_env=False)
    ctx.world, ctx.rank = world, rank
    m, sent, broadcast = _tiny_mixed(rank), [], dist.broadcast
    dist.broadcast = lambda t, *a, **k: sent.append(t.numel()) or broadcast(t, *a, **k)
    ctx.sync_from_main(m, bucket_bytes=40)
    torch.save({"state": m.state_dict(), "sent": sent}, f"{out}/rank{rank}.pt")
    _leave_together(dist)


def test_replicas_start_from_the_main_weights_in_buckets(tmp_path):
    """`sync_from_main` (before any wrap): every process ends with rank 0's parameters and buffers, of every dtype, in
    one broadcast per bucket of consecutive tensors of one dtype (40 bytes here: 6 broadcasts for 9 tensors)."""
    import torch.multiprocessing as mp
    mp.spawn(_sync_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    want = _tiny_mixed(0).state_dict()
    assert not torch.equal(_tiny_mixed(1)[0].weight, want["0.weight"])       # the processes started apart
    for r in (r0, r1):
        assert set(r["state"]) == set(want)
        for k, v in want.items(): assert torch.equal(r["state"][k], v) and r["state"][k].dtype == v.dtype, k
    # [0.weight] [0.bias] [1.weight 1.bias](bf16) [2.weight 2.bias 2.running_mean] [2.running_var] [num_batches_tracked]
    assert r0["sent"] == r1["sent"] == [16, 4, 12 + 3, 3 + 3 + 3, 3, 1]


def test_the_planner_reads_the_memory_fields_of_a_config():
    from comlrl_nb.plan import plan_from_config, plan_memory
    from dataclasses import asdict
    m, _ = make_tiny_model(seed=0)
    plain = plan_from_config(MAGRPOConfig(num_generations=8))
    ckpt = plan_from_config(MAGRPOConfig(num_generations=8, gradient_checkpointing=True, micro_batch_size=2),
                            {"dtype": "bfloat16"})
    assert (ckpt.gradient_checkpointing, ckpt.micro_batch_size, ckpt.compute_dtype) == (True, 2, "bfloat16")
    peak = lambda s: plan_memory(m.config, **{k: v for k, v in asdict(s).items()}).peak_bytes
    assert peak(ckpt) < peak(plain)


def test_checkpointing_and_micro_batches_reach_critics_reward_model_and_backends(tmp_path):
    from comlrl_nb.trainers.marlhf import MARLHFConfig, MARLHFTrainer
    m, tok = make_tiny_model(seed=0)
    cm, _ = make_tiny_model(seed=3, tokenizer=tok)
    ac = MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, critic_model=cm, train_dataset=ITEMS,
                     args=MAACConfig(gradient_checkpointing=True, output_dir=str(tmp_path / "ac")))
    assert all(checkpointed(x) for x in [*ac.agents, ac.critics[0].backbone])
    rl = MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, reward_model=m, train_dataset=ITEMS,
                       args=MARLHFConfig(gradient_checkpointing=True, micro_batch_size=2, master_weights=False,
                                         output_dir=str(tmp_path / "rl")))
    back = rl.policy_trainer.args
    assert (back.gradient_checkpointing, back.micro_batch_size, back.master_weights) == (True, 2, False)
    assert all(checkpointed(x) for x in [*rl.team.agents, rl.reward_model.body])


def test_master_weights_survive_a_checkpoint():
    from comlrl_nb.sampling import MasterAdamW
    team, _ = bf16_training(True, steps=3)
    opt = team.optimizers[0]
    sd = copy.deepcopy(opt.state_dict())
    other = MasterAdamW(copy.deepcopy(team.agents[0]).parameters(), 1e-5)
    other.load_state_dict(sd)
    for a, b in zip(other.masters[0], opt.masters[0]): assert torch.equal(a, b)
    assert other.inner.state_dict()["state"][0]["step"] == 3


def _pair_team():
    "A team of two tiny agents (SGD, so steps compare exactly) and five random (prompt, winner, loser) id triples."
    from comlrl_nb.team import Team
    m, tok = make_tiny_model(seed=0)
    team = Team(agents=[m, m], tokenizer=tok, learning_rate=1e-2)
    team.optimizers[:] = [torch.optim.SGD(a.parameters(), lr=1e-2) for a in team.agents]
    g = torch.Generator().manual_seed(5)
    rand = lambda n: torch.randint(3, 300, (n,), generator=g)
    pairs = [(rand(3 + j % 3), rand(2 + j % 2), rand(4 - j % 2)) for j in range(5)]
    return team, [pairs, pairs]


def _madpo_worker(rank, world, init, out):
    import torch.distributed as dist
    from comlrl_nb.distributed import DistContext
    import comlrl_nb.trainers.madpo as md
    torch.set_num_threads(1)
    sizes, pm = [], md.pair_margins
    md.pair_margins = lambda model, tok, tokens, idx, *a: sizes.append(len(idx)) or pm(model, tok, tokens, idx, *a)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ctx = DistContext(from_env=False)
    ctx.world, ctx.rank = world, rank
    team, tokens = _pair_team()
    team.agents[:] = [ctx.use("ddp").wrap(a) for a in team.agents]     # as a launcher's team: torch sums the gradients
    team.optimizers[:] = [torch.optim.SGD(a.parameters(), lr=1e-2) for a in team.agents]
    res = md.madpo_update(team, tokens, list(range(5)), 0.5, [0, 0], None, None, ctx, micro_batch_size=2)
    torch.save([weights(team.agents), res["margins"], res["losses"], max(sizes)], f"{out}/rank{rank}.pt")
    _leave_together(dist)


def test_madpo_micro_batches_under_two_processes_match_one_plain_process(tmp_path):
    import torch.multiprocessing as mp
    from comlrl_nb.trainers.madpo import madpo_update
    team, tokens = _pair_team()
    res = madpo_update(team, tokens, list(range(5)), 0.5, [0, 0])
    mp.spawn(_madpo_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True)
    (w0, m0, l0, s0), (w1, m1, l1, s1) = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert s0 == s1 == 2                                   # rank 0 holds pairs 0, 2, 4: scored in chunks of 2
    assert all(torch.equal(a, b) for a, b in zip(w0, w1)) and l0 == l1     # the ranks agree
    torch.testing.assert_close(m0, res["margins"], rtol=1e-5, atol=1e-6)
    assert l0 == pytest.approx(res["losses"], rel=1e-5)
    assert_close(w0, weights(team.agents), rtol=1e-5, atol=1e-8)


def test_references_are_kept_in_the_compute_dtype(tmp_path):
    tr = magrpo(tmp_path, reference_kl_enabled=True, autocast_dtype="bfloat16")
    ref = tr.team.ref_agents[0]
    assert ref is tr.team.ref_agents[1] and ref.dtype == torch.bfloat16 and tr.agents[0].dtype == torch.float32
    fp32_ref = copy.deepcopy(tr.agents[0]).eval()
    for m in tr.agents:
        for p in m.parameters(): p.data.add_(0.02 * torch.randn_like(p))   # policies moved off the reference
    ro = tr.rollout(ITEMS, [0, 1], 0)
    assert max(float(k.abs().max()) for t in ro.turns for k in t.kl) > 1e-2
    tr.team.ref_agents = [fp32_ref] * 2                                   # the fp32 reference, under bf16 autocast
    for t in ro.turns:
        for a, b in zip(t.kl, tr._reference_kl(t.comps)): torch.testing.assert_close(a, b, rtol=0, atol=2e-2)


def test_master_copies_hold_only_the_trained_weights():
    from comlrl_nb.sampling import MasterAdamW, make_optimizer
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).to(torch.bfloat16)
    net[0].requires_grad_(False)                              # a frozen base (LoRA): no fp32 copy of it
    opt = make_optimizer(net.parameters(), 1e-3)
    assert isinstance(opt, MasterAdamW) and sum(m.numel() for ms in opt.masters for m in ms) == 20
    net(torch.ones(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    before = net[0].weight.clone()
    opt.step()
    assert torch.equal(net[0].weight, before) and net[1].weight.grad is not None


def _fsdp_sum_worker(rank, world, init, out, strategy):
    "Each process backpropagates its half of a loss through a model handed to FSDP2; the gradients, whole."
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from comlrl_nb.distributed import DistContext
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ctx = DistContext(from_env=False)
    ctx.world, ctx.rank = world, rank
    model = ctx.use(strategy).wrap(make_tiny_model(seed=0)[0])
    ids = torch.arange(2, 34).view(4, 8)[rank::world]              # this process' rows of one batch of 4
    model(input_ids=ids, labels=ids).loss.backward()
    whole = [(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) for p in model.parameters()]
    torch.save(whole, f"{out}/{strategy}{rank}.pt")
    _leave_together(dist)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_fsdp_units_sum_the_gradients_over_processes(tmp_path, strategy):
    """Every FSDP2 unit (decoder layers, body, model) sums its gradients over the processes, as the losses are shares of
    one batch: the result equals one process' gradient of the two halves' summed losses (a mean halves the layers')."""
    import torch.multiprocessing as mp
    mp.spawn(_fsdp_sum_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path), strategy), nprocs=2, join=True)
    m = make_tiny_model(seed=0)[0]
    ids = torch.arange(2, 34).view(4, 8)
    sum(m(input_ids=ids[r::2], labels=ids[r::2]).loss for r in range(2)).backward()
    for r in range(2):
        got = torch.load(tmp_path / f"{strategy}{r}.pt")
        for (name, p), g in zip(m.named_parameters(), got):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6, msg=lambda s: f"{name}: {s}")

