"""Stored responses of the Responses API (`store`, `previous_response_id`), in the frontend's memory.

A stored response keeps the conversation that led to it, its own reply
included, as chat-template messages: a request naming it as
`previous_response_id` continues that conversation without resending it, and
its prompt starts with the same tokens as the stored turn's, which the prefix
cache then serves. The store is bounded by count and by age, least recently
used first out; it is lost when the frontend restarts (a continuation then
gets a 404, as for any unknown id). /metrics shows its size and its oldest
entry's age, read at scrape time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge
from starlette.requests import Request

MAX_RESPONSES = 1024
MAX_AGE = 3600.0  # seconds


@dataclass
class Stored:
    response: dict  # the response object, as GET /v1/responses/{id} answers it
    messages: list[dict]  # the conversation up to and including this reply (instructions excepted)
    created: float = field(default_factory=time.monotonic)


class ResponseStore:
    def __init__(
        self, registry: CollectorRegistry | None = None, max_count: int = MAX_RESPONSES, max_age: float = MAX_AGE
    ):
        self.max_count, self.max_age = max_count, max_age
        self._items: OrderedDict[str, Stored] = OrderedDict()
        if registry is not None:
            Gauge("cllm_responses_stored", "Responses kept for previous_response_id", registry=registry).set_function(
                self.__len__
            )
            Gauge(
                "cllm_responses_stored_oldest_age_seconds", "Age of the oldest stored response", registry=registry
            ).set_function(self.oldest_age)

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def oldest_age(self) -> float:
        self._expire()
        return time.monotonic() - next(iter(self._items.values())).created if self._items else 0.0

    def put(self, id_: str, stored: Stored) -> None:
        self._items[id_] = stored
        while len(self._items) > self.max_count:
            self._items.popitem(last=False)

    def get(self, id_: str) -> Stored | None:
        self._expire()
        stored = self._items.get(id_)
        if stored is not None:
            self._items.move_to_end(id_)
        return stored

    def delete(self, id_: str) -> bool:
        return self._items.pop(id_, None) is not None

    def _expire(self) -> None:
        # A use moves an entry to the end but does not renew its age, so all are looked at
        # (at most MAX_RESPONSES, once per request or scrape).
        now = time.monotonic()
        for id_ in [i for i, s in self._items.items() if now - s.created > self.max_age]:
            del self._items[id_]


def store(request: Request) -> ResponseStore:
    """The process's store (every model's; the door keeps it on the app)."""
    return request.app.state.responses
