"""Files on disk: bounded reads, atomic writes, swaps, output folders and their locks."""
