"""The replica routing rule alone: no model, no server (the served behaviour is in test_pool.py)."""

from __future__ import annotations

from cllm.core.prefix_router import BLOCK, PrefixMemory, PrefixRouter, block_hashes

SHARED = list(range(1000, 1000 + 4 * BLOCK))  # four blocks every chat turn starts with


def prompt(tail: int, length: int = BLOCK) -> list[int]:
    return SHARED + [tail] * length


def test_block_hashes_name_whole_blocks_and_their_whole_prefix():
    assert block_hashes(list(range(BLOCK - 1))) == []
    a, b = block_hashes(prompt(1)), block_hashes(prompt(2))
    assert len(a) == 5 and a[:4] == b[:4] and a[4] != b[4]
    # A block is named with everything before it: the same block after another start is another hash.
    assert block_hashes([7] * BLOCK + SHARED)[1:] != block_hashes(SHARED)


def test_memory_finds_the_longest_prefix_and_forgets_the_oldest():
    memory = PrefixMemory(max_blocks=6)
    memory.add(block_hashes(prompt(1)))
    assert memory.longest(block_hashes(prompt(2))) == 4
    assert memory.longest(block_hashes(prompt(1))) == 5
    memory.add(block_hashes([5] * 3 * BLOCK))  # 3 more: 2 go, the deepest of the oldest prompt
    assert memory.longest(block_hashes(prompt(1))) == 3


def test_the_replica_with_the_prefix_wins_until_it_is_much_busier():
    router = PrefixRouter(2, max_blocks=100, slack=2)
    router.sent(1, block_hashes(prompt(1)))
    hashes = block_hashes(prompt(2))
    assert router.choose(hashes, [0, 0], [True, True]) == 1
    assert router.choose(hashes, [0, 2], [True, True]) == 1  # busier, within the slack
    assert router.choose(hashes, [0, 3], [True, True]) == 0  # much busier: the least loaded wins
    assert router.choose(hashes, [0, 0], [True, False]) == 0  # a replica that is not serving gets nothing


def test_unrelated_prompts_spread_and_go_to_the_least_loaded():
    router = PrefixRouter(3, max_blocks=100, slack=2)
    picks = [router.choose(block_hashes(prompt(i)), [0, 0, 0], [True] * 3) for i in range(6)]
    assert sorted(picks) == [0, 0, 1, 1, 2, 2]
    assert router.choose([], [3, 1, 2], [True] * 3) == 1


def test_a_restarted_replica_is_forgotten():
    router = PrefixRouter(2, max_blocks=100, slack=2)
    router.sent(0, block_hashes(prompt(1)))
    router.forget(0)
    assert router.memories[0].longest(block_hashes(prompt(1))) == 0


def test_round_robin_ignores_prefixes_and_load():
    router = PrefixRouter(2, max_blocks=100, slack=2, affinity=False)
    router.sent(1, block_hashes(prompt(1)))
    assert [router.choose(block_hashes(prompt(1)), [5, 0], [True, True]) for _ in range(4)] == [0, 1, 0, 1]
