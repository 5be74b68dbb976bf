"""The compiled graph callback llama.cpp calls for every node: its header of slots shared with
Python, the memory it reads through, the counter-based noise and roundings it inlines, numba's
cache stamp for them, and the driver launches it makes at a claim in device memory."""
