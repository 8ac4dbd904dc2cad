"""The shipped environments: code (levels, references, transitions, sandbox_slice, expert hook) and writing; their
tasks."""
import copy
import json
import math
import time

import pytest

from comlrl_nb.envs import code as C
from comlrl_nb.envs import writing as W
from comlrl_nb.rewards import RewardFunction
from comlrl_nb.tasks import TASKS, Task, get_task

PROBS = C.load_problems()
BY_ID = {p["id"]: p for p in PROBS}
ITEM = C.problem_item(BY_ID["primes_below"])          # 4 tests: n = 10, 2, 20, 0

AUX = "def aux(k):\n    if k < 2:\n        return False\n    return all(k % d for d in range(2, int(k ** 0.5) + 1))\n"
MAIN = "def primes_below(n):\n    return [k for k in range(n) if aux(k)]\n"
SELF_MAIN = ("def primes_below(n):\n    out = []\n    for k in range(2, n):\n        if all(k % d for d in "
             "range(2, k)):\n            out.append(k)\n    return out\n")


def reward(aux, main, item=ITEM):
    return C.code_level_reward([aux], [main], [item])[0]


# ----------------------------------------------------------------------------------------------- the problem set
def test_problem_set_shape():
    assert len(PROBS) >= 30 and sum(p["split"] == "train" for p in PROBS) >= 24
    for p in PROBS:
        assert len(p["tests"]) >= 3 and p["entry_point"] != "aux" and p["prompt"].strip()
        assert "def aux" in p["reference_aux"] and f"def {p['entry_point']}" in p["reference_main"]
    assert len({p["prompt"] for p in PROBS}) == len(PROBS)


def test_every_reference_solution_scores_the_maximum():
    evs = C.evaluate_batch([p["reference_aux"] for p in PROBS], [p["reference_main"] for p in PROBS], PROBS)
    bad = {p["id"]: (ev.levels, ev.report.errors if ev.report else None) for p, ev in zip(PROBS, evs)
           if ev.reward != C.MAX_REWARD}
    assert not bad, bad
    assert C.MAX_REWARD == 4.0
    for ev in evs: assert ev.report.all_passed and ev.analysis.main_calls_aux and not ev.analysis.main_defines_aux


def test_loader_rejects_malformed_data(tmp_path):
    def broken(**change):
        ps = copy.deepcopy(PROBS[:3])
        ps[2].update(change)
        return ps
    with pytest.raises(ValueError, match=r"problem #2 \(sum_of_digit_sums\)|problem #2 \(count_palindromes\)"):
        C.load_problems(broken(tests="assert x"))
    with pytest.raises(ValueError, match="field 'prompt' must be a non-empty string"):
        C.load_problems(broken(prompt=""))
    with pytest.raises(ValueError, match="main_signature 'n' is not a parameter list"):
        C.load_problems(broken(main_signature="n"))
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"): C.load_problems(broken(split="test"))
    with pytest.raises(ValueError, match="same prompt"): C.load_problems(broken(prompt=PROBS[0]["prompt"]))
    with pytest.raises(ValueError, match="must be a JSON object"): C.load_problems([PROBS[0], "oops"])
    with pytest.raises(ValueError, match="non-empty list of problems"): C.load_problems({"problems": []})
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"problems": PROBS[:2]}))
    assert [p["id"] for p in C.load_problems(f)] == [p["id"] for p in PROBS[:2]]
    f.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"): C.load_problems(f)


