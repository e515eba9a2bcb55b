"""Prefill + decode over a transformers cache, recording a Trace as the model generates.

``capture_iter`` yields the growing Trace after the prefill and after every decode step (the UI
streams from it); ``capture`` runs to the end. Usage from a notebook::

    from kvviz.models import load_model
    from kvviz.capture.loop import capture
    trace = capture(load_model(), "What is the capital of France?", chat=True, max_new_tokens=16)
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import attention_modules, recording, unpatched
from kvviz.capture.recorder import Recorder, RecorderConfig, installed
from kvviz.capture.tokens import TokenTexts
from kvviz.capture.trace import ModelInfo, Step, Trace
from kvviz.models import LoadedModel

DISPLAY_BUDGET_BYTES = 48 * 2**20  # fp16 binned map + decode rows may use this much (or a quarter of the KV bytes)


@dataclass
class Sampling:
    """Greedy when ``temperature`` is 0; otherwise temperature + nucleus (top-p) sampling."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if not (0.0 <= self.temperature <= 5.0) or not np.isfinite(self.temperature):
            raise ValueError("temperature must be between 0 and 5 (0 = greedy).")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1].")


def model_info(lm: LoadedModel) -> ModelInfo:
    """The attention shape read from the config the way the model reads it (:mod:`kvviz.memory.layout`)."""
    from kvviz.memory.layout import cache_layout

    cfg = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    layout = cache_layout(cfg)
    layers = layout.num_layers
    q_heads, kv_heads, head_dim = layout.num_attention_heads, layout.num_key_value_heads, layout.head_dim
    cache_heads, cache_dims = kv_heads, [head_dim, head_dim]
    if layout.mla:  # attention sees per-head keys and values; the cache holds one latent + one RoPE key
        cache_heads, cache_dims = 1, [layout.mla["kv_lora_rank"], layout.mla["qk_rope_head_dim"]]
    sinks = any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in attention_modules(lm.model))
    kinds = ["full_attention" if spec.layer_type == "mla" else spec.layer_type for spec in layout.layers]
    window = min(layout.windows) if layout.windows else None
    params = sum(p.numel() for p in lm.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    ctx = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 0)
    return ModelInfo(
        name=lm.name,
        model_type=cfg.model_type,
        layers=layers,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=str(lm.dtype).removeprefix("torch."),
        bytes_per_element=torch.tensor([], dtype=lm.dtype).element_size(),
        layer_kinds=kinds,
        sliding_window=window,
        context_length=int(ctx),
        param_count=int(params),
        weight_bytes=int(weight_bytes),
        device=str(lm.device),
        attention=layout.attention,
        cache_heads=cache_heads,
        cache_dims=cache_dims,
        learned_sinks=sinks,
    )


def encode_prompt(lm: LoadedModel, prompt: str, chat: bool) -> list[int]:
    """Token ids of the prompt, through the model's chat template when ``chat``."""
    tok = lm.tokenizer
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return [int(i) for i in ids]
    return [int(i) for i in tok(prompt, add_special_tokens=True)["input_ids"]]


def cache_layer_bytes(cache) -> tuple[list[int], list[int]]:
    """Per layer: entries held and bytes of the stored key and value tensors (not a formula)."""
    lens, sizes = [], []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or keys.numel() == 0:
            lens.append(0)
            sizes.append(0)
            continue
        lens.append(int(keys.shape[-2]))
        sizes.append(int(keys.numel() * keys.element_size() + values.numel() * values.element_size()))
    return lens, sizes


