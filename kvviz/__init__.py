"""kvviz: see a transformer's KV cache — capture, memory arithmetic, eviction and quantization.

Usable from a notebook without gradio; the web UI lives in ``kvviz.ui`` and ``app.py``::

    from kvviz import capture, load_model
    trace = capture(load_model(), "What is the capital of France?", chat=True, max_new_tokens=16)

Both are imported here, not on first use: ``kvviz.capture`` is also the name of a sub-package, and the
import system binds a sub-package's name on its parent whenever it first loads it, so a lazy lookup
would hand back the package once any capture module had been imported. Loaded here first, the
function keeps the name. The cost is torch and transformers with ``import kvviz`` (a few seconds),
which every entry point but the pure memory arithmetic pays anyway. Reach the sub-package's modules
with ``from kvviz.capture.trace import Trace`` (``import kvviz.capture.trace as t`` walks attributes
and finds the function).
"""

from kvviz.capture.loop import capture
from kvviz.models import load_model

__all__ = ["capture", "load_model"]
__version__ = "0.1.0"
