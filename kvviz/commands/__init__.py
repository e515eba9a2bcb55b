"""Sub-commands of ``python -m kvviz``; each module has ``add_parser`` and sets ``func``."""
