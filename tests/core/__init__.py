"""Tests of the pure core: request parsing, policies, placement, planning, patches, the CLI."""
