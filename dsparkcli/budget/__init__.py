"""Choosing the draft budget: the cost model and its fit (``model``), the engine's per-step rule and its
cost-table format (``rule``), the tuning key (``key``), records (``record``) and their store (``store``),
what a budget may be (``limits``), and ``--budget auto`` / ``adaptive`` (``choice``: the one entry point for
"a server with the chosen budget"). Measuring is bench's (``bench.tuning``); this wing sits below bench
and the runner and imports neither.
"""
