"""Synthetic GGUF pairs: tiny known-answer pairs with an exact predictor (known_answer), and full-width
pairs of a real model's shapes for timing (full_width)."""
