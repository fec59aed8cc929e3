"""The package version, in a module of its own: anything may read it without loading the
package's public names."""

__version__ = "0.1.0"
