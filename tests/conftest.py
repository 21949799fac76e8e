"""Shared test setup: import workbench first (fast BLAS before mlx.core)."""
import workbench  # noqa: F401
