"""The engine's one loop thread. Every call into the engine happens on this thread: requests hand it
commands (add, cancel) and get their tokens back on their own asyncio queues, so a long CPU step
never blocks the event loop and a cancel touches only its own sequence. A constrained sequence's
grammar (structured.Constraint) is advanced here too, between steps, so its next token's mask is
in the engine before the step that samples it."""
from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections.abc import Sequence

from trellisforge import Engine, Sampling, TrellisError
from trellisforge.engine import PAGE_TOKENS

IDLE_WAIT_S = 0.5


@dataclasses.dataclass
class Ended:
    """Put on a subscriber's queue when its sequence ends without a final token: an engine failure
    or a shutdown."""
    reason: str


@dataclasses.dataclass
class _Add:
    tokens: list[int]
    sampling: Sampling
    stop_token_ids: list[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    events: asyncio.Queue
    constraint: object | None  # structured.Constraint
    after: int | None = None  # a leader's sequence id: added once its prompt is computed


@dataclasses.dataclass
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    constraint: object | None
    tokens: list[int] = dataclasses.field(default_factory=list)  # the prompt, while it is computed
    prompt_done: bool = False


class Runtime:
    def __init__(self, engine: Engine, metrics=None):
        self.engine = engine
        self.metrics = metrics
        self._commands: queue.Queue = queue.Queue()
        self._subscribers: dict[int, _Subscriber] = {}
        self._followers: dict[int, list[_Add]] = {}  # leader's sequence id -> adds waiting on its prompt
        self._stopping = threading.Event()
        self.failure: str | None = None
        self.stats = engine.stats()
        self._thread = threading.Thread(target=self._run, name="trellisforge-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ends every live sequence (their requests see Ended("shutdown")) and the loop thread."""
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    async def submit(self, tokens: Sequence[int], sampling: Sampling, stop_token_ids: Sequence[int],
                     constraint=None, after: int | None = None) -> tuple[int, asyncio.Queue]:
        """Queues a sequence; returns its id and the queue its TokenEvents arrive on. Raises the
        engine's TrellisError for a request it refuses. With a constraint, every token is sampled
        under its grammar (`sampling` must then be constrained). With `after` (a sequence with the
        same prompt), the sequence enters the engine once that one's prompt is computed, so the
        prefix cache serves its full pages rather than both computing them in the same steps.
        Without it, a prompt that shares at least half of a running prompt's pages waits for that
        one likewise (_sharing_leader)."""
        if not self.alive:
            raise RuntimeError(self.failure or "the engine is not running")
        assert (constraint is not None) == sampling.constrained
        loop = asyncio.get_running_loop()
        command = _Add(list(tokens), sampling, list(stop_token_ids), loop, loop.create_future(), asyncio.Queue(), constraint, after)
        self._commands.put(command)
        sequence_id = await command.future
        return sequence_id, command.events

    def cancel(self, sequence_id: int) -> None:
        """Thread-safe and idempotent: cancelling a finished sequence does nothing."""
        self._commands.put(("cancel", sequence_id))

    # ---- the loop thread ----

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._drain_commands(block=not self._subscribers)
                if self._stopping.is_set():
                    break
                if self._subscribers:
                    self._dispatch(self.engine.step())
                self.stats = self.engine.stats()
                if self.metrics:
                    self.metrics.update_engine(self.stats)
        except Exception as error:  # an engine failure: every request gets a clear error
            self.failure = f"engine failed: {error}"
            self._end_all(self.failure)
            return
        for sequence_id in list(self._subscribers):
            self._cancel_now(sequence_id)
        self._end_all("shutdown")
        self.stats = self.engine.stats()

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while command is not None:
            self._execute(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _execute(self, command) -> None:
        if isinstance(command, _Add):
            if command.after is None and self.stats.get("prefix_cache"):
                command.after = self._sharing_leader(command.tokens)
            leader = self._subscribers.get(command.after) if command.after is not None else None
            if leader is not None and not leader.prompt_done:
                self._followers.setdefault(command.after, []).append(command)
                return
            if command.future.cancelled():  # the request left while it waited on its leader
                return
            try:
                sequence_id = self.engine.add(command.tokens, command.sampling, command.stop_token_ids)
            except TrellisError as error:
                command.loop.call_soon_threadsafe(_settle, command.future, None, error)
                return
            self._subscribers[sequence_id] = _Subscriber(command.loop, command.events, command.constraint, command.tokens)
            if command.constraint is not None and not self._constrain(sequence_id):
                self._cancel_now(sequence_id)
                command.loop.call_soon_threadsafe(_settle, command.future, None, TrellisError(self.mask_failure))
                return
            command.loop.call_soon_threadsafe(self._settle_add, command.future, sequence_id)
        elif command[0] == "cancel":
            self._cancel_now(command[1])

    def _sharing_leader(self, tokens: list[int]) -> int | None:
        """A live sequence still computing a prompt whose full pages `tokens` shares, when those
        pages are at least half that prompt: waiting for it then mostly waits for work this prompt
        would repeat beside it in the same steps, and the prefix cache maps the pages once it is
        done (an agent's parallel requests over one long system prompt). A prompt sharing a little
        of a long one starts at once. Of several, the one sharing the most."""
        best, best_shared = None, 0
        for sequence_id, subscriber in self._subscribers.items():
            # Cheap refusals first (this runs on the engine's thread at every add): a computed
            # prompt, one more than twice as long, one whose first page differs.
            leader = subscriber.tokens
            if subscriber.prompt_done or len(leader) > 2 * len(tokens) or leader[:PAGE_TOKENS] != tokens[:PAGE_TOKENS]:
                continue
            shared = _shared_pages(tokens, leader) * PAGE_TOKENS
            if shared > best_shared and 2 * shared >= len(leader):
                best, best_shared = sequence_id, shared
        return best

    def _release_followers(self, leader: int) -> None:
        if self._stopping.is_set():
            return  # _end_all settles them
        for command in self._followers.pop(leader, []):
            self._execute(command)

    def _cancel_now(self, sequence_id: int) -> None:
        if self._subscribers.pop(sequence_id, None) is None:
            return
        self._release_followers(sequence_id)
        try:
            self.engine.cancel(sequence_id)
        except TrellisError:
            pass  # finished in the step that just ran

    def _dispatch(self, events) -> None:
        for event in events:
            subscriber = self._subscribers.get(event.sequence_id)
            if subscriber is None:
                continue
            subscriber.loop.call_soon_threadsafe(subscriber.events.put_nowait, event)
            subscriber.prompt_done = True
            subscriber.tokens = []
            if event.finish_reason is not None:
                del self._subscribers[event.sequence_id]
            elif subscriber.constraint is not None:
                subscriber.constraint.advance(event.token)
                if not self._constrain(event.sequence_id):
                    self._cancel_now(event.sequence_id)
                    subscriber.loop.call_soon_threadsafe(subscriber.events.put_nowait, Ended(self.mask_failure))
            self._release_followers(event.sequence_id)

    def _constrain(self, sequence_id: int) -> bool:
        """The sequence's next token's mask into the engine; False (and `mask_failure`) when its
        grammar cannot give one: that sequence ends, the others go on."""
        try:
            self.engine.set_token_mask(sequence_id, self._subscribers[sequence_id].constraint.next_mask())
        except (TrellisError, ValueError) as error:
            self.mask_failure = f"the output grammar failed: {error}"
            return False
        return True

    def _end_all(self, reason: str) -> None:
        for subscriber in self._subscribers.values():
            subscriber.loop.call_soon_threadsafe(subscriber.events.put_nowait, Ended(reason))
        self._subscribers.clear()
        for command in (c for waiting in self._followers.values() for c in waiting):
            command.loop.call_soon_threadsafe(_settle, command.future, None, RuntimeError(reason))
        self._followers.clear()


    def _settle_add(self, future: asyncio.Future, sequence_id: int) -> None:
        """On the request's event loop: hand over the id, or cancel the sequence when the request
        went away while it was being added."""
        if future.cancelled():
            self.cancel(sequence_id)
        else:
            future.set_result(sequence_id)


def _settle(future: asyncio.Future, value, error) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _shared_pages(a: list[int], b: list[int]) -> int:
    """Full pages at the start of both token lists: a binary search over page-aligned prefixes,
    compared as list slices (C speed; a prompt may be 100k tokens)."""
    low, high = 0, min(len(a), len(b)) // PAGE_TOKENS
    while low < high:
        middle = (low + high + 1) // 2
        end = middle * PAGE_TOKENS
        if a[:end] == b[:end]:
            low = middle
        else:
            high = middle - 1
    return low
