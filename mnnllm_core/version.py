"""The package's version, in a module of its own so the core can name it (the weight cache keys
its files by it) without importing the package's `__init__`, which reaches the whole engine."""
__version__ = "0.1.0"
