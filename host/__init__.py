"""The neonic runtime and everything a user drives: workloads, planner, schedule, CLI.

May import ``sim`` and ``rtl``.
"""
