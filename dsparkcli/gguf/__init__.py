"""GGUF files from their headers: the bounded reader, what a header says, and the pairing rule."""
