"""Which running prompt a new request waits for (server/runtime.py's rule): one whose full pages it
shares, when they are at least half that prompt; the one sharing the most; never a prompt already
computed. The end-to-end case (two requests at once, one prompt's pages computed once) is
tests/test_server_api.py's."""
from __future__ import annotations

from server.runtime import Runtime, _shared_pages, _Subscriber
from trellisforge.engine import PAGE_TOKENS


def runtime_with(prompts: dict[int, list[int]], done: set[int] = frozenset()) -> Runtime:
    runtime = Runtime.__new__(Runtime)  # the rule alone: no engine, no loop thread
    runtime._subscribers = {sid: _Subscriber(None, None, None, tokens, sid in done) for sid, tokens in prompts.items()}
    return runtime


def test_shared_pages_count_whole_pages_of_the_common_start():
    page = PAGE_TOKENS
    a = list(range(10 * page))
    assert _shared_pages(a, a) == 10
    assert _shared_pages(a, a[:5 * page + 3]) == 5
    assert _shared_pages(a, a[:3 * page] + [-1] + a[3 * page + 1:]) == 3
    assert _shared_pages(a, [-1] + a[1:]) == 0
    assert _shared_pages(a, []) == 0


def test_a_request_waits_for_a_prompt_it_shares_at_least_half_of():
    page = PAGE_TOKENS
    system = list(range(8 * page))
    leader = system + [1000 + i for i in range(3 * page)]  # 8 of its 11 pages shared
    assert runtime_with({7: leader})._sharing_leader(system + [5, 6, 7]) == 7


def test_a_request_sharing_little_of_a_long_prompt_starts_at_once():
    page = PAGE_TOKENS
    system = list(range(2 * page))
    document = system + [1000 + i for i in range(20 * page)]  # 2 of 22 pages shared
    assert runtime_with({3: document})._sharing_leader(system + [5, 6]) is None
    assert runtime_with({3: document})._sharing_leader(list(range(100, 100 + 30 * page))) is None  # nothing shared


def test_the_leader_is_the_running_prompt_sharing_the_most():
    page = PAGE_TOKENS
    base = list(range(12 * page))
    prompts = {1: base[:6 * page] + [-1] * page, 2: base[:10 * page] + [-2] * page, 3: base}
    new = base[:11 * page] + [-3]
    assert runtime_with(prompts)._sharing_leader(new) == 3
    assert runtime_with(prompts, done={3})._sharing_leader(new) == 2  # a computed prompt: the cache serves it already
