"""Model files: streaming a checkpoint into shards, and back out."""
