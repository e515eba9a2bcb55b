"""KVzip's context reconstruction: what the model looks at when it is asked to repeat the context it has cached.

After the prefill, the prompt "Repeat the previous context exactly." (then the chat template's turn
change and the context itself, teacher-forced) is fed through a copy of the prefilled cache. Every
repeat query attends to the cached context; a cached entry that some repeat query needs to copy the
context back is worth keeping. :func:`reconstruction_scores` returns, per layer and KV head, the
largest attention any repeat query of the group pays each cached position — the scores KVzip
(Kim et al. 2025) ranks by. Because the repeat pass feeds the context a second time, it costs about
one more prefill (attention over twice the keys): KVzip's 2–3× prefill.

The order of operations is kvpress's ``KVzipPress`` (0.5.5), so the scores and the kept set are its:

- the chat template is read the way kvpress reads it: a dummy user turn splits it into a header (the
  first ``header`` tokens, e.g. SmolLM2's system prompt and ``<|im_start|>user``) and a suffix (end of
  turn, ``<|im_start|>assistant``); the header positions are never reconstructed and keep score 0;
- the context after the header is repeated in chunks of ``chunk_size`` tokens; a later chunk's prompt
  is "Repeat the part of the previous context exactly, starting with" and the last 8 tokens of the
  chunk before; after each chunk the cache is cut back to the prefill;
- the repeat queries' softmax runs over the first ``n_sink`` cached entries, the chunk being
  reconstructed and the repeat tokens themselves (causal), not over the whole cache;
- a position's score is the maximum of that softmax over the repeat queries and the query heads of
  its KV group.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvviz.capture.attention_fn import installed
from kvviz.capture.model_io import forward
from kvviz.models import CaptureError, LoadedModel

REPEAT_FIRST = "\n\nRepeat the previous context exactly."
REPEAT_NEXT = "\n\nRepeat the part of the previous context exactly, starting with"
PREVIOUS_TAIL = 8  # tokens of the chunk before that a later chunk's prompt quotes
DUMMY = "dummy context"
ROWS = 64  # repeat queries scored at once: [Hq, 64, k] stays in cache where [Hq, q, k] went out to memory


def template_parts(tokenizer) -> tuple[int, list[int]]:
    """(header tokens, suffix ids) of the tokenizer's chat template, as kvpress reads them.

    Without a chat template the header is empty and the suffix is a newline.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return 0, _ids(tokenizer, "\n")
    separator = "\n" + "#" * len(DUMMY)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": DUMMY + separator}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    context, suffix = text.split(separator)
    return len(_ids(tokenizer, context.split(DUMMY)[0])), _ids(tokenizer, suffix)


