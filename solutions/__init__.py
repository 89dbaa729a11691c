"""Reference solutions to the exercises: model answers to learn from."""
