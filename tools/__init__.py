"""Development tools (not shipped with the app): the demo model's data, training, export and evaluation.

Run them from the repository root as modules, e.g. `python -m tools.train_demo_model --help`."""
