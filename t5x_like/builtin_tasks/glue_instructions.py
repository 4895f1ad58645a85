"""Instruction templates for GLUE and SuperGLUE, their ``*_instruct`` tasks and T0's
held-out split of them (``glue_instruct_train``, ``glue_instruct_held_out``).

The templates read the raw TFDS records (``sentence1``, ``premise``, ``label``, ...), so
an instruction task runs ``ApplyTemplates`` in place of T5's formatting step and then
the task's own tokenizing steps. Every template gives its answer words
(``answer_choices``, in the order of the TFDS label ids): "yes"/"no" reads better than
``not_entailment``, and evaluation ranks exactly those words. COPA's answers are its two
alternatives (``choice_fields``). Unlabelled test records (label -1) answer ``<unk>``,
as in T5. STS-B (a regression) and ReCoRD (free-text answers over entity lists) have no
templates here.

T0 (Sanh et al. 2022) held out natural language inference, coreference, sentence
completion and word sense whole; the split below does the same with what GLUE and
SuperGLUE hold: training on paraphrase, sentiment, acceptability and reading
comprehension, evaluating zero-shot on NLI (MNLI, QNLI, RTE, WNLI, CB), WSC, COPA and
WiC. Registering reads nothing: the TFDS datasets are read when a split is.
"""

from __future__ import annotations

from t5x_like import metrics
from t5x_like.builtin_tasks import bench, glue  # noqa: F401 - glue registers the tasks first
from t5x_like.data.dataset_providers import (
    INSTRUCTION_SUFFIX,
    TaskRegistry,
    TemplateRegistry,
    instruction_mixtures,
    instruction_task,
)
from t5x_like.data.preprocessors import Template

NO_YES = ("no", "yes")
YES_NO = ("yes", "no")
NLI3 = ("yes", "maybe", "no")  # entailment, neutral, contradiction (MNLI's label order)

