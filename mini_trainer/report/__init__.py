"""`mini-trainer report`: an HTML page with plots from training runs and evaluate JSONs.

- `inputs`: the manifest, run folders (metrics.jsonl, training_args.json), evaluate JSONs.
- `metrics`: pure functions: accuracy matrix, AA, BWT, frontier point, Pareto front.
- `plots`: matplotlib (Agg) PNGs; `html` and `sections`: the page; `build`: wiring and writing.

This package never imports torch (a test checks it): a report is made on any machine.
"""
