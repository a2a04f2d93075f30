"""Untrusted files read bounded, their digests, and the user cache folder: below every layer."""
