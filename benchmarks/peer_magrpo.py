"""Worker for the yardstick side, run with the yardstick's interpreter ($PEER_DIR/venv/bin/python).

Runs the yardstick's own `run_peer.run_single("magrpo", ...)` unchanged (same trainer, settings, seeding and its own
wall-clock `train_s`), and adds one thing: a stopwatch of process CPU time around `MAGRPOTrainer.train` (a class-level
wrapper that calls the original), so both sides can also be compared by CPU time on a shared machine.
Prints the yardstick's result dict plus `train_cpu_s` as one `RESULT {json}` line.

    $PEER_DIR/venv/bin/python benchmarks/peer_magrpo.py [run_peer.py options, e.g. --threads 1]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

sys.path.insert(0, str(bu.BENCH_DIR))
import run_peer  # noqa: E402  (sets its environment variables at import, before torch is imported)


def main() -> None:
    sys.argv = [sys.argv[0], "--single", "magrpo", *sys.argv[1:]]
    args = run_peer.parse()
    from comlrl.trainers import MAGRPOTrainer

    stat = {"cpu": 0.0, "wall": 0.0, "calls": 0}
    orig = MAGRPOTrainer.train

    def train(self, *a, **kw):
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            stat["cpu"] += time.process_time() - c0
            stat["wall"] += time.perf_counter() - t0
            stat["calls"] += 1

    MAGRPOTrainer.train = train
    res = run_peer.run_single("magrpo", args)
    res.update(side="theirs", train_cpu_s=round(stat["cpu"], 4), train_wall_wrapper_s=round(stat["wall"], 4),
               train_calls=stat["calls"])
    bu.emit(res)


if __name__ == "__main__":
    main()
