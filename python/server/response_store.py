"""The Responses API's stored responses, in memory: what `previous_response_id`, `item_reference`
input items and GET/DELETE /v1/responses/{id} read. A response is kept with its own input items and
the id of the response it continued, so a long chain costs each turn once, not its whole history
per turn. The store is bounded by the bytes of what it holds: the least recently used response goes
first, and a chain that lost a link gets a clear 400 (send the whole conversation instead). Nothing
outlives the process: a restarted server knows no response ids."""
from __future__ import annotations

import collections
import dataclasses
import json
import threading

from .errors import ApiError


@dataclasses.dataclass
class Stored:
    response: dict  # the response object as it was returned
    input: list[dict]  # the request's own input items (a string input as one user message)
    previous: str | None
    size: int


class ResponseStore:
    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self.used = 0
        self._entries: collections.OrderedDict[str, Stored] = collections.OrderedDict()
        # An item id -> the item and how many stored responses hold it (a referenced item is held by
        # its own response and by each one that named it).
        self._items: dict[str, tuple[dict, int]] = {}
        self._lock = threading.Lock()  # streamed responses are stored from their generators

    def put(self, response: dict, input_items: list[dict], previous: str | None) -> bool:
        """Keeps `response`; False when it alone is larger than the store."""
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(input_items, ensure_ascii=False))
        if size > self.capacity:
            return False
        with self._lock:
            while self.used + size > self.capacity:
                self._drop(next(iter(self._entries)))
            self._entries[response["id"]] = Stored(response, input_items, previous, size)
            self.used += size
            for item in input_items + response["output"]:
                if isinstance(item.get("id"), str):
                    held = self._items.get(item["id"], (item, 0))[1]
                    self._items[item["id"]] = (item, held + 1)
        return True

    def get(self, response_id: str) -> dict | None:
        with self._lock:
            entry = self._touch(response_id)
            return entry.response if entry else None

    def delete(self, response_id: str) -> bool:
        with self._lock:
            if response_id not in self._entries:
                return False
            self._drop(response_id)
            return True

    def history(self, response_id: str) -> list[dict] | None:
        """The conversation `response_id` ended: every response's input items then output items,
        oldest first; None when it or a response before it is not stored."""
        with self._lock:
            chain = []
            while response_id is not None:
                entry = self._touch(response_id)
                if entry is None:
                    return None
                chain.append(entry)
                response_id = entry.previous
        return [item for entry in reversed(chain) for item in entry.input + entry.response["output"]]

    def input_items(self, response_id: str) -> list[dict] | None:
        """What the model read for `response_id`: the history before it and its own input."""
        with self._lock:
            entry = self._touch(response_id)
        if entry is None:
            return None
        before = self.history(entry.previous) if entry.previous is not None else []
        return None if before is None else before + entry.input

    def continued(self, previous: str) -> list[dict]:
        """The conversation a request with `previous_response_id` continues (ApiError when gone)."""
        history = self.history(previous)
        if history is None:
            raise ApiError(400, f"previous_response_id: response '{previous}' is not stored here (store was false, it was"
                           " deleted or evicted, or the server restarted): send the whole conversation in 'input'",
                           param="previous_response_id", code="previous_response_not_found")
        return history

    def resolve(self, input_items: list[dict]) -> list[dict]:
        """`input_items` with every item_reference replaced by the stored item it names."""
        items = []
        for i, item in enumerate(input_items):
            if item.get("type") == "item_reference":
                with self._lock:
                    found = self._items.get(item.get("id"), (None,))[0] if isinstance(item.get("id"), str) else None
                if found is None:
                    raise ApiError(400, f"input.{i}: item '{item.get('id')}' is not stored here: send the item itself",
                                   param=f"input.{i}", code="item_not_found")
                item = found
            items.append(item)
        return items

    def _touch(self, response_id: str) -> Stored | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id)
        self.used -= entry.size
        for item in entry.input + entry.response["output"]:
            if isinstance(item.get("id"), str) and item["id"] in self._items:
                kept, held = self._items[item["id"]]
                if held > 1:
                    self._items[item["id"]] = (kept, held - 1)
                else:
                    del self._items[item["id"]]
