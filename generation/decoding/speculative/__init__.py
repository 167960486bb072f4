"""Speculative decoding: the draft-and-verify loop (decode.py), drafters, the verifier, the draft cache and positions."""