def choose_bin_factor(info: ModelInfo, n_prompt: int, t_max: int, budget: int | None = None) -> int:
    """Smallest bin size whose binned map and decode rows (fp16 in the trace) fit the display budget.

    The budget is the larger of a fixed floor (short runs stay exact, f = 1, up to ~300 tokens in all on
    SmolLM2) and a quarter of the final KV cache, so that with the exact summaries (column sums,
    window rows) a trace stays within 2× the cache it describes at long contexts.
    """
    budget = budget or max(DISPLAY_BUDGET_BYTES, info.kv_bytes_per_token * t_max // 4)
    heads = info.layers * info.q_heads
    f = 1
    while True:
        nb, nqb = -(-t_max // f), -(-n_prompt // f)
        if heads * 2 * (nqb + t_max - n_prompt) * nb <= budget or nb <= 16:
            return f
        f += 1


def _cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _sample(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> int:
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < sampling.top_p
        probs = torch.zeros_like(probs).scatter_(0, idx[keep], sorted_p[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def forward(
    lm: LoadedModel, ids: list[int], start: int, cache, recorder: Recorder | None, logits_to_keep: int = 1
) -> torch.Tensor:
    """One forward of ``ids`` at absolute positions ``start…``; returns logits [q, vocab] (fp32)."""
    x = torch.tensor([ids], device=lm.device)
    pos = torch.arange(start, start + len(ids), device=lm.device)[None]
    kw = {_cache_kwarg(lm.model): cache}
    with recording(lm.model, recorder) as extra:
        out = lm.model(input_ids=x, position_ids=pos, use_cache=True, logits_to_keep=logits_to_keep, **kw, **extra)
    if recorder is not None:
        recorder.end_forward()
    return out.logits[0].float()


def capture_iter(
    lm: LoadedModel,
    prompt: str,
    *,
    chat: bool = True,
    max_new_tokens: int = 64,
    sampling: Sampling | None = None,
    prompt_ids: list[int] | None = None,
    should_stop: Callable[[], bool] | None = None,
    cache_factory: Callable | None = None,
    after_step: Callable | None = None,
    cfg: RecorderConfig | None = None,
    verify: bool = False,
) -> Iterator[Trace]:
    """Generate while recording; yields the same (growing) Trace after each step.

    ``cache_factory(lm)`` builds the cache (default: transformers' DynamicCache, which gives
    sliding-window layers where the config has them); ``after_step(cache, recorder, step)`` runs
    after each forward (an eviction policy compresses the cache there). ``verify`` re-runs the whole
    sequence without a cache at the end and stores the largest logit/attention-output difference.
    """
    sampling = sampling or Sampling()
    sampling.validate()
    info = model_info(lm)
    ids = list(prompt_ids) if prompt_ids is not None else encode_prompt(lm, prompt, chat)
    if not ids:
        raise ValueError("The prompt is empty: type some text.")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1.")
    if len(ids) + max_new_tokens > info.context_length > 0:
        raise ValueError(
            f"Prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceeds the model's "
            f"context of {info.context_length} tokens; shorten the prompt or generate fewer tokens."
        )
    cfg = cfg or RecorderConfig()
    n_prompt, t_max = len(ids), len(ids) + max_new_tokens
    cfg.bin_factor = choose_bin_factor(info, n_prompt, t_max) if cfg.bin_factor <= 1 else cfg.bin_factor
    rec = Recorder(info.layers, info.q_heads, t_max, n_prompt, cfg, lm.device, keep_outputs=verify)
    cache = cache_factory(lm) if cache_factory else DynamicCache(config=lm.config)
    rec.cache = cache
    tok = lm.tokenizer
    texts = TokenTexts(tok)
    trace = Trace(
        model=info,
        prompt=prompt,
        chat=chat,
        n_prompt=n_prompt,
        token_ids=list(ids),
        tokens=[texts.push(i) for i in ids],
        bin_factor=cfg.bin_factor,
        sink_k=cfg.sink_k,
        settings={
            "max_new_tokens": max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "obs_window": cfg.obs_window,
        },
    )
    gen = torch.Generator().manual_seed(int(sampling.seed))
    logits_seen: list[torch.Tensor] = []
    t0 = time.perf_counter()
    with torch.inference_mode(), installed(lm.model):
        feed, start = ids, 0
        for step in range(max_new_tokens):
            rec.phase = "prefill" if step == 0 else "decode"
            rec.t_total = start + len(feed)
            logits = forward(lm, feed, start, cache, rec)[-1]
            if verify:
                logits_seen.append(logits)
            if after_step is not None:
                after_step(cache, rec, step)
            nxt = _sample(logits, sampling, gen)
            trace.token_ids.append(nxt)
            trace.tokens.append(texts.push(nxt))
            lens, sizes = cache_layer_bytes(cache)
            trace.steps.append(
                Step(
                    index=step,
                    token_id=nxt,
                    token=trace.tokens[-1],
                    position=rec.t_total,
                    cache_lens=lens,
                    layer_bytes=sizes,
                    elapsed_s=time.perf_counter() - t0,
                )
            )
            if step == 0:
                trace.timings["prefill_s"] = time.perf_counter() - t0
            if nxt in lm.stop_ids:
                trace.stop_reason = "eos"
            elif step == max_new_tokens - 1:
                trace.stop_reason = "max_new_tokens"
            elif should_stop is not None and should_stop():
                trace.stop_reason = "stopped"
            trace.text = tok.decode(trace.token_ids[n_prompt:], skip_special_tokens=True)
            if trace.stop_reason:
                break
            yield trace
            feed, start = [nxt], rec.t_total
        total = time.perf_counter() - t0
        trace.timings["total_s"] = total
        decode_s = total - trace.timings.get("prefill_s", total)
        trace.timings["decode_tokens_per_s"] = (len(trace.steps) - 1) / decode_s if decode_s > 0 else None
        _finish(trace, rec, cache)
        if verify:
            trace.equivalence = _verify(lm, trace, logits_seen, rec.outputs)
    if verify:  # outside the capture: the model's own attention, nothing of kvviz's in the way
        trace.equivalence.update(_verify_unpatched(lm, trace, logits_seen))
    yield trace


def capture(lm: LoadedModel, prompt: str, **kwargs) -> Trace:
    """Run :func:`capture_iter` to the end and return the finished Trace."""
    *_, trace = capture_iter(lm, prompt, **kwargs)
    return trace


def _finish(trace: Trace, rec: Recorder, cache) -> None:
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
    _kv_stats(trace, cache)


def _kv_stats(trace: Trace, cache) -> None:
    """Norms of every cached key/value and mean |k|, |v| per channel, from the final cache (for MLA,
    of the latent and the RoPE key it stores instead)."""
    info, t = trace.model, trace.n_tokens
    (dk, dv), heads = info.stored_dims, info.stored_heads
    knorm = np.full((info.layers, heads, t), np.nan, dtype=np.float32)
    vnorm = knorm.copy()
    kch = np.zeros((info.layers, heads, dk), dtype=np.float32)
    vch = np.zeros((info.layers, heads, dv), dtype=np.float32)
    for i, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or keys.numel() == 0:
            continue
        k, v = keys[0].float(), values[0].float()  # [Hkv, n, Dk], [Hkv, n, Dv]
        pos = getattr(layer, "kv_positions", None)
        if pos is None:
            pos = torch.arange(trace.n_fed - k.shape[1], trace.n_fed).expand(k.shape[0], -1)
        pos = pos.cpu().numpy()
        for h in range(k.shape[0]):
            knorm[i, h, pos[h]] = k[h].norm(dim=-1).cpu().numpy()
            vnorm[i, h, pos[h]] = v[h].norm(dim=-1).cpu().numpy()
        kch[i] = k.abs().mean(1).cpu().numpy()
        vch[i] = v.abs().mean(1).cpu().numpy()
    trace.key_norms, trace.value_norms = knorm, vnorm
    trace.key_channel_absmean, trace.value_channel_absmean = kch, vch


def _verify(
    lm: LoadedModel, trace: Trace, cached_logits: list[torch.Tensor], cached_outputs: list[torch.Tensor]
) -> dict:
    """The chapter's check on the real model: cached decoding equals full recomputation."""
    fed = trace.token_ids[: trace.n_fed]
    n = len(cached_logits)
    cfg = RecorderConfig(bin_factor=trace.bin_factor)
    rec = Recorder(trace.model.layers, trace.model.q_heads, len(fed), len(fed), cfg, lm.device, keep_outputs=True)
    rec.phase = "outputs"
    rec.t_total = len(fed)
    full = forward(lm, fed, 0, DynamicCache(config=lm.config), rec, logits_to_keep=n)  # [n, V]
    logit_diff = (full - torch.stack(cached_logits)).abs().max().item()
    out_diff = None
    if rec.outputs[0] is not None and all(o is not None for o in cached_outputs):
        ref = rec.outputs[0][:, -n:]  # [Lyr, n, Hq*Dv]: outputs at the positions cached decoding produced
        mine = torch.cat([o[:, -1:] for o in cached_outputs], dim=1)  # last query of each forward
        out_diff = (ref - mine).abs().max().item()
    return {"max_abs_logit_diff": logit_diff, "max_abs_attn_output_diff": out_diff, "positions_checked": n}


def _verify_unpatched(lm: LoadedModel, trace: Trace, cached_logits: list[torch.Tensor]) -> dict:
    """The captured run's logits against the model itself: full recomputation without kvviz's
    attention function (so a capture that changed the model's output would show here)."""
    fed = trace.token_ids[: trace.n_fed]
    n = len(cached_logits)
    with torch.inference_mode(), unpatched(lm.model) as alone:
        full = forward(lm, fed, 0, DynamicCache(config=lm.config), None, logits_to_keep=n)  # [n, V]
    return {
        "max_abs_logit_diff_vs_unpatched": (full - torch.stack(cached_logits)).abs().max().item(),
        "unpatched_reference": alone,
    }
