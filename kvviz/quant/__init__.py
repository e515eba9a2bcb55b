"""KV-cache quantization: the schemes (schemes.py), a quantizing cache (cache.py) and errors measured on the
model's own queries, keys and values (model.py)."""
