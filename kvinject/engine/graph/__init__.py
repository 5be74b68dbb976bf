"""What the hook reads from and does in llama.cpp's graph: the hook and its plan, and the
tables the callback fills as the graph runs (cache writes, attention weights, queries, hidden
cells, the residual stream)."""
