"""What a run shows: the console, progress lines, trackers and plots."""
