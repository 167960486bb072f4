"""The vLLM logits-processor plugin (plugin.py) and its per-row state (rows.py). Imported only inside a vLLM process."""
