"""An installed app of an embedding project that declares its pipelines in ``pipelines.py`` (found at start-up)."""
