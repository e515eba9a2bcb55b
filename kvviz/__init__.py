"""kvviz: see a transformer's KV cache — capture, memory arithmetic, eviction and quantization.

Usable from a notebook without gradio; the web UI lives in ``kvviz.ui`` and ``app.py``.
"""

__version__ = "0.1.0"
