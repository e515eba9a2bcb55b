"""Generation with the KV cache captured: the loop (loop.py), the attention function kvviz installs
(attention_fn.py), what it records (recorder.py, attention_math.py) and the Trace it fills (trace.py)."""
