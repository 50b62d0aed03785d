"""Debugging aids: per-stage and per-pass graph dumps (the graph-diff tool builds on them)."""
