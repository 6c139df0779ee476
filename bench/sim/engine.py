"""The simulated vLLM engine: a pure, deterministic, clock-injected scheduler.

`Engine.step(now)` first completes the batch scheduled by the previous call (its tokens
appear at `now`), then schedules the next batch and returns its modelled duration in
simulated seconds, or None when there is nothing to run. Nothing here does I/O or reads
a clock; the server drives it from one asyncio task. `continuous` mode follows vLLM V1's
scheduler (chunked prefill, recompute preemption, FIFO admission); `static` and `dynamic`
run a batch to completion before forming the next one.
"""

from __future__ import annotations

import random
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence

from xxhash import xxh3_64_intdigest

from .blocks import BlockManager
from .config import SimConfig
from .seq import FINISHED, RUNNING, TRANSFERRING, WAITING, QueueFull, RequestTooLong, Seq
from .stats import EngineStats
from .tokenizer import ByteTokenizer, OutputText

__all__ = ["Engine", "QueueFull", "RequestTooLong", "Seq"]

_LOOKAHEAD = 256  # output token ids materialised ahead, so refills are rare


class Engine:
    """Continuous/static/dynamic batching over a paged, prefix-cached KV cache."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        output: OutputText | None = None,
        record_events: bool = False,
    ) -> None:
        self.cfg = cfg
        self.tm = cfg.time_model
        self.bm = BlockManager(
            cfg.num_gpu_blocks,
            cfg.block_size,
            caching=cfg.enable_prefix_caching,
            hash_seed=cfg.hash_seed,
            record_events=record_events,
        )
        self.output = output or OutputText(ByteTokenizer(), cfg.seed)
        self.rng = random.Random(cfg.seed)
        self.stats = EngineStats()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.transferring: list[Seq] = []
        self.held: OrderedDict[str, tuple[Seq, float]] = OrderedDict()
        self.scheduled: list[Seq] = []
        self.emitted: list[Seq] = []  # got a token in the last step
        self.finished: list[Seq] = []  # finished in the last step
        self.pulled: list[Seq] = []  # done with their prefiller's KV in the last step: tell it to free the blocks
        self.lora_ids: dict[str, int] = {name: i + 1 for i, name in enumerate(cfg.lora_adapters)}
        self._continuous = cfg.batching == "continuous"
        self._batch_slots = 0
        self._step_no = 0
        self._order = 0
        self._last_complete = -1.0

    # ----------------------------------------------------------------- requests

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.transferring)

    @property
    def kv_usage(self) -> float:
        return self.bm.usage()

    def add(
        self,
        req_id: str,
        prompt_ids: Sequence[int],
        now: float,
        *,
        max_tokens: int | None = None,
        lora: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        remote_prefill: bool = False,
        remote_decode: bool = False,
        pooling: bool = False,
    ) -> Seq:
        """Queue a request. Raises QueueFull or RequestTooLong (nothing is queued then)."""
        cfg = self.cfg
        if self.num_waiting >= cfg.max_waiting:
            raise QueueFull(f"waiting queue is full ({cfg.max_waiting} requests)")
        ids = prompt_ids if isinstance(prompt_ids, array) else array("I", prompt_ids)
        if not ids:
            raise ValueError("the prompt is empty")
        n = len(ids)
        cap = min(cfg.max_model_len, cfg.kv_capacity_tokens)
        seq = Seq(req_id, array("I", ids), now)
        if pooling:
            seq.pooling, seq.max_output, seq.stop_reason = True, 0, "stop"
        elif max_tokens is not None:
            seq.max_output = max_tokens
        else:
            want = 1 + int(self.rng.expovariate(1.0 / cfg.output_len_mean))
            seq.max_output = min(want, cap - n)
            seq.stop_reason = "stop" if want <= cap - n else "length"
        if n + max(seq.max_output, 0 if pooling else 1) > cap:
            raise RequestTooLong(
                f"{n} prompt + {seq.max_output} output tokens exceed the {cap}-token limit"
            )
        seq.priority = priority
        if lora is not None:
            seq.lora = lora
            seq.extra_key = b"lora\0" + lora.encode()
        if cache_salt:
            seq.salt = cache_salt
            seq.salt_key = b"salt\0" + cache_salt.encode()
        seq.remote_prefill = remote_prefill
        seq.remote_decode = remote_decode
        seq.out_start = xxh3_64_intdigest(ids.tobytes(), seed=cfg.seed) % self.output.length
        self.waiting.append(seq)
        return seq

    def abort(self, seq: Seq, now: float) -> None:
        """Cancel a request (client went away); frees its blocks at once."""
        if seq.status == FINISHED:
            return
        if seq.status == RUNNING:
            self.running.remove(seq)
        elif seq.status == WAITING:
            self.waiting.remove(seq)
        else:
            self.transferring.remove(seq)
        self.bm.free_seq(seq)
        seq.status = FINISHED
        seq.finish_reason = "abort"
        seq.finish_time = now
        self.stats.finished["abort"] += 1

    def release_kv(self, req_id: str) -> bool:
        """P/D prefiller: the decoder has pulled `req_id`'s blocks; free them."""
        item = self.held.pop(req_id, None)
        if item is None:
            return False
        item[0].held = False
        self.bm.free_seq(item[0])
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks (only while idle); publishes AllBlocksCleared."""
        return self.bm.reset_prefix_cache()

    # ------------------------------------------------------------------ stepping

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.transferring or self.scheduled)

    def next_wakeup(self, now: float) -> float | None:
        """Earliest future time at which the engine has something to do without new input."""
        times = [s.kv_ready_at for s in self.transferring]
        if self.held:
            times.append(next(iter(self.held.values()))[1])
        if self.cfg.batching == "dynamic" and self.waiting and not self.running:
            times.append(self.waiting[0].arrival + self.cfg.max_wait_time_s)
        future = [t for t in times if t > now]
        return min(future) if future else None

    def run_until_idle(self, now: float = 0.0, *, check: bool = False) -> float:
        """Step in simulated time until nothing is left to do; returns the final time."""
        while self.has_work() or self.held:
            duration = self.step(now)
            if check:
                self.check()
            if duration is not None:
                now += duration
                continue
            wakeup = self.next_wakeup(now)
            if wakeup is None:
                break
            now = wakeup
        return now

    def step(self, now: float) -> float | None:
        """Complete the previous batch at `now`, schedule the next; return its duration."""
        self.emitted = []
        self.finished = []
        self.pulled = []
        if self.scheduled:
            self._complete(now)
        if self.transferring:
            self._arrived(now)
        if self.held:
            self._expire(now)
        return self._schedule(now)

    def _complete(self, now: float) -> None:
        stats, emitted = self.stats, self.emitted
        itl = stats.itl
        prev = self._last_complete
        same = 0  # sequences that also produced a token at `prev`: one ITL value for all
        done = False
        for seq in self.scheduled:
            if seq.status != RUNNING:
                continue
            seq.num_computed += seq.sched_n
            if seq.num_computed < seq.num_tokens:
                continue  # a prefill chunk; no token sampled yet
            if seq.pooling:
                stats.prompt_tokens += seq.num_prompt
                self._finish(seq, "stop", now)
                done = True
                continue
            seq.num_output += 1
            seq.num_tokens += 1
            if seq.first_token < 0:
                seq.first_token = now
                stats.ttft.observe(now - seq.arrival)
                stats.prompt_tokens += seq.num_prompt
            elif seq.last_token == prev:
                same += 1
            else:
                itl.observe(now - seq.last_token)
            seq.last_token = now
            emitted.append(seq)
            if seq.num_output >= seq.max_output:
                self._finish(seq, seq.stop_reason, now)
                done = True
        if same:
            itl.observe(now - prev, same)
        self._last_complete = now
        stats.generation_tokens += len(emitted)
        self.scheduled = []
        if done:
            self.running = [s for s in self.running if s.status == RUNNING]

    def _finish(self, seq: Seq, reason: str, now: float) -> None:
        seq.status = FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        self.stats.finished[reason] += 1
        self.stats.e2e.observe(now - seq.arrival)
        self.finished.append(seq)
        if seq.remote_decode and reason == "length" and self.cfg.kv_hold_timeout_s > 0:
            seq.held = True
            self.held[seq.req_id] = (seq, now + self.cfg.kv_hold_timeout_s)
        else:
            self.bm.free_seq(seq)

    def _arrived(self, now: float) -> None:
        ready = [s for s in self.transferring if s.kv_ready_at <= now]
        if not ready:
            return
        self.transferring = [s for s in self.transferring if s.kv_ready_at > now]
        ready.sort(key=lambda s: s.kv_ready_at)
        for seq in reversed(ready):
            seq.status = WAITING
            seq.kv_loaded = True
            self.waiting.appendleft(seq)
        self.pulled.extend(ready)

    def _expire(self, now: float) -> None:
        held = self.held
        while held:
            req_id, (_, expires) = next(iter(held.items()))
            if expires > now:
                break
            self.release_kv(req_id)

    def _ensure_ids(self, seq: Seq, upto: int) -> None:
        have = len(seq.all_ids)
        if have < upto:
            end = min(seq.num_prompt + seq.max_output, upto + _LOOKAHEAD)
            seq.all_ids.extend(self.output.ids(seq.out_start + have - seq.num_prompt, end - have))

    # ---------------------------------------------------------------- scheduling

    def _schedule(self, now: float) -> float | None:
        cfg, bm = self.cfg, self.bm
        bs = cfg.block_size
        caching = cfg.enable_prefix_caching
        if self._continuous:
            budget, limit = cfg.max_num_batched_tokens, cfg.max_num_seqs
        else:
            budget, limit = 1 << 62, cfg.batch_size
        step_no = self._step_no
        sched: list[Seq] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = seq.num_tokens - seq.num_computed
            n = min(n, budget)
            upto = seq.num_computed + n
            if upto > len(seq.blocks) * bs or (caching and upto // bs > seq.num_cached_blocks):
                self._ensure_ids(seq, upto)
                while not bm.allocate(seq, upto):
                    victim = max(running, key=_victim_key)
                    if victim is seq and len(running) == 1 and self._unstick():
                        continue  # pulled-but-waiting KV was all that stood in the way
                    budget += self._preempt(victim, step_no, sched)
                    preempted = True
                    if victim is seq:
                        break
                    if running.index(seq) < i:
                        i -= 1
                if seq.status != RUNNING:
                    continue  # preempted itself; running[i] is now the next sequence
            seq.sched_n = n
            seq.sched_step = step_no
            sched.append(seq)
            budget -= n
            i += 1
        # As in vLLM, nothing new is admitted in a step that had to preempt.
        admit = (not preempted or not sched) and self.waiting
        if admit and (self._continuous or (not running and self._batch_ready(now))):
            before = len(running)
            budget = self._admit(now, sched, budget, limit)
            if not sched and not running and self._unstick():
                budget = self._admit(now, sched, budget, limit)
            if not self._continuous and len(running) > before:
                self._batch_slots = len(running)
        if not sched:
            return None
        self.scheduled = sched
        self._step_no += 1
        return self._duration(sched)

    def _preempt(self, victim: Seq, step_no: int, sched: list[Seq]) -> int:
        """Recompute-preempt `victim`; returns the budget it gives back."""
        self.running.remove(victim)
        refund = 0
        if victim.sched_step == step_no:
            sched.remove(victim)
            victim.sched_step = -1
            refund = victim.sched_n
        self.bm.free_seq(victim)
        victim.num_computed = 0
        victim.status = WAITING
        victim.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(victim)
        return refund

    def _batch_ready(self, now: float) -> bool:
        if self.cfg.batching == "static":
            return True
        cfg = self.cfg
        return (
            len(self.waiting) >= cfg.batch_size
            or now - self.waiting[0].arrival >= cfg.max_wait_time_s - 1e-12
        )

    def _admit(self, now: float, sched: list[Seq], budget: int, limit: int) -> int:
        cfg, bm, tm = self.cfg, self.bm, self.tm
        bs = cfg.block_size
        waiting, running = self.waiting, self.running
        loras: set[str] | None = None
        skipped: list[Seq] = []
        while waiting and budget > 0 and len(running) < limit:
            seq = waiting[0]
            if seq.lora is not None:
                if loras is None:
                    loras = {s.lora for s in running if s.lora is not None}
                if seq.lora not in loras and len(loras) >= cfg.max_loras:
                    skipped.append(waiting.popleft())
                    continue
            fresh = seq.num_computed == 0
            if fresh:
                self._ensure_ids(seq, seq.num_tokens)
                hits = bm.lookup(seq)
            else:
                hits = []
            num_hit = len(hits) * bs
            if fresh and seq.remote_prefill and not seq.kv_loaded:
                ext = seq.num_prompt - 1 - num_hit
                if ext > 0:
                    if not bm.allocate(seq, num_hit + ext, hits):
                        break
                    waiting.popleft()
                    self._first_schedule(seq, num_hit, num_hit + ext, now)
                    seq.num_computed = num_hit + ext
                    seq.status = TRANSFERRING
                    transfer = tm.kv_transfer_latency_s + tm.kv_transfer_s_per_token * ext
                    seq.kv_ready_at = now + transfer
                    self.transferring.append(seq)
                    continue
                # Nothing to pull (a full local prefix hit, or a one-token prompt): NIXL still notifies the
                # prefiller, which would otherwise hold the blocks until its timeout.
                seq.kv_loaded = True
                self.pulled.append(seq)
            n = seq.num_tokens - seq.num_computed - num_hit
            if n > budget:
                if not cfg.enable_chunked_prefill and sched:
                    break
                if cfg.enable_chunked_prefill:
                    n = budget
            if not bm.allocate(seq, seq.num_computed + num_hit + n, hits):
                break
            waiting.popleft()
            if seq.num_cached_tokens < 0:
                self._first_schedule(seq, num_hit, num_hit, now)
            seq.num_computed += num_hit
            seq.status = RUNNING
            self._order += 1
            seq.order = self._order
            seq.sched_n = n
            seq.sched_step = self._step_no
            running.append(seq)
            sched.append(seq)
            budget -= n
            if loras is not None and seq.lora is not None:
                loras.add(seq.lora)
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget

    def _first_schedule(self, seq: Seq, local_hit: int, cached: int, now: float) -> None:
        stats = self.stats
        seq.first_sched = now
        seq.num_cached_tokens = cached
        stats.queue.observe(now - seq.arrival)
        if self.cfg.enable_prefix_caching:
            stats.prefix_cache_queries += seq.num_tokens
            stats.prefix_cache_hits += local_hit

    def _unstick(self) -> bool:
        """Nothing runs and the queue head cannot get blocks: drop KV that waiting sequences
        pulled from a prefiller (they will recompute it), so the head can make progress."""
        freed = False
        for seq in self.waiting:
            if seq.blocks:
                self.bm.free_seq(seq)
                seq.num_computed = 0
                freed = True
        return freed

    def _duration(self, sched: list[Seq]) -> float:
        tm = self.tm
        prefill = decode = kv = 0
        pairs = 0.0
        for seq in sched:
            n = seq.sched_n
            c = seq.num_computed
            if n == 1 and seq.num_output and c == seq.num_tokens - 1:
                decode += 1
                kv += c
            else:
                prefill += n
                pairs += n * (c + (n + 1) / 2)
        charged = decode
        if not self._continuous and self._batch_slots > len(self.running):
            charged += self._batch_slots - len(self.running)  # finished slots still pad the batch
        t = (
            tm.step_overhead_s
            + tm.prefill_s_per_token * prefill
            + tm.prefill_attn_s_per_pair * pairs
            + tm.decode_s_per_seq * charged
            + tm.attn_s_per_kv_token * kv
        )
        if tm.jitter:
            t *= min(1.7, max(0.3, 1.0 + tm.jitter * self.rng.gauss(0.0, 1.0)))
        stats = self.stats
        stats.steps += 1
        stats.busy_time += t
        stats.seq_time += len(sched) * t
        stats.iteration_tokens.observe(prefill + decode)
        return t

    def check(self) -> None:
        """Assert block-accounting invariants (used by the property tests)."""
        holders = list(self.running) + list(self.waiting) + self.transferring
        holders += [seq for seq, _ in self.held.values()]
        self.bm.check(holders)
        assert len(self.running) <= self.cfg.max_num_seqs


def _victim_key(seq: Seq) -> tuple[int, float, int]:
    return (seq.priority, seq.arrival, seq.order)
