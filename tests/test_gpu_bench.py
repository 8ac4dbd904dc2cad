"""benchmarks/gpu.py's dry mode (--small --device cpu), memory section only: the JSON has the planner's estimate for
the run's own settings and the measured timings."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_memory_section_dry(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--small", "--device", "cpu",
                        "--sections", "memory", "--out", str(out)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["info"]["sections"] == ["memory"] and "gen" not in res and "trainers" not in res
    (m,) = res["memory"]
    s = m["settings"]
    assert (s["gradient_checkpointing"], s["micro_batch_size"], s["master_weights"], s["reference_kl_enabled"]) == \
        (True, 2, True, True) and s["model_dtype"] == "bfloat16"
    assert m["step_s"] > 0 and m["tokens_per_s"] > 0 and m["train_s"] >= m["step_s"]
    c = m["planned_components"]
    assert m["planned_peak_bytes"] == sum(c.values()) and c["master_weights"] == 2 * c["weights"]   # fp32 vs bf16
    assert c["references"] > 0 and c["overhead"] == 2**30 and m["planned_peak_one_reference_bytes"] == \
        m["planned_peak_bytes"] - c["references"] // 2      # the plan counts a reference per agent; the trainer one
    assert m["measured_peak"] == "n/a on cpu" and m["measured_over_planned"] is None
    assert "measured: n/a on cpu" in r.stdout


def test_gpu_check_refuses_an_unknown_section(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--small", "--device", "cpu",
                        "--sections", "memory,nope"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown ['nope']" in r.stderr
