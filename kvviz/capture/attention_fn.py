"""The capture attention function: the model's own attention, with the run's recorder beside it.

``installed(model)`` routes a model's attention through :func:`capture_attention` for a run. The
wrapper calls the very implementation the model was loaded with (its modeling file's
``eager_attention_forward``, or transformers' SDPA / flex / flash function), with every argument
the model passed (learned sinks, soft-capping, sliding windows, scalings), so the model's output
is its own; the recorder then gets the same tensors, and the probabilities when the implementation
returns them. One call is computed by kvviz instead: plain causal SDPA in fp32 (nothing but
softmax(QKᵀ·scale + causal mask)·V), whose probabilities the recorder has to compute anyway — it
multiplies them by the values itself rather than have SDPA compute them a second time, and checks
that output against SDPA's own on the call's last queries (every prefill forward, the first decode
step); the equivalence check compares the whole run with the model as loaded. Models whose layers do not hand
a forward's extra arguments down to the interface (Falcon since transformers 5.25, whose ALiBi arrives in the
mask) get the run's recorder from the model call itself (:func:`_keep_given`). Models whose attention
never calls transformers' AttentionInterface (Bloom, MPT, Falcon before 5.25: "legacy" attention) run their own
eager path with ``output_attentions`` instead, and a forward hook per attention layer hands those
probabilities to the recorder. :func:`kvviz.models.check_capturable` refuses,
in one line naming the feature, what cannot be captured; ``unpatched`` holds the model without
the wrapper (the equivalence check's reference).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from contextlib import AbstractContextManager, contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kvviz.adapters.transformers import (
    attn_implementation,
    fold_sparse_indices,
    force_attn_implementation,
    mask_function,
)
from kvviz.capture.attention_math import agree
from kvviz.models import CaptureError, attention_modules, check_capturable, uses_interface

NAME = "kvviz_capture"
RECORDER_KWARG = "kvviz_recorder"
# a forward argument: ``override(module, query, key, value, mask, implementation, ...)`` computes this forward's
# attention instead (an evicting cache whose heads hold different numbers of entries masks its padding slots)
OVERRIDE_KWARG = "kvviz_attention_override"
_cond = threading.Condition()
_users: dict[int, dict] = {}  # id(model) -> {"count", "previous", "legacy", "hooks"}
_exclusive: set[int] = set()  # models held without the wrapper (see ``unpatched``)
_wanted: dict[int, int] = {}  # id(model) -> threads waiting in ``unpatched`` for it (a ``Held`` lets go for them)
_wraps: dict[str, str] = {}  # registered name -> the implementation it calls
_tls = threading.local()  # the recorder of this thread's forward, for legacy attention's hooks
_eager_agrees: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # legacy models checked once


def _name_for(impl: str) -> str:
    """The registered name that wraps ``impl``. The names avoid "sdpa", "eager", "flash" and "flex",
    which transformers' own dispatch checks look for inside implementation names."""
    for name, wrapped in _wraps.items():
        if wrapped == impl:
            return name
    name = NAME if not _wraps else f"{NAME}_{len(_wraps)}"
    AttentionInterface.register(name, capture_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, mask_function(impl))  # the mask ``impl`` would get
    _wraps[name] = impl
    return name


def _implementation(module, impl: str):
    """The function the module's forward would call for ``impl``: for eager, the ``eager_attention_forward``
    its own modeling file defines (gpt-oss's adds learned sinks, Gemma-2's soft-capping)."""
    forward_globals = inspect.unwrap(type(module).forward).__globals__
    eager = forward_globals.get("eager_attention_forward")
    if impl == "eager" and eager is None:
        raise CaptureError(f"{type(module).__name__} defines no eager_attention_forward; kvviz cannot call it.")
    return ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)


def _learned_sinks(kwargs: dict, q_heads: int) -> torch.Tensor | None:
    """Per-head sink logits ([Hq]) the model passes (gpt-oss's ``s_aux``), else None."""
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    return sinks if isinstance(sinks, torch.Tensor) and sinks.numel() == q_heads else None


