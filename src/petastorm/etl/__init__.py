"""Dataset generation helpers (Petastorm's ``petastorm.etl`` package)."""
