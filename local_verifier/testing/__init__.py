"""References for the tests and benchmarks: plain batch-1 decoding on a sequence's own K/V
(``generate``, ``kv_cache``) and transformers' model on the same checkpoint (``reference``).

The product never imports this package (``tests/test_layering.py``): it decodes only through
``Transformer.step`` on the engine's paged ``KVPool``.
"""
