"""Helpers for testing code that uses petastorm: a fake reader and a shuffle-quality measure."""

__all__: list[str] = []
