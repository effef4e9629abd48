"""autotm."""
