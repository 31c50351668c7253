"""The Hugging Face hub: the model registry, hf:// references, verified fetches and remote header reads."""