# ----------------------------------------------------------------------------------------------- the level reward
@pytest.mark.parametrize("aux, main, want", [
    ("", "", 0.0),                                                                     # nothing
    ("I think aux should check primes.", "no idea", 0.0),                              # prose only
    (AUX, "", 0.5),                                                                    # level 1 only
    ("", MAIN, 0.5 + 0.5 + 2.0 * 1 / 4),  # aux missing: only the n = 0 test passes
    (AUX, MAIN + "raise RuntimeError('boom')\n", 0.5 + 0.5),  # does not run: tests do not count
    (AUX, "def primes_below(n):\n    return [aux(0)]\n", 0.5 + 0.5 + 0.5),           # runs, calls aux, 0 tests
    (AUX, "def primes_below(n):\n    return [k for k in range(n) if aux(k)][:4]\n",
     0.5 + 0.5 + 0.5 + 2.0 * 3 / 4 + 0.5),
    (AUX, SELF_MAIN, 0.5 + 0.5 + 0.5 + 2.0),                                           # ignores the helper
    (AUX, "def aux(k):\n    return k > 1 and all(k % d for d in range(2, k))\n" + MAIN, 3.5),  # main writes its own aux
    ("def aux(k)\n    return True\n", SELF_MAIN, 0.5 + 0.5 + 2.0),  # helper does not parse: main tested alone
    (AUX, MAIN, 4.0),
    # fenced, with prose
    ("```python\n" + AUX + "```\nThis checks primality.", "Here:\n```python\n" + MAIN + "```", 4.0),
])
def test_levels(aux, main, want):
    assert math.isclose(reward(aux, main), want), C.evaluate_code(aux, main, ITEM).levels


def test_level_table_and_breakdown():
    ev = C.evaluate_code(AUX, MAIN, ITEM)
    assert list(ev.levels) == [name for name, _ in C.LEVELS] and ev.levels == dict(C.LEVELS)
    ev = C.evaluate_code(AUX, "def primes_below(n):\n    return [k for k in range(n) if aux(k)][:4]\n", ITEM)
    assert ev.report.passed == [True, True, False, True]
    assert ev.report.errors[2].startswith("AssertionError: got [2, 3, 5, 7], expected")


def test_hostile_answers_are_contained_and_scored():
    hostile = ["def primes_below(n):\n    while True: pass\n", "import os\ndef primes_below(n):\n    os._exit(0)\n",
               "def primes_below(n):\n    return bytearray(10 * 2**30)\n",
               "import os\nos.kill(os.getppid(), 9)\n" + MAIN]
    t0 = time.time()
    rs = C.code_level_reward([AUX] * (len(hostile) + 1), hostile + [MAIN], [ITEM] * (len(hostile) + 1),
                             test_timeout=0.3)
    assert time.time() - t0 < 10
    assert rs[-1] == 4.0 and all(0.0 <= r < 4.0 for r in rs[:-1]), rs


def test_reward_contract_and_cache():
    rf = RewardFunction(C.code_level_reward, 2)
    assert rf([[AUX, AUX, ""], [MAIN, SELF_MAIN, MAIN]], [ITEM] * 3) == [4.0, 3.5, 1.5]
    with pytest.raises(ValueError, match="needs batch_items"): C.code_level_reward([AUX], [MAIN])
    with pytest.raises(ValueError, match="they must match"): C.code_level_reward([AUX], [MAIN, MAIN], [ITEM])
    t0 = time.perf_counter()
    C.code_level_reward([AUX], [MAIN], [ITEM])
    assert time.perf_counter() - t0 < 0.05  # cached
    # items of other problems are scored against their own tests
    other = C.problem_item(BY_ID["gcd_list"])
    assert C.code_level_reward([BY_ID["gcd_list"]["reference_aux"], AUX], [BY_ID["gcd_list"]["reference_main"], MAIN],
                               [other, ITEM]) == [4.0, 4.0]


def test_extract_code():
    assert C.extract_code("```py\ndef aux(k):\n    return 1\n```") == "def aux(k):\n    return 1\n"
    assert C.extract_code("def aux(k):\n    return k\n\nprint(aux(") == "def aux(k):\n    return k\n"
    assert C.extract_code("text only") == "text only\n"


