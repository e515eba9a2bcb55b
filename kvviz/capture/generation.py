"""One sequence's generation, step by step: the state a run carries between forwards.

:class:`Generation` holds everything one run needs between two forwards — its prompt ids, cache,
recorder, sampling generator, stop rule and growing Trace — and answers two questions: what to feed
next (:meth:`Generation.next_feed`: a chunk of the prompt while prefilling, then the last token), and
what to do with the logits that came back (:meth:`Generation.take`: prefill progress, the per-step
hook, the next token — sampled or forced — and the stop rules). It also says which recorder the
forward gets (:attr:`Generation.feed_recorder`) and at which position the feed starts (a cache that
re-positions keys is fed its slot positions). Who runs the forward is not its business:
:func:`kvviz.capture.loop.capture_iter` runs one generation alone, the lecture-hall engine
(:mod:`kvviz.engine`) runs many in one packed forward (:mod:`kvviz.capture.packed`), an eviction run
(:func:`kvviz.eviction.run.run_policy`) one with its hooks. Either way the Trace is built by the same
code, so a batched run records what a solo run records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from kvviz.capture.faults.base import FaultyCache
from kvviz.capture.model_io import (
    PREFILL_CHUNK,
    Progress,
    cache_layer_bytes,
    choose_bin_factor,
    encode_prompt,
    model_info,
    sample,
)
from kvviz.capture.options import CacheSetup, Decode, Feed, Recording
from kvviz.capture.recorder import Recorder, RecorderConfig
from kvviz.capture.tokens import TokenTexts
from kvviz.capture.trace import Step, Trace
from kvviz.models import LoadedModel


class Generation:
    """One run's state between forwards (see the module docstring), told what to do by four groups
    (:mod:`kvviz.capture.options`): how the prompt is fed, how tokens are picked and the run ends,
    what is recorded, and which cache it runs on. ``progress`` hears of every prefill chunk.

    A cache whose ``repositions`` is true (its RoPE positions are its slots) is fed position ids
    counted from its length instead of from the tokens fed. With ``score_tokens`` the forward must
    return every fed position's logits (``logits_to_keep=g.logits_to_keep``).
    """

    def __init__(
        self,
        lm: LoadedModel,
        prompt: str,
        *,
        feed: Feed = Feed(),
        decode: Decode = Decode(),
        recording: Recording = Recording(),
        cache: CacheSetup = CacheSetup(),
        progress: Callable[[Progress], None] | None = None,
    ):
        self.lm = lm
        self.sampling = decode.sampling
        info = model_info(lm)
        ids = list(feed.prompt_ids) if feed.prompt_ids is not None else encode_prompt(lm, prompt, feed.chat)
        if not ids:
            raise ValueError("The prompt is empty: type some text.")
        max_new_tokens, verify, record = decode.max_new_tokens, recording.verify, recording.on
        prefill_chunk = feed.prefill_chunk
        if prefill_chunk is None:
            prefill_chunk = 0 if cache.factory or cache.fault else PREFILL_CHUNK
        head = len(ids) if feed.prefill_tokens is None else feed.prefill_tokens
        if isinstance(head, bool) or not isinstance(head, int) or not 1 <= head <= len(ids):
            raise ValueError(f"prefill_tokens must be between 1 and the prompt length {len(ids)}, got {head!r}.")
        if feed.tail_chunk > 1 and record and recording.decode:
            raise ValueError(
                "The recorder follows one query per forward after the prefill: tail_chunk > 1 needs "
                "record_decode=False."
            )
        if head < len(ids) and verify:
            raise ValueError("The equivalence check compares a whole-prompt prefill: it needs prefill_tokens=None.")
        if len(ids) + max_new_tokens > info.context_length > 0:
            raise ValueError(
                f"Prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceeds the model's "
                f"context of {info.context_length} tokens; shorten the prompt or generate fewer tokens."
            )
        self.cfg = cfg = recording.cfg or RecorderConfig()
        n_prompt, t_max = len(ids), len(ids) + max_new_tokens
        cfg.bin_factor = choose_bin_factor(info, n_prompt, t_max) if cfg.bin_factor <= 1 else cfg.bin_factor
        self.rec: Recorder | None = None
        if record:
            self.rec = Recorder(
                info.layers, info.q_heads, t_max, head, cfg, lm.device, verify, attention_layers=info.attention_layers
            )
        self.fault = fault = cache.fault
        plain = FaultyCache(fault, lm.config) if fault else DynamicCache(config=lm.config)
        self.cache = cache.factory(lm) if cache.factory else plain
        if self.rec is not None:
            self.rec.cache = self.cache
        self.stop_on_eos = decode.stop_on_eos
        self.head, self.tail_chunk, self.record_decode = head, feed.tail_chunk, recording.decode
        self.keep_logprobs, self.score_tokens = recording.keep_logprobs, recording.score_tokens
        self.logits_to_keep = 0 if self.score_tokens else 1  # what the forward returns: every position, or the last
        self.default_cache = cache.factory is None and cache.after_step is None and head == n_prompt
        self.max_new_tokens, self.verify = max_new_tokens, verify
        self.should_stop, self.after_step = decode.should_stop, cache.after_step
        self.progress = progress or (lambda _: None)
        self.forced = list(feed.forced) if feed.forced is not None else None
        self.chunk = prefill_chunk or n_prompt
        self.texts = TokenTexts(lm.tokenizer)  # a character split across byte tokens shows on the one completing it
        self.trace = Trace(
            model=info,
            prompt=prompt,
            chat=feed.chat,
            n_prompt=n_prompt,
            token_ids=list(ids),
            tokens=[self.texts.push(i) for i in ids],
            bin_factor=cfg.bin_factor,
            sink_k=cfg.sink_k,
            settings={
                "max_new_tokens": max_new_tokens,
                "temperature": self.sampling.temperature,
                "top_p": self.sampling.top_p,
                "seed": self.sampling.seed,
                "obs_window": cfg.obs_window,
            },
        )
        self.gen = torch.Generator().manual_seed(int(self.sampling.seed))
        self.logits_seen: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []  # with keep_logprobs: [vocab] per produced token
        self.token_logprobs: list[torch.Tensor] = []  # with score_tokens: one value per fed position, in pieces
        self.feed_recorder: Recorder | None = None  # the recorder the planned forward passes (see next_feed)
        self.fed = 0  # tokens in the cache
        self.step = 0  # tokens produced so far
        self.hooks = 0  # after_step calls so far (ahead of ``step`` by the prompt tokens fed after the prefill)
        self.done = False
        self.t0: float | None = None
        if fault is not None:
            fault.start(self)

    # -- what this run would share with an identical one ---------------------------------------
    def key(self) -> tuple:
        """Everything that decides this run's Trace: runs with equal keys compute the same thing."""
        s, c = self.sampling, self.cfg
        return (
            self.lm.name,
            tuple(self.trace.token_ids[: self.trace.n_prompt]),
            self.trace.chat,
            self.trace.prompt,
            self.max_new_tokens,
            (s.temperature, s.top_p, s.seed),
            (c.sink_k, c.obs_window, c.bin_factor, c.chunk),
            self.verify,
            self.chunk,
            tuple(self.forced) if self.forced is not None else None,
            self.rec is not None,
            self.stop_on_eos,
            self.head,
            self.tail_chunk,
            self.record_decode,
            self.keep_logprobs,
            self.score_tokens,
            self.fault,
        )

    @property
    def prefilling(self) -> bool:
        return self.fed < self.trace.n_prompt

    @property
    def steps_left(self) -> int:
        """The forwards this run still takes if it uses its whole token budget (the rest of the prompt
        counted as one, the forward that produces the first token): an engine's estimate of when it ends."""
        return 0 if self.done else self.max_new_tokens - self.step

    def restore_prefix(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor | None) -> None:
        """Start from a prefix cache's entry: its keys and values per layer ([1, Hkv, P, D] each) go into
        this run's cache and its probability rows into the recorder (None for a run without one); the
        prefill then starts at P."""
        if self.fed or not self.default_cache or (self.rec is None) != (rows is None):
            raise RuntimeError("A cached prefix seeds a fresh run on the default cache, with rows when it records.")
        n = layers[0][0].shape[2]
        for i, (k, v) in enumerate(layers):
            self.cache.update(k.clone(), v.clone(), i)
        if self.rec is not None and rows is not None:
            self.rec.replay_prefix(rows)
        self.fed = n
        self.trace.cached_prompt_tokens = n

    # -- the loop's two questions ---------------------------------------------------------------
    def next_feed(self, limit: int | None = None) -> tuple[list[int], int]:
        """The tokens the next forward feeds (a prefill chunk of at most ``limit`` tokens, then the rest of
        the prompt ``tail_chunk`` tokens at a time, then the last token) and the position of the first;
        tells the recorder and sets :attr:`feed_recorder` (the recorder that forward passes, or None)."""
        if self.done:
            raise RuntimeError("This generation has finished.")
        if self.t0 is None:
            self.t0 = time.perf_counter()
        start = self.cache.get_seq_length() if getattr(self.cache, "repositions", False) else self.fed
        if self.fed < self.head:
            n = self.trace.n_prompt
            if self.fed == 0 or self.fed == self.trace.cached_prompt_tokens:
                self.progress(Progress("prefill", self.fed, n))
            size = self.chunk if limit is None else max(1, min(self.chunk, limit))
            part = self.trace.token_ids[self.fed : min(self.fed + size, self.head)]
            self.feed_recorder = self.rec
            if self.rec is not None:
                self.rec.begin_forward("prefill", self.fed + len(part))
            return part, start
        self.feed_recorder = self.rec if self.record_decode else None
        if self.feed_recorder is not None:
            self.feed_recorder.begin_forward("decode", self.fed + 1)
        size = self.tail_chunk if limit is None else max(1, min(self.tail_chunk, limit))
        end = min(self.fed + size, self.trace.n_prompt) if self.prefilling else self.fed + 1
        return self.trace.token_ids[self.fed : end], start  # the prompt's next tokens, or the last one produced

    def take(self, logits: torch.Tensor, fed: int, top: int | None = None) -> bool:
        """The logits of the forward that fed ``fed`` tokens: the last position's [vocab], or every
        position's [q, vocab]; True when a token was produced (False for a forward that ended before the
        prompt's last token). ``top``: the last position's argmax, when the caller found it (a batch's rows
        at once): a greedy run's token, without a reduction of its own over the vocabulary."""
        rows = logits if logits.dim() == 2 else logits[None]
        logits = rows[-1]
        if self.score_tokens:
            self._score(rows, fed)
        self.fed += fed
        n = self.trace.n_prompt
        if self.step == 0 and self.rec is not None:
            del self.rec.outputs[:-1]  # the check compares the last prompt query only: earlier chunks' go
        if self.fed >= self.head:
            if self.after_step is not None:
                self.after_step(self.cache, self.feed_recorder, self.hooks)
            self.hooks += 1
        if self.fed < n:
            self.progress(Progress("prefill", self.fed, n))
            return False
        if self.step == 0:
            self.progress(Progress("prefill", n, n))
        if self.verify:
            self.logits_seen.append(logits)
        if self.keep_logprobs:
            self.logprobs.append(torch.log_softmax(logits.float(), -1).cpu())
        step, trace, tok = self.step, self.trace, self.lm.tokenizer
        forcing = self.forced is not None and step < len(self.forced)
        if forcing and self.forced is not None:
            nxt = self.forced[step]
        else:
            nxt = top if top is not None and self.sampling.temperature <= 0 else sample(logits, self.sampling, self.gen)
        if self.score_tokens:
            self.token_logprobs.append(torch.log_softmax(logits.float(), -1)[nxt, None].cpu())
        trace.token_ids.append(nxt)
        trace.tokens.append(self.texts.push(nxt))
        lens, sizes = cache_layer_bytes(self.cache)
        elapsed = time.perf_counter() - (self.t0 or time.perf_counter())
        trace.steps.append(Step(step, nxt, trace.tokens[-1], self.fed, lens, sizes, elapsed))
        if step == 0:
            trace.timings["prefill_s"] = elapsed
        if self.forced is not None and step == len(self.forced) - 1:
            trace.stop_reason = "forced"
        elif not forcing and self.stop_on_eos and nxt in self.lm.stop_ids:
            trace.stop_reason = "eos"
        elif step == self.max_new_tokens - 1:
            trace.stop_reason = "max_new_tokens"
        elif self.should_stop is not None and self.should_stop():
            trace.stop_reason = "stopped"
        trace.text = tok.decode(trace.token_ids[n:], skip_special_tokens=True)
        self.step += 1
        self.done = bool(trace.stop_reason)
        return True

    def _score(self, rows: torch.Tensor, fed: int) -> None:
        """Log-probabilities of the known tokens that follow the fed ones (the produced one is scored
        once chosen)."""
        if rows.shape[0] != fed:
            raise ValueError("score_tokens needs every fed position's logits (logits_to_keep=g.logits_to_keep).")
        known = torch.tensor(
            self.trace.token_ids[self.fed + 1 : self.fed + fed + 1], dtype=torch.long, device=rows.device
        )
        lp = torch.log_softmax(rows[: len(known)].float(), -1)  # [k, vocab]
        self.token_logprobs.append(lp.gather(1, known[:, None])[:, 0].cpu())

    def stop(self, reason: str = "stopped") -> None:
        """End the run where it is (its last token stays the last one)."""
        if not self.done:
            self.trace.stop_reason = self.trace.stop_reason or reason
            self.done = True

    def release(self) -> None:
        """Drop the cache, the recorder and the kept logits (the finished Trace holds what they gave):
        whoever still holds this run holds no KV."""
        self.cache, self.rec, self.feed_recorder = None, None, None
        self.logits_seen, self.logprobs, self.token_logprobs = [], [], []

    def finish(self) -> Trace:
        """Timings and the recorder's summaries into the Trace, trimmed to what actually ran (the summaries
        only when the prefill was the whole prompt: they are laid out by prompt and generated rows)."""
        trace = self.trace
        total = time.perf_counter() - (self.t0 or time.perf_counter())
        trace.timings["total_s"] = total
        decode_s = total - trace.timings.get("prefill_s", total)
        trace.timings["decode_tokens_per_s"] = (len(trace.steps) - 1) / decode_s if decode_s > 0 else None
        if trace.steps and self.rec is not None and self.head == trace.n_prompt:  # else its prompt is the head
            summarize(trace, self.rec, self.cache)
        return trace


