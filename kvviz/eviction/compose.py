"""Eviction and quantization together: a policy decides what is kept, a quantization scheme stores it.

The chapter lists the fixes for a cache that does not fit, from most to least robust; here they are
measured together on one prompt. :func:`kvviz.eviction.served.quantize_kept` round-trips the entries an
evicting cache holds right after the prefill through a :class:`~kvviz.quant.schemes.Scheme` (KIVI
keeps its most recent entries exact, as :func:`kvviz.quant.schemes.simulate` does); tokens
generated afterwards stay exact (a short answer sits inside KIVI's full-precision window anyway). :func:`compose` runs
the full cache, the policy alone, the quantization alone and both, and reports each one's answer,
agreement with the full cache (teacher-forced: top-1 and KL) and bytes as served (16-bit entries;
quantized ones packed, with their scales). Usage::

    from kvviz.eviction.compose import compose
    from kvviz.quant.schemes import kivi
    table = compose(lm, ids, make_policy("snapkv"), kivi(4), ratio=0.5).frame()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvviz.eviction.compare import agreement_and_kl
from kvviz.eviction.policies import FullCache, Policy
from kvviz.eviction.run import PolicyRun, run_policy
from kvviz.models import LoadedModel
from kvviz.quant.schemes import Scheme, kivi, preset_schemes

Progress = Callable[[float, str], None]


def schemes() -> dict[str, Scheme]:
    """The schemes offered next to a policy, by name: KIVI at 4 and 2 bits, INT8 and FP8 per token."""
    by_name = {s.name: s for s in preset_schemes()}
    return {
        "KIVI-4": kivi(4),
        "KIVI-2": kivi(2),
        "INT8 per token": by_name["INT8 per token"],
        "FP8 per token": by_name["FP8 e4m3 per token"],
    }


@dataclass
class ComposedRow:
    name: str
    answer: str
    top1_agreement: float
    mean_kl: float
    served_bytes: int


@dataclass
class Composition:
    """Full cache, the policy, the quantization, and both: one row each (the full cache first)."""

    rows: list[ComposedRow]
    full_bytes: int

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "cache": r.name,
                    "answer": r.answer,
                    "top-1 agreement": r.top1_agreement,
                    "mean KL (nats)": r.mean_kl,
                    "bytes as served": r.served_bytes,
                    "vs full": r.served_bytes / self.full_bytes,
                }
                for r in self.rows
            ]
        )

    def summary(self) -> dict:
        return {"full_bytes": self.full_bytes, "rows": self.frame().to_dict(orient="records")}


def compose(
    lm: LoadedModel,
    ids: list[int],
    policy: Policy,
    scheme: Scheme,
    *,
    budget: int | None = None,
    ratio: float | None = None,
    n_compress: int | None = None,
    max_new_tokens: int = 16,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Composition:
    """The four caches on one prompt; agreement and KL are teacher-forced along the full cache's answer."""
    report = progress or (lambda f, d: None)

    def run(pol: Policy, **extra: Any) -> PolicyRun:
        return run_policy(
            lm,
            ids,
            pol,
            n_compress=n_compress,
            max_new_tokens=max_new_tokens,
            record_history=False,
            should_stop=should_stop,
            **extra,
        )

    report(0.0, "full cache")
    full = run(FullCache(), keep_logprobs=True)
    rows = [ComposedRow("full cache", full.text, 1.0, 0.0, _served(full))]
    variants = [
        (policy.title, policy, None),
        (scheme.name, FullCache(), scheme),
        (f"{policy.title} + {scheme.name}", policy, scheme),
    ]
    for i, (name, pol, sch) in enumerate(variants):
        report((i + 0.5) / (len(variants) + 1), name)
        b, r = (None, None) if isinstance(pol, FullCache) else (budget, ratio)
        forced = run(pol, budget=b, ratio=r, forced=full.generated_ids, keep_logprobs=True, quant=sch)
        agree, kl = agreement_and_kl(full.logprobs, forced.logprobs)
        text = full.text if agree.all() else run(pol, budget=b, ratio=r, quant=sch).text
        rows.append(
            ComposedRow(
                name,
                text,
                float(np.mean(agree)) if len(agree) else 1.0,
                float(np.mean(kl)) if len(kl) else 0.0,
                _served(forced),
            )
        )
    report(1.0, "done")
    return Composition(rows, _served(full))


def _served(run: PolicyRun) -> int:
    """A finished run's served bytes (every run_policy result has them)."""
    if run.served_bytes is None:
        raise RuntimeError("The run did not measure its served bytes.")
    return run.served_bytes
