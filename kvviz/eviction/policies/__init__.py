"""Eviction policies behind one interface, and the one registry the UI, the CLI and the tests read.

Adding a policy = one module with a dataclass subclass of :class:`~kvviz.eviction.policies.base.Policy` (for a
score-based one, of :class:`~kvviz.eviction.policies.scorer.ScorerPolicy`: what it protects and how it scores)
and one line in ``POLICIES``; the tab's widgets, the CLI's flags and the API's ``params`` come from its fields.
"""

from __future__ import annotations

from kvviz.eviction.policies.adakv import AdaKV
from kvviz.eviction.policies.base import (
    EVICTED,
    HEAVY,
    KEPT,
    PAD,
    ROLE_NAMES,
    SINK,
    WINDOW,
    Policy,
    PolicyState,
    Selection,
    field_specs,
    n_kept_for,
)
from kvviz.eviction.policies.expected_attention import ExpectedAttention
from kvviz.eviction.policies.full import FullCache
from kvviz.eviction.policies.h2o import H2O
from kvviz.eviction.policies.knorm import KNorm
from kvviz.eviction.policies.kvzip import KVzip
from kvviz.eviction.policies.pyramidkv import PyramidKV
from kvviz.eviction.policies.scorer import COMPETES, ScorerPolicy, select_kept
from kvviz.eviction.policies.snapkv import SnapKV
from kvviz.eviction.policies.streaming_llm import StreamingLLM
from kvviz.eviction.policies.tova import TOVA
from kvviz.eviction.policies.window import SlidingWindow
from kvviz.safety import real_number, whole_number

POLICIES: dict[str, type[Policy]] = {
    "full": FullCache,
    "streaming_llm": StreamingLLM,
    "window": SlidingWindow,
    "h2o": H2O,
    "snapkv": SnapKV,
    "knorm": KNorm,
    "tova": TOVA,
    "expected_attention": ExpectedAttention,
    "pyramidkv": PyramidKV,
    "adakv": AdaKV,
    "kvzip": KVzip,
}


def policy_class(name: str) -> type[Policy]:
    """The registered policy class, or ValueError naming the choices."""
    if name not in POLICIES:
        raise ValueError(f"Unknown policy {name!r}; choose one of {', '.join(POLICIES)}.")
    return POLICIES[name]


def make_policy(name: str, **params) -> Policy:
    """A policy by registry name with the given hyper-parameters (unknown names/params → ValueError)."""
    cls = policy_class(name)
    known = {f["name"] for f in field_specs(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"{unknown[0]} does not apply to policy {name!r} (it has no parameter {unknown[0]}); "
            f"its parameters: {', '.join(sorted(known)) or 'none'}."
        )
    return cls(**params)


def check_params(name: str, values: dict | None) -> dict:
    """The policy's hyper-parameters from raw values (tab widgets, CLI flags, API JSON), each checked against
    its field spec; a value of None means the default, a name the policy does not have is refused."""
    specs = {spec["name"]: spec for spec in field_specs(policy_class(name))}
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(
            f"params must be an object of {name}'s parameters ({', '.join(specs) or 'none'}), "
            f"not {type(values).__name__}."
        )
    unknown = next((key for key in values if key not in specs), None)  # the first: a million keys cost one step
    if unknown is not None:
        raise ValueError(
            f"{str(unknown)[:40]} does not apply to policy {name!r}; its parameters: "
            f"{', '.join(sorted(specs)) or 'none'}."
        )
    return {key: _checked(specs[key], value) for key, value in values.items() if value is not None}


def _checked(spec: dict, value):
    label = spec["name"].replace("_", " ")
    if spec["type"] == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{label} must be true or false, not {str(value)[:40]!r}.")
        return value
    if spec["type"] == "int":
        return whole_number(value, label, 0 if spec["min"] is None else spec["min"], spec["max"] or 10**6)
    if spec["type"] == "float":
        return real_number(value, label, spec["min"] or 0.0, 1.0 if spec["max"] is None else spec["max"])
    if spec["choices"] and value not in spec["choices"]:
        raise ValueError(f"{label} must be one of {', '.join(spec['choices'])}, not {str(value)[:40]!r}.")
    return str(value)[:200]


def all_params() -> dict[str, tuple[dict, list[str]]]:
    """Every parameter name over the registry → (its field spec, the policies that have it); the CLI's flags."""
    out: dict[str, tuple[dict, list[str]]] = {}
    for name, cls in POLICIES.items():
        for spec in field_specs(cls):
            seen, owners = out.setdefault(spec["name"], (spec, []))
            if seen["type"] != spec["type"]:
                raise ValueError(
                    f"Parameter {spec['name']} is a {seen['type']} in {owners[0]} but a {spec['type']} "
                    f"in {name}; one flag cannot serve both."
                )
            owners.append(name)
    return out


__all__ = [
    "COMPETES",
    "EVICTED",
    "HEAVY",
    "KEPT",
    "PAD",
    "POLICIES",
    "ROLE_NAMES",
    "SINK",
    "TOVA",
    "WINDOW",
    "AdaKV",
    "ExpectedAttention",
    "FullCache",
    "H2O",
    "KNorm",
    "KVzip",
    "Policy",
    "PolicyState",
    "PyramidKV",
    "ScorerPolicy",
    "Selection",
    "SlidingWindow",
    "SnapKV",
    "StreamingLLM",
    "all_params",
    "check_params",
    "field_specs",
    "make_policy",
    "n_kept_for",
    "policy_class",
    "select_kept",
]
