"""Checkpoints read from disk (read-only) and compared tensor by tensor."""
