"""``genfleet bench``: the engine against Hugging Face transformers on the same workload."""
