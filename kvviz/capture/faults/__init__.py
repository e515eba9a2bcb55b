"""The zoo of KV-cache bugs kvviz can switch on in its own cached decoding (never in the reference).

One module per fault, each a :class:`~kvviz.capture.faults.base.Fault` with its public source and its
one-line lesson; :data:`FAULTS` is the registry the command, the view and the tests read, and
:func:`make_fault` builds one from a name, a step and a layer, refusing unknown names and out-of-range
numbers. A run takes it as ``Generation(..., cache=CacheSetup(fault=make_fault("causal_decode", step=3, layer=5)))``.

Not in the zoo, and why: sinks dropped when a StreamingLLM window slides (an eviction policy's choice,
whose reference is not a full recomputation: kvviz's StreamingCache keeps them by construction), and a
group's scores averaged instead of summed (an eviction scorer's bug, which changes what is kept, not the
attention of what is held).
"""

from __future__ import annotations

from kvviz.capture.faults.appended_twice import AppendedTwice
from kvviz.capture.faults.base import Fault, FaultyCache
from kvviz.capture.faults.causal_decode import CausalDecode
from kvviz.capture.faults.fp8_no_scales import Fp8NoScales
from kvviz.capture.faults.fully_cached_prompt import FullyCachedPrompt
from kvviz.capture.faults.gqa_wrong_group import GqaWrongGroup
from kvviz.capture.faults.not_appended import NotAppended
from kvviz.capture.faults.prefix_block_off_by_one import BLOCK, PrefixBlockOffByOne
from kvviz.capture.faults.rope_off_by_one import RopeOffByOne
from kvviz.capture.faults.sliding_window_off_by_one import SlidingWindowOffByOne
from kvviz.limits import MAX_FAULT_STEP, MAX_LAYERS, bounded_int

FAULTS: dict[str, type[Fault]] = {
    f.name: f
    for f in (
        CausalDecode,
        NotAppended,
        AppendedTwice,
        RopeOffByOne,
        GqaWrongGroup,
        Fp8NoScales,
        PrefixBlockOffByOne,
        FullyCachedPrompt,
        SlidingWindowOffByOne,
    )
}


def make_fault(name: str, step: int = 1, layer: int = 0, block: int = 1) -> Fault:
    """The fault called ``name`` striking at decode ``step`` in ``layer`` (``block``: a prefix-table fault's
    first wrong block); ValueError naming the choices for an unknown name or a number out of range."""
    cls = FAULTS.get(name)
    if cls is None:
        raise ValueError(f"Unknown fault {name!r}; choose one of: {', '.join(FAULTS)}.")
    layer = bounded_int(layer, "fault layer", 0, MAX_LAYERS - 1)
    if cls is PrefixBlockOffByOne:
        return PrefixBlockOffByOne(step=0, layer=0, block=bounded_int(block, "fault block", 1, MAX_FAULT_STEP))
    if cls.prefill:
        return cls(step=0, layer=0)
    return cls(step=bounded_int(step, "fault step", 1, MAX_FAULT_STEP), layer=layer)


def check_fault(fault: Fault, layers: int, max_new_tokens: int, sliding: bool) -> None:
    """Refuse, by name, a fault this model or run cannot show: a layer it lacks, a step past the run's last, a
    sliding-window fault on a model without sliding windows."""
    if not fault.prefill:
        bounded_int(fault.layer, "fault layer", 0, layers - 1)
        bounded_int(fault.step, "fault step", 1, max(1, max_new_tokens - 1))
    if isinstance(fault, SlidingWindowOffByOne) and not sliding:
        raise ValueError(
            "sliding_window_off_by_one needs a model with sliding windows; this one has no sliding-window layers."
        )


__all__ = ["BLOCK", "FAULTS", "Fault", "FaultyCache", "check_fault", "make_fault"]
