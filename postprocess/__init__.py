"""Noisy answers -> consistent, nonnegative protected microdata (weighted least squares)."""
