"""Pure functions from a Trace (plus an analysis) to plotly Figures and pandas DataFrames.

One module per view; none of them touches a model or imports gradio.
"""
