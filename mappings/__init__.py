"""Mapping files, one per model family (data; see converter/mapping.py for the format)."""
