"""Command-line tools and the helpers they share (Spark session options, dataset copying)."""

__all__: list[str] = []
