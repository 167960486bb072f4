"""Provenance that outsiders read with their own tools: JWS receipts and their JWKS, C2PA Content
Credentials for text, and the RFC 9162 Merkle hashing of the transparency log. Pure formats and keys:
no database, no Flask (``db`` stores what these make; ``api`` serves it)."""
