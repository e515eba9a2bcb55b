"""Input checks and containment for a public deployment: prompts, numbers, model specs, config JSON, temp files.

Everything a user can type goes through one of these before any work starts, and each refusal is a
``ValueError`` whose message says what to fix (the UI turns it into ``gr.Error``). Nothing here
imports gradio; nothing here ever enables ``trust_remote_code``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
import unicodedata
from pathlib import Path

from kvviz.admission import NO_SESSION
from kvviz.limits import MAX_CONFIG_BYTES, MAX_TEMPERATURE, MIN_TEMPERATURE, MIN_TOP_P

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_KEEP_CONTROLS = {"\n", "\t", "\r"}


def clean_prompt(text, max_chars: int) -> str:
    """The prompt with control characters removed; refuses non-text, invalid or empty text, and long text.

    Emoji, right-to-left scripts and any other printable Unicode pass through unchanged.
    """
    if text is None:
        raise ValueError("The prompt is empty: type some text or pick an example.")
    if not isinstance(text, str):
        raise ValueError(f"The prompt must be text, not {type(text).__name__}.")
    if len(text) > max_chars:
        raise ValueError(f"The prompt is {len(text):,} characters; the limit is {max_chars:,}. Shorten it.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "The prompt contains invalid characters (unpaired surrogates); paste it again as plain text."
        ) from None
    cleaned = "".join(c for c in text if c in _KEEP_CONTROLS or unicodedata.category(c) not in {"Cc", "Cs"})
    if not cleaned.strip():
        raise ValueError("The prompt is empty: type some text or pick an example.")
    return cleaned


def json_chars(value, limit: int) -> int:
    """About how many characters ``value`` takes as JSON (strings and keys by their length, numbers by their
    text, a container's brackets and separators), counted only until it passes ``limit``: the size check of
    a value that may come as text, a list, an object, a number or nested any deep, that costs at most
    ``limit`` steps whatever arrived. Returns ``limit + 1`` once passed."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 + len(item)
            for key, val in item.items():
                total += len(key) + 3 if isinstance(key, str) else 24
                stack.append(val)
                if total > limit:
                    break
        elif isinstance(item, (list, tuple)):
            total += 2 + len(item)
            if total <= limit:
                stack.extend(item)
        else:
            total += 4 if item is None or isinstance(item, bool) else 24  # a number at most 24 characters
        if total > limit:
            return limit + 1
    return total


def whole_number(value, name: str, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi]; refuses fractions, NaN, infinities, booleans and text."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} must be a whole number between {lo:,} and {hi:,}.")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{name} must be a whole number between {lo:,} and {hi:,}, not {value[:40]!r}.") from None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a whole number between {lo:,} and {hi:,}.") from None
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{name} must be a whole number between {lo:,} and {hi:,}, not {value!r}.")
    _no_negative_zero(number, value, name, f"a whole number between {lo:,} and {hi:,}")
    if not lo <= int(number) <= hi:
        shown = f"{int(number):,}" if abs(number) < 1e15 else f"{number:.3g}"
        raise ValueError(f"{name} must be between {lo:,} and {hi:,}; got {shown}.")
    return int(number)


def real_number(value, name: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """``value`` as a finite float in [lo, hi] (or (lo, hi] with ``lo_open``)."""
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} must be a number in {interval}.")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number in {interval}, not {str(value)[:40]!r}.") from None
    if not math.isfinite(number) or number > hi or number < lo or (lo_open and number == lo):
        raise ValueError(f"{name} must be a number in {interval}; got {value!r}.")
    _no_negative_zero(number, value, name, f"a number in {interval}")
    return number


def _no_negative_zero(number: float, value, name: str, allowed: str) -> None:
    """Refuse ``-0``: a negative sign on a field that has none (a probe, not a typo a page can send:
    JSON.stringify(-0) is "0")."""
    if number == 0 and math.copysign(1.0, number) < 0:
        raise ValueError(f"{name} must be {allowed}, without a minus sign; got {value!r}.")


def temperature(value, hi: float = MAX_TEMPERATURE) -> float:
    """A sampling temperature in [0, ``hi``]; one below :data:`~kvviz.limits.MIN_TEMPERATURE` is 0 (greedy),
    since dividing logits by it overflows or leaves only the argmax anyway."""
    t = real_number(0.0 if value is None else value, "Temperature", 0.0, hi)
    return 0.0 if t < MIN_TEMPERATURE else t


def top_p(value) -> float:
    """A nucleus mass in (0, 1]; one below :data:`~kvviz.limits.MIN_TOP_P` is raised to it, which keeps only the
    most likely token (greedy), as any mass that small does: float32 would round it to 0, a nucleus of nothing."""
    p = real_number(1.0 if value is None else value, "Top-p", 0.0, 1.0, lo_open=True)
    return max(p, MIN_TOP_P)


def looks_like_path(spec: str) -> bool:
    """True for anything that names the local file system rather than a hub repository."""
    s = spec.strip()
    if s.startswith(("/", "~", ".", "\\")) or "\\" in s or ".." in s or ":" in s:
        return True
    try:
        return Path(s).expanduser().exists()
    except OSError:
        return True


