"""The cache as cache-resident models see it: its tensors' cells as float32 rows, every
sequence's tokens with their cells, and prompts decoded once and restored."""
