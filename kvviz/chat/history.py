"""A conversation's history, checked, and rendered into a turn's prompt through a chosen chat template.

Turn n+1's prompt is the whole conversation rendered again — system prompt, every earlier user
message and answer, the new user message — so it starts from the cache of turn n only when the
template renders the earlier turns exactly as turn n's cache holds them (its prompt, then the answer
as generated). The model's own template does; :data:`DROP_ANSWERS` is the same template with every
earlier answer left out (as templates that rewrite history do: Qwen3's drops earlier turns' reasoning,
which left mlx-lm reusing nothing from one turn to the next), so reuse stops at the first answer. It
drops the whole answer message, not only its text: a small model shown earlier answers that were empty
answers the new question the same way, with its end-of-turn token first and no text.

A history comes from strangers (``/chat``'s ``history``): its size is checked before it is parsed — as JSON
text or as the list (or any other value) a client sent, the same bound — its shape and roles after
(:func:`parse_history`), each message's text as a prompt is (:func:`kvviz.safety.clean_prompt`), all of them
together against the longest prompt, and only then is it rendered and counted against the token limit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kvviz.limits import MAX_HISTORY_CHARS, MAX_HISTORY_MESSAGES
from kvviz.safety import clean_prompt, json_chars

MODEL = "model"  # the model's own chat template
DROP_ANSWERS = "drop-answers"  # the model's template with earlier answers left out
TEMPLATES = {
    MODEL: "The model's own chat template (earlier turns rendered as they were)",
    DROP_ANSWERS: "A template that drops earlier answers (rewrites history)",
}
ROLES = ("user", "assistant")
_LOOP = "{% for message in messages %}"
_DROPPED = "{% for message in messages if message['role'] != 'assistant' %}"


def template_source(tokenizer, name: str) -> str | None:
    """The Jinja source of template ``name`` for this tokenizer (None: the tokenizer's own, or none)."""
    if name == MODEL:
        return None
    own = getattr(tokenizer, "chat_template", None)
    if name == DROP_ANSWERS and isinstance(own, str) and _LOOP in own:
        return own.replace(_LOOP, _DROPPED)
    raise ValueError(f"Chat template {name!r} is not available for this model; choose one of {available(tokenizer)}.")


def available(tokenizer) -> list[str]:
    """The templates this tokenizer can render (none without a chat template of its own)."""
    own = getattr(tokenizer, "chat_template", None)
    if not isinstance(own, str):
        return []
    return [MODEL, DROP_ANSWERS] if _LOOP in own else [MODEL]


def parse_history(raw, max_chars: int) -> list[dict[str, str]]:
    """``raw`` (JSON text, or the list it parses to) as checked messages: a list of at most
    :data:`MAX_HISTORY_MESSAGES` ``{"role", "content"}`` objects, user and assistant taking turns from a
    user message to an answer (the new user message comes separately), their contents a prompt of at most
    ``max_chars`` characters together. A ValueError says what is wrong, before anything is tokenized."""
    if not isinstance(raw, str):  # a list (or anything else) as the client sent it: the JSON text's bound
        size = json_chars(raw, MAX_HISTORY_CHARS)
        if size > MAX_HISTORY_CHARS:
            raise ValueError(
                f"The history is over {MAX_HISTORY_CHARS:,} characters of JSON; the limit is {MAX_HISTORY_CHARS:,}."
            )
    if isinstance(raw, str):
        if len(raw) > MAX_HISTORY_CHARS:
            raise ValueError(f"The history is {len(raw):,} characters of JSON; the limit is {MAX_HISTORY_CHARS:,}.")
        if not raw.strip():
            return []
        try:
            raw = json.loads(raw)
        except RecursionError:
            raise ValueError("The history is nested too deeply: send a flat list of messages.") from None
        except ValueError as exc:
            raise ValueError(f"The history is not valid JSON ({exc}); send a list of {{role, content}}.") from None
    if not isinstance(raw, list):
        raise ValueError(f"The history must be a JSON list of {{role, content}} messages, not {type(raw).__name__}.")
    if len(raw) > MAX_HISTORY_MESSAGES:
        raise ValueError(f"The history has {len(raw):,} messages; the limit is {MAX_HISTORY_MESSAGES}.")
    if len(raw) % 2:
        raise ValueError("The history must end with an answer: pairs of a user message and the assistant's reply.")
    out = [_message(m, i, max_chars) for i, m in enumerate(raw)]
    total = sum(len(m["content"]) for m in out)
    if total > max_chars:
        raise ValueError(f"The history's messages are {total:,} characters together; the limit is {max_chars:,}.")
    return out


def _message(m, i: int, max_chars: int) -> dict[str, str]:
    where = f"History message {i + 1}"
    if not isinstance(m, dict) or set(m) != {"role", "content"}:
        raise ValueError(f"{where} must be an object with exactly the keys role and content.")
    role, expected = m["role"], ROLES[i % 2]
    if not isinstance(role, str):
        raise ValueError(f"{where} has a role that is not text; expected {expected!r}.")
    if role != expected:
        raise ValueError(f"{where} has role {str(role)[:20]!r}; expected {expected!r} (user and assistant take turns).")
    try:
        content = clean_prompt(m["content"], max_chars)
    except ValueError as exc:
        raise ValueError(f"{where} ({role}): {str(exc).replace('The prompt', 'its content')}") from None
    return {"role": role, "content": content}


def messages(history: Sequence[dict[str, str]], user: str) -> list[dict[str, str]]:
    """The conversation with the new user message after the history."""
    return [*history, {"role": "user", "content": user}]


def render(
    tokenizer, msgs: Sequence[dict[str, str]], template: str = MODEL, generation_prompt: bool = True
) -> list[int]:
    """Token ids of the conversation through ``template`` (:data:`TEMPLATES`), ending with the assistant's
    generation prompt."""
    ids = tokenizer.apply_chat_template(
        list(msgs), chat_template=template_source(tokenizer, template), add_generation_prompt=generation_prompt
    )
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return [int(i) for i in ids]


def previous_turn(tokenizer, history: Sequence[dict[str, str]], template: str = MODEL) -> list[int]:
    """The tokens the previous turn's cache held, rebuilt from the history alone (an API client sends text):
    its prompt — the history before its answer, through the same template — then the answer's tokens and
    the model's end of turn. Empty without a previous turn."""
    if len(history) < 2:
        return []
    prompt = render(tokenizer, history[:-1], template)
    answer = tokenizer(history[-1]["content"], add_special_tokens=False)["input_ids"]
    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return prompt + [int(i) for i in answer] + end
