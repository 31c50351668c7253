"""`dspark bench`: plan (what runs), run (servers and requests), records (the JSONL, typed), stats (pure
summaries), report (tables, CSV, Markdown, plot), prompts (kits), provenance (where figures came from)
and overhead (dspark's own cost per request)."""
