"""mini-trainer: fast full fine-tuning of causal LMs, with OSFT for continual learning."""

__version__ = "0.1.0"
