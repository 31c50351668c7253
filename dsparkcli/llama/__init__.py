"""llama.cpp: the engine build, the llama-server process and client, and its wire protocol."""