# ----------------------------------------------------------------------------------------------- transitions
def call(tr, aux=AUX, main=MAIN, item=ITEM):
    return tr(prompt=item["prompt"], agent_completions=[aux, main], num_agents=2,
              prompt_history_per_agent=[[C.aux_formatter(item)], [C.main_formatter(item)]],
              response_history_per_agent=[[aux], [main]])


@pytest.mark.parametrize("mode", C.TRANSITION_MODES)
def test_transition_modes_give_one_prompt_per_agent(mode):
    tr = C.CodeTransition(PROBS, mode, expert=lambda p: "AUX: handle k < 2\nMAIN: fine")
    buggy = "def aux(k):\n    return True\n"
    out = call(tr, buggy, MAIN)
    assert isinstance(out, list) and len(out) == 2 and all(isinstance(p, str) for p in out)
    for p in out: assert p.startswith(ITEM["prompt"]) and buggy.strip() in p and MAIN.strip() in p
    assert "only the helper" in out[0] and "only this function" in out[1]
    assert ("Feedback (score" in out[0]) == (mode == "level_feedback")
    assert ("An expert reviewed" in out[0]) == (mode == "expert_edits")
    if mode == "expert_edits": assert "handle k < 2" in out[0] and "fine" in out[1] and "handle k < 2" not in out[1]
    for i, f in enumerate((C.aux_formatter, C.main_formatter)):               # the trainer re-applies the formatters
        assert out[i] in f({**ITEM, "prompt": out[i]})


def test_level_feedback_content_and_sandbox_slice():
    # fails only the third test (n = 20)
    wrong = "def primes_below(n):\n    return [k for k in range(n) if aux(k)][:4]\n"
    tests = ITEM["tests"]
    def shown(s):
        text = call(C.CodeTransition(PROBS, "level_feedback", sandbox_slice=s), AUX, wrong)[0]
        return [t for t in tests if f"PASS {t}" in text or f"FAIL {t}" in text], text
    assert shown(1)[0] == tests[:1] and "first 1 of 4 shown" in shown(1)[1]
    assert shown(3)[0] == tests[:3] and "FAIL " + tests[2] + "  ->  AssertionError: got [2, 3, 5, 7]" in shown(3)[1]
    assert shown(-1)[0] == tests[-1:] and "last 1 of 4 shown" in shown(-1)[1]
    assert shown(-2)[0] == tests[-2:]
    for s in (0, None, "all", 99): assert shown(s)[0] == tests and "all 4 shown" in shown(s)[1]
    text = shown(1)[1]
    assert "3 of 4 pass" in text and "score 3.50 of 4.0" in text and "`primes_below` calls aux" in text
    text = call(C.CodeTransition(PROBS, "level_feedback"), "def aux(k)\n  pass", "x = ")[0]
    assert "helper: syntax error" in text and "main: syntax error" in text and "tests: not run" in text
    text = call(C.CodeTransition(PROBS, "level_feedback"), AUX, MAIN + "raise RuntimeError('boom')")[0]
    assert "program: fails to load: RuntimeError: boom" in text and "tests: not counted until the program loads" in text
    for bad in (1.5, True, "first", [1]):
        with pytest.raises(ValueError, match="sandbox_slice"):
            C.CodeTransition(PROBS, "level_feedback", sandbox_slice=bad)
    assert C.select_tests(list(range(5)), -3) == [2, 3, 4] and C.select_tests([], 2) == []


def test_transition_errors():
    tr = C.CodeTransition(PROBS, "plain")
    with pytest.raises(ValueError, match="no code problem has the prompt"): tr("unknown prompt", [AUX, MAIN], 2)
    with pytest.raises(ValueError, match="has 2 agents"): tr(ITEM["prompt"], [AUX, MAIN, MAIN], 3)
    with pytest.raises(ValueError, match="transition_mode='feedback' is invalid"): C.CodeTransition(PROBS, "feedback")
    ex = C.CodeTransition(PROBS, "expert_edits", expert=lambda p: 42)
    with pytest.raises(TypeError, match="must return a string"): call(ex)


