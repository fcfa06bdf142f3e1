"""The checkpoint coordinator: drives every sink of a job through one epoch (begin, write,
pre-commit, decision, commit or rollback) and recovers what a crashed coordinator left behind.

It knows nothing of any particular sink. Skeleton only until the core issue lands: it exports
nothing yet.
"""

__all__: list[str] = []
