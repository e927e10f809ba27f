"""accel.spd (work in progress)."""
