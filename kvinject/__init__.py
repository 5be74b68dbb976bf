"""kvinject: inject controlled error into the KV cache of llama.cpp models."""

import os

# Before numpy loads: BLAS worker threads that spin after a call compete with llama.cpp's
# threads for the cores; kvinject's numpy work is small and runs between decodes.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

__version__ = "0.1.0"
