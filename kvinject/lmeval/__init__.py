"""kvinject and lm-evaluation-harness: kvinject's engine as an lm-eval model (``--model
kvinject``), with every request type in process and a configuration's error in its KV cache.

Nothing is imported here: lm-eval is an optional extra (``pip install 'kvinject[lm-eval]'``),
and :mod:`kvinject.lmeval.model` needs it.
"""
