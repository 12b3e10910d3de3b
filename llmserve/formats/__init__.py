"""Pydantic models of every file a user writes or the tool writes."""
