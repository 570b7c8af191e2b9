"""megafuse.serve.engine: many requests on one model, one scheduling step at a time.

    engine = Engine(model, parallel=4)            # 4 sequences on one copy of the weights
    job = engine.submit_completion(prompt_ids, settings, on_event)
    ...
    engine.close()

The engine owns ``parallel`` sequences (``Model.new_sequence``: one copy of the weights, a KV
cache each) and a worker thread.  A request becomes one task per choice (or per embedding
input); a task holds a sequence from its admission to its end.  Each turn of the worker:

1. drop the tasks whose job was cancelled (a client gone: its sequence is free at once), and
   admit waiting tasks while sequences are free -- each to the free sequence that can reuse the
   longest prefix of its prompt (``Sequence.reusable_prefix``);
2. gather one ``StepInput`` per running task: the next prefill chunk of its prompt (at most
   PREFILL_CHUNK tokens, starting at a multiple of it: the same chunks whatever else runs), or
   the token it sampled last;
3. run them all with one call of ``Engine.step(batch)``;
4. hand each task its output: a generation samples its next token (``TextGeneration.step``)
   and reports it; an embedding adds its rows.

``step`` is the one place where the model runs: the native batched step (several sequences'
tokens in one call of ``ModelRunner.forward_batch``, the weights read once for all of them).
Since a task's chunks and tokens do not depend on the batch, and each sequence's result does not
depend on the others in the step, a request's output is the same alone or among any others, at
any thread count (tests/serve/test_engine.py).

The worker runs the model without the GIL; events go to each job's ``on_event`` callback from
the worker thread (the HTTP app forwards them to its event loop).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Sequence as Seq

import numpy as np
import numpy.typing as npt

from megafuse.llm.completion import Delta, Settings, TextGeneration, pooled
from megafuse.llm.sequence import PREFILL_CHUNK, Sequence

log = logging.getLogger("megafuse.serve")

_runner: Any = importlib.import_module("megafuse.llm._runner")       # (private: not in stubs)
STEP_TOKENS: int = _runner.STEP_TOKENS              # tokens one batched call takes at most
MAX_STEP_SEQUENCES: int = _runner.MAX_STEP_SEQUENCES    # sequences one batched call holds at most

F32Array = npt.NDArray[np.float32]


class QueueFull(RuntimeError):
    """More requests are waiting than the engine's max_queue (the server's 429)."""


class EngineClosed(RuntimeError):
    """The engine is shutting down or closed (the server's 503)."""


@dataclasses.dataclass
class StepInput:
    """One sequence's part of a step: token_ids (int32 [T], appended at the sequence's
    position) and the output wanted -- "logits" (float32 [V], the last token's), "hidden"
    (float32 [T, E], the last layer's output before the final norm) or "none" (the cache is
    written, nothing returned)."""
    sequence: Sequence
    token_ids: npt.NDArray[np.int32]
    output: str


@dataclasses.dataclass
class Event:
    """What a job's on_event receives.  kind: "delta" (a generation step: ``generation``,
    ``delta``), "embedding" (``index``, ``vector``, ``tokens``), "error" (``error``), "done"
    (every task of the job has ended; after an error or a cancel too)."""
    kind: str
    generation: Optional[TextGeneration] = None
    delta: Optional[Delta] = None
    index: int = 0
    vector: Optional[F32Array] = None
    tokens: int = 0
    error: Optional[BaseException] = None


class Job:
    """A submitted request: its tasks and its callback.  ``cancel()`` (any thread) frees its
    sequences at the worker's next turn; ``cancelled`` / ``finished`` tell its state."""

    def __init__(self, on_event: Callable[[Event], None]) -> None:
        self.on_event = on_event
        self.cancelled = False
        self.finished = False
        self.failed = False
        self.remaining = 0

    def cancel(self) -> None:
        self.cancelled = True


class _Task:
    """One choice of a generation, or one input of an embedding request, on one sequence."""

    def __init__(self, job: Job, ids: List[int], generation: Optional[TextGeneration] = None,
                 index: int = 0) -> None:
        self.job = job
        self.ids = np.asarray(ids, dtype=np.int32)
        self.generation = generation
        self.index = index
        self.sequence: Optional[Sequence] = None
        self.next = 0                                  # the prompt's next position to run
        self.total = np.zeros(0)                       # an embedding's sum of rows

    def admit(self, seq: Sequence) -> None:
        self.sequence = seq
        if self.generation is not None:
            self.next = seq.reusable_prefix(self.ids)
        else:
            self.next = 0                              # an embedding pools every row
            self.total = np.zeros(seq.model.config.embed_dim, dtype=np.float64)
        seq.rewind(self.next)

    def step_input(self) -> StepInput:
        assert self.sequence is not None
        if self.next < self.ids.size:
            chunk = self.ids[self.next:self.next + PREFILL_CHUNK]
            last = self.next + chunk.size == self.ids.size
            output = ("hidden" if self.generation is None else "logits" if last else "none")
            return StepInput(self.sequence, chunk, output)
        assert self.generation is not None and self.generation.token is not None
        return StepInput(self.sequence, np.array([self.generation.token], dtype=np.int32),
                         "logits")


class Engine:
    """Runs requests on ``parallel`` sequences of ``model`` (each of cache_capacity positions,
    default the model's), at most ``max_queue`` waiting tasks beyond them (then QueueFull).
    The worker thread starts at once; ``close()`` stops it."""

    def __init__(self, model: Any, *, parallel: int = 4, max_queue: int = 64,
                 cache_capacity: Optional[int] = None) -> None:
        from megafuse.llm.sampling import _integer
        parallel = _integer(parallel, "parallel", 1, 1024)
        self.max_queue = _integer(max_queue, "max_queue", 0)
        self.model = model
        # The first sequence's runner leads the batched calls (any runner of the model's
        # weights may; it needs room for `parallel` sequences a call).
        self.sequences = [Sequence(model, model.cache_capacity if cache_capacity is None
                                   else cache_capacity,
                                   max_sequences=min(parallel, MAX_STEP_SEQUENCES) if i == 0
                                   else 1)
                          for i in range(parallel)]
        self._leader = self.sequences[0]._runner
        self.cache_capacity = self.sequences[0].cache_capacity
        self._free: List[Sequence] = list(self.sequences)
        self._waiting: Deque[_Task] = deque()
        self._running: List[_Task] = []
        self._cv = threading.Condition()
        self._closing = False
        self._cancel_all = False
        self.steps = 0                                 # steps run (for tests and stats)
        self._thread = threading.Thread(target=self._work, name="megafuse-engine", daemon=True)
        self._thread.start()

    # ---- the step -------------------------------------------------------------------------

    def step(self, batch: Seq[StepInput]) -> List[Optional[npt.NDArray[np.float32]]]:
        """Run one scheduling step: every StepInput's tokens appended to its sequence (each
        sequence appears at most once).  Returns, in order, each one's output: logits [V],
        hidden [T, E] or None.  Each sequence's result is what it would get alone.

        The inputs run in native batched calls (``ModelRunner.forward_batch``: the weights read
        once for all the sequences of a call), packed in order into calls of at most
        STEP_TOKENS tokens and ``parallel`` sequences; an input of more tokens than a call
        takes runs on its own sequence.  Everything is checked before anything runs (ids, room,
        each sequence once): a mistake is a ValueError with no cache written."""
        if not batch:
            return []
        seen: set = set()
        ids: List[npt.NDArray[np.int32]] = []
        for i, item in enumerate(batch):
            seq = item.sequence
            if seq.model is not self.model:
                raise ValueError(f"step: batch[{i}] is a sequence of another model")
            if id(seq) in seen:
                raise ValueError(f"step: batch[{i}]: a sequence appears twice in one step")
            if item.output not in ("logits", "hidden", "none"):
                raise ValueError(f"step: batch[{i}].output: expected 'logits', 'hidden' or "
                                 f"'none', got {item.output!r}")
            seen.add(id(seq))
            ids.append(self.model._ids(item.token_ids))
            seq._check_room(int(ids[-1].size), f"step: batch[{i}]")
        out: List[Optional[npt.NDArray[np.float32]]] = [None] * len(batch)
        group: List[int] = []
        tokens = 0
        for i in range(len(batch)):
            n = int(ids[i].size)
            if n > STEP_TOKENS:                        # more than one call: the sequence's own
                out[i] = self._run_alone(batch[i], ids[i])
                continue
            if group and (tokens + n > STEP_TOKENS or len(group) == self._leader.max_sequences):
                self._run_batch(batch, ids, group, out)
                group, tokens = [], 0
            group.append(i)
            tokens += n
        if group:
            self._run_batch(batch, ids, group, out)
        return out

    def _run_alone(self, item: StepInput, ids: npt.NDArray[np.int32]) -> Optional[F32Array]:
        if item.output == "logits":
            return item.sequence.forward(ids)
        if item.output == "hidden":
            return item.sequence.last_hidden(ids)
        item.sequence.write(ids)
        return None

    def _run_batch(self, batch: Seq[StepInput], ids: List[npt.NDArray[np.int32]],
                   group: List[int], out: List[Optional[F32Array]]) -> None:
        """batch[group] in one forward_batch call, each sequence's lock held through it."""
        E, V = self.model.config.embed_dim, self.model.vocab_size
        items = []
        held: List[Sequence] = []
        try:
            for i in group:
                seq, output = batch[i].sequence, batch[i].output
                if not seq._lock.acquire(blocking=False):
                    raise RuntimeError("Engine.step: a sequence of the step is running in "
                                       "another thread")
                held.append(seq)
                n = int(ids[i].size)
                logits = np.empty(V, dtype=np.float32) if output == "logits" else None
                hidden = np.empty((n, E), dtype=np.float32) if output == "hidden" else None
                out[i] = logits if logits is not None else hidden
                items.append((seq._runner, ids[i], seq.position, logits, False, hidden))
            self._leader.forward_batch(items)
            for i in group:
                batch[i].sequence._record(ids[i])
        finally:
            for seq in held:
                seq._lock.release()

    # ---- submitting ----------------------------------------------------------------------

    def submit_generation(self, ids: List[int], s: Settings,
                          on_event: Callable[[Event], None]) -> Job:
        """Queue a generation of s.n choices after the prompt ids (already checked to leave
        room in a sequence: ``megafuse.llm.completion.prompt_ids``)."""
        job = Job(on_event)
        room = self.cache_capacity - len(ids)
        tasks = [_Task(job, ids, TextGeneration(self.model, ids, s, index=i, room=room))
                 for i in range(s.n)]
        return self._submit(job, tasks)

    def submit_embeddings(self, inputs: List[List[int]],
                          on_event: Callable[[Event], None]) -> Job:
        """Queue the embeddings of token-id lists (each at most cache_capacity tokens)."""
        job = Job(on_event)
        return self._submit(job, [_Task(job, ids, index=i) for i, ids in enumerate(inputs)])

    def _submit(self, job: Job, tasks: List[_Task]) -> Job:
        with self._cv:
            if self._closing:
                raise EngineClosed("the server is shutting down")
            if len(self._waiting) + len(tasks) > self.max_queue + len(self._free):
                raise QueueFull(f"{len(self._waiting)} requests are waiting for one of "
                                f"{len(self.sequences)} sequences (max_queue = "
                                f"{self.max_queue}): try again later")
            job.remaining = len(tasks)
            self._waiting.extend(tasks)
            self._cv.notify()
        return job

    @property
    def load(self) -> dict:
        """Running and waiting tasks, free sequences."""
        with self._cv:
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "free": len(self._free), "sequences": len(self.sequences)}

    # ---- closing ---------------------------------------------------------------------------

    def close(self, cancel: bool = True, timeout: Optional[float] = None) -> None:
        """Stop taking requests; cancel what runs and waits (cancel=True) or let it finish;
        then stop the worker (waiting at most timeout seconds)."""
        with self._cv:
            self._closing = True
            self._cancel_all = self._cancel_all or cancel
            self._cv.notify()
        self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        return not self._thread.is_alive()

    # ---- the worker ------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cv:
                while not (self._waiting or self._running or self._closing):
                    self._cv.wait()
                if self._cancel_all:
                    for task in list(self._running) + list(self._waiting):
                        task.job.cancel()
                self._drop_cancelled()
                if self._closing and not self._running and not self._waiting:
                    return
                self._admit()
                tasks = list(self._running)
            if not tasks:
                continue
            try:
                batch = [t.step_input() for t in tasks]
                outputs = self.step(batch)
            except Exception as exc:
                log.exception("megafuse engine: a step failed")
                for task in tasks:
                    self._fail(task, exc)
                continue
            self.steps += 1
            for task, item, out in zip(tasks, batch, outputs):
                try:
                    self._advance(task, item, out)
                except Exception as exc:   # noqa: BLE001 -- a request's own failure (its logits processor, grammar)
                    self._fail(task, exc)

    def _advance(self, task: _Task, item: StepInput, out: Any) -> None:
        if task.next < task.ids.size:                 # a prompt chunk ran
            task.next += int(item.token_ids.size)
        gen = task.generation
        if gen is None:
            task.total += self.model.final_norm(out).sum(axis=0, dtype=np.float64)
            if task.next == task.ids.size:
                vector = pooled(task.total, int(task.ids.size))
                self._emit(task, Event("embedding", index=task.index, vector=vector,
                                       tokens=int(task.ids.size)))
                self._end(task)
            return
        if out is None:                               # a prefill chunk before the last
            return
        delta = gen.step(out)
        self._emit(task, Event("delta", generation=gen, delta=delta))
        if gen.finish_reason is not None:
            self._end(task)

    def _emit(self, task: _Task, event: Event) -> None:
        if task.job.cancelled:
            return
        try:
            task.job.on_event(event)
        except Exception:
            log.exception("megafuse engine: an event callback failed")
            task.job.cancel()

    def _end(self, task: _Task) -> None:
        with self._cv:
            if task in self._running:
                self._running.remove(task)
                self._release(task)
            job = task.job
            job.remaining -= 1
            done = job.remaining == 0 and not job.finished
            if done:
                job.finished = True
        if done:
            self._emit_done(job)

    def _fail(self, task: _Task, exc: BaseException) -> None:
        job = task.job
        if not job.failed and not job.cancelled:
            job.failed = True
            self._emit(task, Event("error", error=exc))
        job.cancel()
        if task.sequence is not None:
            task.sequence.reset()                     # its cache may be half written
        self._end(task)

    def _emit_done(self, job: Job) -> None:
        try:
            job.on_event(Event("done"))
        except Exception:
            log.exception("megafuse engine: an event callback failed")

    def _release(self, task: _Task) -> None:
        """(lock held) The task's sequence back to the free list."""
        if task.sequence is not None:
            self._free.append(task.sequence)
            task.sequence = None
        self._cv.notify()

    def _drop_cancelled(self) -> None:
        """(lock held) Remove the cancelled jobs' tasks, freeing their sequences at once."""
        ended = []
        for task in list(self._running):
            if task.job.cancelled:
                self._running.remove(task)
                self._release(task)
                ended.append(task)
        for task in list(self._waiting):
            if task.job.cancelled:
                self._waiting.remove(task)
                ended.append(task)
        for task in ended:
            job = task.job
            job.remaining -= 1
            if job.remaining == 0 and not job.finished:
                job.finished = True
                self._emit_done(job)

    def _admit(self) -> None:
        """(lock held) Waiting tasks onto free sequences, in order; each to the free sequence
        that keeps the longest prefix of its prompt."""
        while self._waiting and self._free:
            task = self._waiting.popleft()
            if task.generation is not None:
                best = max(self._free, key=lambda s: s.reusable_prefix(task.ids))
            else:
                best = self._free[-1]
            self._free.remove(best)
            task.admit(best)
            self._running.append(task)


__all__ = ["Engine", "StepInput", "Event", "Job", "QueueFull", "EngineClosed"]
