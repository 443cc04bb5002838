"""klein applications for the daemons' HTTP APIs (no listening here)."""
