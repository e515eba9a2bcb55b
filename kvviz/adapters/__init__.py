"""The only modules that touch private internals of the libraries kvviz builds on.

Each private name is used in one function here, and ``tests/adapters`` holds a canary test per
function that fails, naming the attribute, when a new release of the library moves it. Gradio's
adapter imports gradio, so it lives under :mod:`kvviz.ui` (``kvviz/ui/serving/gradio_adapter.py``).
"""
