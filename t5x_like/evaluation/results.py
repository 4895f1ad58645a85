"""Where evaluation results go: ``metrics.jsonl`` (one line per step and task, appended
once the step's predictions are written), ``predictions/<task>/step_<N>.jsonl``,
TensorBoard scalars, and the table printed to the console. Shared by ``eval`` and the
benchmark evaluation inside ``train``.
"""

from __future__ import annotations

import json

from t5x_like.system import storage

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.


def done_steps(output_dir, task_names, split: str = "validation") -> set[int]:
    """Steps whose every task already has a line for ``split`` in ``metrics.jsonl``."""
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        return set()
    seen: dict[int, set] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by an interruption; its step is evaluated again
        if record.get("split", "validation") != split:
            continue
        seen.setdefault(int(record["step"]), set()).add(record.get("task"))
    return {step for step, tasks in seen.items() if set(task_names) <= tasks}


class ResultWriter:
    """``metrics.jsonl``, predictions and TensorBoard under ``output_dir`` (process 0 only)."""

    def __init__(self, output_dir, enabled: bool):
        self.output_dir = output_dir
        self.enabled = enabled
        self._tb = None
        if enabled:
            output_dir.mkdir(parents=True, exist_ok=True)
            self._tb = storage.summary_writer(output_dir / "tensorboard")

    def write(self, step: int, results, split: str = "validation") -> None:
        if not self.enabled:
            return
        from t5x_like.evaluation import evaluator
        for result in results:
            folder = self.output_dir / "predictions" / result.task
            folder.mkdir(parents=True, exist_ok=True)
            storage.write_atomic(folder / f"step_{step}.jsonl", "".join(
                json.dumps(record, ensure_ascii=False) + "\n" for record in result.records))
            for key, value in result.metrics.items():
                self._tb.add_scalar(f"{result.task}/{key}", float(value), global_step=step)
        mean = evaluator.average(results)
        if mean is not None and len(results) > 1:
            self._tb.add_scalar("average", mean, global_step=step)
        self._tb.flush()
        # The step's lines go in one append, after its predictions: an interrupted step
        # leaves no line and is evaluated again, never twice.
        lines = "".join(json.dumps(dict(r, split=split)) + "\n"
                        for r in evaluator.as_records(results, step))
        log = storage.AppendLog(self.output_dir / "metrics.jsonl")
        try:
            log.append(lines)
        finally:
            log.close()

    def close(self):
        if self._tb is not None:
            self._tb.close()


def format_table(step: int, results) -> str:
    from t5x_like.evaluation import evaluator
    lines = [f"step {step}"]
    width = max(len(r.task) for r in results)
    for r in results:
        values = ", ".join(f"{k} {v:.2f}" if abs(v) >= 1 else f"{k} {v:.4f}"
                           for k, v in r.metrics.items())
        lines.append(f"  {r.task:<{width}}  [{r.mode}]  {values}")
    mean = evaluator.average(results)
    if mean is not None and len(results) > 1:
        lines.append(f"  {'average':<{width}}  {mean:.2f}")
    return "\n".join(lines)
