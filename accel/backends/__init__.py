"""accel.backends (work in progress)."""
