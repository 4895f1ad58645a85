"""Text sources: where raw documents come from, before any tokenization.

A source is an indexable, deterministic collection of documents (``str``).
Random access by index is what lets the pipeline derive every random choice
from ``(seed, example index)`` and resume a stream exactly.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import os
import re
from typing import Sequence

# "Genesis 1:1<TAB>In the beginning ..." -> the verse text only.
_VERSE_KEY = re.compile(r"^[^\t]*\d+:\d+\t")

SPLITS = ("train", "validation")


def _is_validation_line(line_index: int, holdout_every: int) -> bool:
    """Every ``holdout_every``-th line is held out; stable across runs and hosts."""
    return line_index % holdout_every == holdout_every - 1


@dataclasses.dataclass(frozen=True)
class TextLineSource:
    """Documents are lines of UTF-8 text files (plain or ``.gz``), read in path order.

    ``split`` selects a deterministic hold-out: every ``holdout_every``-th line of
    each file is ``validation``, the rest ``train``. Lines that are empty after
    stripping are skipped (documented skip, never an error).
    """

    file_patterns: Sequence[str]
    split: str = "train"
    holdout_every: int = 100
    strip_verse_keys: bool = True

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(
                f"Unknown split {self.split!r}; TextLineSource has splits {SPLITS}.")

    def files(self) -> list[str]:
        paths: list[str] = []
        for pattern in self.file_patterns:
            matched = sorted(glob.glob(os.path.expanduser(pattern)))
            if not matched:
                raise FileNotFoundError(
                    f"No file matches {pattern!r}. Check the path (relative paths are "
                    f"resolved from {os.getcwd()!r}) or run from the repository root.")
            paths.extend(matched)
        return paths

    def documents(self) -> list[str]:
        want_validation = self.split == "validation"
        docs: list[str] = []
        for path in self.files():
            for index, line in enumerate(_read_lines(path)):
                if _is_validation_line(index, self.holdout_every) != want_validation:
                    continue
                if self.strip_verse_keys:
                    line = _VERSE_KEY.sub("", line, count=1)
                line = line.strip()
                if line:
                    docs.append(line)
        return docs


def _read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    # errors="replace": a stray non-UTF-8 byte becomes U+FFFD instead of a crash.
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()