def _ids(tokenizer, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


@dataclass(frozen=True)
class Chunk:
    """One repeat pass: it reconstructs prompt positions ``[start, end)`` by feeding ``ids``."""

    start: int
    end: int
    ids: list[int]


def repeat_chunks(tokenizer, ids: list[int], chunk_size: int) -> tuple[int, list[Chunk]]:
    """(header tokens, the repeat passes) for a prompt of token ``ids``."""
    header, suffix = template_parts(tokenizer)
    if len(ids) <= header:
        raise ValueError(
            f"KVzip reconstructs the context after the chat template's {header}-token header; "
            f"this prompt has only {len(ids)} tokens."
        )
    context = ids[header:]
    pieces = [context[i : i + chunk_size] for i in range(0, len(context), chunk_size)]
    chunks, start = [], header
    for i, piece in enumerate(pieces):
        prompt = (
            _ids(tokenizer, REPEAT_FIRST) if i == 0 else _ids(tokenizer, REPEAT_NEXT) + pieces[i - 1][-PREVIOUS_TAIL:]
        )
        chunks.append(Chunk(start, start + len(piece), prompt + suffix + piece))
        start += len(piece)
    return header, chunks


def repeat_passes(tokenizer, ids: list[int], chunk_size: int) -> tuple[tuple[int, int], ...]:
    """(cached, fed) tokens of each repeat pass over a cache holding the prompt ``ids``: what the pass
    costs (:func:`kvviz.limits.job_cost`), known from the tokenizer before any model work."""
    return tuple((len(ids), len(c.ids)) for c in repeat_chunks(tokenizer, ids, chunk_size)[1])


class _MaxAttention:
    """Stands in for a Recorder during a repeat pass: each layer's largest repeat attention per cached position."""

    def __init__(self, scores: torch.Tensor, n_cached: int, n_sink: int):
        self.scores = scores  # [Lyr, Hkv, n], filled chunk by chunk
        self.n_cached, self.n_sink = n_cached, n_sink
        self.chunk = Chunk(0, 0, [])
        self.seen: set[int] = set()
        self._scratch: torch.Tensor | None = None  # one block of query rows' scores, kept across layers

    def record(self, layer, query, key, mask, scaling, softcap, out, **extra) -> None:
        """query [1, Hq, q, D] (after RoPE), key [1, Hkv, n + q, D]: the cache with the repeat tokens appended.

        The repeat queries are scored ``ROWS`` at a time against the keys they see (the sinks, the chunk
        and the repeat tokens up to their own), keeping only a running max per (KV head, position): the
        numbers of one [Hkv, G, q, k] softmax, without writing that matrix out (~70 MB a layer for 1,000 tokens).
        """
        _, hq, q_len, d = query.shape
        hkv = key.shape[1]
        g, c = hq // hkv, self.chunk
        sink = min(self.n_sink, c.start)
        keys = torch.cat([key[0, :, :sink], key[0, :, c.start : c.end], key[0, :, -q_len:]], dim=1)
        kt = keys.transpose(1, 2).contiguous()  # [Hkv, D, m + q]
        m = sink + c.end - c.start  # keys before the repeat tokens
        queries = query[0].reshape(hkv, g, q_len, d)  # repeat_kv's head order
        best = torch.zeros(hkv, c.end - c.start, dtype=query.dtype, device=query.device)
        low = torch.finfo(query.dtype).min
        causal = torch.zeros(ROWS, ROWS, dtype=query.dtype, device=query.device).masked_fill_(
            torch.ones(ROWS, ROWS, dtype=torch.bool, device=query.device).triu(1), low
        )
        if (
            self._scratch is None
            or self._scratch.numel() < hq * ROWS * (m + q_len)
            or self._scratch.dtype != query.dtype
            or self._scratch.device != query.device
        ):
            self._scratch = query.new_empty(hq * ROWS * (m + q_len))
        for c0 in range(0, q_len, ROWS):
            c1 = min(c0 + ROWS, q_len)
            rows, seen = c1 - c0, m + c1  # no query sees a later repeat token
            s = self._scratch[: hq * rows * seen].view(hkv, g * rows, seen)
            torch.bmm(queries[:, :, c0:c1].reshape(hkv, g * rows, d), kt[:, :, :seen], out=s)
            s.div_(math.sqrt(d))
            s4 = s.view(hkv, g, rows, seen)
            s4[..., seen - rows :].add_(causal[:rows, :rows])
            torch.softmax(s, dim=-1, out=s)
            torch.maximum(best, s4[..., sink:m].amax(dim=(1, 2)), out=best)
        self.scores[layer, :, c.start : c.end] = best.float().to(self.scores.device)
        self.seen.add(layer)

    def record_weights(self, layer, weights, learned_sinks: bool = False) -> None:
        raise CaptureError(
            "KVzip needs the repeat queries; this model's legacy attention hands over probabilities only."
        )

    def end_forward(self) -> None:
        pass


@dataclass
class Reconstruction:
    """``scores`` [Lyr, Hkv, n]: each position's largest repeat attention (0 for the header); the passes; seconds."""

    scores: torch.Tensor
    header: int
    chunks: list[Chunk]
    seconds: float


def reconstruction_scores(
    lm: LoadedModel, keys: torch.Tensor, values: torch.Tensor, ids: list[int], n_sink: int, chunk_size: int
) -> Reconstruction:
    """Run the repeat passes over a cache holding ``keys``/``values`` [Lyr, Hkv, n, D] of the prompt ``ids``.

    The prefilled entries are copied into a fresh cache, so the caller's cache is left as it was.
    """
    layers, hkv, n, _ = keys.shape
    if len(ids) != n:
        raise ValueError(f"The cache holds {n} positions but {len(ids)} prompt tokens were given.")
    header, chunks = repeat_chunks(lm.tokenizer, ids, int(chunk_size))
    t0 = time.perf_counter()
    scores = torch.zeros(layers, hkv, n)
    collector = _MaxAttention(scores, n, int(n_sink))
    with torch.inference_mode(), installed(lm.model):
        for chunk in chunks:  # each pass starts from the prefill alone (kvpress cuts the cache back after each)
            cache = DynamicCache(config=lm.config)
            for layer in range(layers):
                cache.update(keys[layer][None], values[layer][None], layer)
            collector.chunk, collector.seen = chunk, set()
            forward(lm, chunk.ids, n, cache, collector)
            if len(collector.seen) != layers:
                raise CaptureError("The repeat pass did not reach every layer's attention through the capture wrapper.")
    return Reconstruction(scores, header, chunks, time.perf_counter() - t0)