def capture_attention(module, query, key, value, attention_mask, *args, **kwargs):
    """The wrapped implementation's output (and weights), plus a call to the run's recorder, if any.

    query: [B, Hq, q, Dk]; key: [B, Hkv, k, Dk]; value: [B, Hkv, k, Dv] (the layer's whole cache).
    """
    given = _given()  # what the model's caller passed, for models whose layers drop extra arguments
    recorder = kwargs.pop(RECORDER_KWARG, given.get(RECORDER_KWARG))
    override = kwargs.pop(OVERRIDE_KWARG, given.get(OVERRIDE_KWARG))
    impl = _wraps.get(attn_implementation(getattr(module, "config", None)))
    if impl is None:
        raise CaptureError(f"{type(module).__name__} has no config naming its attention implementation.")
    implementation = _implementation(module, impl)
    indices = kwargs.pop("indices", None)  # DeepSeek sparse attention's top-k keys, meant for a sparse kernel
    if indices is not None and impl in ("eager", "sdpa"):
        attention_mask = fold_sparse_indices(attention_mask, indices, key.shape[-2], query.dtype)
    if override is not None:
        if recorder is not None:
            raise CaptureError("An attention override and a recorder do not combine in one forward.")
        return override(module, query, key, value, attention_mask, implementation, *args, **kwargs)
    attend = getattr(recorder, "attend", None)
    if attend is not None:  # a packed forward: each sequence's rows against its own cache (kvviz.capture.packed)
        return attend(module, implementation, query, *args, **kwargs)
    return attend_one(recorder, module, implementation, query, key, value, attention_mask, *args, **kwargs)


def attend_one(recorder, module, implementation, query, key, value, attention_mask, *args, **kwargs):
    """One sequence's attention and its recording. A plain causal SDPA call in fp32 takes its output
    from the recorder's own probabilities (:meth:`~kvviz.capture.recorder.Recorder.own_output`, which
    checks it against the implementation on the call's last queries): the probabilities are computed
    once instead of twice. Every other call runs the implementation, then the recorder."""
    return attend_checked(recorder, module, implementation, query, key, value, attention_mask, args, kwargs)


def attend_checked(
    recorder, module, implementation, query, key, value, attention_mask, args: tuple, kwargs: dict, probe=None
):
    """:func:`attend_one`, where ``probe(rows, mask, mine)`` checks the recorder's own output (see
    :meth:`~kvviz.capture.recorder.Recorder.own_output`); None: at once, against the implementation run on the
    call's last ``rows`` queries. A packed forward checks its sequences' rows together instead."""
    own = getattr(recorder, "own_output", None)
    if own is not None and plain_sdpa(module, implementation, query, kwargs):
        if probe is None:

            def probe(rows: int, mask, mine: torch.Tensor) -> None:
                ref = implementation(module, query[:, :, -rows:], key, value, mask, *args, **kwargs)[0]
                agree(module.layer_idx, mine, ref, query.dtype, "its probabilities × values do not reproduce")

        out = own(module.layer_idx, query, key, value, attention_mask, kwargs.get("scaling"), probe)
        if out is not None:
            return out, None
    out, weights = implementation(module, query, key, value, attention_mask, *args, **kwargs)
    if recorder is not None:
        record_call(recorder, module, query, key, value, attention_mask, out, weights, kwargs)
    return out, weights


def plain_sdpa(module, implementation, query, kwargs: dict) -> bool:
    """Whether a call is transformers' SDPA with nothing beyond softmax(QKᵀ·scale + causal mask)·V: no
    soft-cap, learned sinks, position bias, window argument or dropout, and causal."""
    return (
        implementation is sdpa_attention_forward
        and all(kwargs.get(k) is None for k in ("softcap", "s_aux", "sinks", "position_bias", "sliding_window"))
        and not kwargs.get("dropout")
        and kwargs.get("is_causal", getattr(module, "is_causal", True)) is not False
    )


