"""``genfleet bench``: seeded workloads through the engine and Hugging Face transformers in
one run, and through the whole fleet (``--fleet``, ``--batch-mix``) or with structured
outputs (``--structured``) against the offline engine."""
