"""Dataset metadata: the schema, the row groups and the row-group indexes stored in ``_common_metadata``."""

__all__: list[str] = []
