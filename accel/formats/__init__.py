"""accel.formats (work in progress)."""
