"""Thin adapters to outside systems, each named after what it adapts."""
