"""An engine's prefix cache over time, rebuilt from its KV events and set against a trace's requests.

Blocks are named by content, as vLLM chains its block hashes: a block is its parent block, its ``block_size``
token ids, its extra keys (vLLM: the cache salt on block 0, LoRA names, multimodal hashes) and its LoRA id. The
events' own hashes (random-rooted when the engine ran without ``PYTHONHASHSEED``) are only used to find a
stored block's parent and a removed block's content, so a request's blocks (:meth:`EngineCache.request_keys`)
are found in the cache without knowing the engine's hash seed. A second, *blind* name drops the extra keys and the
LoRA id: the same tokens held under another salt or adapter.

Each batch is put at one request (:meth:`EngineCache.assign`): the first request after the last one placed whose
blocks include every block the batch stores (vLLM emits one batch per engine step, and a request stores its blocks
in the step that schedules it), else the last one placed (a long prompt prefilled over several steps), else the
next request (its prompt tokens differ from the trace's). A batch that stores nothing goes to the next request.
The cache a request met on arrival is every batch of the requests before it.

Cost: a dict entry per distinct block and per block hash seen; one pass over the batches.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from kvcli.engine.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch


@dataclass
class _Batch:
    """One batch's effect: ``("store", key, blind, medium)``, ``("remove", key, blind, medium)`` or ``("clear",)``
    operations in order, and the keys it stores."""

    ops: list[tuple] = field(default_factory=list)
    stored: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class BlockHistory:
    """Where one block stood when a request arrived: ``held`` (on some medium), ``stored_before`` (some earlier
    request's batch stored it), ``removed_by`` (the requests, by index, whose batches removed it since it was last
    stored before the arrival), ``stored_later`` (a batch of this request or a later one stores it), ``held_blind``
    (its tokens are held under other extra keys or LoRA id)."""

    held: bool
    stored_before: bool
    removed_by: tuple[int, ...]
    stored_later: bool
    held_blind: bool


class EngineCache:
    """The cache's contents per request arrival (module docstring).

    Args:
        batches: the recorded batches, in order. requests: each request's ``(token_ids, cache_salt)``, arrival
            order. block_size: the engine's tokens per block.
    """

    def __init__(self, batches: Iterable[EventBatch], requests: Sequence[tuple[Sequence[int], str]],
                 block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[Hashable, int] = {}
        self._hash_key: dict[bytes, tuple[int, int]] = {}
        self.media: Counter[str] = Counter()
        self._blind_of: dict[int, int] = {}
        self.keys = [self.request_keys(tokens, salt) for tokens, salt in requests]
        self.batches = [self._decode(b) for b in batches]
        self.owner = self.assign()
        self.unplaced = 0  # batches whose stored blocks no request holds (put at the next request)
        self._history()

    def request_keys(self, tokens: Sequence[int], salt: str) -> list[int]:
        """The keys of a request's full blocks, in prompt order (the salt is block 0's extra key, as vLLM's)."""
        b, keys, parent, blind = self.block_size, [], -1, -1
        for k in range(len(tokens) // b):
            extra = (salt,) if salt and k == 0 else None
            block = tuple(int(t) for t in tokens[k * b:(k + 1) * b])
            parent, blind = self._key((parent, block, extra, None)), self._key(("blind", blind, block))
            self._blind_of[parent] = blind
            keys.append(parent)
        return keys

    def _key(self, content: Hashable) -> int:
        return self._ids.setdefault(content, len(self._ids))

    def _decode(self, batch: EventBatch) -> _Batch:
        out = _Batch()
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                out.ops.append(("clear",))
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    if h in self._hash_key:
                        out.ops.append(("remove", *self._hash_key[h], event.medium or ""))
            elif isinstance(event, BlockStored):
                self._store(event, out)
        return out

    def _store(self, event: BlockStored, out: _Batch) -> None:
        parent, blind = self._hash_key.get(event.parent_block_hash, (-1, -1)) if event.parent_block_hash else (-1, -1)
        b, extras = event.block_size, event.extra_keys or ()
        for i, h in enumerate(event.block_hashes):
            tokens = event.token_ids[i * b:(i + 1) * b]
            extra = extras[i] if i < len(extras) else None
            parent = self._key((parent, tokens, extra, event.lora_id))
            blind = self._key(("blind", blind, tokens))
            self._hash_key[h] = (parent, blind)
            out.ops.append(("store", parent, blind, event.medium or ""))
            out.stored.add(parent)
            self.media[event.medium or ""] += 1

    def assign(self) -> list[int]:
        """Each batch's request index (module docstring)."""
        owner, last, count = [], -1, len(self.keys)
        sets = [set(k) for k in self.keys]
        for batch in self.batches:
            j = None
            if batch.stored:
                j = next((i for i in range(last + 1, count) if batch.stored <= sets[i]), None)
                if j is None and last >= 0 and batch.stored <= sets[last]:
                    j = last
            if j is None:
                j = min(last + 1, count - 1)
            owner.append(j)
            last = max(last, j)
        return owner

    def _history(self) -> None:
        """Per request, the state on arrival of each of its blocks (:meth:`history`)."""
        by_request: dict[int, list[_Batch]] = defaultdict(list)
        for batch, j in zip(self.batches, self.owner):
            by_request[j].append(batch)
            if not batch.stored <= set(self.keys[j]):
                self.unplaced += 1
        stored_from: dict[int, int] = {}  # key -> first request index whose batch stores it
        for j in sorted(by_request, reverse=True):
            for batch in by_request[j]:
                for key in batch.stored:
                    stored_from[key] = j
        held: Counter[int] = Counter()
        blind: Counter[int] = Counter()
        last_store: dict[int, int] = {}
        removals: dict[int, list[int]] = defaultdict(list)
        self._arrivals: list[list[BlockHistory]] = []
        for i, keys in enumerate(self.keys):
            self._arrivals.append([self._block(key, i, held, blind, last_store, removals, stored_from)
                                   for key in keys])
            for batch in by_request.get(i, []):
                self._apply(batch, i, held, blind, last_store, removals)

    def _block(self, key: int, i: int, held: Counter[int], blind: Counter[int], last_store: dict[int, int],
               removals: dict[int, list[int]], stored_from: dict[int, int]) -> BlockHistory:
        blind_key = self._blind_of.get(key)
        return BlockHistory(held[key] > 0, key in last_store, tuple(removals.get(key, ())),
                            stored_from.get(key, -1) >= i,
                            blind_key is not None and blind[blind_key] > 0)

    def _apply(self, batch: _Batch, i: int, held: Counter[int], blind: Counter[int], last_store: dict[int, int],
               removals: dict[int, list[int]]) -> None:
        for op in batch.ops:
            if op[0] == "clear":
                held.clear()
                blind.clear()
            elif op[0] == "store":
                held[op[1]] += 1
                blind[op[2]] += 1
                last_store[op[1]] = i
                removals.pop(op[1], None)
            elif held[op[1]] > 0:
                held[op[1]] -= 1
                blind[op[2]] -= 1
                removals[op[1]].append(i)

    def arrival(self, index: int) -> list[BlockHistory]:
        """Each full block of request ``index`` (arrival order) as the cache held it when the request arrived."""
        return self._arrivals[index]
