"""Pieces the examples share (progress and timings)."""