def test_expert_hooks():
    from comlrl_nb.models import make_tiny_model
    with pytest.raises(ValueError, match="API client is not available"):
        C.resolve_expert({"format": "openai", "model": "x"})
    try:
        C.register_expert_api(lambda spec: (lambda prompt: f"AUX: from {spec['model']}\nMAIN: ok"))
        out = call(C.CodeTransition(PROBS, "expert_edits", expert=C.resolve_expert({"model": "api-model"})))
        assert "from api-model" in out[0]
    finally: C.register_expert_api(None)
    lazy = C.resolve_expert(None)
    # loads on first call only
    assert isinstance(lazy, C.LocalExpert) and lazy.spec == "embedded" and lazy.model is None
    model, tok = make_tiny_model(seed=3)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        C.resolve_expert(model)(C.expert_prompt(ITEM, C.evaluate_code(AUX, MAIN, ITEM)))
    seen = []
    expert = C.resolve_expert((model, tok), max_new_tokens=6)
    out = call(C.CodeTransition(PROBS, "expert_edits", expert=lambda p: seen.append(p) or expert(p)))
    assert len(out) == 2 and "AUX:" in seen[0] and "Feedback (score" in seen[0]


# ----------------------------------------------------------------------------------------------- tasks
def test_code_task_builds():
    t = get_task("code")
    assert isinstance(t, Task) and t.name == "code" and t.num_agents == 2 and t.num_turns == 2
    assert (len(t.train_dataset), len(t.eval_dataset)) == (32, 8)
    assert all("reference_aux" not in it and "reference_main" not in it for it in t.train_dataset + t.eval_dataset)
    assert isinstance(t.external_transition, C.CodeTransition) and t.external_transition.mode == "level_feedback"
    assert t.external_transition.sandbox_slice == 1
    it = t.train_dataset[0]
    assert t.reward_func([BY_ID[it["id"]]["reference_aux"]], [BY_ID[it["id"]]["reference_main"]],
                         batch_items=[it]) == [4.0]
    for f in t.formatters: assert isinstance(f(it), str) and it["prompt"] in f(it)
    t2 = get_task("code", transition_mode="plain", sandbox_slice=-2, num_turns=3, split=5)
    assert (t2.num_turns, t2.external_transition.mode, len(t2.eval_dataset)) == (3, "plain", 5)
    with pytest.raises(ValueError, match="num_turns"): get_task("code", num_turns=0)
    with pytest.raises(ValueError, match="API client is not available"):
        get_task("code", transition_mode="expert_edits", expert_model={"model": "x"})


