"""Cycle-approximate timing models of the hardware units (one module per unit)."""
