"""The embedded demo: a tiny model, a local tokenizer and synthetic tasks, built offline."""
