"""KV-cache memory: the config reader (layout.py), the size formula (estimate.py), capacity and decode time
(capacity.py), one request's report (report.py), tiny live models (architectures.py) and presets/."""
