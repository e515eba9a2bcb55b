"""Generate under an eviction policy with a cache that really shrinks, and record what it kept.

``Evictor`` is the glue between a policy and an :class:`~kvviz.eviction.cache.EvictingCache`: its
``cache_factory``/``after_step`` plug into :func:`kvviz.capture.loop.capture_iter`. ``run_policy`` is
kvviz's own greedy loop for the eviction views: it can prefill and compress only the context and
then feed the question uncompressed, feed a forced continuation (teacher forcing, for KL against
the full cache), re-position keys (StreamingLLM), and it records the kept set after every step.
Usage::

    from kvviz.eviction.run import run_policy
    from kvviz.eviction.policies import make_policy
    run = run_policy(lm, ids, make_policy("snapkv"), budget=96, max_new_tokens=16)
    run.text, run.kept.shape  # answer, [layers, kv_heads, 96]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from kvviz.capture.loop import forward, model_info
from kvviz.capture.recorder import Recorder, RecorderConfig, installed
from kvviz.capture.tokens import token_texts
from kvviz.eviction.cache import EvictingCache, KeyRerotator
from kvviz.eviction.policies import KEPT, FullCache, Policy, PolicyState, n_kept_for
from kvviz.models import LoadedModel


class Evictor:
    """Applies ``policy`` after every forward and keeps the history of held positions and roles."""

    def __init__(
        self,
        lm: LoadedModel,
        policy: Policy,
        n_kept: int,
        n_prompt: int,
        record_history: bool = True,
        feeds_slot_positions: bool = False,
    ):
        """``feeds_slot_positions``: the caller feeds position ids = cache slots when the policy re-positions
        keys (``run_policy`` does; ``capture_iter`` feeds absolute positions, so it cannot re-position)."""
        info = model_info(lm)
        self.feeds_slot_positions = feeds_slot_positions
        self.policy, self.n_kept, self.n_prompt = policy, int(n_kept), int(n_prompt)
        self.kv_heads = info.kv_heads
        self.record_history = record_history
        self.prefill_positions: np.ndarray | None = None  # [Lyr, Hkv, L] held before the prefill decision
        self.prefill_scores: np.ndarray | None = None  # [Lyr, Hkv, L] the policy's scores at that decision
        self.kept: np.ndarray | None = None  # [Lyr, Hkv, k] held right after step 0
        self.kept_roles: np.ndarray | None = None
        self.history: list[np.ndarray] = []  # per step: positions held after it [Lyr, Hkv, n]
        self.history_roles: list[np.ndarray] = []
        self._roles: torch.Tensor | None = None

    def recorder_config(self) -> RecorderConfig:
        """What the Recorder must keep for this policy (the observation window for SnapKV)."""
        return RecorderConfig(obs_window=max(self.policy.observation_window, 1))

    def cache_factory(self, lm: LoadedModel) -> EvictingCache:
        rerotator = None
        if self.policy.position_mode != "original":
            if not self.feeds_slot_positions:
                raise ValueError(
                    "Re-positioning keys needs a loop that feeds cache-slot positions "
                    "(kvviz.eviction.run.run_policy); capture_iter feeds original positions."
                )
            rerotator = KeyRerotator.from_model(lm.model)
        return EvictingCache(lm.config, rerotator)

    def after_step(self, cache: EvictingCache, recorder: Recorder | None, step: int) -> None:
        """Compress if the policy wants to now; then record what is held (in cache-slot order)."""
        track = self.record_history or step == 0  # roles are bookkeeping for the views only
        n = cache.get_seq_length()
        if track:
            new = n - (0 if self._roles is None else self._roles.shape[-1])
            roles = torch.full((len(cache.layers), self.kv_heads, new), KEPT, dtype=torch.int8)
            self._roles = roles if self._roles is None else torch.cat([self._roles, roles], dim=-1)
        if self.policy.compresses(n, self.n_kept, step):
            held = cache.positions()  # [Lyr, Hkv, n] in slot order; new entries sit in the last slots
            ordered, order = held.sort(dim=-1)
            state = PolicyState(
                positions=ordered,
                n_kept=self.n_kept,
                n_prompt=self.n_prompt,
                step=step,
                kv_heads=self.kv_heads,
                colsum=recorder.colsum if recorder is not None and self.policy.needs_colsum else None,
                window_rows=recorder.window_rows if recorder is not None and step == 0 else None,
            )
            sel = self.policy.select(state)
            cache.keep(sel.keep, held=held, order=order)
            if track:
                now = cache.positions()
                self._roles = sel.roles.to(torch.int8).gather(-1, torch.searchsorted(sel.keep, now).cpu())
            if step == 0 and sel.scores is not None:
                self.prefill_scores = sel.scores.float().cpu().numpy()
        if step == 0:
            self.prefill_positions = np.arange(n, dtype=np.int32)
            self.kept = cache.positions().cpu().numpy().astype(np.int32)
            self.kept_roles = self._roles.numpy().copy()
        if self.record_history:
            self.history.append(cache.positions().cpu().numpy().astype(np.int32))
            self.history_roles.append(self._roles.numpy().copy())


@dataclass
class PolicyRun:
    """One greedy generation under a policy (positions are absolute token indices)."""

    policy: str
    params: dict
    position_mode: str
    prompt_ids: list[int]
    tokens: list[str]  # text of every prompt and generated token, by position
    n_compressed: int  # prompt tokens prefilled and compressed; the rest was fed after, uncompressed
    n_kept: int
    generated_ids: list[int]
    text: str
    kept: np.ndarray  # [Lyr, Hkv, k] held right after the prefill compression
    kept_roles: np.ndarray  # [Lyr, Hkv, k] role codes (kvviz.eviction.policies.ROLE_NAMES)
    prefill_scores: np.ndarray | None  # [Lyr, Hkv, n_compressed] scores behind the prefill decision
    history: list[np.ndarray]  # per step (0 = prefill): positions held after it in cache-slot order, [Lyr, Hkv, n]
    history_roles: list[np.ndarray]
    step_bytes: list[int]  # cache bytes after each step, measured from the tensors
    kv_bytes_per_token: int
    stop_reason: str
    timings: dict = field(default_factory=dict)
    logprobs: np.ndarray | None = None  # [N, V] next-token log-probabilities, one row per prediction

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def cache_bytes(self) -> int:
        return self.step_bytes[-1]

    @property
    def full_cache_bytes(self) -> int:
        """What the full cache would hold at the same point: every token fed so far (formula)."""
        return self.kv_bytes_per_token * (self.n_prompt + max(len(self.generated_ids) - 1, 0))

    def kept_lists(self) -> list[list[list[int]]]:
        """The prefill kept set as JSON: per layer, per KV head, sorted positions."""
        return [[sorted(int(p) for p in head) for head in layer] for layer in self.kept]

    def summary(self) -> dict:
        """The CLI's and the API's JSON answer."""
        return {
            "policy": self.policy,
            "params": self.params,
            "position_mode": self.position_mode,
            "prompt_tokens": self.n_prompt,
            "compressed_tokens": self.n_compressed,
            "n_kept": self.n_kept,
            "kept": self.kept_lists(),
            "text": self.text,
            "generated_tokens": len(self.generated_ids),
            "stop_reason": self.stop_reason,
            "cache_bytes": self.cache_bytes,
            "full_cache_bytes": self.full_cache_bytes,
            "timings": self.timings,
        }


def resolve_budget(policy: Policy, n_compressed: int, budget: int | None, ratio: float | None) -> int:
    """n_kept for this policy (the full cache keeps everything); validates the policy against it."""
    if isinstance(policy, FullCache):
        return n_compressed
    n_kept = n_kept_for(n_compressed, budget, ratio)
    policy.validate(n_kept, n_compressed)
    return n_kept


def run_policy(
    lm: LoadedModel,
    prompt_ids: list[int],
    policy: Policy,
    *,
    budget: int | None = None,
    ratio: float | None = None,
    n_compress: int | None = None,
    max_new_tokens: int = 32,
    forced: list[int] | None = None,
    keep_logprobs: bool = False,
    record_history: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> PolicyRun:
    """Greedy generation under ``policy``; see the module docstring.

    ``n_compress``: prefill and compress only the first ``n_compress`` prompt tokens (budget computed
    on them), then feed the rest one by one like decode steps. ``forced``: feed these tokens instead of
    the greedy choice (teacher forcing); ``keep_logprobs`` keeps every next-token distribution.
    """
    ids = [int(i) for i in prompt_ids]
    info = model_info(lm)
    if info.attention == "MLA":
        raise ValueError(
            "Eviction keeps or drops entries per KV head, but this model caches MLA's one shared "
            "latent per token; kvviz does not evict MLA caches."
        )
    n_c = len(ids) if n_compress is None else int(n_compress)
    if not 1 <= n_c <= len(ids):
        raise ValueError(f"n_compress must be between 1 and the prompt length {len(ids)}, got {n_compress}.")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1.")
    if len(ids) + max_new_tokens > info.context_length > 0:
        raise ValueError(
            f"Prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceeds the model's context "
            f"of {info.context_length} tokens."
        )
    n_kept = resolve_budget(policy, n_c, budget, ratio)
    ev = Evictor(lm, policy, n_kept, n_c, record_history, feeds_slot_positions=True)
    needs_rec = policy.needs_colsum or (policy.needs_window_rows and n_kept < n_c)
    t_max = len(ids) + max_new_tokens
    rec = None
    if needs_rec:
        cfg = ev.recorder_config()
        cfg.bin_factor = t_max  # the display maps are not needed here: one bin
        rec = Recorder(info.layers, info.q_heads, t_max, n_c, cfg, lm.device)
    cache = ev.cache_factory(lm)
    if rec is not None:
        rec.cache = cache
    step_bytes: list[int] = []
    logprobs: list[torch.Tensor] = []
    generated: list[int] = []
    stop_reason = "max_new_tokens"
    timings: dict = {}
    step_s: list[float] = []  # wall seconds of each generated token's forward + eviction
    step_cpu_s: list[float] = []  # CPU seconds of the same (this process, all threads): steadier on a busy machine

    def feed(token: int, t: int, step: int) -> torch.Tensor:
        r = rec if policy.needs_colsum else None
        if r is not None:
            r.phase, r.t_total = "decode", t + 1
        start = cache.get_seq_length() if cache.repositions else t
        logits = forward(lm, [token], start, cache, r)[-1]
        ev.after_step(cache, r, step)
        step_bytes.append(cache.nbytes())
        return logits

    t0 = time.perf_counter()
    with torch.inference_mode(), installed(lm.model) if rec is not None else nullcontext():
        if rec is not None:
            rec.phase, rec.t_total = "prefill", n_c
        logits = forward(lm, ids[:n_c], 0, cache, rec)[-1]
        ev.after_step(cache, rec, 0)
        step_bytes.append(cache.nbytes())
        t, step = n_c, 0
        for token in ids[n_c:]:
            step += 1
            logits = feed(token, t, step)
            t += 1
        timings["prefill_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        for i in range(max_new_tokens):
            if keep_logprobs:
                logprobs.append(torch.log_softmax(logits.float(), -1).cpu())
            nxt = int(forced[i]) if forced is not None and i < len(forced) else int(torch.argmax(logits))
            generated.append(nxt)
            if forced is None and nxt in lm.stop_ids:
                stop_reason = "eos"
                break
            if forced is not None and i == len(forced) - 1:
                stop_reason = "forced"
                break
            if i == max_new_tokens - 1:
                break
            if should_stop is not None and should_stop():
                stop_reason = "stopped"
                break
            step += 1
            ts, cs = time.perf_counter(), time.process_time()
            logits = feed(nxt, t, step)
            step_s.append(time.perf_counter() - ts)
            step_cpu_s.append(time.process_time() - cs)
            t += 1
        decode_s = time.perf_counter() - t1
    fed = len(generated) - 1
    timings.update(
        decode_s=decode_s,
        decode_tokens_per_s=fed / decode_s if fed > 0 and decode_s > 0 else None,
        total_s=time.perf_counter() - t0,
        decode_step_median_s=float(np.median(step_s)) if step_s else None,
        decode_step_median_cpu_s=float(np.median(step_cpu_s)) if step_cpu_s else None,
    )
    return PolicyRun(
        policy=policy.name,
        params=policy.params(),
        position_mode=policy.position_mode,
        prompt_ids=ids,
        tokens=token_texts(lm.tokenizer, ids + generated),
        n_compressed=n_c,
        n_kept=n_kept,
        generated_ids=generated,
        text=lm.tokenizer.decode(generated, skip_special_tokens=True),
        kept=ev.kept,
        kept_roles=ev.kept_roles,
        prefill_scores=ev.prefill_scores,
        history=ev.history,
        history_roles=ev.history_roles,
        step_bytes=step_bytes,
        kv_bytes_per_token=info.kv_bytes_per_token,
        stop_reason=stop_reason,
        timings=timings,
        logprobs=torch.stack(logprobs).numpy() if logprobs else None,
    )
