"""accel.models (work in progress)."""
