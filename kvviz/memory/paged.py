"""A paged serving engine's (vLLM's) start-up numbers: KV memory per GPU, blocks, "GPU KV cache size", "Maximum concurrency".

vLLM (v1) allocates the whole KV cache at start-up and logs how much fits. This module computes
those lines for any config with the rules of ``vllm/v1/core/kv_cache_utils.py``:

- a page is one layer's ``block_size`` tokens on one GPU: ``block_size × KV heads per GPU × (key +
  value dims) × bytes`` (MLA: one latent + RoPE key, replicated on every GPU);
- layers of one kind form one KV-cache group; a hybrid (sliding + full) model splits its layers
  into groups of equal size (the smallest kind's count, or the largest when they are within 1.5×),
  every group shares one pool of blocks, and a block is one page in each layer of a group;
- ``blocks = ⌊KV memory per GPU / (page × layers per group)⌋``; ``GPU KV cache size = ⌊blocks /
  groups⌋ × block_size``;
- one request of ``max_model_len`` tokens needs ``⌈M / B⌉`` blocks in a full-attention group,
  ``⌈min(W − 1 + max_num_batched_tokens, M) / B⌉ + 1`` in a sliding group (window W) and
  ``⌈min(C + max_num_batched_tokens, M) / B⌉`` in a chunked one; ``Maximum concurrency = blocks /
  blocks per request``.

The KV memory per GPU is :func:`kvviz.memory.capacity.kv_budget` (GPU memory minus the reserve,
minus the weights) divided over the GPUs; kvviz's reserve stands for vLLM's ``1 −
gpu_memory_utilization`` plus the activations it profiles. With more GPUs than the TP degree the
rest is pipeline parallelism (layers split evenly over the stages).

    from kvviz.memory.paged import startup
    s = startup(cache_layout(load_preset("Llama-3-70B")), gpus=8, gpu_mem_gb=80, weight_bytes=140e9,
                block_size=16, max_model_len=8192)
    print(s.log)   # ... GPU KV cache size: 1,330,560 tokens / Maximum concurrency ...: 162.42x
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.limits import MAX_CONTEXT, bounded_int
from kvviz.memory.capacity import Budget, kv_budget
from kvviz.memory.estimate import KVDtype, _tp_heads_per_gpu, layer_bytes_per_token, resolve_kv_dtype
from kvviz.memory.layout import CacheLayout
from kvviz.units import format_bytes

GiB = 2**30
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's scheduler default for an online server (it varies by version/GPU)
ADVICE = (
    "Fewer than one request of max_model_len tokens fits, so vLLM would refuse to start: lower "
    "--max-model-len (to at most {fit:,} here), store the KV cache in fp8, shrink the reserve (raise "
    "gpu_memory_utilization), shard over more GPUs (higher tensor parallelism) or quantize the weights."
)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KindGroup:
    """The layers of one attention kind on this engine: how many, their page and what a request needs."""

    kind: str  # "full", "sliding", "chunked" or "mla"
    window: int | None
    layers: int  # in the whole model
    groups: int  # KV-cache groups these layers are split into
    page_bytes: int  # one layer's block_size tokens on one GPU
    blocks_per_request: int  # per group, for one request of max_model_len tokens
    request_expr: str  # the formula of blocks_per_request, with numbers


@dataclass(frozen=True)
class PagedStartup:
    """What a paged engine prints at start-up, and every number behind it (bytes, per GPU)."""

    model: str
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    kv_dtype: str
    gpus: int
    tp: int
    pp: int
    budget: Budget
    kv_bytes_per_gpu: int
    kinds: tuple[KindGroup, ...]
    layers_per_group: int  # in the whole model
    layers_per_group_per_gpu: int  # on one pipeline stage
    bytes_per_block_per_gpu: int
    page_expr: str

    @property
    def num_groups(self) -> int:
        return sum(k.groups for k in self.kinds)

    @property
    def num_blocks(self) -> int:
        return self.kv_bytes_per_gpu // self.bytes_per_block_per_gpu

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_blocks // self.num_groups * self.block_size

    @property
    def blocks_per_request(self) -> int:
        return sum(k.groups * k.blocks_per_request for k in self.kinds)

    @property
    def max_concurrency(self) -> float:
        return self.num_blocks / self.blocks_per_request

    def fitting_model_len(self) -> int:
        """Longest max_model_len whose one request fits in the blocks (vLLM's estimate when it refuses)."""
        lo, hi = 0, self.max_model_len
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _request_blocks(self, mid) <= self.num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def concurrency_at(self, model_len: int) -> float:
        """Maximum concurrency the same blocks would give requests of ``model_len`` tokens."""
        return self.num_blocks / _request_blocks(self, bounded_int(model_len, "max_model_len", 1, MAX_CONTEXT))

    @property
    def advice(self) -> str:
        return ADVICE.format(fit=self.fitting_model_len()) if self.max_concurrency < 1 else ""

    @property
    def log_lines(self) -> list[str]:
        return [
            f"Available KV cache memory: {self.kv_bytes_per_gpu / GiB:.2f} GiB",
            f"# GPU blocks: {self.num_blocks}",
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
        ]

    @property
    def log(self) -> str:
        return "\n".join(f"INFO {line}" for line in self.log_lines)

    def formulas(self) -> list[tuple[str, str]]:
        """(number in the log, the formula that gives it with this config's values), one per log line."""
        b = self.budget
        mem = (
            f"{b.gpus} × {b.gpu_mem_bytes / 1e9:g} GB × (1 − {b.reserve:g} reserve) − {b.weight_bytes / 1e9:,.2f} GB "
            f"weights = {b.kv_budget_bytes / 1e9:,.2f} GB over {b.gpus} GPU{'s' if b.gpus > 1 else ''} → "
            f"{self.kv_bytes_per_gpu:,} B per GPU = {self.kv_bytes_per_gpu / GiB:.2f} GiB"
        )
        per_layer = self.layers_per_group_per_gpu
        block = (
            f"⌊{self.kv_bytes_per_gpu:,} B / {self.bytes_per_block_per_gpu:,} B per block⌋ = "
            f"{self.num_blocks:,} blocks, where one block = {self.page_expr} per layer × {per_layer} "
            f"layer{'s' if per_layer > 1 else ''} per group"
            + (f" on each of {self.pp} pipeline stages" if self.pp > 1 else "")
            + f" = {self.bytes_per_block_per_gpu:,} B ({format_bytes(self.bytes_per_block_per_gpu)})"
        )
        g = self.num_groups
        tokens = (
            f"⌊{self.num_blocks:,} blocks / {g} group{'s' if g > 1 else ''}⌋ × {self.block_size} tokens = "
            f"{self.kv_cache_tokens:,} tokens"
        )
        per_req = " + ".join(f"{k.groups} × {k.request_expr}" if k.groups > 1 else k.request_expr for k in self.kinds)
        conc = (
            f"{self.num_blocks:,} blocks / {self.blocks_per_request:,} blocks per request ({per_req}) = "
            f"{self.max_concurrency:.2f}"
        )
        return list(zip(self.log_lines, [mem, block, tokens, conc]))

    def to_json(self) -> dict:
        return {
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "tp": self.tp,
            "pp": self.pp,
            "kv_bytes_per_gpu": self.kv_bytes_per_gpu,
            "bytes_per_block_per_gpu": self.bytes_per_block_per_gpu,
            "num_blocks": self.num_blocks,
            "kv_cache_groups": self.num_groups,
            "layers_per_group": self.layers_per_group,
            "kv_cache_tokens": self.kv_cache_tokens,
            "blocks_per_request": self.blocks_per_request,
            "max_concurrency": self.max_concurrency,
            "groups": [
                {
                    "kind": k.kind,
                    "window": k.window,
                    "layers": k.layers,
                    "groups": k.groups,
                    "page_bytes": k.page_bytes,
                    "blocks_per_request": k.blocks_per_request,
                }
                for k in self.kinds
            ],
            "log": self.log,
            "advice": self.advice,
        }


def _request_blocks(s: PagedStartup, model_len: int) -> int:
    return sum(
        k.groups * _blocks_needed(k.kind, k.window, model_len, s.block_size, s.max_num_batched_tokens) for k in s.kinds
    )


def _blocks_needed(kind: str, window: int | None, model_len: int, b: int, batched: int) -> int:
    if kind not in ("sliding", "chunked"):
        return cdiv(model_len, b)
    if window is None:
        raise ValueError(f"A {kind} layer group needs its window size.")
    if kind == "sliding":
        return cdiv(min(window - 1 + batched, model_len), b) + 1  # the window may straddle one more block
    return cdiv(min(window + batched, model_len), b)


def _request_expr(kind: str, window: int | None, model_len: int, b: int, batched: int) -> str:
    n = _blocks_needed(kind, window, model_len, b, batched)
    if kind == "sliding":
        return f"(⌈min({window} − 1 + {batched}, {model_len:,}) / {b}⌉ + 1 = {n:,})"
    if kind == "chunked":
        return f"⌈min({window} + {batched}, {model_len:,}) / {b}⌉ = {n:,}"
    return f"⌈{model_len:,} / {b}⌉ = {n:,}"


def startup(
    layout: CacheLayout,
    *,
    gpus: int,
    gpu_mem_gb: float,
    weight_bytes: int,
    reserve: float = 0.1,
    tp: int | None = None,
    kv_dtype: str | KVDtype = "bf16",
    group_size: int | None = None,
    block_size: int = 16,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> PagedStartup:
    """The start-up numbers of a paged engine serving ``layout`` (see the module docstring)."""
    b = bounded_int(block_size, "block size", 1, 4096)
    model_len = layout.max_position_embeddings if max_model_len is None else max_model_len
    if model_len is None:
        raise ValueError("The config states no context length: give max_model_len.")
    model_len = bounded_int(model_len, "max_model_len", 1, MAX_CONTEXT)
    batched = bounded_int(max_num_batched_tokens, "max_num_batched_tokens", 1, MAX_CONTEXT)
    tp = gpus if tp is None else tp
    tp = bounded_int(tp, "tensor parallelism", 1, 1024)
    if gpus % tp:
        raise ValueError(
            f"{gpus} GPUs cannot run TP={tp}: the number of GPUs must be a multiple of the TP degree "
            "(the rest is pipeline parallelism)."
        )
    pp = gpus // tp
    dtype = resolve_kv_dtype(kv_dtype, group_size)
    budget = kv_budget(gpus, gpu_mem_gb, int(weight_bytes), reserve)
    kinds, per_group, page_expr = _kinds(layout, dtype, tp, b, model_len, batched)
    if pp > per_group:
        raise ValueError(f"{pp} pipeline stages for {per_group} layers per group: use fewer GPUs or a higher TP.")
    per_gpu_layers = cdiv(per_group, pp)
    return PagedStartup(
        layout.name,
        b,
        model_len,
        batched,
        dtype.name,
        gpus,
        tp,
        pp,
        budget,
        budget.kv_budget_bytes // gpus,
        tuple(kinds),
        per_group,
        per_gpu_layers,
        kinds[0].page_bytes * per_gpu_layers,
        page_expr,
    )


def _kinds(
    layout: CacheLayout, dtype: KVDtype, tp: int, b: int, model_len: int, batched: int
) -> tuple[list[KindGroup], int, str]:
    """The model's layers by attention kind, split into vLLM's equal-size KV-cache groups."""
    specs: dict[tuple, list] = {}
    for layer in layout.layers:
        if layer.state_elements:
            raise ValueError(
                f"Layer {layer.index} keeps a fixed state ({layer.kind}): vLLM pages Mamba/linear "
                "states with rules of their own, which kvviz does not model."
            )
        if not layer.vectors:
            continue  # no cache at all
        per_token = layer_bytes_per_token(layer, dtype) // layer.kv_heads * _tp_heads_per_gpu(layer.kv_heads, tp)
        kind = "full" if layer.kind == "mla" else layer.kind
        specs.setdefault((kind, layer.window if kind != "full" else None), []).append((layer, per_token))
    if not specs:
        raise ValueError("This model caches no keys or values: a paged engine has nothing to allocate.")
    pages = {per_token * b for items in specs.values() for _, per_token in items}
    first, per_token0 = next(iter(specs.values()))[0]
    heads = _tp_heads_per_gpu(first.kv_heads, tp)
    dims = (
        " + ".join(str(length) for length, _ in first.vectors)
        if first.kind == "mla" or len(first.vectors) > 1
        else f"2 × {first.vectors[0][0]}"
    )
    what = "latent (replicated)" if first.kind == "mla" else f"KV head{'s' if heads > 1 else ''}"
    page_expr = f"{b} tokens × {heads} {what} per GPU × ({dims}) × {dtype.bits / 8:g} B = {per_token0 * b:,} B"
    if len(specs) == 1:  # one kind: one group of every layer, each layer its own page size if they differ
        (kind, window), items = next(iter(specs.items()))
        page = sum(pt for _, pt in items) * b
        uniform = len(pages) == 1  # else one page spans every layer (vLLM's UniformTypeKVCacheSpecs)
        group = KindGroup(
            kind,
            window,
            len(items),
            1,
            page // len(items) if uniform else page,
            _blocks_needed(kind, window, model_len, b, batched),
            _request_expr(kind, window, model_len, b, batched),
        )
        if uniform:
            return [group], len(items), page_expr
        return [group], 1, f"{b} tokens × the per-token bytes of every layer = {page:,} B"
    if len(pages) > 1:
        raise ValueError(
            "Hybrid layers with different page sizes: vLLM enlarges the smaller pages' block size to "
            "match, which kvviz does not model."
        )
    counts = [len(items) for items in specs.values()]
    lo, hi = min(counts), max(counts)
    size = hi if hi < lo * 1.5 else lo
    kinds = [
        KindGroup(
            kind,
            window,
            len(items),
            cdiv(len(items), size),
            next(iter(pages)),
            _blocks_needed(kind, window, model_len, b, batched),
            _request_expr(kind, window, model_len, b, batched),
        )
        for (kind, window), items in specs.items()
    ]
    return kinds, size, page_expr


def from_report(
    layout: CacheLayout,
    report: dict,
    block_size: int = 16,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> PagedStartup:
    """The start-up numbers for the GPUs, weights, reserve, TP and KV dtype of a :func:`capacity.report`."""
    if "kv_budget_bytes" not in report:
        raise ValueError(
            "The engine's start-up numbers need the GPU memory: give --gpu or --gpu-mem-gb "
            "(and the weights, unless the preset knows its parameter count)."
        )
    return startup(
        layout,
        gpus=report["gpus"],
        gpu_mem_gb=report["gpu_mem_bytes"] / 1e9,
        weight_bytes=report["weight_bytes"],
        reserve=report["reserve"],
        tp=report["tp"],
        kv_dtype=report["kv_dtype"],
        group_size=report["group_size"],
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
    )
