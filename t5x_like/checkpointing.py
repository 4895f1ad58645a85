"""Orbax checkpoints of the train state, the data-iterator state and the config.

Saves are asynchronous and atomic (orbax writes to a temporary directory and
renames it), so a crash mid-save never replaces the last complete checkpoint.
"""

from __future__ import annotations

import pathlib

import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, directory: str | pathlib.Path, keep: int, async_save: bool = True,
                 keep_every: int = 0, read_only: bool = False):
        """Keeps the newest ``keep`` checkpoints, plus every step divisible by ``keep_every``
        (when positive) for good, e.g. to evaluate or fine-tune from later.
        ``read_only`` (evaluation) creates, cleans and deletes nothing."""
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=None if read_only else keep,
                                               create=not read_only,
                                               keep_period=keep_every or None,
                                               # A save cut off by kill -9 leaves a
                                               # temporary directory; drop it on restart.
                                               cleanup_tmp_directories=not read_only,
                                               read_only=read_only,
                                               enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "data", "config"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Complete checkpoints, oldest first (a save still in flight is not listed)."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state, data_state: dict, config: dict, force: bool = False) -> bool:
        return self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config)), force=force)

    def restore_config(self, step: int) -> dict:
        """Only the saved config: cheap, and checked before any array is read."""
        return self._manager.restore(step, args=ocp.args.Composite(
            config=ocp.args.JsonRestore())).config

    def restore(self, step: int, abstract_state):
        """Restores onto the shardings carried by ``abstract_state``'s leaves."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            config=ocp.args.JsonRestore()))
        return restored.state, restored.data, restored.config

    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
