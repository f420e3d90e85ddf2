"""Hostile input: property-based and coverage-guided fuzzing of the decoder, the annotation
reader and the policy loader (issue 14)."""
