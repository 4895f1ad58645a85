"""The built-in tasks and mixtures: importing this package registers them.

Kept apart from the data library (``t5x_like.data`` registers nothing on import), as
seqio keeps its library apart from t5's task modules. Every command imports this
package before the user's ``--module`` (``cli_flags.import_modules``); Python users
write ``import t5x_like.builtin_tasks`` before looking a built-in task up.

| module | registers |
| --- | --- |
| ``pretraining`` | one pretraining task per objective on the embedded English corpus; step lists |
| ``tfds`` | C4, Wikipedia and mC4 from TFDS |
| ``bench`` | ``embedded_bench``: six offline benchmark tasks on the labelled data in ``data/`` |
| ``glue`` | GLUE and SuperGLUE in T5's text-to-text formats |
| ``instructions`` | ``embedded_bench``'s instruction templates, ``*_instruct`` tasks, held-out split |
| ``glue_instructions`` | the same for GLUE and SuperGLUE, split by T0's held-out clusters |
| ``multilingual`` | XLM-R and mBART tasks and mixtures on the multilingual vocabulary |
| ``preferences`` | preference pairs from the benchmark data (``embedded_austen_cloze_preference``) |
| ``retrieval`` | ``embedded_bible_web_to_kjv``: KJV verses as a retrieval corpus, WEB queries |
"""

from t5x_like.builtin_tasks import (
    bench,
    glue,
    glue_instructions,
    instructions,
    multilingual,
    preferences,
    pretraining,
    retrieval,
    tfds,
)

__all__ = ["bench", "glue", "glue_instructions", "instructions", "multilingual", "preferences",
           "pretraining", "retrieval", "tfds"]
