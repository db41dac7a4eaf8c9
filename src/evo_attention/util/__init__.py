"""The bottom layer: errors, JSON, atomic files, number formatting, statistics, terminal progress.

Nothing here imports another part of the package (only ``util`` itself), so every layer may use it.
"""
