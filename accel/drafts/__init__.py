"""accel.drafts (work in progress)."""
