#!/usr/bin/env python
"""Every speed ratio of issue T in one run, side by side: ours vs the existing library (MAGRPO, MADPO, MARLHF on the
yardstick's tiny-model settings), one agent vs TRL's GRPO on SmolLM2, our SmolLM2 MAGRPO step vs the bare floor, and
our generation tokens/s as a fraction of this CPU's roofline (peak GFLOP/s and memory bandwidth measured here, now).

    .venv/bin/python benchmarks/ratios.py                    # ~6-8 min on 2 idle cores
    .venv/bin/python benchmarks/ratios.py --repeats 5 --skip floor,trl

Every measurement is a fresh subprocess with one torch thread that prints one `RESULT {json}` line. Ours and theirs
alternate (ours, theirs, ours, theirs, ...); every ratio is given twice, from wall time and from the process CPU time
of the same `train()` call (on a shared machine the CPU ratio is the one to read; both sides are timed the same way).
The yardstick (comlrl 1.4.3) and TRL live in $PEER_DIR/venv (`PEER_DIR=.peer bash /work/shared/bench/setup_peer.sh`,
then `.peer/venv/bin/pip install trl`); without TRL the TRL row says why it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402
import pref  # noqa: E402  (our MADPO/MARLHF worker script)

HERE = Path(__file__).resolve().parent
TARGETS = {"magrpo": 0.25, "madpo": 0.25, "marlhf": 0.25, "trl": 0.6, "floor": 1.15}
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")


TREES = {"": None}          # label suffix -> source tree on PYTHONPATH for our workers (None: as this process)


def worker(cmd: list[str], timeout: float = 900, tree: str | None = None) -> dict:
    env = dict(os.environ, **bu.BENCH_ENV, PEER_DIR=str(bu.PEER_DIR), OMP_NUM_THREADS="1")
    if tree is not None:
        env["PYTHONPATH"] = tree
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=bu.REPO, timeout=timeout)
    res = bu.parse_result(out.stdout)
    if res is None:
        raise RuntimeError(f"worker failed (rc={out.returncode}): {' '.join(map(str, cmd))}\n{out.stderr[-3000:]}")
    return res


def header() -> dict:
    import torch
    import transformers

    flags = set()
    model = "?"
    for ln in open("/proc/cpuinfo"):
        if ln.startswith("flags") and not flags:
            flags = set(ln.split(":", 1)[1].split())
        if ln.startswith("model name") and model == "?":
            model = ln.split(":", 1)[1].strip()
    h = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": model, "cpus": os.cpu_count(),
         "flags": {f: f in flags for f in FLAGS}, "torch": torch.__version__, "transformers": transformers.__version__,
         "load_start": os.getloadavg()}
    print(f"# {h['date']}  {platform.node()}  {model}, {h['cpus']} CPUs  torch {h['torch']}  transformers "
          f"{h['transformers']}")
    print("# CPU flags: " + "  ".join(f"{f}={'yes' if v else 'no'}" for f, v in h["flags"].items()))
    print(f"# load average at start {h['load_start'][0]:.2f} {h['load_start'][1]:.2f} {h['load_start'][2]:.2f} "
          "(2-core machine; other jobs inflate wall times, read the CPU columns)", flush=True)
    return h


def pair_rows(name: str, ours: list, theirs: list) -> dict:
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    r = {"name": name, "runs": (len(ours), len(theirs)), "ours_s": med(ours, "train_s"),
         "theirs_s": med(theirs, "train_s"), "ours_cpu": med(ours, "train_cpu_s"),
         "theirs_cpu": med(theirs, "train_cpu_s")}
    r["ratio"], r["ratio_cpu"] = r["ours_s"] / r["theirs_s"], r["ours_cpu"] / r["theirs_cpu"]
    # Each round's own ratio (ours and theirs ran back to back): this machine's speed drifts by up to ~40% over
    # seconds (the same tensor add timed 1.1-2.0 us within one process), so the spread says how far to trust a verdict.
    paired = sorted(o["train_cpu_s"] / t["train_cpu_s"] for o, t in zip(ours, theirs))
    r["paired_cpu"] = {"median": statistics.median(paired), "min": paired[0], "max": paired[-1]} if paired else None
    return r


def yardstick(algos: list[str], repeats: int, out: list) -> None:
    peer = str(bu.PEER_PYTHON)
    for algo in algos:
        ours, theirs = {lab: [] for lab in TREES}, []
        for rep in range(repeats):
            for lab, tree in TREES.items():                 # ours (each tree), theirs, alternating
                if algo == "magrpo":
                    o = worker([sys.executable, str(HERE / "ours_magrpo.py"), "--rollout-batch-size", "1"], tree=tree)
                else:
                    o = worker([sys.executable, "-c", pref.OURS, algo, str(HERE), str(bu.TINY_MODEL), "1"], tree=tree)
                t = worker([peer, str(HERE / "peer_magrpo.py"), "--algo", algo, "--threads", "1"])
                ours[lab].append(o), theirs.append(t)
                print(f"#   {algo + lab:16s} round {rep + 1}: ours {o['train_s']:.3f} s (CPU {o['train_cpu_s']:.3f})   "
                      f"theirs {t['train_s']:.3f} s (CPU {t['train_cpu_s']:.3f})", flush=True)
        for lab in TREES:
            out.append(pair_rows(algo + lab, ours[lab], theirs))


def trl_rows(pairs: int, out: list) -> None:
    ok = subprocess.run([str(bu.PEER_PYTHON), "-c", "import trl; print(trl.__version__)"], capture_output=True,
                        text=True)
    if ok.returncode != 0:
        print(f"#   TRL: not run: `import trl` fails in {bu.PEER_PYTHON} ({ok.stderr.strip().splitlines()[-1:]}); "
              f"install it there with: {bu.PEER_DIR}/venv/bin/pip install trl", flush=True)
        return
    model = bu.PEER_DIR / "smollm2-hf"
    if not (model / "config.json").exists():                 # SmolLM2-135M from the embedded GGUF, as a plain HF folder
        subprocess.run([sys.executable, "-c", SAVE_SMOLLM2, str(model)], check=True, capture_output=True)
    ours, theirs = {lab: [] for lab in TREES}, []
    for rep in range(pairs):
        for lab, tree in TREES.items():
            o = worker([sys.executable, str(HERE / "trl_grpo.py"), "--side", "ours", "--model", str(model)], tree=tree)
            ours[lab].append(o)
        t = worker([str(bu.PEER_PYTHON), str(HERE / "trl_grpo.py"), "--side", "trl", "--model", str(model)])
        theirs.append(t)
        print(f"#   trl pair {rep + 1}: "
              + "   ".join(f"ours{lab} {ours[lab][-1]['train_s']:.2f} s (CPU {ours[lab][-1]['train_cpu_s']:.2f})"
                           for lab in TREES)
              + f"   TRL {t.get('trl_version')} {t['train_s']:.2f} s (CPU {t['train_cpu_s']:.2f}); optimizer steps "
              f"{ours[''][-1]['optimizer_steps']} / {t['optimizer_steps']}", flush=True)
    for lab in TREES:
        out.append(pair_rows("trl" + lab, ours[lab], theirs))


SAVE_SMOLLM2 = r'''
import copy, sys
from comlrl_nb.models import load_embedded
m, t = load_embedded()
cfg = copy.deepcopy(m.config)
if hasattr(cfg, "quantization_config"): delattr(cfg, "quantization_config")
new = type(m)(cfg); new.load_state_dict(m.state_dict()); new.generation_config = m.generation_config
new.save_pretrained(sys.argv[1]); t.save_pretrained(sys.argv[1])
'''


def floor_rows(out: list, lab: str = "", tree: str | None = None) -> None:
    res = worker([sys.executable, str(HERE / "floor.py"), "--dtype", "fp32", "--pairs", "1"], timeout=1500, tree=tree)
    o, f = res["summary"]["ours"], res["summary"]["floor"]
    r = {"name": "floor" + lab, "runs": (len(res["runs"]["ours"]), len(res["runs"]["floor"])), "ours_s": o["train_s"],
         "theirs_s": f["step_s"], "ours_cpu": o["train_cpu_s"], "theirs_cpu": f["step_cpu_s"]}
    r["ratio"], r["ratio_cpu"] = r["ours_s"] / r["theirs_s"], r["ours_cpu"] / r["theirs_cpu"]
    print(f"#   floor{lab} SmolLM2 fp32, 2 agents: ours train() {o['train_s']:.2f} s (CPU {o['train_cpu_s']:.2f})   "
          f"floor {f['step_s']:.2f} s (CPU {f['step_cpu_s']:.2f})", flush=True)
    out.append(r)


def roofline(dtypes: str, lab: str = "", tree: str | None = None) -> dict:
    res = worker([sys.executable, str(HERE / "roofline.py"), "--threads", "1", "--rows", "16", "--dtypes", dtypes,
                  "--reps", "1"], timeout=1500, tree=tree)
    for g in res["generation"]:
        g["label"] = lab
        print(f"#   roofline{lab} {g['dtype']}: peak {res['peak_gflops'][g['dtype'] + '/1']:.1f} GFLOP/s, copy "
              f"{res['bandwidth_gbs']['1']:.1f} GB/s; generation {g['tokens_per_s']:.0f} tokens/s "
              f"({g['achieved_gflops']:.1f} GFLOP/s) vs roofline {g['roofline_tokens_per_s']:.0f} -> "
              f"{g['fraction']:.2f}", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="ours/theirs rounds per yardstick trainer")
    p.add_argument("--trl-pairs", type=int, default=1)
    p.add_argument("--algos", default="magrpo,madpo,marlhf")
    p.add_argument("--skip", default="", help="any of yardstick, trl, floor, roofline")
    p.add_argument("--before", default=None,
                   help="another source tree (e.g. a checkout of main): its rows, '(before)', "
                   "alternate with ours against the same theirs runs")
    p.add_argument("--out", default=str(bu.PEER_DIR / "ratios.json"))
    a = p.parse_args()
    if a.before:
        TREES[" (before)"] = str(Path(a.before).resolve())
    skip = set(filter(None, a.skip.split(",")))
    h = header()
    rows: list = []
    roof = None
    t0 = time.perf_counter()
    if "yardstick" not in skip:
        print("## ours vs the yardstick (comlrl 1.4.3): tiny Qwen2, 8 prompts, 2 agents, K=4, 16 new tokens, 1 epoch",
              flush=True)
        yardstick(a.algos.split(","), a.repeats, rows)
    if "trl" not in skip:
        print("## one agent vs TRL GRPO: SmolLM2-135M fp32, 4 prompts x K=4, 32 new tokens, one AdamW step", flush=True)
        trl_rows(a.trl_pairs, rows)
    if "floor" not in skip:
        print("## SmolLM2 MAGRPO step vs the bare floor (benchmarks/floor.py --dtype fp32)", flush=True)
        for lab, tree in TREES.items():
            floor_rows(rows, lab, tree)
    if "roofline" not in skip:
        print("## generation vs this CPU's roofline (benchmarks/roofline.py, one thread, 16 rows x 32 tokens)",
              flush=True)
        dts = "fp32,bf16" if h["flags"]["avx512_bf16"] or h["flags"]["amx_bf16"] else "fp32"
        for lab, tree in TREES.items():
            r = roofline(dts, lab, tree)
            roof = r if roof is None else {**roof, "generation": roof["generation"] + r["generation"]}
    print()
    table = []
    for r in rows:
        base, lab = r["name"].split(" ", 1)[0], r["name"][len(r["name"].split(" ", 1)[0]):]
        tgt = TARGETS.get(base)
        what = {"trl": "ours / TRL GRPO (1 agent)",
                "floor": "ours / bare floor"}.get(base, f"ours / comlrl {base.upper()}") + lab
        pc = r.get("paired_cpu")
        spread = f"{pc['median']:.2f} [{pc['min']:.2f}-{pc['max']:.2f}]" if pc and r["runs"][0] > 1 else "-"
        table.append([what, f"{r['ours_s']:.3f}", f"{r['theirs_s']:.3f}", f"{r['ratio']:.2f}", f"{r['ratio_cpu']:.2f}",
                      spread, f"<= {tgt}" if tgt else "-",
                      ("met" if r["ratio_cpu"] <= tgt else "NOT met") if tgt else "-"])
    for g in (roof or {}).get("generation", []):
        table.append([f"generation / roofline ({g['dtype']}){g.get('label', '')}", f"{g['tokens_per_s']:.0f} tok/s",
                      f"{g['roofline_tokens_per_s']:.0f} tok/s", f"{g['fraction']:.2f}", "-", "-", "-", "-"])
    bu.table(["ratio", "ours", "theirs / limit", "wall ratio", "CPU ratio", "per-round CPU [range]", "target", "(CPU)"],
             table)
    la = os.getloadavg()
    print(f"# load average at end {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; took {time.perf_counter() - t0:.0f} s")
    json.dump({"header": h, "rows": rows, "roofline": roof, "load_end": la}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
