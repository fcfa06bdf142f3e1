"""Decision stores: where the coordinator durably records an epoch's commit decision
(the commit point), one module per store. Skeleton only until the core issue lands: it exports
nothing yet.
"""

__all__: list[str] = []
