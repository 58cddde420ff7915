"""Dataset metadata: the schema and row-group information stored in ``_common_metadata``."""
