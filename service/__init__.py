"""FastAPI inference service (imports schemas, never training or torch)."""
