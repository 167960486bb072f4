"""Constrained decoding: constraint specs compiled by llguidance (constraint.py) and the per-row bitmasks they fill (masks.py)."""