def test_writing_task_and_reward():
    t = get_task("writing")
    assert (t.name, t.num_agents, t.num_turns, len(t.train_dataset), len(t.eval_dataset)) == ("writing", 2, 2, 26, 6)
    it = t.train_dataset[0]
    full = " ".join(it["keywords"])
    r = W.writing_reward(["x" * 9], ["y" * 29], [it], target=3.0, coverage_weight=0.5)[0]
    assert math.isclose(r, 0.5)                                                 # perfect ratio, no key terms
    r = W.writing_reward([full], [full], [it], coverage_weight=1.0)[0]
    assert math.isclose(r, 1.0)
    r = W.writing_reward([full], [full], [it], coverage_weight=0.0)[0]
    assert math.isclose(r, 1 / 3)                                               # ratio 1 vs target 3
    half = it["keywords"][: len(it["keywords"]) // 2]
    assert math.isclose(W.keyword_coverage(" ".join(half), it["keywords"]), len(half) / len(it["keywords"]))
    rs = t.reward_func(["a", full, ""], ["b" * 100, full * 3, ""], batch_items=[it] * 3)
    assert all(0.0 <= x <= 1.0 for x in rs) and rs[1] == max(rs)
    with pytest.raises(ValueError, match="coverage_weight"): W.writing_task(coverage_weight=-0.1)
    with pytest.raises(ValueError, match="do not occur in the text"):
        W.load_texts([{"id": "a", "text": "Cats sleep.", "keywords": ["dogs"]}])


def test_writing_transition():
    t = get_task("writing")
    it = t.train_dataset[1]
    out = t.external_transition(prompt=it["prompt"], agent_completions=["short.", "long " * 5], num_agents=2,
                                prompt_history_per_agent=[[t.formatters[0](it)], [t.formatters[1](it)]],
                                response_history_per_agent=[["short."], ["long " * 5]])
    assert len(out) == 2 and all(p.startswith(it["prompt"]) and "Summary: short." in p for p in out)
    assert "improved summary" in out[0] and "improved, more detailed explanation" in out[1]
    with pytest.raises(ValueError, match="has 2 agents"): t.external_transition(it["prompt"], ["a"], 1)


def test_registry_is_lazy():
    import subprocess, sys
    code = "import sys, comlrl_nb.tasks as t; print(sorted(m for m in sys.modules if m.startswith('comlrl_nb.envs') " \
           "or m == 'comlrl_nb.sandbox'))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == \
        "[]"
    assert list(TASKS)[:3] == ["length_ratio", "code", "writing"]
    with pytest.raises(ValueError, match="known tasks: length_ratio, code, writing"): get_task("poetry")


@pytest.mark.parametrize("name", ["code", "writing"])
def test_multi_turn_magrpo_run_on_tiny_models(name, tmp_path):
    "The environments inside the real trainer: a 2-turn tree, every branch through the transition."
    from comlrl_nb.engine import read_metrics
    from comlrl_nb.models import make_tiny_model
    from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    task = get_task(name)
    calls = []
    def transition(**kw):
        calls.append(kw)
        return task.external_transition(**kw)
    (m1, tok), (m2, _) = make_tiny_model(seed=1), make_tiny_model(seed=2)
    cfg = MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=8, num_train_epochs=1,
                       early_termination_threshold=None, eval_interval=0, output_dir=str(tmp_path), save_steps=-1,
                       progress_bar=False)
    MAGRPOTrainer(agents=[m1, m2], tokenizer=tok, reward_func=task.reward_func, formatters=task.formatters, args=cfg,
                  train_dataset=task.train_dataset[:2], external_transition=transition).train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 2 and all("turn_2/reward_mean" in r for r in rows)
    assert len(calls) == 2 * 2                                                # K=2 branches per item, 2 items
    assert all(c["prompt"] in {it["prompt"] for it in task.train_dataset[:2]} and len(c["agent_completions"]) == 2
               for c in calls)


# ----------------------------------------------------------------------------------------------- reward games (S3)
# A model under RL finds any way to test points without solving the problem. Each case below is wrong code that
# must earn no test points; the honest controls next to them must keep theirs.
from comlrl_nb.envs import humaneval as H  # noqa: E402

