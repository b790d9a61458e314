"""Data: chat tokenization, validation and the index-backed dataset."""
