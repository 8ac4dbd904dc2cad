"""Transitions receive the task item (`batch_item=`) when they accept it, in both trainer families; older ones are
called as before."""
import torch

from comlrl_nb.models import make_tiny_model
from comlrl_nb.trainers.actor_critic import MAACConfig, MAACTrainer
from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

torch.set_num_threads(1)
ROWS = [{"prompt": "Name a colour", "answer": "red"}, {"prompt": "Name a fruit", "answer": "apple"}]


def reward(a, b):
    return [float(len(x) + len(y)) for x, y in zip(a, b)]


def recorder(calls, with_item=True):
    if with_item:
        def transition(prompt, agent_completions, num_agents, batch_item=None, **kwargs):
            calls.append((prompt, batch_item))
            return [f"{prompt} (hint: {batch_item['answer']})"] * num_agents
    else:
        def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
            calls.append((prompt, None))
            return [f"{prompt} again"] * num_agents
    return transition


def test_magrpo_tree_passes_the_row(tmp_path):
    m, tok = make_tiny_model()
    calls = []
    cfg = MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=4, early_termination_threshold=None,
                       output_dir=str(tmp_path))
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=reward, args=cfg, train_dataset=ROWS,
                       external_transition=recorder(calls))
    ro = tr.rollout(ROWS, [0, 1], "t", k=2)
    assert len(calls) == 4 and {c[1]["answer"] for c in calls} == {"red", "apple"}
    assert all(c[1] is ROWS[0] for c in calls if c[0] == "Name a colour")
    assert ro["levels"][1][0].prompts[0] == "Name a colour (hint: red)"


def test_maac_episodes_pass_the_row_and_old_transitions_still_work(tmp_path):
    m, tok = make_tiny_model()
    for with_item in (True, False):
        calls = []
        cfg = MAACConfig(num_turns=2, early_termination_threshold=None, max_new_tokens=4, output_dir=str(tmp_path))
        tr = MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=reward, critic_model=m, args=cfg, train_dataset=ROWS,
                         external_transition=recorder(calls, with_item))
        eps = tr.rollout(ROWS, [0, 1], ("train", 0))["episodes"]
        assert [c[0] for c in calls] == ["Name a colour", "Name a fruit"]
        assert [c[1] for c in calls] == (ROWS if with_item else [None, None])
        assert eps[1].prompts[0][1] == ("Name a fruit (hint: apple)" if with_item else "Name a fruit again")
