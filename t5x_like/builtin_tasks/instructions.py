"""Instruction templates for the embedded benchmark tasks, and their ``<task>_instruct``
tasks (``TemplateRegistry``, ``instruction_task``).

Written as FLAN's are (Wei et al. 2022, appendix: ten per dataset there): several
phrasings of the same question, some listing the options (``{options}``) and some
not, and for classification some with their own answer words (yes/no) in place of the
task's labels. The question and the options come before a long field (an email, a
paragraph, a passage): the task's ``Truncate`` keeps an input's first tokens. Each
``embedded_*_instruct`` task reads its task's examples through one template per
example, picked from the pipeline's seed.

``embedded_instruct_train`` mixes the instructions of four of the six tasks' clusters
and ``embedded_instruct_held_out`` the other two (paraphrase and cloze), as T0 held
whole clusters out of training. ``embedded_instruct_one_template_train`` is the same
mix through each task's first template alone (T0 measured how the number of templates
per dataset matters).
"""

from __future__ import annotations

from t5x_like import metrics
from t5x_like.builtin_tasks import bench
from t5x_like.data.dataset_providers import (
    INSTRUCTION_SUFFIX,
    TaskRegistry,
    TemplateRegistry,
    instruction_mixtures,
    instruction_task,
)
from t5x_like.data.preprocessors import Template

YES_NO = ("no", "yes")  # by label: 0 no, 1 yes

TEMPLATES: dict[str, tuple[Template, ...]] = {
    "embedded_spam": (
        Template("is_spam", "Is the following email spam?\n\n{text}", answer_choices=YES_NO),
        Template("is_spam_options", "Is this email spam?\n{options}\n\nEmail: {text}",
                 answer_choices=YES_NO),
        Template("ham_or_spam", "Classify this email as ham or spam.\n\n{text}"),
        Template("ham_or_spam_options", "Which kind of email is this?\n{options}\n\n"
                 "Email: {text}"),
        Template("legitimate", "Would a spam filter let this email through?\n\n{text}",
                 answer_choices=("yes", "no")),  # label 0 (ham) passes
    ),
    "embedded_bible_paraphrase": (
        Template("same_meaning", "Do these two sentences say the same thing?\n\n"
                 "Sentence 1: {sentence1}\nSentence 2: {sentence2}", answer_choices=YES_NO),
        Template("same_meaning_options", "{sentence1}\n{sentence2}\n\nAre these two "
                 "sentences paraphrases of each other?\n{options}", answer_choices=YES_NO),
        Template("equivalent", "Sentence A: \"{sentence1}\"\nSentence B: \"{sentence2}\"\n"
                 "Are A and B equivalent or not equivalent?\n{options}",
                 answer_choices=("not equivalent", "equivalent")),
        Template("rewrite", "Is the second sentence a rewording of the first?\n"
                 "{sentence1}\n{sentence2}", answer_choices=YES_NO),
    ),
    "embedded_bible_en_es": (
        Template("translate", "Translate to Spanish:\n\n{english}"),
        Template("translate_sentence", "{english}\n\nHow would you say this in Spanish?"),
        Template("translate_from", "Translate the following sentence from English to "
                 "Spanish.\nEnglish: {english}\nSpanish:"),
        Template("reverse_question", "What is the Spanish for \"{english}\"?"),
    ),
    "embedded_udhr_langid": (
        Template("which_language", "Which language is this text written in?\n\n{paragraph}"),
        Template("identify", "Identify the language of the text below.\n\n{paragraph}"),
        Template("language_name", "Text: {paragraph}\nLanguage:"),
    ),
    "embedded_austen_cloze": (
        Template("next_word", "What word comes next?\n\n{context}"),
        Template("next_word_options", "Complete the passage with the right word.\n{options}"
                 "\n\n{context} ___"),
        Template("continue", "Continue the text with one word: {context}"),
        Template("choose", "Which word comes next?\n{options}\n\n{context}"),
    ),
    "embedded_ud_pos": (
        Template("tag", "Give the part-of-speech tag of each word.\n\n{sentence}"),
        Template("upos", "Sentence: {sentence}\nUniversal POS tags:"),
        Template("label_words", "Label every word of \"{sentence}\" with its universal "
                 "part of speech (NOUN, VERB, ADJ, ...)."),
    ),
}


# Metrics on the answer texts (the yes/no of a template is not the task's label word).
METRICS = {
    "embedded_spam": (metrics.accuracy,),
    "embedded_bible_paraphrase": (metrics.accuracy,),
    "embedded_bible_en_es": (metrics.bleu, metrics.chrf),
    "embedded_udhr_langid": (metrics.accuracy, metrics.macro_f1),
    "embedded_austen_cloze": (metrics.accuracy,),
    "embedded_ud_pos": (metrics.token_accuracy,),
}

# The benchmark's tasks by kind, one cluster each (T0 clusters its datasets so).
CLUSTERS = {
    "spam detection": ("embedded_spam",),
    "paraphrase": ("embedded_bible_paraphrase",),
    "translation": ("embedded_bible_en_es",),
    "language identification": ("embedded_udhr_langid",),
    "cloze": ("embedded_austen_cloze",),
    "part-of-speech tagging": ("embedded_ud_pos",),
}
# T0 held out paraphrase identification and sentence completion among others: here the
# paraphrase and cloze clusters, trained on the other four.
HELD_OUT = ("paraphrase", "cloze")
MIXTURE_MAXIMUM = 3000  # FLAN capped each task at 3,000 examples
ONE_TEMPLATE_SUFFIX = "_instruct_one_template"


def _register() -> None:
    if bench.TASKS[0] + INSTRUCTION_SUFFIX in TaskRegistry.names():
        return
    for task_name in bench.TASKS:
        TemplateRegistry.add(task_name, TEMPLATES[task_name])
        instruction_task(task_name, postprocess_fn=bench.text_postprocess,
                         metric_fns=METRICS[task_name])
        # T0 found more templates per dataset help held-out tasks: the same tasks
        # through their first template alone, to measure it.
        instruction_task(task_name, TEMPLATES[task_name][:1],
                         name=task_name + ONE_TEMPLATE_SUFFIX,
                         postprocess_fn=bench.text_postprocess, metric_fns=METRICS[task_name])
    instruction_mixtures("embedded_instruct", CLUSTERS, HELD_OUT, MIXTURE_MAXIMUM)
    instruction_mixtures("embedded_instruct_one_template", CLUSTERS, HELD_OUT, MIXTURE_MAXIMUM,
                         suffix=ONE_TEMPLATE_SUFFIX)


_register()
