"""`python -m mini_trainer.pipeline FILE...`: each config file's YAML syntax, FILE:LINE.

For files given with `snakemake --configfile`, which Snakemake reads itself, before any
workflow code runs, and whose syntax errors it reports without file or line."""

import sys

from mini_trainer.pipeline.checks import main

sys.exit(main())
