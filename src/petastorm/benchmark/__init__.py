"""Read-throughput benchmark of Petastorm readers (library: :mod:`.throughput`, command: :mod:`.cli`)."""

__all__: list[str] = []
