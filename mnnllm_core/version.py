"""The package version (its own module: the core reads it without importing the package's entry points)."""
__version__ = "0.1.0"
