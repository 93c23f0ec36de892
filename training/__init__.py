"""Training package: data, encoders, losses, fit, evaluate, export (PyTorch)."""
