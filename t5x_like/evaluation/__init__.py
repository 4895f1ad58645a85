"""Evaluation: metric functions, the evaluator over tasks and mixtures, few-shot prompts."""
