"""The memory planner: exact parameter counts on the meta device, the JSON shape scripts rely on, suggestions that
really fit, the command's argument checks, and the estimate against a measured CPU training step."""
import contextlib
import io
import json

import pytest
import torch

from comlrl_nb.models import make_tiny_model
from comlrl_nb.plan import (MODEL_SHAPES, estimate_update, measure_update, model_shape, parse_bytes, plan_main,
                            plan_memory)

PUBLISHED = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen3-4b": 4_022_468_096,
             "qwen3-8b": 8_190_735_360, "llama-3.2-1b": 1_235_814_400, "llama-3.1-8b": 8_030_261_248}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_meta_count_matches_the_published_size(name):
    assert model_shape(name).params == PUBLISHED[name]


def test_local_directory_counts_what_the_model_holds(tmp_path):
    model, _ = make_tiny_model(hidden_size=64, num_layers=3)
    model.config.save_pretrained(tmp_path)
    assert model_shape(str(tmp_path)).params == sum(p.numel() for p in model.parameters())
    p = plan_memory(str(tmp_path), num_agents=1, compute_dtype="float32", overhead_bytes=0)
    assert p.per_device[0].components["weights"] == 4 * sum(p.numel() for p in model.parameters())


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = plan_main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_json_shape_for_qwen25_1_5b():
    rc, out, _ = _run(["--algo", "magrpo", "--model", "qwen2.5-1.5b", "--num-agents", "2", "--device-memory", "80GB",
                       "--json"])
    d = json.loads(out)
    assert rc == 0 and d["fits"] is True and d["suggestions"] == []
    (dev,) = d["per_device"]
    assert dev["device"] == "cuda:0" and isinstance(dev["total_bytes"], int)
    assert sum(dev["components"].values()) == dev["total_bytes"]
    assert {"weights", "master_weights", "optimizer_states", "gradients", "activations", "logits"} <= set(
        dev["components"])
    assert dev["total_bytes"] == max(dev["moments"].values())
    # bf16 weights of two agents, fp32 master copies, two fp32 AdamW states each
    assert dev["components"]["weights"] == 2 * 2 * PUBLISHED["qwen2.5-1.5b"]
    assert dev["components"]["optimizer_states"] == 2 * 8 * PUBLISHED["qwen2.5-1.5b"]


def test_no_fits_key_without_device_memory():
    d = plan_memory("qwen2.5-0.5b").to_dict()
    assert "fits" not in d and d["suggestions"] == []


def _settings_of(suggestion: str) -> dict:
    "'--set lora=true --devices 4: peak ...' -> {'lora': True, 'devices': 4}"
    words, out = suggestion.split(":")[0].split(), {}
    for flag, value in zip(words[::2], words[1::2]):
        if flag == "--devices": out["devices"] = int(value)
        else:
            k, v = value.split("=")
            out[k] = {"true": True, "false": False}.get(v, int(v) if v.isdigit() else v)
    return out


def test_every_suggestion_fits_when_replanned():
    ex = dict(num_agents=2, num_generations=4, max_new_tokens=512, prompt_length=512, train_batch_size=2)
    p = plan_memory("qwen3-4b", device_memory="80GB", **ex)
    assert p.fits is False and p.suggestions
    for s in p.suggestions:
        again = plan_memory("qwen3-4b", device_memory="80GB", **{**ex, **_settings_of(s)})
        assert again.fits, s
    assert not plan_memory("qwen3-4b", device_memory="80GB", gradient_checkpointing=True, **ex).fits
    assert not any("gradient_checkpointing" in s for s in p.suggestions)


