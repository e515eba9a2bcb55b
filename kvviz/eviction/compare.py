"""Full cache vs eviction policies on the same prompt, side by side.

For every policy: the answer it generates on its own (greedy), and — teacher-forced along the full
cache's continuation — how often its top-1 next token agrees with the full cache's and the KL
divergence KL(full ‖ policy) of the next-token distributions (nats); plus cache bytes (measured from
the tensors) and decode tokens/s. Usage::

    from kvviz.eviction.compare import compare
    cmp = compare(lm, ids, [make_policy("streaming_llm"), make_policy("snapkv")], budget=128)
    cmp.frame()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvviz.eviction.policies import FullCache, Policy
from kvviz.eviction.run import PolicyRun, run_policy
from kvviz.models import LoadedModel

Progress = Callable[[float, str], None]


def agreement_and_kl(full_logprobs: np.ndarray, policy_logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per prediction: top-1 agreement (bool) and KL(full ‖ policy) in nats. Inputs [N, V] log-probs."""
    n = min(len(full_logprobs), len(policy_logprobs))
    p, q = full_logprobs[:n].astype(np.float64), policy_logprobs[:n].astype(np.float64)
    agree = p.argmax(-1) == q.argmax(-1)
    kl = np.maximum((np.exp(p) * (p - q)).sum(-1), 0.0)  # rounding can give -1e-9
    return agree, kl


@dataclass
class PolicyResult:
    """One row of the side-by-side comparison."""

    policy: Policy
    run: PolicyRun  # the policy's own greedy generation
    agree: np.ndarray  # [N] top-1 agreement with the full cache, teacher-forced
    kl: np.ndarray  # [N] KL(full ‖ policy) per prediction, nats

    @property
    def top1_agreement(self) -> float:
        return float(self.agree.mean()) if len(self.agree) else 1.0

    @property
    def mean_kl(self) -> float:
        return float(self.kl.mean()) if len(self.kl) else 0.0

    def row(self) -> dict:
        r = self.run
        return {
            "policy": self.policy.name,
            "title": self.policy.title,
            "params": self.policy.params(),
            "n_kept": r.n_kept,
            "answer": r.text,
            "top1_agreement": self.top1_agreement,
            "mean_kl_nats": self.mean_kl,
            "max_kl_nats": float(self.kl.max()) if len(self.kl) else 0.0,
            "cache_bytes": r.cache_bytes,
            "full_cache_bytes": r.full_cache_bytes,
            "decode_tokens_per_s": r.timings.get("decode_tokens_per_s"),
        }


@dataclass
class Comparison:
    """The full cache's run and one result per policy (the full cache first)."""

    full: PolicyRun
    results: list[PolicyResult] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.row() for r in self.results])

    def summary(self) -> dict:
        return {
            "prompt_tokens": self.full.n_prompt,
            "compressed_tokens": self.full.n_compressed,
            "full_text": self.full.text,
            "rows": [r.row() for r in self.results],
        }


def compare(
    lm: LoadedModel,
    prompt_ids: list[int],
    policies: list[Policy],
    *,
    budget: int | None = None,
    ratio: float | None = None,
    n_compress: int | None = None,
    max_new_tokens: int = 24,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Comparison:
    """Run the full cache, then every policy twice at most (teacher-forced, and free if it diverged)."""
    report = progress or (lambda f, d: None)
    report(0.0, "full cache")
    full = run_policy(
        lm,
        prompt_ids,
        FullCache(),
        n_compress=n_compress,
        max_new_tokens=max_new_tokens,
        keep_logprobs=True,
        should_stop=should_stop,
    )
    out = Comparison(full=full)
    n_full = len(full.generated_ids)
    out.results.append(PolicyResult(FullCache(), full, np.ones(n_full, bool), np.zeros(n_full)))
    todo = [p for p in policies if not isinstance(p, FullCache)]
    for i, policy in enumerate(todo):
        report((i + 0.5) / (len(todo) + 1), f"{policy.title}: teacher-forced")
        forced = run_policy(
            lm,
            prompt_ids,
            policy,
            budget=budget,
            ratio=ratio,
            n_compress=n_compress,
            max_new_tokens=max_new_tokens,
            forced=full.generated_ids,
            keep_logprobs=True,
            should_stop=should_stop,
        )
        agree, kl = agreement_and_kl(full.logprobs, forced.logprobs)
        free = forced
        if not agree.all():  # it would have written something else: let it
            report((i + 1) / (len(todo) + 1), f"{policy.title}: own answer")
            free = run_policy(
                lm,
                prompt_ids,
                policy,
                budget=budget,
                ratio=ratio,
                n_compress=n_compress,
                max_new_tokens=max_new_tokens,
                should_stop=should_stop,
            )
        else:
            free.stop_reason = full.stop_reason
        out.results.append(PolicyResult(policy, free, agree, kl))
    report(1.0, "done")
    return out
