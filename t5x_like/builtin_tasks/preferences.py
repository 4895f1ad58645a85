"""Preference pairs from the embedded benchmark data (``data/preference.py``'s rows):

- ``embedded_austen_cloze_preference``: an Austen context (the prompt) and its next
  word preferred over each of the three distractors of ``embedded_austen_cloze``
  (three pairs per cloze point, same splits). The responses carry no EOS: the word
  continues the text, it does not end a turn.

Reading pairs: ``PreferenceSource`` for JSONL files of your own, as
``docs/preference_tuning.md`` shows.
"""

from __future__ import annotations

import functools

from t5x_like.builtin_tasks import bench
from t5x_like.builtin_tasks.pretraining import features
from t5x_like.data import sources
from t5x_like.data.dataset_providers import TaskRegistry
from t5x_like.data.preference import TokenizePair

CLOZE_PREFERENCE = "embedded_austen_cloze_preference"


def cloze_pairs(split: str) -> list[dict]:
    """Three pairs per cloze point of ``split``: (context, answer, distractor)."""
    examples = TaskRegistry.get("embedded_austen_cloze").source.get(split)
    pairs = []
    for example in examples:
        answer = example["options"][example["label"]]
        for option in example["options"]:
            if option != answer:
                pairs.append({"prompt": example["context"], "chosen": answer, "rejected": option,
                              "margin": 0.0, "conversational": False,
                              "label": int(example["label"])})
    return pairs


def _register() -> None:
    if CLOZE_PREFERENCE in TaskRegistry.names():
        return
    TaskRegistry.add(
        CLOZE_PREFERENCE,
        sources.FunctionSource(functools.partial(cloze_pairs), splits=bench.SPLITS),
        [TokenizePair()], features("prompt", "chosen", "rejected", add_eos=False),
        description="Austen context -> its next word preferred over each distractor of "
                    "embedded_austen_cloze (3 pairs per cloze point).")


_register()
