"""Read-throughput benchmark of Petastorm readers (library: :mod:`.throughput`, command: :mod:`.cli`)."""