def check_model_spec(spec: str | None, *, public: bool, allowed: list[str]) -> str | None:
    """``spec`` if this deployment may load it, else ValueError.

    Private deployments load anything (``None`` = the default). Public ones load only the
    allowlist, never a local path, and a spec that is not even a hub id is refused before any
    download is tried.
    """
    if spec is None or not str(spec).strip():
        return None
    spec = str(spec).strip()
    if not public:
        return spec
    if spec == "bundled" and "bundled" in allowed:
        return spec
    if looks_like_path(spec):
        raise ValueError(
            f"{spec[:80]!r} is a local path; this public deployment loads only models on its "
            f"allowlist: {', '.join(allowed) or 'none'}."
        )
    if spec not in allowed and not HUB_ID.match(spec):
        raise ValueError(
            f"{spec[:80]!r} is not a Hugging Face model id (owner/name) on this deployment's "
            f"allowlist: {', '.join(allowed) or 'none'}."
        )
    if spec not in allowed:
        raise ValueError(
            f"{spec!r} is not on this deployment's allowlist (KVVIZ_ALLOWED_MODELS): {', '.join(allowed) or 'none'}."
        )
    return spec


def check_config_size(n_bytes: int, max_bytes: int = MAX_CONFIG_BYTES, where: str = "The config") -> None:
    """Refuse a config of ``n_bytes`` over the limit (before an uploaded file is even read)."""
    if n_bytes > max_bytes:
        raise ValueError(
            f"{where} is {n_bytes:,} bytes; the limit is {max_bytes:,} bytes (a config.json is a few KiB)."
        )


def parse_config_json(data, max_bytes: int = MAX_CONFIG_BYTES, where: str | None = None) -> dict:
    """A model config from uploaded or pasted text: JSON only (never code or pickle), at most ``max_bytes``.

    Accepts ``str``/``bytes``; returns the JSON object. Refuses other JSON values, non-finite
    numbers and nesting deeper than a config ever needs; ``where`` (e.g. a file name) leads the message.
    """
    try:
        return _parse_config_json(data, max_bytes)
    except ValueError as exc:
        if where is None:
            raise
        raise ValueError(f"{where}: {exc}") from None


def _parse_config_json(data, max_bytes: int) -> dict:
    if data is None:
        raise ValueError("No config given: paste a config.json or upload one.")
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if not isinstance(raw, (bytes, bytearray)):
        raise ValueError(f"A config must be JSON text, not {type(data).__name__}.")
    check_config_size(len(raw), max_bytes)
    try:
        text = bytes(raw).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError("The config is not UTF-8 text; upload the model's config.json.") from None
    if not text.strip():
        raise ValueError("The config is empty: paste a config.json or upload one.")

    def no_constants(name: str):
        raise ValueError(f"The config contains {name}, which is not valid JSON.")

    try:
        value = json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise ValueError(f"The config is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
    except RecursionError:
        raise ValueError("The config is nested too deeply to be a model config.") from None
    if not isinstance(value, dict):
        raise ValueError(f"The config must be a JSON object like a config.json, not {type(value).__name__}.")
    if _depth(value) > 16:
        raise ValueError("The config is nested too deeply to be a model config.")
    return value


def _depth(value, level: int = 0) -> int:
    if level > 16:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


PREFIX = "kvviz-"  # SessionFiles' folders: kvviz-<pid>-<random>


def remove_stale(parent: str | Path | None = None) -> list[Path]:
    """Delete the export folders (``kvviz-<pid>-…`` under ``parent``, default the system temp folder) of
    processes that are gone: a server killed with ``kill -9`` never ran its exit cleanup. Only this user's
    own folders, never a link, never a live process's. Returns what was removed."""
    removed = []
    base = Path(parent or tempfile.gettempdir())
    for path in base.glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        try:
            st = path.lstat()
        except OSError:
            continue
        if not pid.isdigit() or path.is_symlink() or not path.is_dir() or st.st_uid != os.getuid():
            continue
        if _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or a number no process has: leave it
    return True


class SessionFiles:
    """One private temporary folder per app, one sub-folder per session; removed at session end and at exit.

    Every file the app writes for a user (exports) goes under :meth:`folder`, so nothing lands
    outside the temporary folder and one session never sees another's files.
    """

    def __init__(self, parent: str | Path | None = None):
        self._parent = parent
        self._root: Path | None = None
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        """The app's folder under the system temp folder, made on first use and removed at exit; its name
        carries this process's id, so a later start-up can remove it if the process was killed
        (:func:`remove_stale`)."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self._parent))
            atexit.register(self.cleanup)
        return self._root

    def _path(self, session: str) -> Path:
        # hashed so a session id never becomes a path component as typed
        return self.root / hashlib.sha256(session.encode()).hexdigest()[:24]

    def folder(self, session: str | None) -> Path:
        """The session's folder (created on first use, private to this user of the machine)."""
        path = self._path(session or NO_SESSION)
        with self._lock:
            self.root.mkdir(mode=0o700, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
        return path

    def run_folder(self, session: str | None) -> Path:
        """A fresh folder for one export inside the session's folder."""
        return Path(tempfile.mkdtemp(prefix="run-", dir=self.folder(session)))

    def forget(self, session: str | None) -> None:
        """Delete the session's files (its session ended)."""
        if self._root is None:
            return
        with self._lock:
            shutil.rmtree(self._path(session or NO_SESSION), ignore_errors=True)

    def sessions(self) -> list[str]:
        """Hashed names of the sessions that still have files (for tests and the load bench)."""
        if self._root is None or not self._root.exists():
            return []
        return sorted(p.name for p in self._root.iterdir())

    def cleanup(self) -> None:
        """Delete everything (server shutdown)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