def test_settings_move_the_components_they_should():
    base = dict(num_agents=2, max_new_tokens=512, prompt_length=256)
    comp = lambda **kw: plan_memory("qwen2.5-1.5b", **{**base, **kw}).per_device[0].moments["train: update of agent 0"]
    assert comp(gradient_checkpointing=True) < comp() and comp(micro_batch_size=1) < comp()
    ref = plan_memory("qwen2.5-1.5b", reference_kl_enabled=True, **base).per_device[0].components
    assert ref["references"] == 1 * 2 * PUBLISHED["qwen2.5-1.5b"]     # agents of one base share one (the trainer's rule)
    two = plan_memory("qwen2.5-1.5b", reference_kl_enabled=True, one_base=False, **base).per_device[0].components
    assert two["references"] == 2 * 2 * PUBLISHED["qwen2.5-1.5b"]
    sharded = plan_memory("qwen2.5-1.5b", reference_kl_enabled=True, sharding="fsdp", devices=2, **base)
    assert sharded.per_device[1].components["references"] == ref["references"] // 2   # sharded like the agents
    lora = plan_memory("qwen2.5-1.5b", reference_kl_enabled=True, lora=True, **base).per_device[0].components
    assert "references" not in lora and lora["weights"] < 2 * PUBLISHED["qwen2.5-1.5b"] * 1.05
    fsdp = plan_memory("qwen2.5-1.5b", sharding="fsdp", devices=4, **base)
    assert len(fsdp.per_device) == 4 and fsdp.per_device[0].components["weights"] == 2 * 2 * PUBLISHED[
        "qwen2.5-1.5b"] // 4
    mp = plan_memory("qwen2.5-1.5b", devices=2, **base)               # round-robin: one agent per device
    assert [d.components["weights"] for d in mp.per_device] == [2 * PUBLISHED["qwen2.5-1.5b"]] * 2
    k8 = plan_memory("qwen2.5-1.5b", num_generations=8, **base).per_device[0].moments["train: sampling"]
    assert k8 > plan_memory("qwen2.5-1.5b", **base).per_device[0].moments["train: sampling"]


def test_algorithms_bring_their_models():
    maac = plan_memory("qwen2.5-0.5b", "maac").per_device[0].components
    assert maac["critics"] > 0
    rlhf = plan_memory("qwen2.5-0.5b", "marlhf").per_device[0]
    assert set(m.split(":")[0] for m in rlhf.moments) == {"reward fit", "policy"}
    assert "reward_model" in rlhf.components
    cen = plan_memory("qwen2.5-0.5b", "centralized", num_agents=3).per_device[0].components
    assert cen["weights"] == 2 * PUBLISHED["qwen2.5-0.5b"]            # one actor for every role


@pytest.mark.parametrize("argv, message", [
    (["--num-agents", "0"], "use an integer >= 1"),
    (["--devices", "x"], "use an integer >= 1"),
    (["--device-memory", "lots"], "use a positive size such as 80GB"),
    (["--algo", "ppo"], "invalid choice"),
    (["--model", "gpt-9"], "qwen2.5-1.5b, qwen2.5-3b"),
    (["--set", "micro_batch_size=0"], "micro_batch_size=0 is invalid: use an integer >= 1"),
    (["--set", "compute_dtype=int8"], "use one of float32, bfloat16, float16"),
    (["--set", "colour=blue"], "use KEY=VALUE with KEY one of"),
    (["--set", "lora=maybe"], "use true or false"),
])
def test_bad_arguments_name_the_accepted_range(argv, message):
    rc, _, err = _run(argv)
    assert rc == 2 and message in err, err


def test_text_output_and_exit_status_when_it_does_not_fit():
    rc, out, _ = _run(["--model", "qwen3-8b", "--num-agents", "2", "--device-memory", "80GB"])
    assert rc == 1 and "does NOT fit" in out and "what would fit" in out
    assert parse_bytes("80GiB") == 80 * 2**30


@pytest.mark.parametrize("hidden, layers", [(32, 2), (256, 4)])
def test_estimate_within_20_percent_of_a_measured_step(hidden, layers):
    torch.set_num_threads(1)
    model, _ = make_tiny_model(hidden_size=hidden, num_layers=layers)
    measured, planned = measure_update(model), estimate_update(model.config)
    assert abs(planned / measured - 1) < 0.2, (measured, planned)


def test_estimate_follows_micro_batches():
    model, _ = make_tiny_model(hidden_size=256, num_layers=4)
    measured, planned = measure_update(model, micro_batch_size=2), estimate_update(model.config, micro_batch_size=2)
    assert abs(planned / measured - 1) < 0.2, (measured, planned)
    assert planned < estimate_update(model.config)


def test_the_table_is_public_shapes_only():
    assert len(MODEL_SHAPES) == 10 and all(v["arch"] in ("qwen2", "qwen3", "llama") for v in MODEL_SHAPES.values())


