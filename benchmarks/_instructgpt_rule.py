"""The hidden rule and the preference pairs of ``benchmarks/instructgpt_recipe.py`` (not a
benchmark: a ``--module`` its runs load, with ``benchmarks/`` on ``PYTHONPATH``).

The rule stands for InstructGPT's human labellers: a fixed preference nobody tells the
models. A continuation scores the share of its words that start with a vowel; the
reward model learns it from pairs of the SFT model's own samples labelled by it, and PPO
optimises the reward model's score while the rule itself is only measured (its reward
weight is 0). ``hidden_rule`` is registered as a reward, and ``distinct_words`` (a
measure of collapse onto few words, also weighted 0); the pairs task
(``instructgpt_pairs``, every 8th pair held out) is registered when the environment
variable ``INSTRUCTGPT_PAIRS`` names the pairs file.
"""

from __future__ import annotations

import os
import re

from t5x_like.data import Feature, TaskRegistry, get_task_or_mixture
from t5x_like.data.preference import PreferenceSource, TokenizePair
from t5x_like.metrics.rewards import RewardRegistry

PAIRS_TASK = "instructgpt_pairs"
PROMPTS_TASK = "embedded_en_prefix_lm"


def vowel_share(text: str) -> float:
    """The share of ``text``'s words that start with a vowel (0 without words)."""
    words = re.findall(r"[A-Za-z]+", text)
    return sum(w[0].lower() in "aeiou" for w in words) / len(words) if words else 0.0


def hidden_rule(completions, examples):
    return [vowel_share(c) for c in completions]


RewardRegistry.add("hidden_rule", hidden_rule)

if os.environ.get("INSTRUCTGPT_PAIRS") and PAIRS_TASK not in TaskRegistry.names():
    _vocabulary = get_task_or_mixture(PROMPTS_TASK).vocabulary
    TaskRegistry.add(PAIRS_TASK, PreferenceSource((os.environ["INSTRUCTGPT_PAIRS"],),
                                                  holdout_every=8),
                     [TokenizePair()],
                     {name: Feature(_vocabulary) for name in ("prompt", "chosen", "rejected")},
                     description="SFT samples' continuation pairs, labelled by the hidden rule.")


def distinct_words(completions, examples):
    """A measurement, not a preference: the share of a completion's words that are
    distinct (1: no word repeats), which falls when a policy collapses onto a few words."""
    out = []
    for text in completions:
        words = re.findall(r"[A-Za-z]+", text.lower())
        out.append(len(set(words)) / len(words) if words else 0.0)
    return out


RewardRegistry.add("distinct_words", distinct_words)
