"""``BlockManager``: the host-side page allocator (pure Python). Kernels never see it; they read the
``block_table`` and ``lengths`` it produces."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from jax_ops._src.kv_cache.cache import NO_PAGE


class BlockManager:
    """Pages ``0 .. num_pages - 1`` of ``page_size`` tokens, handed to requests (any hashable id).

    Each request owns an ordered page list and a token count. Pages are reference counted: ``fork`` shares a
    prefix's pages with a new request; ``extend`` replaces a shared page by a private copy before a write lands in
    it (copy-on-write) and returns the ``(src, dst)`` copies for ``kv_cache.copy_pages``.
    """

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages and page_size must be positive, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out the lowest page first
        self._refs = [0] * num_pages
        self._pages: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, int] = {}

    # -- queries ---------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages(self, request: Hashable) -> list[int]:
        return list(self._known(request))

    def num_tokens(self, request: Hashable) -> int:
        self._known(request)
        return self._tokens[request]

    def ref_count(self, page: int) -> int:
        return self._refs[page]

    def block_table(self, requests: Sequence[Hashable], max_pages: int) -> np.ndarray:
        """``[len(requests), max_pages]`` int32, unallocated slots ``-1``; raises if a request holds more pages."""
        table = np.full((len(requests), max_pages), NO_PAGE, np.int32)
        for row, request in enumerate(requests):
            pages = self._known(request)
            if len(pages) > max_pages:
                raise ValueError(
                    f"request {request!r} holds {len(pages)} pages, more than max_pages={max_pages}"
                )
            table[row, : len(pages)] = pages
        return table

    def lengths(self, requests: Sequence[Hashable]) -> np.ndarray:
        return np.asarray([self.num_tokens(r) for r in requests], np.int32)

    # -- updates ---------------------------------------------------------------------------------------------
    def allocate(self, request: Hashable, num_tokens: int = 0) -> list[tuple[int, int]]:
        """A new request with room for ``num_tokens`` tokens (its count becomes ``num_tokens``)."""
        if request in self._pages:
            raise ValueError(f"request {request!r} already exists")
        self._pages[request] = []
        self._tokens[request] = 0
        return self.extend(request, num_tokens)

    def fork(self, source: Hashable, request: Hashable, num_tokens: int | None = None) -> None:
        """A new request whose first ``num_tokens`` tokens (default: all of ``source``'s) share ``source``'s
        pages (reference counts + 1); nothing is copied until one of them writes into a shared page."""
        pages = self._known(source)
        if request in self._pages:
            raise ValueError(f"request {request!r} already exists")
        total = self._tokens[source]
        num_tokens = total if num_tokens is None else num_tokens
        if not 0 <= num_tokens <= total:
            raise ValueError(
                f"num_tokens must be in [0, {total}] (the tokens of {source!r}), got {num_tokens}"
            )
        shared = pages[: -(-num_tokens // self.page_size)]
        for page in shared:
            self._refs[page] += 1
        self._pages[request] = list(shared)
        self._tokens[request] = num_tokens

    def extend(self, request: Hashable, num_new_tokens: int) -> list[tuple[int, int]]:
        """Room for ``num_new_tokens`` more tokens (the count grows by that many): a shared page the new tokens
        land in is replaced by a private copy, and new pages are taken from the free list. Returns the
        ``(src, dst)`` copies to apply to the pools. Raises (changing nothing) when too few pages are free."""
        pages = self._known(request)
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        start, end = self._tokens[request], self._tokens[request] + num_new_tokens
        first, last = start // self.page_size, -(-end // self.page_size)
        written = range(first, min(last, len(pages))) if num_new_tokens else range(0)
        shared = [slot for slot in written if self._refs[pages[slot]] > 1]
        needed = len(shared) + max(0, last - len(pages))
        if needed > len(self._free):
            raise MemoryError(f"request {request!r} needs {needed} free pages, {len(self._free)} left")
        copies = []
        for slot in shared:
            src, dst = pages[slot], self._free.pop()
            self._refs[src] -= 1
            self._refs[dst] = 1
            pages[slot] = dst
            copies.append((src, dst))
        while len(pages) < last:
            page = self._free.pop()
            self._refs[page] = 1
            pages.append(page)
        self._tokens[request] = end
        return copies

    def free(self, request: Hashable) -> None:
        """Drops the request; each of its pages whose count reaches 0 goes back to the free list."""
        for page in reversed(self._known(request)):
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free.append(page)
        del self._pages[request], self._tokens[request]

    def _known(self, request: Hashable) -> list[int]:
        if request not in self._pages:
            raise KeyError(f"unknown request {request!r}")
        return self._pages[request]
