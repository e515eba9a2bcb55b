"""Generate under an eviction policy with a cache that really shrinks, and record what it kept.

``Evictor`` is the glue between a policy and an :class:`~kvviz.eviction.cache.EvictingCache`: its
``cache_factory``/``after_step`` plug into the generation loop
(:class:`~kvviz.capture.generation.Generation`, as :func:`kvviz.capture.loop.capture_iter` takes them).
``run_policy`` drives one such generation greedily for the eviction views (through the solo driver,
:func:`kvviz.capture.drive.forwards`): it can prefill and compress
only the context and then feed the question uncompressed, feed a forced continuation (teacher forcing,
for KL against the full cache), re-position keys (StreamingLLM), and it records the kept set after
every step.
Usage::

    from kvviz.eviction.run import run_policy
    from kvviz.eviction.policies import make_policy
    run = run_policy(lm, ids, make_policy("snapkv"), budget=96, max_new_tokens=16)
    run.text, run.kept.shape  # answer, [layers, kv_heads, 96]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from kvviz.capture.drive import forwards
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import model_info
from kvviz.capture.options import CacheSetup, Decode, Feed, Recording
from kvviz.capture.recorder import Recorder, RecorderConfig
from kvviz.eviction.cache import EvictingCache, KeyRerotator
from kvviz.eviction.held import held_kv, ragged_roles, role_map
from kvviz.eviction.policies import KEPT, FullCache, Policy, PolicyState, n_kept_for
from kvviz.eviction.query_stats import QueryStats, collecting
from kvviz.eviction.reconstruction import reconstruction_scores
from kvviz.eviction.served import quantize_kept, served_bytes
from kvviz.models import LoadedModel
from kvviz.quant.schemes import Scheme


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
        ratio: float | None = None,
    ):
        """``feeds_slot_positions``: the caller accepts position ids = cache slots when the policy re-positions
        keys (``run_policy`` does; a capture's views place every key at its original position).
        ``ratio``: the compression ratio asked for, when the budget was given as one (PyramidKV's formula uses it)."""
        info = model_info(lm)
        self.lm = lm
        self.context_ids: list[int] | None = None  # the compressed prompt's ids, set by the caller (KVzip's repeat)
        self.reconstruction_s: float | None = None  # seconds of the context-reconstruction pass, when one ran
        self.feeds_slot_positions = feeds_slot_positions
        self.ratio = ratio
        self.query_stats: QueryStats | None = (
            None  # set by the caller after the prefill for policies with a query_stats_skip
        )
        self.held_bytes0: int | None = None  # bytes of the entries held right after step 0 (padding excluded)
        self._role_map: torch.Tensor | None = None  # [Lyr, Hkv, n_prompt] role per prompt position (ragged caches)
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
        """The evicting cache; it re-rotates kept keys to their slots when the policy re-positions them
        (the generation loop then feeds slot positions: the cache says it ``repositions``)."""
        rerotator = None
        if self.policy.position_mode != "original":
            if not self.feeds_slot_positions:
                raise ValueError(
                    "Re-positioning keys feeds cache-slot positions, which a capture's views do not place: "
                    "run the policy with kvviz.eviction.run.run_policy."
                )
            rerotator = KeyRerotator.from_model(lm.model)
        return EvictingCache(lm.config, rerotator)

    def after_step(self, cache: EvictingCache, recorder: Recorder | None, step: int) -> None:
        """Compress if the policy wants to now; then record what is held (in cache-slot order)."""
        track = self.record_history or step == 0  # roles are bookkeeping for the views only
        n = cache.get_seq_length()
        if track and not cache.ragged:
            new = n - (0 if self._roles is None else self._roles.shape[-1])
            roles = torch.full((len(cache.layers), self.kv_heads, new), KEPT, dtype=torch.int8)
            self._roles = roles if self._roles is None else torch.cat([self._roles, roles], dim=-1)
        if self.policy.compresses(n, self.n_kept, step):
            held = cache.positions()  # [Lyr, Hkv, n] in slot order; new entries sit in the last slots
            ordered, order = held.sort(dim=-1)
            sel = self.policy.select(self.state(cache, recorder, step, ordered, order))
            cache.keep(sel.keep, held=held, order=order)
            if track and cache.ragged:
                self._role_map = role_map(sel, self.n_prompt)
            elif track:
                now = cache.positions()
                self._roles = sel.roles.to("cpu", torch.int8).gather(-1, torch.searchsorted(sel.keep, now).cpu())
            if step == 0 and sel.scores is not None:
                self.prefill_scores = sel.scores.float().cpu().numpy()
        if track and cache.ragged:
            if self._role_map is None:
                raise RuntimeError("The cache became ragged without a decision of this run.")
            self._roles = ragged_roles(cache.positions(), self._role_map, self.n_prompt)
        if step == 0:
            self.prefill_positions = np.arange(n, dtype=np.int32)
            self.kept = cache.positions().cpu().numpy().astype(np.int32)
            self.kept_roles = self._tracked_roles().numpy().copy()
            self.held_bytes0 = cache.held_bytes()
        if self.record_history:
            self.history.append(cache.positions().cpu().numpy().astype(np.int32))
            self.history_roles.append(self._tracked_roles().numpy().copy())

    def _tracked_roles(self) -> torch.Tensor:
        """Roles of the held entries in slot order [Lyr, Hkv, n] (tracked at step 0 and with the history)."""
        if self._roles is None:
            raise RuntimeError("No roles are tracked before the first step.")
        return self._roles

    def state(
        self, cache: EvictingCache, recorder: Recorder | None, step: int, ordered: torch.Tensor, order: torch.Tensor
    ) -> PolicyState:
        """What the policy sees: held positions ascending, and the summaries and tensors it asked for."""
        keys = values = reconstruction = None
        if self.policy.needs_kv:
            keys, values = held_kv(cache, order)
        repeat = self.policy.reconstruction_pass
        if repeat is not None and step == 0:
            if self.context_ids is None or keys is None or values is None:
                raise ValueError("KVzip re-reads the compressed prompt: run it with kvviz.eviction.run.run_policy.")
            rec = reconstruction_scores(self.lm, keys, values, self.context_ids, *repeat)
            reconstruction, self.reconstruction_s = rec.scores, rec.seconds
        return PolicyState(
            positions=ordered,
            n_kept=self.n_kept,
            n_prompt=self.n_prompt,
            step=step,
            kv_heads=self.kv_heads,
            colsum=recorder.colsum if recorder is not None and self.policy.needs_colsum else None,
            window_rows=recorder.window_rows if recorder is not None and step == 0 else None,
            keys=keys,
            values=values,
            query_stats=self.query_stats if step == 0 else None,
            ratio=self.ratio,
            reconstruction=reconstruction,
        )


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
    held_bytes: int | None = (
        None  # after the prefill: bytes of the entries held (padding slots of ragged heads excluded)
    )
    served_bytes: int | None = None  # after the prefill: the held entries as served (16-bit, or packed when quantized)

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
        """The prefill kept set as JSON: per layer, per KV head, sorted positions (padding slots left out)."""
        return [[sorted(int(p) for p in head if p >= 0) for head in layer] for layer in self.kept]

    def kept_counts(self) -> np.ndarray:
        """Entries each layer and KV head keeps after the prefill: [Lyr, Hkv]."""
        return (self.kept >= 0).sum(-1)

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
            "held_bytes_after_prefill": self.held_bytes,
            "timings": self.timings,
        }


@dataclass(frozen=True)
class EvictionRequest:
    """A checked eviction run: prompt ids, the policy, its budget (tokens or ratio), how much is compressed."""

    ids: list[int]
    policy: Policy
    budget: int | None
    ratio: float | None
    n_compress: int
    max_new_tokens: int
    # (cached, fed) tokens of each repeat pass the policies of the job make (KVzip), for its cost estimate
    repeat_passes: tuple[tuple[int, int], ...] = ()

    def run(self, lm: LoadedModel, **kwargs) -> PolicyRun:
        """:func:`run_policy` on this request (``kwargs``: record_history, should_stop, ...)."""
        return run_policy(
            lm,
            self.ids,
            self.policy,
            budget=self.budget,
            ratio=self.ratio,
            n_compress=self.n_compress,
            max_new_tokens=self.max_new_tokens,
            **kwargs,
        )


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
    quant: Scheme | None = None,
) -> PolicyRun:
    """Greedy generation under ``policy``; see the module docstring.

    ``n_compress``: prefill and compress only the first ``n_compress`` prompt tokens (budget computed
    on them), then feed the rest one by one like decode steps. ``forced``: feed these tokens instead of
    the greedy choice (teacher forcing); ``keep_logprobs`` keeps every next-token distribution.
    ``quant``: store what the policy keeps under this quantization scheme (:mod:`kvviz.eviction.compose`).

    Length: the prefill, the compression hook and the decode share one generation's state, so they read in order here.
    """
    ids = [int(i) for i in prompt_ids]
    info = model_info(lm)
    if info.attention == "MLA":
        raise ValueError(
            "Eviction keeps or drops entries per KV head, but this model caches MLA's one shared "
            "latent per token; kvviz does not evict MLA caches."
        )
    n_c = len(ids) if n_compress is None else int(n_compress)  # Generation checks it (prefill_tokens)
    n_kept = resolve_budget(policy, n_c, budget, ratio)
    ev = Evictor(lm, policy, n_kept, n_c, record_history, feeds_slot_positions=True, ratio=ratio)
    ev.context_ids = ids[:n_c]
    cfg = ev.recorder_config()
    cfg.bin_factor = len(ids) + max_new_tokens  # the display maps are not needed here: one bin
    step_bytes: list[int] = []
    served: list[int | None] = []

    def after_step(cache: EvictingCache, rec: Recorder | None, step: int) -> None:
        ev.after_step(cache, rec, step)
        if step == 0:
            if quant is not None:
                quantize_kept(cache, quant)
            served.append(served_bytes(cache, quant))
        step_bytes.append(cache.nbytes())

    g = Generation(  # checks the prompt, n_compress, max_new_tokens and the model's context
        lm,
        "",
        feed=Feed(chat=False, prompt_ids=ids, prefill_tokens=n_c, forced=forced),
        decode=Decode(max_new_tokens=max_new_tokens, should_stop=should_stop, stop_on_eos=forced is None),
        cache=CacheSetup(factory=ev.cache_factory, after_step=after_step),
        recording=Recording(
            cfg=cfg,
            on=policy.needs_colsum or (policy.needs_window_rows and n_kept < n_c),
            decode=policy.needs_colsum,
            keep_logprobs=keep_logprobs,
        ),
    )
    skip = policy.query_stats_skip if n_kept < n_c else None

    @contextmanager
    def prefill_stats() -> Iterator[None]:
        """The prefill's query statistics, for the policy's decision that ``g.take`` then makes."""
        assert skip is not None  # only entered when the policy asked for statistics (``around``)
        with collecting(lm.model, skip, [n_c]) as stats:
            yield
        ev.query_stats = stats(n_c)

    def around(run: Generation):
        return prefill_stats() if skip is not None and run.fed == 0 else nullcontext()

    timings: dict = {}
    step_s: list[float] = []  # wall seconds of each generated token's step (forward, eviction, bookkeeping)
    step_cpu_s: list[float] = []  # CPU seconds of the same (this process, all threads): steadier on a busy machine
    wrapped = g.rec is not None or (policy.ragged and n_kept < n_c)  # ragged caches mask through the wrapper
    t0 = t1 = time.perf_counter()
    for f in forwards(lm, g, wrapped=wrapped, around=around):
        if f.decode:
            step_s.append(f.wall_s)
            step_cpu_s.append(f.cpu_s)
        elif f.produced:
            t1 = time.perf_counter()
            timings["prefill_s"] = t1 - t0
    decode_s = time.perf_counter() - t1
    if ev.reconstruction_s is not None:
        timings["reconstruction_s"] = ev.reconstruction_s  # inside prefill_s: the repeat pass runs at step 0
    generated = g.trace.token_ids[len(ids) :]
    fed = len(generated) - 1
    timings.update(
        decode_s=decode_s,
        decode_tokens_per_s=fed / decode_s if fed > 0 and decode_s > 0 else None,
        total_s=time.perf_counter() - t0,
        decode_step_median_s=float(np.median(step_s)) if step_s else None,
        decode_step_median_cpu_s=float(np.median(step_cpu_s)) if step_cpu_s else None,
    )
    if ev.kept is None or ev.kept_roles is None:
        raise RuntimeError("The run ended before its prefill was compressed.")
    return PolicyRun(
        policy=policy.name,
        params=policy.params(),
        position_mode=policy.position_mode,
        prompt_ids=ids,
        tokens=list(g.trace.tokens),
        n_compressed=n_c,
        n_kept=n_kept,
        generated_ids=generated,
        text=g.trace.text,
        kept=ev.kept,
        kept_roles=ev.kept_roles,
        prefill_scores=ev.prefill_scores,
        history=ev.history,
        history_roles=ev.history_roles,
        step_bytes=step_bytes,
        kv_bytes_per_token=info.kv_bytes_per_token,
        stop_reason=g.trace.stop_reason,
        timings=timings,
        logprobs=torch.stack(g.logprobs).numpy() if g.logprobs else None,
        held_bytes=ev.held_bytes0,
        served_bytes=served[0],
    )