def record_call(
    recorder, module, query, key, value, attention_mask, out, weights, kwargs: dict, scores=None, probs=None
) -> None:
    """Hand one attention call's tensors, and everything the implementation applied, to ``recorder``
    (``scores`` or ``probs``: a decode query's q·kᵀ or probabilities, when a packed forward computed them
    for many sequences at once)."""
    recorder.record(
        module.layer_idx,
        query,
        key,
        attention_mask,
        kwargs.get("scaling"),
        kwargs.get("softcap"),
        out,
        value=value,
        weights=weights,
        sinks=_learned_sinks(kwargs, query.shape[1]),
        bias=kwargs.get("position_bias"),
        sliding_window=kwargs.get("sliding_window"),
        scores=scores,
        probs=probs,
    )


# ---- installing ----------------------------------------------------------------------------------
def _given() -> dict:
    """kvviz's arguments to the innermost model call running in this thread (see :func:`_keep_given`)."""
    stack = getattr(_tls, "given", None)
    return stack[-1] if stack else {}


def _keep_given(module, args, kwargs) -> None:
    """Keep kvviz's arguments of a model call for the attention calls inside it. Most models hand a forward's
    extra keyword arguments down to their attention; some (Falcon since transformers 5.25) call the
    attention interface without them, and the wrapper then reads them here."""
    mine = {k: kwargs[k] for k in (RECORDER_KWARG, OVERRIDE_KWARG) if k in kwargs}
    _tls.given = [*getattr(_tls, "given", []), {**_given(), **mine}]  # an inner call the outer one dropped them for


def _drop_given(module, args, kwargs, output) -> None:
    _tls.given = getattr(_tls, "given", [None])[:-1]


def _given_hooks(model) -> list:
    """Hooks on the model and its base model that keep each call's kvviz arguments (``always_call``: popped
    when a forward raises too)."""
    hooks = []
    for m in dict.fromkeys((model, getattr(model, "base_model", model))):
        hooks.append(m.register_forward_pre_hook(_keep_given, with_kwargs=True))
        hooks.append(m.register_forward_hook(_drop_given, with_kwargs=True, always_call=True))
    return hooks


def _legacy_hook(module, args, kwargs, output):
    """Hand the probabilities a legacy attention layer returned to this thread's recorder, then drop
    them from the output (so the model does not keep every layer's T × T matrix)."""
    recorder = getattr(_tls, "recorder", None)
    if recorder is None or not isinstance(output, tuple):
        return None
    if len(output) < 2 or output[1] is None:
        raise CaptureError(f"{type(module).__name__} returned no attention probabilities with output_attentions.")
    recorder.record_weights(module.layer_idx, output[1])
    return (output[0], None, *output[2:])


def _check_eager_agrees(model, previous: str) -> None:
    """Legacy attention returns probabilities only on its eager path: before switching a model loaded
    with another implementation to it, make sure both give the same output (Falcon with ALiBi does
    not: its eager path adds ALiBi twice), once per model."""
    if previous == "eager" or _eager_agrees.get(model):
        return
    param = next(model.parameters())
    ids = torch.arange(min(16, int(getattr(model.config, "vocab_size", 16))), device=param.device)[None]
    with torch.inference_mode():
        ref = model(input_ids=ids, use_cache=False).logits.float()
        force_attn_implementation(model.config, "eager")
        try:
            mine = model(input_ids=ids, use_cache=False, output_attentions=True).logits.float()
        finally:
            force_attn_implementation(model.config, previous)
    diff = (ref - mine).abs().max().item()
    if not diff <= (1e-3 if param.dtype == torch.float32 else 5e-2) * max(1.0, ref.abs().max().item()):
        raise CaptureError(
            f"kvviz cannot capture {model.config.model_type} loaded with {previous} attention: its "
            f"eager attention, the only path that returns probabilities, gives other outputs (max "
            f"|Δ logit| {diff:.2g}); load it with attn_implementation='eager'."
        )
    _eager_agrees[model] = True