TEMPLATES: dict[str, tuple[Template, ...]] = {
    "glue_cola_v002": (
        Template("acceptable", "Is the following sentence grammatically acceptable?\n\n"
                 "{sentence}", answer_choices=NO_YES),
        Template("acceptable_options", "Sentence: \"{sentence}\"\nWould a linguist rate this "
                 "sentence as acceptable English?\n{options}", answer_choices=NO_YES),
        Template("correct", "{sentence}\n\nIs this sentence correct English?",
                 answer_choices=NO_YES),
    ),
    "glue_sst2_v002": (
        Template("sentiment", "What is the sentiment of this review?\n\n{sentence}",
                 answer_choices=("negative", "positive")),
        Template("sentiment_options", "Review: {sentence}\nIs this review positive or "
                 "negative?\n{options}", answer_choices=("negative", "positive")),
        Template("liked", "Did the reviewer like the movie?\n\n{sentence}",
                 answer_choices=NO_YES),
    ),
    "glue_mrpc_v002": (
        Template("paraphrase", "Do these two sentences mean the same thing?\n\n{sentence1}\n"
                 "{sentence2}", answer_choices=NO_YES),
        Template("paraphrase_options", "Sentence 1: {sentence1}\nSentence 2: {sentence2}\n\n"
                 "Are these sentences paraphrases of each other?\n{options}",
                 answer_choices=NO_YES),
        Template("equivalent", "\"{sentence1}\"\n\"{sentence2}\"\nAre the two sentences "
                 "equivalent?", answer_choices=NO_YES),
    ),
    "glue_qqp_v002": (
        Template("duplicate", "Are these two questions asking the same thing?\n\n{question1}\n"
                 "{question2}", answer_choices=NO_YES),
        Template("duplicate_options", "Question 1: {question1}\nQuestion 2: {question2}\n\n"
                 "Would the answer to one answer the other?\n{options}",
                 answer_choices=NO_YES),
        Template("same_question", "Is \"{question1}\" the same question as \"{question2}\"?",
                 answer_choices=NO_YES),
    ),
    "glue_mnli_v002": (
        Template("entails", "Premise: {premise}\nHypothesis: {hypothesis}\n\nDoes the premise "
                 "entail the hypothesis?\n{options}", answer_choices=NLI3),
        Template("true_given", "{premise}\n\nBased on the paragraph above, is it true that "
                 "\"{hypothesis}\"?", answer_choices=NLI3),
        Template("follows", "If \"{premise}\", does it follow that \"{hypothesis}\"?\n{options}",
                 answer_choices=NLI3),
    ),
    "glue_qnli_v002": (
        Template("answers", "Does the sentence answer the question?\n\nQuestion: {question}\n"
                 "Sentence: {sentence}", answer_choices=YES_NO),
        Template("answers_options", "{question}\n\nDoes \"{sentence}\" answer this question?\n"
                 "{options}", answer_choices=YES_NO),
        Template("contains", "Sentence: {sentence}\nDoes this sentence contain the answer to "
                 "\"{question}\"?", answer_choices=YES_NO),
    ),
    "glue_rte_v002": (
        Template("entails", "{sentence1}\n\nDoes this mean that \"{sentence2}\" is true?",
                 answer_choices=YES_NO),
        Template("entails_options", "Premise: {sentence1}\nHypothesis: {sentence2}\n\nDoes "
                 "the premise entail the hypothesis?\n{options}", answer_choices=YES_NO),
        Template("conclude", "Given that \"{sentence1}\", can we conclude that "
                 "\"{sentence2}\"?", answer_choices=YES_NO),
    ),
    "glue_wnli_v002": (
        Template("entails", "{sentence1}\n\nDoes this mean that \"{sentence2}\"?",
                 answer_choices=NO_YES),
        Template("entails_options", "Sentence 1: {sentence1}\nSentence 2: {sentence2}\n\nIs "
                 "sentence 2 true if sentence 1 is?\n{options}", answer_choices=NO_YES),
        Template("follows", "If \"{sentence1}\", does it follow that \"{sentence2}\"?",
                 answer_choices=NO_YES),
    ),
    "super_glue_boolq_v102": (
        Template("question", "{passage}\n\nQuestion: {question}?", answer_choices=NO_YES),
        Template("question_options", "Read the text and answer the question.\n\n{passage}\n\n"
                 "{question}?\n{options}", answer_choices=NO_YES),
        Template("true_or_false", "Based on this passage, is it true that {question}?\n\n"
                 "{passage}", answer_choices=NO_YES),
    ),
    "super_glue_cb_v102": (
        Template("entails", "Premise: {premise}\nHypothesis: {hypothesis}\n\nDoes the premise "
                 "entail the hypothesis?\n{options}", answer_choices=("yes", "no", "maybe")),
        Template("true_given", "{premise}\n\nBased on the text above, is it true that "
                 "\"{hypothesis}\"?", answer_choices=("yes", "no", "maybe")),
        Template("follows", "If \"{premise}\", does it follow that \"{hypothesis}\"?\n{options}",
                 answer_choices=("yes", "no", "maybe")),
    ),
    "super_glue_copa_v102": (
        Template("what_happened", "{premise} What was the {question}?\n{options}",
                 choice_fields=("choice1", "choice2")),
        Template("more_plausible", "Premise: {premise}\nWhich alternative is the more "
                 "plausible {question}?\n{options}", choice_fields=("choice1", "choice2")),
        Template("continue", "{premise}\n\nWhat is the {question} of this?",
                 choice_fields=("choice1", "choice2")),
    ),
    "super_glue_multirc_v102": (
        Template("correct_answer", "{paragraph}\n\nQuestion: {question}\nIs \"{answer}\" a "
                 "correct answer?", answer_choices=NO_YES),
        Template("correct_answer_options", "Read the paragraph and decide whether the answer "
                 "is correct.\nQuestion: {question}\nAnswer: {answer}\n{options}\n\n"
                 "{paragraph}", answer_choices=NO_YES),
        Template("true_answer", "Based on the paragraph, does \"{answer}\" answer \"{question}"
                 "\"?\n\n{paragraph}", answer_choices=NO_YES),
    ),
    "super_glue_rte_v102": (
        Template("entails", "{premise}\n\nDoes this mean that \"{hypothesis}\" is true?",
                 answer_choices=YES_NO),
        Template("entails_options", "Premise: {premise}\nHypothesis: {hypothesis}\n\nDoes the "
                 "premise entail the hypothesis?\n{options}", answer_choices=YES_NO),
        Template("conclude", "Given that \"{premise}\", can we conclude that \"{hypothesis}\"?",
                 answer_choices=YES_NO),
    ),
    "super_glue_wic_v102": (
        Template("same_sense", "Does the word \"{word}\" mean the same thing in these two "
                 "sentences?\n\n{sentence1}\n{sentence2}", answer_choices=NO_YES),
        Template("same_sense_options", "Sentence 1: {sentence1}\nSentence 2: {sentence2}\n\n"
                 "Is \"{word}\" used in the same sense in both?\n{options}",
                 answer_choices=NO_YES),
        Template("meaning", "\"{word}\" in \"{sentence1}\" and in \"{sentence2}\": the same "
                 "meaning?", answer_choices=NO_YES),
    ),
    "super_glue_wsc_v102": (
        Template("refers", "{text}\n\nIn the sentence above, does \"{span2_text}\" refer to "
                 "\"{span1_text}\"?", answer_choices=NO_YES),
        Template("refers_options", "Sentence: {text}\nDoes the pronoun \"{span2_text}\" refer "
                 "to \"{span1_text}\"?\n{options}", answer_choices=NO_YES),
        Template("who", "In \"{text}\", is \"{span2_text}\" {span1_text}?",
                 answer_choices=NO_YES),
    ),
}

CLUSTERS = {
    "paraphrase": ("glue_mrpc_v002", "glue_qqp_v002"),
    "sentiment": ("glue_sst2_v002",),
    "acceptability": ("glue_cola_v002",),
    "reading comprehension": ("super_glue_boolq_v102", "super_glue_multirc_v102"),
    "natural language inference": ("glue_mnli_v002", "glue_qnli_v002", "glue_rte_v002",
                                   "glue_wnli_v002", "super_glue_cb_v102",
                                   "super_glue_rte_v102"),
    "coreference": ("super_glue_wsc_v102",),
    "sentence completion": ("super_glue_copa_v102",),
    "word sense": ("super_glue_wic_v102",),
}
HELD_OUT = ("natural language inference", "coreference", "sentence completion", "word sense")
MIXTURE_MAXIMUM = 3000  # FLAN's cap per task


def _register() -> None:
    if next(iter(TEMPLATES)) + INSTRUCTION_SUFFIX in TaskRegistry.names():
        return
    for task_name, templates in TEMPLATES.items():
        TemplateRegistry.add(task_name, templates)
        task = TaskRegistry.get(task_name)
        # The templates read the raw record: they replace T5's formatting step.
        instruction_task(task_name, steps=task.preprocessors[1:],
                         postprocess_fn=bench.text_postprocess, metric_fns=(metrics.accuracy,))
    instruction_mixtures("glue_instruct", CLUSTERS, HELD_OUT, MIXTURE_MAXIMUM)


_register()
