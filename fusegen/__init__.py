"""fusegen: declarative fused-op specs compiled to NKI kernels for AWS Trainium."""

__version__ = "0.1.0"
