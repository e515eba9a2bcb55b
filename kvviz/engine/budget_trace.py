"""A KV-budget replay's requests and answers: the traces, each request's solo run, the summary numbers.

The room (:mod:`kvviz.examples.room`) arrives in waves, as the load bench sends it; long prompts are windows
of the chapter. A lossless mode's answers must equal each request's solo run (greedy, on a plain cache);
the lossy mode's are compared with them (agreement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvviz.capture.drive import drive
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import encode_prompt
from kvviz.capture.options import Decode, Feed, Recording
from kvviz.models import LoadedModel


@dataclass(frozen=True)
class Request:
    """One request of a trace: its prompt (text through the chat template, or ``ids`` as given), the step it
    arrives at, and its token budget."""

    prompt: str
    arrival: int = 0
    max_new_tokens: int = 16
    chat: bool = True
    ids: tuple[int, ...] | None = None


def room_trace(students: int = 24, waves: int = 3, gap: int = 8, max_new_tokens: int = 16) -> list[Request]:
    """The room's requests (:mod:`kvviz.examples.room`): the example everyone presses and the first wave of
    each student's own question at step 0, each later wave ``gap`` steps after the one before."""
    from kvviz.examples.room import SAME_EXAMPLE, prompt_for

    out = [Request(SAME_EXAMPLE, 0, max_new_tokens)]
    for w in range(waves):
        out += [Request(prompt_for(i, w), w * gap, max_new_tokens) for i in range(students)]
    return out


def long_trace(lm: LoadedModel, requests: int = 8, tokens: int = 2000, max_new_tokens: int = 16) -> list[Request]:
    """Long prompts, all at step 0: windows of ``tokens`` tokens of the chapter, each starting 64 tokens after
    the one before (so no two share a block), with no chat template."""
    from kvviz.examples import chapter_text

    ids = [int(t) for t in lm.tokenizer(chapter_text(), add_special_tokens=False)["input_ids"]]
    ids = ids * -(-(tokens + 64 * requests) // len(ids))
    return [
        Request(f"chapter[{64 * i}:{64 * i + tokens}]", 0, max_new_tokens, False, tuple(ids[64 * i : 64 * i + tokens]))
        for i in range(requests)
    ]


def prompt_ids(lm: LoadedModel, req: Request) -> list[int]:
    return list(req.ids) if req.ids is not None else encode_prompt(lm, req.prompt, req.chat)


def solo_runs(lm: LoadedModel, requests: Sequence[Request]) -> list[list[int]]:
    """Each request's answer (token ids) run alone, greedy, on a plain cache: what a lossless mode must give."""
    out = []
    with torch.inference_mode():
        for req in requests:
            g = Generation(
                lm,
                req.prompt,
                feed=Feed(prompt_ids=prompt_ids(lm, req)),
                decode=Decode(max_new_tokens=req.max_new_tokens),
                recording=Recording(on=False),
            )
            drive(lm, g)
            out.append(g.trace.token_ids[g.trace.n_prompt :])
    return out


def summarize(steps: Sequence[dict], reqs: Sequence[dict]) -> dict:
    """The replay in a few numbers: sequences running (most, mean), tokens per second and per step, time to
    first token (p50 / p95, steps and seconds), preemptions, the most bytes held."""
    seconds = sum(s["seconds"] for s in steps)
    tokens = sum(s["new_tokens"] for s in steps)
    ttft_steps = [q["first_token_steps"] for q in reqs]
    ttft_s = [q["first_token_s"] for q in reqs if q["first_token_s"] is not None]
    return {
        "steps": len(steps),
        "max_running": max((s["running"] for s in steps), default=0),
        "mean_running": float(np.mean([s["running"] for s in steps])) if steps else 0.0,
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else None,
        "tokens_per_step": tokens / len(steps) if steps else None,
        "ttft_steps_p50": float(np.percentile(ttft_steps, 50)),
        "ttft_steps_p95": float(np.percentile(ttft_steps, 95)),
        "ttft_s_p50": float(np.percentile(ttft_s, 50)) if ttft_s else None,
        "ttft_s_p95": float(np.percentile(ttft_s, 95)) if ttft_s else None,
        "preemptions": sum(len(s["preempted"]) for s in steps),
        "peak_bytes": max((sum(s["bytes"].values()) for s in steps), default=0),
    }


def compare_solo(result: dict, solo: Sequence[Sequence[int]]) -> dict:
    """Each request's answer against its solo run: ``same_as_solo`` and ``agreement`` (the share of positions,
    over the longer of the two, where the tokens agree before they first differ); the summary gets
    ``all_same_as_solo`` and the mean agreement."""
    for q, ref in zip(result["requests"], solo):
        mine, ref = list(q["answer_ids"]), list(ref)
        same = 0
        while same < min(len(mine), len(ref)) and mine[same] == ref[same]:
            same += 1
        q["same_as_solo"] = mine == ref
        q["agreement"] = same / max(len(mine), len(ref), 1)
    result["summary"]["all_same_as_solo"] = all(q["same_as_solo"] for q in result["requests"])
    result["summary"]["agreement"] = float(np.mean([q["agreement"] for q in result["requests"]]))
    return result
