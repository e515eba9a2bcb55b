"""The bad-input corpus: what students (and scripts) may send to each endpoint, and what must come back.

Each :class:`Case` names an endpoint, the inputs it changes (``"name|other_name"`` lists the
parameter names it may have, so the memory and evict endpoints can name theirs as they like), and
either a regex the error message must match or ``ok=True`` for input that is odd but valid (emoji,
right-to-left text, stray control characters) and must simply work. Inputs the gradio_client
refuses to encode itself (NaN, infinities, unpaired surrogates) go through ``raw=True``: the same
``/gradio_api/call`` route with hand-written JSON, as ``curl`` would send it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx

UI = Path(__file__).resolve().parents[2] / "kvviz" / "ui"
REQUIRED_ENDPOINTS = ("generate", "memory", "evict")
NAN, INF = float("nan"), float("inf")


@dataclass
class Case:
    id: str
    endpoint: str
    inputs: dict = field(default_factory=dict)
    error: str | None = None  # regex the message must match (case-insensitive); None with ok=True
    ok: bool = False
    raw: bool = False


def _oversized_config() -> str:
    """A valid-looking config.json of about 1 MiB (past any sane upload limit)."""
    return json.dumps({"model_type": "llama", "num_hidden_layers": 2, "padding": "x" * 1_100_000})


GEN = "prompt_text|prompt"
NEW = "max_new_tokens"
CASES: list[Case] = [
    # --- generate: prompts
    Case("gen-empty", "generate", {GEN: ""}, r"prompt is empty"),
    Case("gen-whitespace", "generate", {GEN: "   \n\t  "}, r"prompt is empty"),
    Case("gen-only-controls", "generate", {GEN: "\x00\x01\x07\x1b"}, r"prompt is empty"),
    Case("gen-none", "generate", {GEN: None}, r"prompt is empty"),
    Case("gen-surrogate", "generate", {GEN: "abc\ud800 def"}, r"invalid characters", raw=True),
    Case("gen-past-context", "generate", {GEN: "word " * 9000}, r"exceeds the limit"),
    Case("gen-very-long-line", "generate", {GEN: "x" * 250_000}, r"characters; the limit"),
    Case("gen-single-token", "generate", {GEN: "Hi", "chat": False, NEW: 2}, ok=True),
    Case("gen-emoji", "generate", {GEN: "🙂🚀🧠 what do these mean?", "chat": False, NEW: 2}, ok=True),
    Case("gen-rtl", "generate", {GEN: "ما هي عاصمة فرنسا؟", "chat": False, NEW: 2}, ok=True),
    Case(
        "gen-bidi-override", "generate", {GEN: "\u202eabc\u202c \u200bzero\u200dwidth", "chat": False, NEW: 2}, ok=True
    ),
    Case(
        "gen-embedded-controls",
        "generate",
        {GEN: "What is\x00 the capital\x07 of France?", "chat": False, NEW: 2},
        ok=True,
    ),
    # --- generate: numbers
    Case("gen-new-zero", "generate", {NEW: 0}, r"between 1 and"),
    Case("gen-new-negative", "generate", {NEW: -5}, r"between 1 and"),
    Case("gen-new-fraction", "generate", {NEW: 2.5}, r"whole number"),
    Case("gen-new-nan", "generate", {NEW: NAN}, r"whole number", raw=True),
    Case("gen-new-inf", "generate", {NEW: INF}, r"whole number", raw=True),
    Case("gen-new-huge", "generate", {NEW: 10**12}, r"between 1 and"),
    Case("gen-new-over-limit", "generate", {NEW: 65}, r"between 1 and 64"),
    Case("gen-new-bool", "generate", {NEW: True}, r"whole number", raw=True),
    Case("gen-new-text", "generate", {NEW: "ten"}, r"whole number"),
    Case("gen-temp-negative", "generate", {"temperature": -1.0}, r"temperature"),
    Case("gen-temp-nan", "generate", {"temperature": NAN}, r"temperature", raw=True),
    Case("gen-temp-huge", "generate", {"temperature": 1e9}, r"temperature"),
    Case("gen-top-p-zero", "generate", {"top_p": 0.0}, r"top-p"),
    Case("gen-top-p-over", "generate", {"top_p": 1.5}, r"top-p"),
    Case("gen-top-p-nan", "generate", {"top_p": NAN}, r"top-p", raw=True),
    Case("gen-seed-negative", "generate", {"seed": -1}, r"seed"),
    Case("gen-seed-fraction", "generate", {"seed": 2.5}, r"seed.*whole number"),
    Case("gen-seed-huge", "generate", {"seed": 1e30}, r"seed"),
    # --- chat: a chat's history
    Case("gen-history-huge", "chat", {"history": "[" + "1," * 200_000 + "1]"}, r"characters of JSON; the limit"),
    Case("gen-history-malformed", "chat", {"history": '[{"role": "user"'}, r"not valid JSON"),
    Case(
        "gen-history-roles",
        "chat",
        {"history": '[{"role": "system", "content": "Obey"}, {"role": "user", "content": "Hi"}]'},
        r"role 'system'; expected 'user'",
    ),
    Case("gen-history-template", "chat", {"history": "[]", "template": "../../etc"}, r"is not one of"),
    # --- memory (the calculator): configs, sizes, model ids, paths
    Case("mem-malformed-json", "memory", {"config_json|config|config_text": "{not json"}, r"json"),
    Case(
        "mem-oversized-json",
        "memory",
        {"config_json|config|config_text": _oversized_config()},
        r"limit|larger|too (big|large)|bytes",
    ),
    Case("mem-json-array", "memory", {"config_json|config|config_text": "[1, 2, 3]"}, r"object|json"),
    Case(
        "mem-json-nan", "memory", {"config_json|config|config_text": '{"num_hidden_layers": NaN}'}, r"json|nan|number"
    ),
    Case("mem-context-zero", "memory", {"context": 0}, r"context"),
    Case("mem-context-negative", "memory", {"context": -8192}, r"context"),
    Case("mem-context-fraction", "memory", {"context": 100.5}, r"context|whole"),
    Case("mem-context-huge", "memory", {"context": 10**13}, r"context"),
    Case("mem-batch-zero", "memory", {"batch": 0}, r"batch"),
    Case("mem-batch-nan", "memory", {"batch": NAN}, r"batch|whole|number", raw=True),
    Case("mem-unknown-dtype", "memory", {"kv_dtype|dtype": "fp7"}, r"dtype|fp7"),
    Case(
        "mem-unknown-model",
        "memory",
        {"model|model_id|preset|source|config": "no-such-org/no-such-model-kvviz"},
        r"no-such|not found|unknown|could not|neither|must be a preset",
    ),
    Case(
        "mem-local-path",
        "memory",
        {"model|model_id|preset|source|config": "/etc/passwd"},
        r"path|not allowed|neither|config",
    ),
    # --- evict (generate under a policy)
    Case("evict-unknown-policy", "evict", {"policy|policy_name": "lru"}, r"policy|lru"),
    Case("evict-budget-zero", "evict", {"budget": 0}, r"budget"),
    Case("evict-budget-negative", "evict", {"budget": -3}, r"budget"),
    Case("evict-budget-nan", "evict", {"budget": NAN}, r"budget|whole|number", raw=True),
    Case("evict-ratio-over", "evict", {"ratio": 1.5, "budget": None}, r"ratio"),
    Case("evict-ratio-negative", "evict", {"ratio": -0.2, "budget": None}, r"ratio"),
    Case("evict-ratio-nan", "evict", {"ratio": NAN, "budget": None}, r"ratio|number", raw=True),
    Case("evict-empty-prompt", "evict", {"prompt|prompt_text": "  "}, r"prompt is empty|empty"),
    Case(
        "evict-param-of-another-policy",
        "evict",
        {"policy|policy_name": "h2o", "params": {"sinks": 4}},
        r"does not apply",
    ),
    Case(
        "evict-param-nan",
        "evict",
        {"policy|policy_name": "h2o", "params": {"heavy_fraction": NAN}},
        r"heavy fraction",
        raw=True,
    ),
    Case(
        "evict-param-text",
        "evict",
        {"policy|policy_name": "snapkv", "params": {"window_size": "many"}},
        r"window size.*whole number",
    ),
    Case("evict-params-not-an-object", "evict", {"params": [1, 2]}, r"params must be an object"),
    # --- odd but valid input for the other endpoints: each must answer with its own contract
    Case("mem-preset-any-case", "memory", {"config_json|config|config_text": "llama-3-8b"}, ok=True),
    Case(
        "evict-emoji",
        "evict",
        {"prompt|prompt_text": "🙂 The code is 3390. 🚀 What is the code?", "policy|policy_name": "h2o"},
        ok=True,
    ),
]


def answered(endpoint: str, result) -> bool:
    """Whether ``result`` is what ``endpoint`` promises for valid input (the CLI's JSON for memory and evict)."""
    if not isinstance(result, dict):
        return False
    if endpoint in ("generate", "chat"):
        return result.get("generated_tokens", 0) >= 1 and isinstance(result.get("text"), str)
    if endpoint == "memory":
        return result.get("bytes_per_token", 0) > 0 and len(result.get("layers", [])) == result.get("num_layers")
    if endpoint == "evict":
        kept = result.get("kept") or []
        return (
            result.get("generated_tokens", 0) >= 1
            and len(kept) > 0
            and all(len(head) == result.get("n_kept") for layer in kept for head in layer)
        )
    raise AssertionError(f"no success contract for /{endpoint}: add one to answered()")


def endpoints_in_source() -> set[str]:
    """Endpoints the app defines, read from kvviz/ui (collection must not start the app)."""
    found = set()
    for path in UI.rglob("*.py"):
        found.update(re.findall(r"api_name\s*=\s*[\"']([A-Za-z_]+)[\"']", path.read_text()))
    return found


def resolve(case: Case, params: list[dict]) -> list:
    """Positional inputs for ``case``: its values by parameter name, else the endpoint's baseline, else defaults."""
    names = [p["parameter_name"] for p in params]
    chosen = {k: v for k, v in BASELINE.get(case.endpoint, {}).items() if k in names}
    for key, value in case.inputs.items():
        hit = next((n for n in key.split("|") if n in names), None)
        if hit is None:
            raise AssertionError(
                f"case {case.id}: /{case.endpoint} has none of the parameters {key!r}; "
                f"it has {names}. Update tests/api/bad_inputs.py."
            )
        chosen[hit] = value
    values = []
    for p in params:
        name = p["parameter_name"]
        if name in chosen:
            values.append(chosen[name])
        elif p.get("parameter_has_default"):
            values.append(p.get("parameter_default"))
        else:
            values.append(VALID_EXAMPLES.get(name, p.get("example_input")))
    return values


# a valid request per endpoint that each case then breaks in one place (quick: few new tokens)
BASELINE = {"evict": {"budget": 16, "max_new_tokens": 2}}
# valid values for required parameters the cases do not set (the generic "example_input" may be invalid)
VALID_EXAMPLES = {
    "prompt_text": "What is the capital of France?",
    "prompt": "What is the capital of France?",
    "config": "loaded",
}


def call_raw(base_url: str, endpoint: str, values: list, timeout: float = 120.0) -> tuple[str, object]:
    """POST hand-written JSON (NaN, surrogates allowed) to ``/gradio_api/call/<endpoint>``; returns (event, data)."""
    body = json.dumps({"data": values}, allow_nan=True, ensure_ascii=True)
    url = base_url.rstrip("/") + f"/gradio_api/call/{endpoint}"
    r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    r.raise_for_status()
    event_id = r.json()["event_id"]
    event, data = None, None
    with httpx.stream("GET", f"{url}/{event_id}", timeout=timeout) as stream:
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data = json.loads(line.split(":", 1)[1])
                if event in {"complete", "error"}:
                    break
    return event, data
