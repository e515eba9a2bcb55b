"""Show-me results on disk, so a restarted server answers every show-me at once instead of computing them first.

One result is two files in the store's folder: ``<hash>.json`` (the key, the kvviz version, the machine and the
value as a tagged JSON tree) and ``<hash>.npz`` (its arrays). Nothing is pickled: a tree may name only
dataclasses of kvviz modules already imported (built field by field), tuples, sets, dicts, numpy arrays and torch
tensors (kept as numpy; bfloat16 as float32 with its dtype noted), and arrays load with ``allow_pickle=False``. A
file that does not parse, was written for another key, version or machine, or names anything else is refused
(:class:`Unreadable`) and the caller computes the result again. Files are written to a temporary name and
moved into place, so a reader never sees half a file.

The folder is keyed by model, the dtype and device it runs in, kvviz version and machine: timings (tokens/s, the
no-cache loop) are this machine's, a new version may compute something else, and a model in bf16 computes other
numbers (logits, equivalence differences, agreement) than the same model in fp32. Nothing here imports gradio or kvviz.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 1


class Unreadable(ValueError):
    """A stored file that is not one this server wrote for this key (corrupt, foreign or from another format)."""


class NotStorable(TypeError):
    """A value holding something the format cannot write (it is then kept in memory only)."""


def machine() -> str:
    """The processor, core count and accelerator: what the stored timings depend on (not the host name, which
    a Space changes on every restart)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    gpu = ""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gpu = " + " + torch.cuda.get_device_name(0)
    return f"{cpu} × {os.cpu_count() or 1}{gpu}"


def code_version() -> str:
    """kvviz's version and a digest of its source files: a changed computation is a new version, even
    between releases, so a stored result never outlives the code that made it."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    release = getattr(sys.modules.get("kvviz"), "__version__", "0")
    return f"{release}+{digest.hexdigest()[:12]}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "x"


class Encoder:
    """A value → (JSON tree, arrays)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def _array(self, a: np.ndarray, **tags: Any) -> dict:
        if a.dtype == object:
            raise NotStorable("an array of Python objects")
        name = f"a{len(self.arrays)}"
        self.arrays[name] = a
        return {"$a": name, **tags}

    def encode(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, float)) and type(v) in (int, float):
            return v
        if isinstance(v, np.generic):
            return {"$n": str(v.dtype), "v": v.item()}
        if isinstance(v, np.ndarray):
            return self._array(v)
        if isinstance(v, bytes):
            return self._array(np.frombuffer(v, dtype=np.uint8), bytes=True)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(v, torch.Tensor):
            t = v.detach().cpu()
            kept = t.float() if t.dtype == torch.bfloat16 else t
            return self._array(kept.numpy(), torch=str(t.dtype).removeprefix("torch."))
        if isinstance(v, list):
            return [self.encode(x) for x in v]
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return {"$t": [self.encode(x) for x in v]}
        if isinstance(v, (set, frozenset)):
            return {"$s": [self.encode(x) for x in v], "frozen": isinstance(v, frozenset)}
        if isinstance(v, dict) and type(v) is dict:
            return {"$d": [[self.encode(k), self.encode(x)] for k, x in v.items()]}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            cls = type(v)
            if not cls.__module__.startswith("kvviz."):
                raise NotStorable(f"{cls.__module__}.{cls.__qualname__} is not a kvviz dataclass")
            fields = {f.name: self.encode(getattr(v, f.name)) for f in dataclasses.fields(v)}
            return {"$c": f"{cls.__module__}:{cls.__qualname__}", "f": fields}
        kind = type(v).__module__.split(".", 1)[0]
        if kind == "plotly" and hasattr(v, "to_json"):  # a figure: plotly's own JSON
            return {"$plotly": v.to_json()}
        if kind == "pandas" and type(v).__name__ == "DataFrame":  # a table: its columns, index and cells
            split = v.to_dict(orient="split")
            return {"$df": {k: self.encode(split[k]) for k in ("columns", "index", "data")}}
        raise NotStorable(f"{type(v).__module__}.{type(v).__qualname__}")


