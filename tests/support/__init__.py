"""Test helpers in one place: a fake hub (hubserver), GGUF writers (gguf_fixtures), the chat oracle,
the CLI runner and the user-registry writer. Imported as ``support.<module>`` (tests/ is on sys.path)."""
