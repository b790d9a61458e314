"""`python -m mini_trainer` is the `mini-trainer` command."""

from mini_trainer.cli import main

if __name__ == "__main__":
    main()