def _install(model) -> dict:
    previous = attn_implementation(model.config) or "eager"
    entry: dict = {"count": 0, "previous": previous, "legacy": not uses_interface(model), "hooks": []}
    if entry["legacy"]:  # its own eager path is the one that returns probabilities
        _check_eager_agrees(model, previous)
        force_attn_implementation(model.config, "eager")
        entry["hooks"] = [m.register_forward_hook(_legacy_hook, with_kwargs=True) for m in attention_modules(model)]
    else:
        model.set_attn_implementation(_name_for(previous))
        entry["hooks"] = _given_hooks(model)
    return entry


def _uninstall(model, entry: dict) -> None:
    for hook in entry["hooks"]:
        hook.remove()
    if entry["legacy"]:
        force_attn_implementation(model.config, entry["previous"])
    else:
        model.set_attn_implementation(entry["previous"])


@contextmanager
def installed(model, state_layers: bool = False):
    """Route ``model``'s attention through the capture wrapper for the block, then restore it.

    Re-entrant and thread-safe: concurrent runs on one shared model share the installation, and
    the last one out puts the previous implementation back. ``state_layers``: a linear-attention
    hybrid's attention layers are wrapped, its linear layers run as loaded (see ``check_capturable``).
    """
    check_capturable(model, state_layers=state_layers)
    with _cond:
        _cond.wait_for(lambda: id(model) not in _exclusive)
        entry = _users.get(id(model))
        if entry is None:
            entry = _users[id(model)] = _install(model)
        entry["count"] += 1
    try:
        yield
    finally:
        with _cond:
            entry["count"] -= 1
            if entry["count"] == 0:
                _uninstall(model, entry)
                _users.pop(id(model), None)
                _cond.notify_all()


class Held:
    """The capture kept installed on ``model`` across one thread's consecutive calls of :meth:`hold` (the
    engine's steps), instead of once per call: installing walks every module of the model
    (``set_attn_implementation``), a few milliseconds each time. :meth:`release` lets it go — the holder calls it
    before its own check and when it has nothing to do — and :meth:`hold` lets go first whenever another thread
    waits in :func:`unpatched`, so that one still gets its turn between two calls, as between two ``installed``
    blocks."""

    def __init__(self, model):
        self.model = model
        self._block: AbstractContextManager | None = None

    def hold(self) -> None:
        key = id(self.model)
        if self._block is not None and _wanted.get(key):
            self.release()
            with _cond:  # the waiting thread takes the model first (or gives up, or another thread holds it now)
                _cond.wait_for(lambda: not _wanted.get(key) or key in _users)
        if self._block is None:
            block = installed(self.model)
            block.__enter__()
            self._block = block

    def release(self) -> None:
        block, self._block = self._block, None
        if block is not None:
            block.__exit__(None, None, None)


def is_installed(model) -> bool:
    """True while a capture is routing this model's attention (tests check it is gone after)."""
    impl = attn_implementation(model.config)
    return id(model) in _users or (isinstance(impl, str) and impl.startswith(NAME))


@contextmanager
def recording(model, recorder):
    """The extra forward arguments that hand ``recorder`` this forward's attention, for the block."""
    if recorder is None:
        yield {}
        return
    entry = _users.get(id(model))
    if entry is None or not entry["legacy"]:
        yield {RECORDER_KWARG: recorder}
        return
    previous, _tls.recorder = getattr(_tls, "recorder", None), recorder
    try:
        yield {"output_attentions": True}
    finally:
        _tls.recorder = previous


@contextmanager
def unpatched(model, timeout: float = 10.0):
    """Hold ``model`` without the capture wrapper for the block; yields False if another run kept it
    installed for ``timeout`` seconds (the block then runs with the wrapper, which changes no output)."""
    with _cond:
        _wanted[id(model)] = _wanted.get(id(model), 0) + 1
        try:
            alone = _cond.wait_for(lambda: id(model) not in _users, timeout)
        finally:
            _wanted[id(model)] -= 1
            if not _wanted[id(model)]:
                del _wanted[id(model)]
            _cond.notify_all()  # a Held that let go for this thread waits for it to have taken the model
        if alone:
            _exclusive.add(id(model))
    try:
        yield alone
    finally:
        if alone:
            with _cond:
                _exclusive.discard(id(model))
                _cond.notify_all()