def test_the_cli_plans(capsys):
    "`comlrl-nb plan ... --json` through the package's own command line: one JSON object; exit 1 when it does not fit."
    import json
    from comlrl_nb.cli import main
    assert main(["plan", "--algo", "magrpo", "--model", "qwen2.5-1.5b", "--num-agents", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["per_device"][0]["total_bytes"] == sum(out["per_device"][0]["components"].values())
    assert main(["plan", "--model", "qwen3-4b", "--num-agents", "2", "--device-memory", "80GB", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False
    assert main(["plan", "--model", "no-such-model", "--json"]) == 2


def test_the_vllm_engine_is_planned_per_device():
    "generation_backend='vllm': per device an engine per sampling agent (weights in the compute dtype + KV cache)."
    from comlrl_nb.plan import plan_from_config
    from comlrl_nb.trainers.preference import MADPOConfig
    from comlrl_nb.trainers.reinforce import MAGRPOConfig
    N, kv, base = PUBLISHED["qwen2.5-1.5b"], 3 * 2**30, dict(num_agents=2, max_new_tokens=512, prompt_length=256)
    own = plan_memory("qwen2.5-1.5b", **base).per_device[0]
    eng = plan_memory("qwen2.5-1.5b", generation_backend="vllm", vllm_kv_cache_bytes=kv, **base).per_device[0]
    assert eng.components["engine"] == 2 * (2 * N + kv)
    for moment in ("train: update of agent 0", "train: update of agent 1"):
        assert eng.moments[moment] == own.moments[moment] + 2 * (2 * N + kv)
    assert eng.moments["train: sampling"] < own.moments["train: sampling"] + 2 * (2 * N + kv)   # no own KV cache
    fp32 = plan_memory("qwen2.5-1.5b", generation_backend="vllm", compute_dtype="float32", **base).per_device[0]
    assert fp32.components["engine"] == 2 * (4 * N + 2**30)                  # default KV cache: 1 GiB per engine
    rr = plan_memory("qwen2.5-1.5b", generation_backend="vllm", devices=2, **base).per_device
    assert [d.components["engine"] for d in rr] == [2 * N + 2**30] * 2    # round-robin: one agent, one engine each
    ddp = plan_memory("qwen2.5-1.5b", generation_backend="vllm", devices=2, sharding="ddp", **base).per_device
    assert [d.components["engine"] for d in ddp] == [2 * (2 * N + 2**30)] * 2
    assert ddp[0].components["sharding_buffers"] == 2 * 2 * N              # DDP's gradient buckets (planned again)
    lora = plan_memory("qwen2.5-1.5b", generation_backend="vllm", lora=True, **base).per_device[0]
    assert 2 * N + 2**30 < lora.components["engine"] < 2 * N * 1.05 + 2**30   # one engine: the base and adapters
    share = plan_memory("qwen2.5-1.5b", "centralized", device_memory="141GB", generation_backend="vllm",
                        vllm_gpu_memory_utilization=0.2).per_device[0]
    assert share.components["engine"] == int(0.2 * 141e9)                # one actor: one engine
    assert "engine" not in plan_memory("qwen2.5-1.5b", generation_backend="hf", **base).per_device[0].components
    with pytest.raises(ValueError, match="pass device_memory"):
        plan_memory("qwen2.5-1.5b", generation_backend="vllm", vllm_gpu_memory_utilization=0.2)
    with pytest.raises(ValueError, match="use sharding='ddp' or 'none'"):
        plan_memory("qwen2.5-1.5b", generation_backend="vllm", sharding="fsdp", devices=2)
    big = plan_memory("qwen3-4b", device_memory="80GB", generation_backend="vllm", num_agents=2, max_new_tokens=512,
                      prompt_length=512, train_batch_size=2, num_generations=4)
    assert big.fits is False and big.suggestions and not any("fsdp" in s for s in big.suggestions)
    s = plan_from_config(MAGRPOConfig(generation_backend="vllm", vllm_gpu_memory_utilization=0.3))
    assert (s.generation_backend, s.vllm_kv_cache_bytes, s.vllm_gpu_memory_utilization) == ("vllm", None, 0.3)
    s = plan_from_config(MADPOConfig(generation_backend="vllm", vllm_kv_cache_bytes=2**31))
    assert (s.algo, s.generation_backend, s.vllm_kv_cache_bytes) == ("madpo", "vllm", 2**31)
    rc, out, _ = _run(["--model", "qwen2.5-1.5b", "--set", "generation_backend=vllm", "vllm_kv_cache_bytes=2GiB",
                       "--json"])
    assert rc == 0 and json.loads(out)["per_device"][0]["components"]["engine"] == 2 * (2 * N + 2 * 2**30)
    rc, out, _ = _run(["--model", "qwen2.5-1.5b", "--device-memory", "80GB", "--set", "generation_backend=vllm",
                       "vllm_gpu_memory_utilization=0.1", "--json"])
    assert rc == 0 and json.loads(out)["per_device"][0]["components"]["engine"] == 2 * 8 * 10**9
    rc, _, err = _run(["--set", "vllm_gpu_memory_utilization=lots"])
    assert rc == 2 and "use a number" in err
