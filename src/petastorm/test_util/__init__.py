"""Helpers for testing code that uses petastorm: a fake reader and a shuffle-quality measure."""