HE = {p["task_id"]: H.humaneval_item(p) for p in H.load_humaneval()}
HE_PROBS = {p["task_id"]: p for p in H.load_humaneval()}
ID = "def decode_cyclic(s):\n    return s\n"
HE_GAMES = {   # (task, helper agent's text, main agent's text)
    "main redefines the prompt's encoder": ("HumanEval/38", "", "def encode_cyclic(s):\n    return s\n\n" + ID),
    "main redefines encode_shift": ("HumanEval/50", "", "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n"
                                                        "    return s\n"),
    "main redefines poly to be zero": ("HumanEval/32", "", "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n"
                                                           "    return 1.0\n"),
    "the helper agent redefines the encoder": ("HumanEval/38", "def encode_cyclic(s):\n    return s\n", ID),
    "an assignment rebinds the encoder": ("HumanEval/38", "", ID + "encode_cyclic = decode_cyclic\n"),
    "an import rebinds the encoder": ("HumanEval/38", "", "from builtins import str as encode_cyclic\n" + ID),
    "rebinding through globals() at load": ("HumanEval/38", "", "globals()['encode_cyclic'] = lambda s: s\n" + ID),
    "rebinding through the builtins module": ("HumanEval/32", "", "import builtins\nbuiltins.poly = lambda xs, x: 0\n"
                                              "del poly\ndef find_zero(xs):\n    return 1.0\n"),
    "a body whose dedented tail redefines the encoder": ("HumanEval/38", "", "    return s\n\ndef encode_cyclic(s):\n"
                                                                              "    return s\n"),
    "a class redefines poly": ("HumanEval/32", "", "class poly:\n    def __new__(cls, xs, x):\n        return 0\n"
                                                          "def find_zero(xs):\n    return 3.0\n"),
    "builtin abs redefined for check": ("HumanEval/2", "", "abs = lambda x: 0\ndef truncate_number(number):\n"
                                                          "    return 42.0\n"),
    "check redefined by the answer": ("HumanEval/2", "", "def check(candidate):\n    pass\ndef truncate_number(n):\n"
                                                        "    return 42.0\n"),
    "always-equal object": ("HumanEval/38", "", "class Any(str):\n    def __eq__(self, o): return True\n"
                                                "def decode_cyclic(s):\n    return Any('x')\n"),
    "sys.exit(0) after the definitions": ("HumanEval/2", "", "import sys\ndef truncate_number(n):\n    return 4.0\n"
                                                           "sys.exit(0)\n"),
    "exit inside the function": ("HumanEval/2", "", "def truncate_number(n):\n    raise SystemExit(0)\n"),
    "os._exit inside the function": ("HumanEval/2", "", "import os\ndef truncate_number(n):\n    os._exit(0)\n"),
    "the harness killed at load": ("HumanEval/2", "", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                                                    "def truncate_number(n):\n    return 4.0\n"),
}


@pytest.mark.parametrize("name", list(HE_GAMES))
def test_humaneval_games_earn_no_test_points(name):
    task, aux, main = HE_GAMES[name]
    fence = lambda code: code if not code or code.startswith(" ") else "```python\n" + code + "```"  # all of it is code
    ev = H.evaluate_humaneval([fence(aux)], [fence(main)], [HE[task]])[0]
    assert ev.levels["tests"] == 0.0, (name, ev.levels, ev.report and ev.report.errors, ev.analysis.diagnostics)
    assert ev.reward <= 1.5


def test_humaneval_honest_answers_around_the_prompt_helpers_keep_their_points():
    items = [HE[k] for k in ("HumanEval/38", "HumanEval/50", "HumanEval/32", "HumanEval/10")]
    bodies = [HE_PROBS[it["task_id"]]["canonical_solution"] for it in items]
    copied = ["```python\n" + HE_PROBS[it["task_id"]]["prompt"] + b + "```" for it, b in zip(items, bodies)]
    evs = H.evaluate_humaneval([""] * 8, bodies + copied, items * 2)
    assert [e.levels["tests"] for e in evs] == [2.0] * 8, [e.report.errors for e in evs]
    assert not any("redefines" in d for e in evs for d in e.analysis.diagnostics)
    # an answer with its own, different encoder that only its decoder uses: the answer's business, still correct
    own = "def encode_cyclic(s):\n    return s[::-1]\n\ndef decode_cyclic(s):\n    " \
          "return encode_cyclic(encode_cyclic(''.join((g[-1] + g[:-1]) if len(g) == 3 else g for g in " \
          "[s[i:i + 3] for i in range(0, len(s), 3)])))\n"
    ev = H.evaluate_humaneval([""], [own], [HE["HumanEval/38"]])[0]
    assert ev.levels["tests"] == 2.0 and any("redefines `encode_cyclic`" in d for d in ev.analysis.diagnostics)
    aux = "def aux(s):\n    return encode_cyclic(encode_cyclic(s))\n"
    ev = H.evaluate_humaneval([aux], ["def decode_cyclic(s):\n    return aux(s)\n"], [HE["HumanEval/38"]])[0]
    assert ev.reward == 4.0, ev.levels


