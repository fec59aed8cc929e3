"""ridgeline: what is the least GPU that serves demand D within my SLO, and does it really?"""

__version__ = "0.1.0"
