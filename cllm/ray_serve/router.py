"""cllm's Ray Serve request router: the replica holding the longest prefix of a prompt, unless much busier.

The rule is the engine pool's (cllm/core/prefix_router.py), across Ray
replicas: the replica with the longest cached prefix of the prompt wins unless
it has more than ``slack`` requests in flight beyond the least loaded one;
then, and for prompts that share nothing, the least loaded wins (ties at
random, so unrelated requests spread).

What a replica caches is known two ways. This router remembers what it sent
each replica, at once (a chat's next turn comes right after the reply, too soon
for anything reported). Each replica also reports, every
``request_routing_stats_period_s``, the prefixes its engine was sent by every
router (several ingress replicas, each with its own router, share it that way);
a replica that is replaced starts empty. Loads are the requests this router
has in flight on each replica: exact at once, where a report is a second old.
Ray's PowerOfTwoChoices and PrefixCacheAffinityRouter (which guesses from
routed text alone, in a shared actor) can be set instead: see cllm/ray_serve/app.py.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from cllm.core.prefix_router import PrefixMemory, pick
from cllm.ray_serve.call import HttpCall


def call_of(pending: PendingRequest | None) -> HttpCall | None:
    if pending is None:
        return None
    return next((a for a in pending.args if isinstance(a, HttpCall)), None)


def reported_longest(stats: dict[str, Any], blocks: list[int]) -> int:
    """How many leading blocks of the prompt a replica reports its engine was sent."""
    known = stats.get("prefixes")
    n = 0
    if known:
        for h in blocks:
            if h not in known:
                break
            n += 1
    return n


class CllmRouter(RequestRouter):
    def initialize_state(self, slack: int = 4, max_blocks: int = 512) -> None:
        self._slack = slack
        self._max_blocks = max_blocks
        self._memories: dict[ReplicaID, PrefixMemory] = {}
        self._in_flight: Counter[ReplicaID] = Counter()
        self._owners: dict[str, ReplicaID] = {}  # internal request id -> the replica it was sent to

    def _remembered(self, replica_id: ReplicaID, blocks: list[int]) -> int:
        memory = self._memories.get(replica_id)
        return memory.longest(blocks) if memory else 0

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        call = call_of(pending_request)
        blocks = call.blocks if call is not None else []
        by_id = {r.replica_id: r for r in candidate_replicas}
        loads = {rid: self._in_flight[rid] for rid in by_id}
        least = min(loads.values())
        lengths = (
            {
                rid: max(self._remembered(rid, blocks), reported_longest(r.routing_stats, blocks))
                for rid, r in by_id.items()
            }
            if blocks
            else {}
        )
        idle = [rid for rid in by_id if loads[rid] == least]
        random.shuffle(idle)
        first = [by_id[pick(lengths, loads, self._slack, idle)]]
        if pending_request is not None:
            self._chosen(pending_request, first[0].replica_id, blocks)
        rest = sorted((r for r in candidate_replicas if r is not first[0]), key=lambda r: loads[r.replica_id])
        return [first, rest] if rest else [first]  # the next rank if the first is full (max_ongoing_requests)

    def _chosen(self, pending: PendingRequest, replica_id: ReplicaID, blocks: list[int]) -> None:
        """Count the request against the replica now: Ray calls on_request_routed only under its
        strict max_ongoing_requests mode, and a chat's next turn may come before anything is reported."""
        rid = pending.metadata.internal_request_id
        before = self._owners.get(rid)
        if before is not None:  # routed again (a full replica, a retry): count it once
            self._in_flight[before] -= 1
        self._owners[rid] = replica_id
        self._in_flight[replica_id] += 1
        if blocks:
            memory = self._memories.get(replica_id)
            if memory is None:
                memory = self._memories[replica_id] = PrefixMemory(self._max_blocks)
            memory.add(blocks)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        chosen = self._owners.pop(internal_request_id, None)
        if chosen is not None:
            self._in_flight[chosen] -= 1

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for gone in [rid for rid in self._memories if rid not in live]:
            del self._memories[gone]  # a replaced replica's engine starts with an empty cache

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._memories.pop(replica_id, None)
