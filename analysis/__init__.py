"""skewlens analysis."""
