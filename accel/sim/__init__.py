"""accel.sim (work in progress)."""
