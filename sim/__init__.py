"""Simulation engines of neonic: RTL runners, reference and timing models, the network.

May import ``rtl``; never ``host``.
"""