class Decoder:
    """A (JSON tree, arrays) → value, refusing anything :class:`Encoder` would not have written."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    @staticmethod
    def _class(name: Any) -> type:
        module, _, qualname = str(name).partition(":")
        mod = sys.modules.get(module) if module.startswith("kvviz.") else None
        obj: Any = mod
        for part in qualname.split("."):
            obj = getattr(obj, part, None) if obj is not None and not part.startswith("_") else None
        if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
            raise Unreadable(f"not a loaded kvviz dataclass: {name!r}")
        return obj

    def decode(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self.decode(x) for x in v]
        if not isinstance(v, dict) or len(v) == 0:
            raise Unreadable(f"unexpected {type(v).__name__}")
        if "$a" in v:
            a = self.arrays.get(str(v["$a"]))
            if a is None:
                raise Unreadable(f"missing array {v['$a']!r}")
            if v.get("bytes") is True and a.dtype == np.uint8 and a.ndim == 1:
                return a.tobytes()
            if "torch" not in v:
                return a
            torch = sys.modules.get("torch")
            dtype = getattr(torch, str(v["torch"]), None) if torch is not None else None
            if torch is None or not isinstance(dtype, torch.dtype):
                raise Unreadable(f"bad tensor dtype {v['torch']!r}")
            return torch.from_numpy(np.array(a)).to(dtype)
        if "$plotly" in v:
            import plotly.io

            return plotly.io.from_json(str(v["$plotly"]), skip_invalid=False)
        if "$df" in v:
            import pandas as pd

            parts = {k: self.decode(v["$df"][k]) for k in ("columns", "index", "data")}
            return pd.DataFrame(parts["data"], columns=parts["columns"], index=parts["index"])
        if "$n" in v:
            return np.dtype(str(v["$n"])).type(v["v"])
        if "$t" in v:
            return tuple(self.decode(x) for x in v["$t"])
        if "$s" in v:
            items = [self.decode(x) for x in v["$s"]]
            return frozenset(items) if v.get("frozen") else set(items)
        if "$d" in v:
            return {self.decode(k): self.decode(x) for k, x in v["$d"]}
        if "$c" in v:
            cls = self._class(v["$c"])
            given = v.get("f")
            if not isinstance(given, dict):
                raise Unreadable("a dataclass without fields")
            fields = {f.name: f for f in dataclasses.fields(cls)}
            if set(given) != set(fields):
                raise Unreadable(f"{cls.__qualname__}: fields changed")
            values = {k: self.decode(x) for k, x in given.items()}
            obj = cls(**{k: x for k, x in values.items() if fields[k].init})
            for k, x in values.items():
                if not fields[k].init:
                    object.__setattr__(obj, k, x)
            return obj
        raise Unreadable(f"unknown tag in {sorted(v)[:3]}")


class DemoFiles:
    """The folder of stored results for one model as it runs (``runs_as``: its dtype and device, e.g.
    ``"bfloat16 on cpu"``), kvviz version and machine."""

    def __init__(self, root: Path, model: str, version: str, where: str | None = None, runs_as: str = "") -> None:
        self.where = machine() if where is None else where
        self.version = version
        self.runs_as = runs_as
        tag = hashlib.sha256(f"{model}\n{runs_as}\n{version}\n{self.where}".encode()).hexdigest()[:12]
        self.folder = Path(root) / f"{_slug(model)}-{_slug(runs_as)}-{_slug(version)}-{tag}"

    def _name(self, key: Hashable) -> str:
        return hashlib.sha256(repr(key).encode()).hexdigest()[:32]

    def path(self, key: Hashable) -> Path:
        return self.folder / f"{self._name(key)}.json"

    def save(self, key: Hashable, value: Any, label: str = "", seconds: float | None = None) -> Path:
        """Write ``value`` for ``key`` (raises :class:`NotStorable` for what the format cannot hold)."""
        enc = Encoder()
        tree = enc.encode(value)
        head = {
            "format": FORMAT,
            "key": repr(key),
            "version": self.version,
            "machine": self.where,
            "runs_as": self.runs_as,
            "label": label,
            "seconds": seconds,
            "saved_at": time.time(),
        }
        buf = io.BytesIO()
        np.savez(buf, allow_pickle=False, **enc.arrays)  # type: ignore[arg-type]
        digest = hashlib.sha256(buf.getvalue()).hexdigest()
        text = json.dumps({**head, "arrays": digest, "value": tree}, allow_nan=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path(key)
        for data, dest in ((buf.getvalue(), target.with_suffix(".npz")), (text.encode(), target)):
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".part-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, dest)
        return target

    def load(self, key: Hashable) -> tuple[Any, dict] | None:
        """(value, its header) for ``key``, None when nothing is stored; :class:`Unreadable` for a bad file."""
        target = self.path(key)
        if not target.exists():
            return None
        try:
            doc = json.loads(target.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Unreadable(f"{target.name}: {exc}") from None
        if not isinstance(doc, dict):
            raise Unreadable(f"{target.name}: not an object")
        expected = {
            "format": FORMAT,
            "key": repr(key),
            "version": self.version,
            "machine": self.where,
            "runs_as": self.runs_as,
        }
        for name, want in expected.items():
            if doc.get(name) != want:
                raise Unreadable(f"{target.name}: {name} is {doc.get(name)!r}, not {want!r}")
        try:
            raw = target.with_suffix(".npz").read_bytes()
        except OSError as exc:
            raise Unreadable(f"{target.name}: its arrays: {exc}") from None
        if hashlib.sha256(raw).hexdigest() != doc.get("arrays"):
            raise Unreadable(f"{target.name}: its arrays are not the ones written with it")
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (ValueError, OSError) as exc:
            raise Unreadable(f"{target.name}: its arrays: {exc}") from None
        try:
            value = Decoder(arrays).decode(doc.get("value"))
        except Unreadable:
            raise
        except Exception as exc:  # a constructor refusing the stored fields
            raise Unreadable(f"{target.name}: {exc}") from None
        return value, {k: doc.get(k) for k in ("label", "seconds", "saved_at")}

    def remove(self, key: Hashable) -> None:
        for suffix in (".json", ".npz"):
            self.path(key).with_suffix(suffix).unlink(missing_ok=True)
