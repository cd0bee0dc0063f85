"""The release's version, declared once (setup.cfg reads it; the package's face and the provider info hand it on)."""

__version__ = "0.4.0"
