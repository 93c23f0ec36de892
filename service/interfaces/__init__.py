"""The interfaces that score stays: one codec each (`base.Codec`), one endpoint factory
(`endpoint`) that builds their routes."""
