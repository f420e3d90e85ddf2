"""The decision: annotation + policy + pod in, a plan (or a denial) and its JSON Patch out."""
