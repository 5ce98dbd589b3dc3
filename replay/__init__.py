"""skewlens replay."""
