"""Model definitions written for the engine, and loading them from a Hugging Face folder."""

from worker.models.loader import load_model

__all__ = ["load_model"]
