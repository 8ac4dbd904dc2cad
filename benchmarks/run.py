#!/usr/bin/env python
"""Benchmarks of comlrl_nb, side by side with the existing library comlrl 1.4.3 (the yardstick). Prints figures only.

    .venv/bin/python benchmarks/run.py --suite magrpo --repeats 3     # ours vs theirs, MAGRPO on the tiny model
    .venv/bin/python benchmarks/run.py --suite gen_score               # generation / scoring micro-benchmarks
    .venv/bin/python benchmarks/run.py --suite smollm2_floor           # SmolLM2 MAGRPO batch-step vs a bare floor
    .venv/bin/python benchmarks/run.py --suite all

Every measurement runs in a fresh subprocess with one torch thread; each prints one `RESULT {json}` line, which this
driver collects (all of them are also written to --out as JSON lines). The yardstick needs
`PEER_DIR=$PWD/.peer bash /work/shared/bench/setup_peer.sh` once (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

HERE = Path(__file__).resolve().parent
OURS_PY = sys.executable
TARGET_RATIO = 0.5


# --------------------------------------------------------------------------- plumbing
def machine_load() -> str:
    "1-minute load average and the busiest other processes (a benchmark wants an otherwise idle machine)."
    la = open("/proc/loadavg").read().split()[0]
    try:
        ps = subprocess.run(["ps", "-eo", "pid,pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True).stdout
        busy = [ln.strip()[:110] for ln in ps.splitlines()[1:] if float(ln.split()[1]) >= 20.0
                and str(os.getpid()) != ln.split()[0]]
    except Exception:
        busy = []
    return f"load1={la}" + (f"; busy processes: {busy}" if busy else "")


def wait_idle(max_wait: float, threshold: float = 0.5) -> None:
    "Wait (up to max_wait s) until the 1-minute load average drops below threshold."
    t0 = time.time()
    while time.time() - t0 < max_wait:
        if float(open("/proc/loadavg").read().split()[0]) < threshold:
            return
        time.sleep(10)
    print(f"# still busy after waiting {max_wait:.0f}s: {machine_load()}", flush=True)


def run_worker(cmd: list[str], env_extra: dict | None = None, timeout: float = 900) -> dict:
    env = dict(os.environ, **bu.BENCH_ENV, **(env_extra or {}))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=bu.REPO, timeout=timeout)
    wall = time.perf_counter() - t0
    res = bu.parse_result(proc.stdout)
    if proc.returncode != 0 or res is None:
        raise RuntimeError(f"worker failed (rc={proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    res["subprocess_wall_s"] = round(wall, 2)
    return res


def log(out_fh, suite: str, res: dict) -> None:
    out_fh.write(json.dumps({"suite": suite, **res}) + "\n")
    out_fh.flush()


# --------------------------------------------------------------------------- suite: magrpo
def suite_magrpo(a, out_fh) -> None:
    if not bu.PEER_PYTHON.exists() or not bu.TINY_MODEL.exists():
        sys.exit(f"the yardstick is missing under {bu.PEER_DIR}; build it with:\n"
                 f"  PEER_DIR={bu.PEER_DIR} bash {bu.BENCH_DIR}/setup_peer.sh")
    if a.repeats < 3:
        print(f"# note: --repeats {a.repeats} < 3 pairs; medians of so few runs are fragile")
    rbs = [x.strip() for x in a.rollout_batch_sizes.split(",")]     # ints, or "auto" (None: one rollout buffer)
    print(f"## suite magrpo: tiny Qwen2 (107k params), 8 prompts, 2 agents, K=4, 16 new tokens, 1 epoch, 1 thread")
    print(f"# {a.repeats} rounds; each round runs, in fresh subprocesses: "
          + ", ".join(f"ours(rbs={r}), theirs" for r in rbs) + f"   [{machine_load()}]", flush=True)
    # The yardstick's own run_peer.run_single("magrpo"), plus a CPU-time stopwatch around train() (peer_magrpo.py).
    theirs_cmd = [str(bu.PEER_PYTHON), str(HERE / "peer_magrpo.py"), "--threads", "1"]
    runs = {"theirs": []} | {f"ours rbs={r}": [] for r in rbs}
    for rep in range(a.repeats):
        for r in rbs:
            for label, cmd in ((f"ours rbs={r}",
                                [OURS_PY, str(HERE / "ours_magrpo.py"), "--rollout-batch-size", str(r)]),
                               ("theirs", theirs_cmd)):
                res = run_worker(cmd, {"PEER_DIR": str(bu.PEER_DIR)})
                runs[label].append(res)
                log(out_fh, "magrpo", {"label": label, "round": rep, **res})
                print(f"#   round {rep + 1} {label:<12} train_s={res['train_s']:.4f}  "
                      f"peak_rss={res['peak_rss_mb']:.0f} MB", flush=True)

    # Split of the train() wall time. Theirs: the yardstick's method timers; ours: the time/* keys of metrics.jsonl.
    def split(label, r):
        if label == "theirs":
            t = r["timers"]
            g, w, u, pl = t["generate"]["seconds"], t["reward"]["seconds"], t["update"]["seconds"], 0.0
            sc = t.get("loss_fwd", {}).get("seconds", float("nan"))
            st = u - sc  # its update = loss forward, backward, step
        else:
            g, w, u, pl = r["time_generate_s"], r["time_reward_s"], r["time_update_s"], r["time_plot_s"]
            sc, st = r.get("time_score_s", float("nan")), r.get("time_backward_step_s", float("nan"))
        return {"generate": g, "reward": w, "update": u, "score": sc, "bwd+step": st, "plot": pl,
                "other": r["train_s"] - g - w - u - pl}

    theirs_med = bu.median([r["train_s"] for r in runs["theirs"]])
    theirs_cpu = bu.median([r["train_cpu_s"] for r in runs["theirs"]])
    rows, ratios = [], {}
    for label, rs in runs.items():
        ts = [r["train_s"] for r in rs]
        med, cpu = bu.median(ts), bu.median([r["train_cpu_s"] for r in rs])
        parts = {k: bu.median([split(label, r)[k] for r in rs])
                 for k in ("generate", "reward", "update", "score", "bwd+step", "plot", "other")}
        no_plot = bu.median([r["train_s"] - split(label, r)["plot"] for r in rs])
        no_plot_cpu = bu.median([r["train_cpu_s"] - r.get("time_plot_cpu_s", 0.0) for r in rs])
        if label != "theirs":
            ratios[label] = (med / theirs_med, cpu / theirs_cpu)
        rows.append([label, len(rs), f"{med:.3f}", f"{min(ts):.3f}-{max(ts):.3f}", f"{med / theirs_med:.2f}",
                     f"{no_plot / theirs_med:.2f}", f"{cpu:.3f}", f"{cpu / theirs_cpu:.2f}",
                     f"{no_plot_cpu / theirs_cpu:.2f}", f"{bu.median([r['peak_rss_mb'] for r in rs]):.0f}",
                     *(f"{parts[k]:.3f}" for k in ("generate", "reward", "update", "score", "bwd+step", "plot",
                                                   "other"))])
    print()
    bu.table(["variant", "runs", "wall s med", "min-max", "/theirs", "/theirs no-plot", "CPU s med", "/theirs CPU",
              "/theirs CPU no-plot", "peak RSS MB", "generate", "reward", "update", "score", "bwd+step", "plot",
              "other"], rows)
    print("  (wall s = wall time of the train() call; CPU s = process CPU time of the same call (robust to other load);"
          " ratios are of medians; no-plot = minus our end-of-run plot_run call.\n"
          "   split columns: median wall seconds; ours from metrics.jsonl time/generate, time/reward, time/update "
          "(log-probs + backward + step + metrics) and a stopwatch around the end-of-run plot; theirs from the "
          "yardstick's method timers; other = wall s - the rest.\n   score = log-prob forward, bwd+step = backward + "
          "optimizer step: parts of update (ours: time/score, time/backward_step; theirs: its "
          "_compute_loss_with_gradients timer, and the rest of its update))")
    # Same-work checks (reported, not asserted).
    print()
    chk = []
    for label, rs in runs.items():
        if label == "theirs":
            steps = rs[0]["optimizer_step_calls"] / 2
            det = len({json.dumps([r["agent_param_checksums"], r["losses_first16"]]) for r in rs}) == 1
            chk.append([label, f"{steps:g}", "-", f"{rs[0]['mean_reward']:.4f}", "yes" if det else "NO"])
        else:
            det = len({r["fingerprint"] for r in rs}) == 1
            chk.append([label, "/".join(map(str, rs[0]["optimizer_steps_per_agent"])), rs[0]["generated_tokens"],
                        f"{rs[0]['mean_reward']:.4f}", "yes" if det else "NO"])
    bu.table(["variant", "optimizer steps/agent", "generated tokens", "mean reward", "identical across runs"], chk)
    print()
    for label, (ratio, cratio) in ratios.items():
        print(f"target ours/theirs <= {TARGET_RATIO}: {label}: wall {ratio:.2f} -> "
              f"{'MET' if ratio <= TARGET_RATIO else 'NOT met'}   (CPU time {cratio:.2f} -> "
              f"{'MET' if cratio <= TARGET_RATIO else 'NOT met'})")
    print(f"# done [{machine_load()}]", flush=True)


# --------------------------------------------------------------------------- suite: gen_score
def suite_gen_score(a, out_fh) -> None:
    print("## suite gen_score: 4 prompts x K=4 (16 rows), 32 new tokens, temperature 0.6 / top_p 0.6 / top_k 50, "
          "1 thread")
    print(f"# [{machine_load()}]", flush=True)
    jobs = []
    if bu.TINY_MODEL.exists():
        jobs.append(["--model", "tiny", "--warmup", "2", "--repeats", str(a.gs_tiny_repeats)])
    else:
        print(f"# tiny model missing under {bu.PEER_DIR} (run setup_peer.sh); skipping it")
    jobs.append(["--model", "smollm2", "--warmup", "1", "--repeats", str(a.gs_smollm2_repeats)])
    for args in jobs:
        res = run_worker([OURS_PY, str(HERE / "gen_score.py"), *args])
        log(out_fh, "gen_score", res)
        print(f"\n# model={res['model']} params={res['params'] / 1e6:.3f}M, prompt length {res['prompt_len']} "
              f"(left-padded), load {res['load_s']}s, peak RSS {res['peak_rss_mb']:.0f} MB")
        rows, by = [], {}
        for r in res["results"]:
            by[(r["dtype"], r["op"].split()[0])] = r
        for r in res["results"]:
            op = r["op"].split()[0]
            vs = vs_cpu = ""
            if op == "gen/ours":
                hf = by.get((r["dtype"], "gen/hf"))
                if hf:  # > 1: ours is faster per generated token
                    vs = f"{r['tok_per_s'] / hf['tok_per_s']:.2f}x"
                    per_tok = lambda x: x["cpu_ms_median"] / x["tokens_per_call"]  # noqa: E731
                    vs_cpu = f"{per_tok(hf) / per_tok(r):.2f}x"
            rows.append([r["dtype"], r["op"], r["calls"], f"{r['ms_median']:.1f}", f"{r['ms_min']:.1f}",
                         f"{r['cpu_ms_median']:.1f}", fmt_int(r["tokens_per_call"]), fmt_int(r["tok_per_s"]),
                         fmt_int(1e3 * r["tokens_per_call"] / r["cpu_ms_median"]), vs, vs_cpu])
        bu.table(["dtype", "op", "calls", "ms/call med", "ms min", "CPU ms med", "tokens/call", "tokens/s",
                  "tokens/CPU-s", "ours vs HF", "ours vs HF (CPU)"], rows)
    print("  (ms = wall per call; CPU ms = process CPU time per call; ours vs HF = our tokens/s over HF's "
          "tokens/s (wall, then CPU): > 1 means generate_completions is faster; tokens counted up to and including "
          "EOS; score ops count the completion tokens scored)")
    print(f"# done [{machine_load()}]", flush=True)


def fmt_int(x):
    return "-" if x is None else f"{x:.0f}"


# --------------------------------------------------------------------------- suite: smollm2_floor
def suite_floor(a, out_fh) -> None:
    print("## suite smollm2_floor: 2 SmolLM2-135M agents, 4 prompts (chat template) x K=4, 32 new tokens, one "
          "AdamW step per agent on its 16 completions, 1 thread")
    print(f"# [{machine_load()}]", flush=True)
    rows, split_rows = [], []
    for dtype in a.floor_dtypes.split(","):
        pairs = a.floor_pairs_bf16 if dtype == "bf16" else a.floor_pairs_fp32
        res = run_worker([OURS_PY, str(HERE / "floor.py"), "--dtype", dtype, "--pairs", str(pairs)])
        log(out_fh, "smollm2_floor", res)
        s = res["summary"]
        o, f = s["ours"], s["floor"]
        rows.append([dtype, len(res["runs"]["ours"]), f"{f['step_s']:.2f}", f"{o['step_s']:.2f}", f"{o['train_s']:.2f}",
                     f"{o['step_s'] / f['step_s']:.2f}", f"{o['train_s'] / f['step_s']:.2f}",
                     f"{f['step_cpu_s']:.2f}", f"{o['train_cpu_s']:.2f}", f"{o['train_cpu_s'] / f['step_cpu_s']:.2f}",
                     f"{res['warmup_step_s']:.2f}" if res.get("warmup_step_s") else "-", f"{res['peak_rss_mb']:.0f}"])
        for side, d in (("floor", f), ("ours", o)):
            split_rows.append([dtype, side, f"{d['generate_s']:.2f}", f"{d['reward_s']:.3f}", f"{d['update_s']:.2f}",
                               f"{d.get('plot_s', 0.0):.2f}", f"{d['tokens']:.0f}",
                               "/".join(map(str, o["optimizer_steps"])) if side == "ours" else "1/1"])
        print(f"#   {dtype}: order {' '.join(res['order'])}; per-run step_s floor "
              f"{[round(r['step_s'], 2) for r in res['runs']['floor']]} ours "
              f"{[round(r['step_s'], 2) for r in res['runs']['ours']]}", flush=True)
    print()
    bu.table(["dtype", "runs/side", "floor step s", "ours batch s", "ours train() s", "ours/floor (batch)",
              "ours/floor (train())", "floor CPU s", "ours train() CPU s", "ours/floor CPU", "warm-up s",
              "peak RSS MB"], rows)
    print()
    bu.table(["dtype", "side", "generate s", "reward s", "update s", "plot s", "gen tokens", "optimizer steps/agent"],
             split_rows)
    print("  (medians; s = wall seconds, CPU s = process CPU seconds; ours batch = metrics.jsonl time/batch; "
          "ours train() adds trainer start-up, the end-of-run plot and closing; update = log-probs + backward + AdamW "
          "step for both agents)")
    print(f"# done [{machine_load()}]", flush=True)


# --------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=["magrpo", "gen_score", "smollm2_floor", "all"], default="magrpo")
    p.add_argument("--repeats", type=int, default=3, help="magrpo: rounds of alternating ours/theirs runs (>= 3)")
    p.add_argument("--rollout-batch-sizes", default="1,auto,8",
                   help="magrpo: our rollout_batch_size values, one row each (1 = the default; 'auto' = None, one "
                        "buffer = 2 items)")
    p.add_argument("--gs-tiny-repeats", type=int, default=10)
    p.add_argument("--gs-smollm2-repeats", type=int, default=2)
    p.add_argument("--floor-dtypes", default="bf16,fp32")
    p.add_argument("--floor-pairs-bf16", type=int, default=2)
    p.add_argument("--floor-pairs-fp32", type=int, default=1)
    p.add_argument("--wait-idle", type=float, default=0.0,
                   help="wait up to this many seconds for the 1-min load average to drop below 0.5 before each suite")
    p.add_argument("--out", default=str(bu.REPO / ".peer" / "bench_results.jsonl"),
                   help="raw RESULT lines (JSON lines)")
    a = p.parse_args()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    suites = ["magrpo", "gen_score", "smollm2_floor"] if a.suite == "all" else [a.suite]
    import platform

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  {os.cpu_count()} CPUs  python "
          f"{platform.python_version()}  results -> {a.out}", flush=True)
    with open(a.out, "a") as out_fh:
        for s in suites:
            if a.wait_idle:
                wait_idle(a.wait_idle)
            t0 = time.perf_counter()
            {"magrpo": suite_magrpo, "gen_score": suite_gen_score, "smollm2_floor": suite_floor}[s](a, out_fh)
            print(f"# suite {s} took {time.perf_counter() - t0:.0f}s\n", flush=True)


if __name__ == "__main__":
    main()