def summarize(trace: Trace, rec: Recorder, cache) -> None:
    """Move the recorder's summaries into the trace, trimmed to what actually ran."""
    t, tq, n = trace.n_tokens, trace.n_fed, trace.n_prompt
    nb = -(-t // rec.cfg.bin_factor)
    trace.colsum = rec.colsum[:, :, :t].cpu().numpy()
    trace.prefill_colsum = rec.prefill_colsum.cpu().numpy()
    trace.sink_mass = rec.sink_mass[:, :, :tq].cpu().numpy()
    trace.window_rows = rec.window_rows.cpu().numpy()
    trace.prefill_map = rec.finish_prefill_map()[..., :nb].half().cpu().numpy()
    trace.decode_rows = rec.decode_rows[: tq - n, ..., :nb].cpu().numpy()
    if rec.learned_sink_mass is not None:
        trace.learned_sink_mass = rec.learned_sink_mass[:, :, :tq].cpu().numpy()
    kv_stats(trace, cache)
    absent = sorted(set(range(trace.model.layers)) - set(rec.attention_layers))
    if absent:  # layers without attention (a linear hybrid's): NaN, absent, never zeros posing as attention
        for name in ("colsum", "prefill_colsum", "sink_mass", "window_rows", "prefill_map", *KV_STATS):
            getattr(trace, name)[absent] = np.nan
        trace.decode_rows[:, absent] = np.nan


KV_STATS = ("key_norms", "value_norms", "key_channel_absmean", "value_channel_absmean")


def kv_stats(trace: Trace, cache) -> None:
    """Norms of every cached key/value and mean |k|, |v| per channel, from the final cache (for MLA,
    of the latent and the RoPE key it stores instead)."""
    info, t = trace.model, trace.n_tokens
    (dk, dv), heads = info.stored_dims, info.stored_heads
    knorm = np.full((info.layers, heads, t), np.nan, dtype=np.float32)
    vnorm = knorm.copy()
    kch = np.zeros((info.layers, heads, dk), dtype=np.float32)
    vch = np.zeros((info.layers, heads, dv), dtype=np.float32)
    plain: dict[tuple, list[int]] = {}  # layers whose keys are the last positions in order, by shape
    for i, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None or keys.numel() == 0:
            continue
        pos = getattr(layer, "kv_positions", None)
        if pos is None:
            plain.setdefault((tuple(keys.shape), tuple(values.shape)), []).append(i)
            continue
        k, v = keys[0].float(), values[0].float()  # [Hkv, n, Dk], [Hkv, n, Dv]
        pos = pos.cpu().numpy()
        for h in range(k.shape[0]):
            knorm[i, h, pos[h]] = k[h].norm(dim=-1).cpu().numpy()
            vnorm[i, h, pos[h]] = v[h].norm(dim=-1).cpu().numpy()
        kch[i] = k.abs().mean(1).cpu().numpy()
        vch[i] = v.abs().mean(1).cpu().numpy()
    for ((_, _, n, _), _), idx in plain.items():  # a few ops for all of them: one run's summary, not 10 ms
        k = torch.stack([cache.layers[i].keys[0] for i in idx]).float()  # [l, Hkv, n, Dk]
        v = torch.stack([cache.layers[i].values[0] for i in idx]).float()
        knorm[idx, :, trace.n_fed - n : trace.n_fed] = k.norm(dim=-1).cpu().numpy()
        vnorm[idx, :, trace.n_fed - n : trace.n_fed] = v.norm(dim=-1).cpu().numpy()
        kch[idx] = k.abs().mean(2).cpu().numpy()
        vch[idx] = v.abs().mean(2).cpu().numpy()
    trace.key_norms, trace.value_norms = knorm, vnorm
    trace.key_channel_absmean, trace.value_channel_absmean = kch, vch
