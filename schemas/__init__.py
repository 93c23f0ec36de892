"""The clinical contract shared by training and serving (numpy + pydantic only, never torch)."""
