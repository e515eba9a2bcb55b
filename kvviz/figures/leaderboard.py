"""Figures for the Leaderboard: score against compression ratio, one line per policy (kvpress's leaderboard view).

Pure functions of a sweep result as plain data (the JSON ``bench/leaderboard.py`` and
``python -m kvviz sweep --out`` write): its ``table`` rows (one per policy, mode and ratio) and its
``records`` (one per sample). Each figure has a caption in ``CAPTIONS``.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvviz.eviction.demos import NEEDLE_BUDGET
from kvviz.eviction.policies import POLICIES
from kvviz.examples import NEEDLE_ANSWER

METRIC_LABELS = {
    "string_match": "string match (kvpress's string_match_all, %)",
    "needle_retention": "needle retention (share of the needle's entries kept, %)",
    "top1_agreement": "top-1 agreement with the full cache (%)",
    "mean_kl": "KL(full ‖ policy) per answer token (nats, lower is better)",
}
X_AXES = {"ratio": "requested compression ratio", "achieved_ratio": "achieved compression (measured bytes freed)"}
PERCENT = {"string_match", "needle_retention", "top1_agreement"}
CAPTIONS = {
    "curves": "Each line is one policy: the chosen metric averaged over every sample at each compression ratio "
    "(0 = the full cache), with its 95 % interval over the samples (Wilson's for string match); a line that stays "
    "high longer keeps what the answer needs at a smaller cache.",
    "points": "One row per point of the chart: the mean of each metric over the samples, and the compression "
    "achieved (bytes measured from the evicting cache) next to the one requested.",
    "samples": "Every sample behind the chosen point; click a row to open it in the Eviction tab (its context, "
    "question, policy and ratio) and see what was kept and where the needle was.",
}


DEMO_LINK = "?tab=eviction"  # a deep link: the Eviction tab, whose Demos section holds the needle demo


def needle_vs_demo(table: pd.DataFrame, policy: str = "snapkv") -> str | None:
    """One sentence reconciling the curves with the Eviction tab's needle demo, where SnapKV keeps the fact:
    it keeps most of the needle here too, but writes only the answer's first digits (numbers from ``table``)."""
    rows = table[(table["policy"] == policy) & (table["ratio"] >= 0.25)]
    kept = rows[(rows["mode"] == "query_aware") & ((rows["ratio"] - 0.5).abs() < 1e-9)]
    if rows.empty or kept.empty:
        return None
    lo, hi = 100 * rows["string_match"].min(), 100 * rows["string_match"].max()
    return (
        f"**SnapKV here vs in the [needle demo]({DEMO_LINK}).** From r = 0.25 on, SnapKV answers only "
        f"{lo:.0f}–{hi:.0f} % of these samples, yet it still holds {100 * kept['needle_retention'].iloc[0]:.0f} % "
        f"of the needle's entries at r = 0.5 (query-aware) — and in the Eviction tab's needle demo, keeping "
        f"{NEEDLE_BUDGET} tokens, it keeps the code {NEEDLE_ANSWER} and answers. Both are true: on these passkeys and keys it starts "
        'the answer and stops after the first digits (" 98." for 9871676), because its observation window '
        "votes for what the question attends to, not for the digits the model must copy next."
    )


# one marker and dash per policy, and markers shrinking in drawing order, so a line drawn over another with the same
# scores (PyramidKV under SnapKV from r = 0.25) still shows at its points
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "cross", "x", "star", "pentagon", "hexagram", "triangle-down"]
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]


def _style(i: int) -> dict:
    return dict(
        line=dict(dash=DASHES[i % len(DASHES)]),
        marker=dict(symbol=SYMBOLS[i % len(SYMBOLS)], size=max(6, 16 - 2 * i), line=dict(width=1, color="white")),
    )


def _error_y(part: pd.DataFrame, metric: str, scale: float) -> dict | None:
    lo, hi = f"{metric}_lo", f"{metric}_hi"
    if lo not in part or part[lo].isna().all():
        return None
    return dict(
        type="data",
        symmetric=False,
        array=((part[hi] - part[metric]) * scale).tolist(),
        arrayminus=((part[metric] - part[lo]) * scale).tolist(),
        thickness=1,
        width=3,
    )


