"""The handheld side: the daemon that runs tails for a wearable."""