def test_humaneval_harness_is_the_prompt_without_its_entry_point():
    h = H.humaneval_harness(HE["HumanEval/38"])
    assert "def encode_cyclic" in h and "def decode_cyclic" not in h
    assert h.count("\n") == HE["HumanEval/38"]["prompt"].count("\n")       # line numbers stay the prompt's
    h = H.humaneval_harness(HE["HumanEval/32"])
    assert "import math" in h and "def poly" in h and "def find_zero" not in h
    with pytest.raises(ValueError, match="prompt is not valid Python"):
        H.humaneval_harness({"task_id": "X/1", "prompt": "def f(:\n", "entry_point": "f"})
    ev = H.evaluate_humaneval([""], [HE_GAMES["main redefines poly to be zero"][2]], [HE["HumanEval/32"]])[0]
    assert "main: redefines `poly` of the problem's prompt; check() uses the prompt's own" in ev.analysis.diagnostics


@pytest.mark.parametrize("test, name", [
    ("assert primes_below(10) == EXPECTED", "EXPECTED"),
    ("assert is_sorted(primes_below(30))", "is_sorted"),
    ("assert primes_below(10) == [2, 3, 5, 7] or helper_says_ok()", "helper_says_ok"),
])
def test_code_problem_whose_test_reads_a_name_only_the_model_defines_is_refused(test, name):
    # the same hole as HumanEval's prompt helpers, in a user's problem file: the model's code would define it
    ps = copy.deepcopy(PROBS[:3])
    ps[0]["tests"][2] = test
    with pytest.raises(ValueError, match=rf"problem #0 \(primes_below\): tests\[2\] reads {name}, which neither the "
                                         "test nor"):
        C.load_problems(ps)
    game = "def is_sorted(x):\n    return True\nEXPECTED = [-1]\ndef helper_says_ok():\n    return True\n"
    assert C.run_tests_batch([(game + "def primes_below(n):\n    return [-1]\n", [test])])[0].passed == [True]


def test_code_problem_tests_may_define_and_import_their_own_names():
    ps = copy.deepcopy(PROBS[:1])
    ps[0]["tests"] += ["import math\nassert math.prod(primes_below(6)) == 30",
                       "expected = [2, 3]\nassert primes_below(4) == expected",
                       "assert all(aux(k) for k in primes_below(20))",
                       "assert [k for k in primes_below(10) if k > 2] == [3, 5, 7]",
                       "def ok(xs):\n    return xs == sorted(xs)\nassert ok(primes_below(30))",
                       "try:\n    primes_below(-1)\nexcept ValueError as e:\n    err = e"]
    assert len(C.load_problems(ps)[0]["tests"]) == len(PROBS[0]["tests"]) + 6


def test_code_env_games_earn_no_test_points():
    games = {"redefine the builtin the test uses": "sorted = lambda x: [2, 3, 5, 7]\ndef primes_below(n):\n"
                                                   "    return aux(n) or [-1]\n",
             "rebind assert helpers via builtins": "import builtins\nbuiltins.AssertionError = None\n"
                                                   "def primes_below(n):\n    aux(n)\n    return [-1]\n",
             "exit(0) at import after defining": "import sys\ndef primes_below(n):\n    return [2]\nsys.exit(0)\n"}
    for name, main in games.items():
        ev = C.evaluate_code(AUX, "```python\n" + main + "```", ITEM)
        assert ev.levels["tests"] == 0.0 and ev.reward <= 1.5, (name, ev.levels, ev.report.errors)
