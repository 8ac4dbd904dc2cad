"""Worker for the yardstick side, run with the yardstick's interpreter ($PEER_DIR/venv/bin/python).

Runs the yardstick's own `run_peer.run_single(algo, ...)` unchanged (algo: --algo, default magrpo) (same trainer,
settings, seeding and its own wall-clock `train_s`), and adds one thing: a stopwatch of process CPU time around
`MAGRPOTrainer.train` (a class-level wrapper that calls the original; for any algo: every trainer class of
comlrl.trainers, the outermost call only), so both sides can also be compared by CPU time on a shared machine. Prints
the yardstick's result dict plus `train_cpu_s` as one `RESULT {json}` line.

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
    algo = "magrpo"
    if "--algo" in sys.argv:
        i = sys.argv.index("--algo")
        algo = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    sys.argv = [sys.argv[0], "--single", algo, *sys.argv[1:]]
    args = run_peer.parse()
    import comlrl.trainers as T

    stat = {"cpu": 0.0, "wall": 0.0, "calls": 0, "depth": 0}

    def wrap(orig):
        def train(self, *a, **kw):
            stat["depth"] += 1
            c0, t0 = time.process_time(), time.perf_counter()
            try:
                return orig(self, *a, **kw)
            finally:
                stat["depth"] -= 1
                if stat["depth"] == 0:              # the outermost train() only (a trainer may call another's)
                    stat["cpu"] += time.process_time() - c0
                    stat["wall"] += time.perf_counter() - t0
                    stat["calls"] += 1
        return train

    for name in dir(T):
        cls = getattr(T, name)
        if isinstance(cls, type) and "train" in vars(cls):
            cls.train = wrap(cls.train)
    res = run_peer.run_single(algo, args)
    res.update(side="theirs", train_cpu_s=round(stat["cpu"], 4), train_wall_wrapper_s=round(stat["wall"], 4),
               train_calls=stat["calls"])
    bu.emit(res)


if __name__ == "__main__":
    main()