def above_full_note(table: pd.DataFrame, mode: str | None = None) -> str | None:
    """A sentence for every policy that scores above the full cache at some ratio (string match): by how many
    samples, and whether the two 95 % intervals overlap (with 25 samples they do: noise, not a gain)."""
    rows = table if mode is None else table[table["mode"] == mode]
    lines = []
    for (md, policy), part in rows.groupby(["mode", "policy"], sort=True):
        full = part[part["ratio"] == 0]
        if full.empty:
            continue
        f = full.iloc[0]
        above = part[(part["ratio"] > 0) & (part["string_match"] > f["string_match"] + 1e-9)]
        for score, same in above.groupby("string_match", sort=True):
            p, n = same.iloc[0], int(same.iloc[0]["samples"])
            hits, full_hits = round(score * n), round(f["string_match"] * int(f["samples"]))
            ratios = " and ".join(f"{r:g}" for r in same["ratio"])
            name = POLICIES[policy].title.split(" (")[0] if policy in POLICIES else policy
            interval = ""
            if {"string_match_lo", "string_match_hi"} <= set(part):
                lo, hi = p["string_match_lo"], p["string_match_hi"]
                overlap = lo <= f["string_match_hi"]
                interval = (
                    f" The 95 % intervals (Wilson) are {100 * f['string_match_lo']:.0f}–{100 * f['string_match_hi']:.0f} % "
                    f"for the full cache and {100 * lo:.0f}–{100 * hi:.0f} % for {name}: "
                    + (
                        f"they overlap, and with {n} samples a difference this small is within the noise, not "
                        "evidence of a gain from evicting."
                        if overlap
                        else "they do not overlap."
                    )
                )
            lines.append(
                f"**{name} above the full cache?** At r = {ratios} ({md.replace('_', '-')}) it scores "
                f"{100 * score:.0f} % against the full cache's {100 * f['string_match']:.0f} %: {hits} against "
                f"{full_hits} of {n} samples, {hits - full_hits} sample{'s' if hits - full_hits != 1 else ''} apart."
                + interval
            )
    return "\n\n".join(lines) or None


def curves(table: pd.DataFrame, metric: str = "string_match", mode: str = "query_aware", x: str = "ratio") -> go.Figure:
    """Metric against compression, one line per policy, for one mode, with each point's 95 % interval when the
    table carries it (:func:`kvviz.leaderboard.results.table` adds it from the stored records)."""
    if metric not in METRIC_LABELS:
        raise ValueError(f"metric must be one of {', '.join(METRIC_LABELS)}.")
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}.")
    df = table[table["mode"] == mode].sort_values(["policy", "ratio"])
    scale = 100.0 if metric in PERCENT else 1.0
    fig = go.Figure()
    for i, (policy, part) in enumerate(df.groupby("policy", sort=False)):
        fig.add_trace(
            go.Scatter(
                x=part[x],
                y=part[metric] * scale,
                mode="lines+markers",
                name=policy,
                error_y=_error_y(part, metric, scale),
                **_style(i),
                customdata=part[["ratio", "achieved_ratio", "samples"]].values,
                hovertemplate=(
                    f"<b>{policy}</b><br>requested %{{customdata[0]:.3f}}, achieved %{{customdata[1]:.3f}}"
                    f"<br>{METRIC_LABELS[metric].split(' (')[0]} %{{y:.3g}}<br>%{{customdata[2]}} samples"
                    "<extra></extra>"
                ),
            )
        )
    fig.update_layout(
        title=f"{METRIC_LABELS[metric].split(' (')[0]} vs compression — {mode.replace('_', '-')}",
        xaxis_title=X_AXES[x],
        yaxis_title=METRIC_LABELS[metric],
        height=420,
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def points_table(table: pd.DataFrame, mode: str) -> pd.DataFrame:
    """The chart's points for one mode, in human units."""
    df = table[table["mode"] == mode].sort_values(["policy", "ratio"])
    out = pd.DataFrame(
        {
            "policy": df["policy"],
            "requested ratio": df["ratio"],
            "achieved (stored)": df["achieved_ratio"].round(3),
            "achieved (held entries)": df["achieved_ratio_held"].round(3),
            "string match %": (100 * df["string_match"]).round(1),
            **(
                {
                    "string match 95 % interval": [
                        f"{100 * lo:.0f}–{100 * hi:.0f}" for lo, hi in zip(df["string_match_lo"], df["string_match_hi"])
                    ]
                }
                if "string_match_lo" in df
                else {}
            ),
            "needle kept %": (100 * df["needle_retention"]).round(1),
            "top-1 agree %": (100 * df["top1_agreement"]).round(1),
            "KL (nats)": df["mean_kl"].round(3),
            "samples": df["samples"],
        }
    )
    if {"prefill_s", "extra_prefill_s"} <= set(df):  # KVzip's repeat pass: a prefill cost the others do not pay
        out["prefill × shared"] = ((df["prefill_s"] + df["extra_prefill_s"]) / df["prefill_s"]).round(2)
    return out


def samples_table(records: pd.DataFrame, policy: str, ratio: float, mode: str) -> pd.DataFrame:
    """Every sample at one point (policy, ratio, mode)."""
    df = records[(records["policy"] == policy) & (records["mode"] == mode) & ((records["ratio"] - ratio).abs() < 1e-9)]
    return pd.DataFrame(
        {
            "sample": df["sample"],
            "task": df["task"],
            "length": df["length"],
            "depth %": (100 * df["depth"]).round(0),
            "answer": df["answer"],
            "match": df["string_match"],
            "needle kept %": (100 * df["needle_retention"]).round(1),
            "KL (nats)": df["mean_kl"].round(3),
        }
    ).reset_index(drop=True)
