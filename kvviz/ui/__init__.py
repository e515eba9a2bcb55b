"""The Gradio face of kvviz: tabs that wire events to library calls (no tensor math here)."""
