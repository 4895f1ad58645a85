"""The page allocator of a paged key/value cache: which pages are free, who holds each,
and which full pages of prompt tokens a new sequence can share.

A sequence's cache is a list of fixed-size pages from one pool (vLLM's paged attention,
Levanter's page table), so memory goes to the tokens sequences hold instead of to a
``slots x max_length`` block. A page that holds a full run of prompt tokens is indexed by
the tokens up to its end; a later sequence whose prompt starts with the same tokens reads
those pages instead of prefilling them again (automatic prefix caching: GRPO's
completions of one prompt, few-shot prompts that share their shots). Pages are counted
by references; a page nobody holds is free, and one that holds a prompt's full page stays
findable until it is handed out again, the least recently released first (so a prompt
asked again soon after is not prefilled again).

Page 0 is never handed out: the decoding steps write what falls outside a sequence's
pages (padding, idle slots) there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

SCRATCH_PAGE = 0


class OutOfPages(RuntimeError):
    """Raised by ``allocate`` when the free pages do not cover a request."""


class PagePool:
    """``pages`` pages of ``page_size`` positions (page 0 kept as scratch)."""

    def __init__(self, pages: int, page_size: int):
        if pages < 2 or page_size < 1:
            raise ValueError(f"pages={pages}, page_size={page_size}: a pool needs a scratch "
                             "page and one more, of at least one position.")
        self.pages, self.page_size = pages, page_size
        self._free = list(range(pages - 1, SCRATCH_PAGE, -1))  # pop() hands out low ids first
        self._cached: OrderedDict[int, None] = OrderedDict()  # free, still indexed; LRU first
        self._references = [0] * pages
        self._by_prefix: dict[tuple[int, ...], int] = {}
        self._prefix_of: dict[int, tuple[int, ...]] = {}

    @property
    def free(self) -> int:
        """Pages ``allocate`` can hand out (indexed ones nobody holds included)."""
        return len(self._free) + len(self._cached)

    def pages_for(self, positions: int) -> int:
        return -(-positions // self.page_size)

    def shared_prefix(self, prompt: Sequence[int]) -> list[int]:
        """The indexed pages holding ``prompt``'s leading full pages, as many as match in
        a row. The last prompt token is never shared (its logits choose the first new
        token, so it must be run)."""
        shared = []
        for end in range(self.page_size, len(prompt), self.page_size):
            page = self._by_prefix.get(tuple(prompt[:end]))
            if page is None:
                break
            shared.append(page)
        return shared

    def allocate(self, count: int) -> list[int]:
        """``count`` pages for one holder: never-indexed free pages first, then the
        indexed ones released longest ago (which stop being found by their prefix)."""
        if count > self.free:
            raise OutOfPages(f"{count} pages asked, {self.free} free")
        taken = []
        for _ in range(count):
            if self._free:
                page = self._free.pop()
            else:
                page, _ = self._cached.popitem(last=False)
                del self._by_prefix[self._prefix_of.pop(page)]
            self._references[page] = 1
            taken.append(page)
        return taken

    def hold(self, pages: Sequence[int]) -> None:
        """One more holder of ``pages`` (a sequence reading shared prefix pages)."""
        for page in pages:
            self._cached.pop(page, None)
            self._references[page] += 1

    def index_prompt(self, prompt: Sequence[int], pages: Sequence[int]) -> None:
        """Makes ``pages`` (a sequence's, in order, their prompt tokens written) findable
        by the full pages of ``prompt`` they hold."""
        for i, end in enumerate(range(self.page_size, len(prompt) + 1, self.page_size)):
            key = tuple(prompt[:end])
            if key not in self._by_prefix and pages[i] not in self._prefix_of:
                self._by_prefix[key] = pages[i]
                self._prefix_of[pages[i]] = key

    def release(self, pages: Sequence[int]) -> None:
        """Drops one holder of each page; a page nobody holds is free again (an indexed
        one still found by its prefix until ``allocate`` hands it out)."""
        for page in pages:
            self._references[page] -= 1
            if self._references[page] < 0:
                raise RuntimeError(f"page {page} released more often than held")
            if self._references[page] == 0:
                if page in self._prefix_of:
                    self._cached[page] = None
                else:
                    self._free.append(page)
