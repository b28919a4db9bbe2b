"""Amaranth hardware of neonic: the SmartNIC and accelerator datapaths.

Imports nothing from ``sim`` or ``host`` (imports point host -> sim -> rtl).
"""
